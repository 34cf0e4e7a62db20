"""Which client objects the Redis backend accepts, how it names their server, and what their errors are.

Two client libraries work: redis-py (``redis.Redis``) and valkey-py (``valkey.Valkey``). They have the same API
but separate exception classes, so each library's family is looked up once per client (:func:`client_family`
for the blocking backend, :func:`asyncio_client_family` for the asyncio one) and used wherever an exception is
caught (``translated_errors``, ``ScriptRunner``). Each side refuses the other side's clients (cluster clients
included), at construction and with the reason: a blocking call in a coroutine would stall its event loop, and an
un-awaited coroutine in blocking code would silently do nothing. Cluster clients (``redis.cluster.RedisCluster``,
``redis.asyncio.RedisCluster``, valkey-py's ``ValkeyCluster``) are accepted by each family function and served by
the cluster backend (:func:`is_cluster_client` tells them apart).

Shared by both sides and hand-written (it does no I/O): the generated ``_sync`` backend calls ``client_family``
where the ``_async`` source says ``asyncio_client_family`` (a rename in ``scripts/unasync.py``).

Anything printed about a server goes through :func:`server_name` (from a client) or :func:`redacted_url` (from a
URL): neither ever shows a password. A refused login is told by :func:`login_refused`: who logged in as
whom, where, and how to give the password (:func:`login_of` reads what a client logs in with, the password's
presence only).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
import ssl
import sys
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode

from ..errors import AuthenticationFailedError, ClientSettingsWarning, InvalidArgumentError

__all__ = [
    "ClientFamily",
    "Login",
    "asyncio_client_family",
    "login_refused",
    "check_client_settings",
    "client_family",
    "cluster_server_name",
    "is_cluster_client",
    "library_family",
    "login_of",
    "login_of_url",
    "redacted",
    "redacted_url",
    "server_name",
]


@dataclass(frozen=True)
class ClientFamily:
    """One client library's classes: what it raises, and which of its clients hybridlock can use."""

    library: str
    client: type  # the blocking client (redis.Redis)
    asyncio_client: type  # the asyncio client (redis.asyncio.Redis)
    unavailable: tuple[type[BaseException], ...]  # the server did not answer: ConnectionError, TimeoutError
    authentication: type[BaseException]  # the server refused the login (a ConnectionError, so also "unavailable")
    # No sentinel gave the master's address (the blocking and the asyncio class): why is only in its text.
    master_not_found: tuple[type[BaseException], ...]
    busy_loading: type[BaseException]
    read_only: type[BaseException]
    no_script: type[BaseException]
    response_error: type[BaseException]
    any_error: type[BaseException]  # the library's root exception
    ssl_connections: tuple[type, ...]  # the TLS connection classes, blocking and asyncio
    asyncio_clients: tuple[type, ...]
    cluster_clients: tuple[type, ...]  # the blocking cluster client, then the asyncio one
    # A cluster that cannot serve a slot for now: no master for it (a failover under way), a slot being migrated
    # (TRYAGAIN), redirections that did not settle, a slot no node serves.
    cluster_unavailable: tuple[type[BaseException], ...]
    cluster_try_again: type[BaseException]
    cluster_redirect: type[BaseException]  # ASK and MOVED (MovedError is an AskError)


# Each library's names for what differs between them: its client, its cluster client, its root exception.
_LIBRARIES = {
    "redis": ("Redis", "RedisCluster", "RedisError", "RedisClusterException"),
    "valkey": ("Valkey", "ValkeyCluster", "ValkeyError", "ValkeyClusterException"),
}


@functools.cache
def library_family(library: str) -> ClientFamily:
    """The family of ``library`` ("redis" or "valkey"), imported at first use (valkey-py is optional)."""
    client_name, cluster_name, root_error, cluster_root_error = _LIBRARIES[library]
    lib = importlib.import_module(library)
    exceptions = importlib.import_module(f"{library}.exceptions")
    connection = importlib.import_module(f"{library}.connection")
    asyncio_lib = importlib.import_module(f"{library}.asyncio")
    asyncio_connection = importlib.import_module(f"{library}.asyncio.connection")
    cluster = importlib.import_module(f"{library}.cluster")
    sentinel = importlib.import_module(f"{library}.sentinel")
    asyncio_sentinel = importlib.import_module(f"{library}.asyncio.sentinel")
    return ClientFamily(
        library=library,
        client=getattr(lib, client_name),
        asyncio_client=getattr(asyncio_lib, client_name),
        unavailable=(exceptions.ConnectionError, exceptions.TimeoutError),
        authentication=exceptions.AuthenticationError,
        master_not_found=(sentinel.MasterNotFoundError, asyncio_sentinel.MasterNotFoundError),
        busy_loading=exceptions.BusyLoadingError,
        read_only=exceptions.ReadOnlyError,
        no_script=exceptions.NoScriptError,
        response_error=exceptions.ResponseError,
        any_error=getattr(exceptions, root_error),
        ssl_connections=(connection.SSLConnection, asyncio_connection.SSLConnection),
        asyncio_clients=(getattr(asyncio_lib, client_name),),
        cluster_clients=(getattr(cluster, cluster_name), getattr(asyncio_lib, cluster_name)),
        cluster_unavailable=(
            exceptions.ClusterError,  # ClusterDownError, MasterDownError, "TTL exhausted" (endless redirections)
            exceptions.TryAgainError,
            exceptions.SlotNotCoveredError,
            getattr(exceptions, cluster_root_error),  # no node reachable at all, no slot table
        ),
        cluster_try_again=exceptions.TryAgainError,
        cluster_redirect=exceptions.AskError,
    )


def client_family(client: Any) -> ClientFamily:
    """The library of ``client``, a blocking client (``redis.Redis``, ``redis.cluster.RedisCluster``, valkey-py's
    twins); raises ``InvalidArgumentError`` for an asyncio client (with the registry to use instead). A duck-typed
    stand-in (a proxy, a mock) is taken as redis-py's."""
    # A class of one of the libraries, or a subclass of one (fakeredis.FakeRedis is a redis.Redis).
    libraries = {cls.__module__.partition(".")[0] for cls in type(client).__mro__}.intersection(_LIBRARIES)
    for library in sorted(libraries):
        family = library_family(library)
        if isinstance(client, (*family.asyncio_clients, family.cluster_clients[1])):
            raise InvalidArgumentError(
                f"{type(client).__module__}.{type(client).__name__} is an asyncio client: pass it to "
                f"hybridlock.AsyncLockRegistry, or give this registry a {library}.{family.client.__name__} (or a "
                f"{library}.cluster.{family.cluster_clients[0].__name__})"
            )
        if isinstance(client, family.cluster_clients[0]):
            return family
        if isinstance(client, family.client):
            _refuse_sentinel_replica(client)
            return family
    return library_family("redis")


def asyncio_client_family(client: Any) -> ClientFamily:
    """The library of ``client``, an asyncio client (``redis.asyncio.Redis``, ``redis.asyncio.RedisCluster``,
    valkey-py's twins); raises ``InvalidArgumentError`` for a blocking client (with the asyncio class to use
    instead). A duck-typed stand-in is taken as redis-py's."""
    libraries = {cls.__module__.partition(".")[0] for cls in type(client).__mro__}.intersection(_LIBRARIES)
    for library in sorted(libraries):
        family = library_family(library)
        if isinstance(client, family.cluster_clients[1]):
            return family
        if isinstance(client, family.asyncio_clients):
            _refuse_sentinel_replica(client)
            return family
        if isinstance(client, family.cluster_clients[0]):
            raise InvalidArgumentError(
                f"{type(client).__module__}.{type(client).__name__} is a blocking client, which would stall the "
                f"event loop; hybridlock's asyncio API needs a {library}.asyncio.{family.cluster_clients[1].__name__} "
                "(or use the blocking API, LockRegistry, with this one)"
            )
        if isinstance(client, family.client):
            raise InvalidArgumentError(
                f"{type(client).__module__}.{type(client).__name__} is a blocking client, which would stall the "
                f"event loop; hybridlock's asyncio API needs a {library}.asyncio.{family.asyncio_client.__name__} "
                "(or use the blocking API, LockRegistry, with this one)"
            )
    return library_family("redis")


def _refuse_sentinel_replica(client: Any) -> None:
    """A client from ``Sentinel.slave_for`` talks to read-only replicas: every acquire would be refused."""
    pool = getattr(client, "connection_pool", None)
    service = getattr(pool, "service_name", None)
    if service is not None and getattr(pool, "is_master", True) is False:
        raise InvalidArgumentError(
            f"the client for sentinel://{service} talks to its replicas (Sentinel.slave_for), which refuse writes; "
            "use Sentinel.master_for(...) or a redis+sentinel:// URL"
        )


def is_cluster_client(client: Any) -> bool:
    """Whether ``client`` is a cluster client of either library, blocking or asyncio."""
    libraries = {cls.__module__.partition(".")[0] for cls in type(client).__mro__}.intersection(_LIBRARIES)
    return any(isinstance(client, library_family(library).cluster_clients) for library in libraries)


def cluster_server_name(client: Any, family: ClientFamily) -> str:
    """A cluster as its user knows it, for messages: ``redis+cluster://host:port,host:port`` (the nodes it was
    given to start from, or the first three it knows; ``rediss+cluster://`` over TLS). Never a password."""
    manager = getattr(client, "nodes_manager", None)
    startup = getattr(manager, "startup_nodes", None)
    nodes = list(startup) if isinstance(startup, dict) and startup else []
    if not nodes:
        return type(client).__name__
    kwargs = getattr(client, "connection_kwargs", None) or getattr(manager, "connection_kwargs", None) or {}
    connection_class = kwargs.get("connection_class") if isinstance(kwargs, dict) else None
    tls = (isinstance(connection_class, type) and issubclass(connection_class, family.ssl_connections)) or bool(
        isinstance(kwargs, dict) and kwargs.get("ssl")
    )
    # A client that has met the cluster lists every node it found (replicas too): the first few say which cluster.
    shown = ",".join(nodes[:3]) + (",..." if len(nodes) > 3 else "")
    return f"{'rediss' if tls else 'redis'}+cluster://{shown}"


def server_name(client: Any, family: ClientFamily) -> str:
    """The server as its user knows it, for messages: ``redis://host:port/db``, ``rediss://`` over TLS,
    ``unix://path``, ``sentinel://service`` for a master found through Sentinel. Never a password."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return type(client).__name__
    service = getattr(pool, "service_name", None)
    if service is not None:
        return f"sentinel://{service}/{kwargs.get('db', 0)}"
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    connection_class = getattr(pool, "connection_class", None)
    tls = isinstance(connection_class, type) and issubclass(connection_class, family.ssl_connections)
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


@dataclass(frozen=True)
class Login:
    """What a client logs in with, for messages: the user names and whether a password was given, never the password.

    ``user`` is None for the default user; ``provider`` is True when a credential provider supplies the login
    (its user is then unknown here). For a Sentinel-managed master, ``sentinels`` lists the sentinels' addresses,
    with the sentinels' own login (``sentinel_user``, ``sentinel_password``); ``topology`` is ``"server"``,
    ``"sentinel"`` or ``"cluster"``. ``socket_timeout`` and ``socket_connect_timeout`` (seconds; None: none, or
    unknown) are the client's, for the message of a request that got no answer in time."""

    user: str | None = None
    password: bool = False
    provider: bool = False
    topology: str = "server"
    sentinels: tuple[str, ...] = ()
    sentinel_user: str | None = None
    sentinel_password: bool = False
    socket_timeout: float | None = None
    socket_connect_timeout: float | None = None


def _login_fields(kwargs: Any) -> dict[str, Any]:
    if not isinstance(kwargs, dict):
        return {}

    def seconds(name: str) -> float | None:
        value = kwargs.get(name)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    timeout = seconds("socket_timeout")
    connect = seconds("socket_connect_timeout")
    return {
        "user": kwargs.get("username") or None,
        "password": bool(kwargs.get("password")),
        "provider": kwargs.get("credential_provider") is not None,
        "socket_timeout": timeout,
        # (Both libraries connect within socket_timeout when given no socket_connect_timeout.)
        "socket_connect_timeout": timeout if connect is None else connect,
    }


def login_of(client: Any) -> Login:
    """What ``client`` (either library, either side, one server, a Sentinel-managed master or a cluster) logs in
    with. A client whose settings cannot be read (a stand-in) logs in as the default user, with no password."""
    if is_cluster_client(client):
        kwargs = getattr(client, "connection_kwargs", None)
        if not isinstance(kwargs, dict):
            kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None)
        return Login(**_login_fields(kwargs), topology="cluster")
    pool = getattr(client, "connection_pool", None)
    fields = _login_fields(getattr(pool, "connection_kwargs", None))
    manager = getattr(pool, "sentinel_manager", None)
    if manager is None:
        return Login(**fields)
    sentinels = []
    for sentinel in getattr(manager, "sentinels", ()):
        kwargs = getattr(getattr(sentinel, "connection_pool", None), "connection_kwargs", None) or {}
        sentinels.append(f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}")
    theirs = _login_fields(getattr(manager, "sentinel_kwargs", None))
    return Login(
        **fields,
        topology="sentinel",
        sentinels=tuple(sentinels),
        sentinel_user=theirs.get("user"),
        sentinel_password=bool(theirs.get("password")),
    )


def login_of_url(url: str, topology: str = "server") -> Login:
    """What a client made from ``url`` logs in with (for an error raised while making it)."""
    match = _USERINFO.match(url)
    if match is None:
        return Login(topology=topology)
    user, colon, password = match["userinfo"].partition(":")
    if not colon:  # one field alone is a password, as redis-py reads redis://secret@host
        user, password = "", user
    return Login(user=unquote(user) or None, password=bool(password), topology=topology)


def _refused_login(exc: BaseException, family: ClientFamily) -> tuple[BaseException, bool] | None:
    """The authentication error behind ``exc`` (itself, or what caused it: a cluster client wraps it), and whether
    the sentinels refused (a ``MasterNotFoundError`` whose text, all it has, names an authentication error)."""
    seen: BaseException | None = exc
    for _ in range(5):  # a short chain: the error, what a cluster client wrapped it in, ...
        if seen is None:
            return None
        if isinstance(seen, family.authentication):
            return seen, False
        if isinstance(seen, family.master_not_found) and "AuthenticationError" in str(seen):
            return seen, True
        seen = seen.__cause__ or seen.__context__
    return None


def login_refused(
    exc: BaseException,
    family: ClientFamily,
    login: Login,
    *,
    operation: str,
    key: str | None,
    server: str,
    where: str | None = None,
) -> AuthenticationFailedError | None:
    """``exc`` told as an ``AuthenticationFailedError`` if a refused login is behind it (None otherwise): who was
    refused where, and how to give the password. ``where``: the node, for a cluster. Never the password."""
    found = _refused_login(exc, family)
    if found is None:
        return None
    refused, by_sentinels = found
    if by_sentinels:
        user, given = login.sentinel_user, login.sentinel_password
        at = f"the sentinels of {server} ({', '.join(login.sentinels)})" if login.sentinels else "the sentinels"
        said = "no sentinel gave the master's address, and at least one refused the login"
        how = (
            "give the sentinels' own password in the URL (redis+sentinel://...?sentinel_password=...&"
            "sentinel_username=...; the URL's user info is the master's) or to the client (Sentinel(..., "
            "sentinel_kwargs={'password': ..., 'username': ...}))"
        )
    else:
        user, given = login.user, login.password
        at = f"{server} ({where})" if where else server
        said = f"the server said: {refused}"
        client = family.cluster_clients[0].__name__ if login.topology == "cluster" else family.client.__name__
        how = {
            "server": "give it in the server URL (redis://user:password@host:port/db) or to the client "
            f"({family.library}.{client}(username=..., password=...))",
            "sentinel": "give the master's password in the URL (redis+sentinel://user:password@host:port,.../"
            "service/db) or to the client (Sentinel(...).master_for(service, username=..., password=...))",
            "cluster": "give it in the URL (redis+cluster://user:password@host:port,...) or to the client "
            f"({family.library}.cluster.{client}(username=..., password=...))",
        }[login.topology]
        if login.topology == "sentinel":
            at = f"the master of {at}"
    if login.provider and not by_sentinels:
        who, name = "the user of the client's credential provider", None
    else:
        name = user or "default"
        who = f"user {name!r}"
    if login.provider and not by_sentinels:
        what = "the credential provider's login was refused"
    elif given:
        what = "the password given was refused (wrong, or the user is unknown or disabled)"
    else:
        what = "no password was given, and one is needed"
    return AuthenticationFailedError(
        f"authentication failed during {operation} at {at} for {who}: {what} ({said}); {how}",
        key=key,
        server=server,
        user=name,
    )


# scheme://userinfo@rest. The user info is read as widely as it can be (up to the last "@" before any query), so
# that a malformed URL, say with an unescaped "/" in its password, still has all of its password hidden.
_USERINFO = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^?#]*)@")
_SECRET_QUERY_ARGS = frozenset({"password", "ssl_password", "sentinel_password"})


def _secrets(url: str) -> tuple[str | None, list[str]]:
    """The URL's user info and the secrets in it (the password; a lone field, which may be one; query
    passwords)."""
    found: list[str] = []
    userinfo = None
    match = _USERINFO.match(url)
    if match:
        userinfo = match["userinfo"]
        user, colon, password = userinfo.partition(":")
        found.append(password if colon else user)
    _, _, query = url.partition("?")
    found.extend(v for n, v in parse_qsl(query.partition("#")[0], keep_blank_values=True) if n in _SECRET_QUERY_ARGS)
    return userinfo, [secret for secret in found if secret]


def redacted_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``redis://user:***@host``, ``redis://***@host``), also in
    the query string (``?password=***``). Works on malformed URLs too: it never parses more than it must."""
    userinfo, _ = _secrets(url)
    if userinfo is not None:
        user, colon, _password = userinfo.partition(":")
        # Without a colon the one field may well be a password put where the user name goes: hide it too.
        scheme_end = url.index("://") + 3
        url = f"{url[:scheme_end]}{f'{user}:***' if colon else '***'}{url[scheme_end + len(userinfo) :]}"
    base, question, query = url.partition("?")
    if question:
        query, hash_mark, fragment = query.partition("#")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name in _SECRET_QUERY_ARGS for name, _ in pairs):
            query = urlencode([(n, "***" if n in _SECRET_QUERY_ARGS else v) for n, v in pairs], safe="*")
        url = f"{base}?{query}{hash_mark}{fragment}"
    return url


def redacted(text: str, url: str) -> str:
    """``text`` (an error message about ``url``) with the secrets of ``url`` hidden where they stand as fields:
    the URL as given, its user info (``user:password@``), a ``password=`` query argument, and a secret, or a piece
    of one, in quotes (a parser may quote a password cut at a "/" or ":"; pieces under 4 characters are kept).

    Never a secret where it stands as a word of the text: a password that is also a word of the message ("the
    password given was refused") would otherwise be told by the words masked around it."""
    userinfo, secrets = _secrets(url)
    if not secrets:
        return text
    text = text.replace(url, redacted_url(url))
    if userinfo is not None:
        text = text.replace(f"{userinfo}@", redacted_url(f"x://{userinfo}@")[len("x://") :])
    pieces = {piece for secret in secrets for piece in re.split(r"[/:?#@]", secret) if len(piece) >= 4}
    for secret in sorted({*secrets, *pieces}, key=len, reverse=True):
        for name in _SECRET_QUERY_ARGS:
            text = text.replace(f"{name}={secret}", f"{name}=***")
        for quote in "'\"":
            text = text.replace(f"{quote}{secret}{quote}", f"{quote}***{quote}")
    return text


# More retries than this make one command's worst case several socket timeouts (and backoffs) long.
_MAX_RETRIES = 1


def check_client_settings(client: Any, server: str) -> None:
    """Warn (``ClientSettingsWarning``) when a passed-in client cannot keep ``acquire``'s timeout promise: a
    command to a server that does not answer must fail within one socket timeout, so the client needs a
    ``socket_timeout`` and a ``socket_connect_timeout``, and at most one retry. Settings it cannot read (a
    stand-in client) draw no warning."""
    kwargs: Any
    if is_cluster_client(client):
        # A cluster client keeps its own retry policy (its nodes' clients retry nothing), and its nodes' connection
        # settings: on the client of a node it met (the blocking client meets the cluster at construction), else on
        # itself, for the connections it will make.
        node = _a_node_client(client)
        if node is not None:
            kwargs = _pool_settings(getattr(node, "connection_pool", None))
        else:
            try:
                kwargs = dict(client.get_connection_kwargs())
            except Exception:  # a stub without any
                return
            kwargs = {**_connection_defaults(kwargs.get("connection_class")), **kwargs}
        if kwargs is None:
            return
        kwargs["retry"] = getattr(client, "retry", None)
    else:
        kwargs = _pool_settings(getattr(client, "connection_pool", None))
    if not isinstance(kwargs, dict):
        return
    if kwargs.get("socket_connect_timeout", 0) is None:
        # Both libraries' connections connect within socket_timeout when given no socket_connect_timeout.
        kwargs["socket_connect_timeout"] = kwargs.get("socket_timeout", 0)
    untimed = [name for name in ("socket_timeout", "socket_connect_timeout") if kwargs.get(name, 0) is None]
    retries = _retries(client, kwargs)
    too_many = retries is not None and retries > _MAX_RETRIES
    if not untimed and not too_many:
        return
    problems = [f"no {name}" for name in untimed] + ([f"a retry policy of {retries} retries"] if too_many else [])
    cost = (
        "for ever, on a hung server"
        if untimed
        else f"up to {retries} + 1 socket timeouts and the backoffs between them"
    )
    warnings.warn(
        f"the client for {server} has {' and '.join(problems)}: a lock call may wait far past its timeout "
        f"({cost}). Pass socket_timeout=..., socket_connect_timeout=... and retry=Retry(NoBackoff(), 1) "
        "(from redis.retry and redis.backoff), or give hybridlock a URL",
        ClientSettingsWarning,
        stacklevel=_caller_stacklevel(),
    )


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside hybridlock (the user's own line),
    however many of the package's frames lie between."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def _pool_settings(pool: Any) -> dict[str, Any] | None:
    """What the connections ``pool`` makes will carry: a setting the client was not given (a URL names only what it
    has; ``redis.Redis(host=...)`` fills in its own defaults) is the connection class's default. None for a pool
    whose settings cannot be read (a stand-in)."""
    kwargs = getattr(pool, "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    return {**_connection_defaults(getattr(pool, "connection_class", None)), **kwargs}


def _a_node_client(client: Any) -> Any:
    """The client of one node a blocking cluster client has met (redis-py's ``redis_connection``, valkey-py's
    ``valkey_connection``); None when it has none yet (the asyncio client, before its first command)."""
    try:
        node = client.get_default_node()
    except Exception:  # a stub, or no node known
        return None
    for name in ("redis_connection", "valkey_connection"):
        found = getattr(node, name, None)
        if found is not None and hasattr(found, "connection_pool"):
            return found
    return None


_DEFAULTED = ("socket_timeout", "socket_connect_timeout", "retry", "retry_on_timeout", "retry_on_error")


@functools.cache
def _connection_defaults(connection_class: Any) -> dict[str, Any]:
    """The defaults of ``connection_class``'s settings that bear on the timeout promise (the first class of its MRO
    that names one gives it: ``UnixDomainSocketConnection`` has a ``socket_timeout`` of its own); none for a class
    whose signature cannot be read (a stand-in)."""
    defaults: dict[str, Any] = {}
    for cls in getattr(connection_class, "__mro__", ()):
        try:
            parameters = inspect.signature(cls.__dict__["__init__"]).parameters
        except (KeyError, TypeError, ValueError):
            continue
        for name in _DEFAULTED:
            parameter = parameters.get(name)
            if parameter is not None and parameter.default is not parameter.empty:
                defaults.setdefault(name, parameter.default)
    return defaults


def _retries(client: Any, kwargs: dict[str, Any]) -> int | None:
    # redis-py 5 and later keep the policy on the client (get_retry()) and in the pool's connection kwargs.
    retry = None
    get_retry = getattr(client, "get_retry", None)
    if callable(get_retry):
        try:
            retry = get_retry()
        except Exception:  # a stand-in without one
            retry = None
    if retry is None:
        retry = kwargs.get("retry")
    if retry is None:
        return None
    count = getattr(retry, "_retries", None)
    if count is None and callable(getattr(retry, "get_retries", None)):
        count = retry.get_retries()
    return count if isinstance(count, int) and count >= 0 else None


def unanswered_hint(exc: BaseException, login: Login | None = None) -> str:
    """Why a request that failed with ``exc`` (a client's connection or timeout error) ended when it did, to follow
    its message: a TLS handshake that failed or got no answer (most often a ``rediss://`` client, or ``ssl=True``,
    at a server without TLS, which never answers the handshake); else a request the server did not answer within
    the client's socket timeout, which bounds each request whatever the caller's own timeout. Empty when neither."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 6 and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(error, ssl.SSLCertVerificationError) for error in chain):
        return ""  # (the message says which certificate failed: nothing to add)
    if any(isinstance(error, ssl.SSLError) or "handshake" in str(error).lower() for error in chain):
        return (
            "; the TLS handshake failed or got no answer: is the server serving TLS on that port? A server without "
            "TLS never answers a TLS client's handshake (a rediss:// URL, ssl=True), which then ends at the socket "
            "timeout: use redis:// for it (see docs/tls.md)"
        )
    if any(isinstance(error, TimeoutError) or type(error).__name__ == "TimeoutError" for error in chain):
        login = login or Login()
        connecting = "connecting" in str(exc).lower()
        seconds = login.socket_connect_timeout if connecting else login.socket_timeout
        name = "socket_connect_timeout" if connecting else "socket_timeout"
        bound = f" ({name}={seconds:g} s)" if seconds is not None else f" ({name})"
        return (
            f"; no answer within the client's socket timeout{bound}, which bounds each request to the server (it is "
            "stalled, or out of reach): a call's own timeout bounds its wait for the lock, not a request in flight, "
            "so the call can end up to that much after its timeout"
        )
    return ""
