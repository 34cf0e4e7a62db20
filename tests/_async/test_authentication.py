"""A refused login is told as one: ``AuthenticationFailedError`` (a ``BackendUnavailableError``) saying that
authentication failed, for which user, at which server (or at a Sentinel service's master, or its sentinels), and
how to give the password, never showing it; on every topology (one server, Sentinel, Cluster, a quorum) and for a
client passed in as for a URL. Real servers asking for passwords (``requirepass``, an ACL user).

Written for asyncio; ``tests/_sync/test_authentication.py`` is generated from it.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import redis.asyncio
from redis.asyncio import retry as retries
from redis.backoff import NoBackoff

import hybridlock
from hybridlock.testing import EmbeddedServer

from ..conftest import CLUSTER_PASSWORD, MASTER_PASSWORD, SENTINEL_PASSWORD

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

PASSWORD = "right-pw-31d7"
USER_PASSWORD = "locker-pw-c5a0"
WRONG = "wrong-pw-e28b"
SECRETS = (PASSWORD, USER_PASSWORD, WRONG, MASTER_PASSWORD, SENTINEL_PASSWORD, CLUSTER_PASSWORD)

URL_ADVICE = "redis://user:password@host:port/db"
SENTINEL_ADVICE = "redis+sentinel://user:password@host:port,.../service/db"
SENTINELS_ADVICE = "sentinel_password="
CLUSTER_ADVICE = "redis+cluster://user:password@host:port,..."


@pytest.fixture
def protected(own_server: EmbeddedServer) -> EmbeddedServer:
    """A server whose default user needs ``PASSWORD``, with a user ``locker`` whose password is ``USER_PASSWORD``."""
    with redis.Redis.from_url(own_server.url) as admin:
        admin.execute_command("ACL", "SETUSER", "locker", "on", f">{USER_PASSWORD}", "~*", "&*", "+@all")
        admin.config_set("requirepass", PASSWORD)
    return own_server


def url_of(server: EmbeddedServer, userinfo: str = "") -> str:
    return f"redis://{userinfo}127.0.0.1:{server.port}/0"


async def refused(connection: object, **options: object) -> hybridlock.AuthenticationFailedError:
    """What taking a lock on ``connection`` (a URL, URLs, or a client) raises: an ``AuthenticationFailedError``
    (from making the registry when the client connects at once, as the blocking cluster client does)."""
    with pytest.raises(hybridlock.AuthenticationFailedError) as excinfo:
        await take(connection, **options)
    return excinfo.value


async def take(connection: object, **options: object) -> None:
    quorum = isinstance(connection, list)
    registry_class = hybridlock.AsyncQuorumLockRegistry if quorum else hybridlock.AsyncLockRegistry
    async with registry_class(connection, **options) as registry:  # type: ignore[arg-type]
        lock = registry.obtain("job")
        await lock.acquire(timeout=10)
        await lock.release()  # (taken: given back before the registry closes)


def check(error: hybridlock.AuthenticationFailedError, *, user: str, at: str, what: str, advice: str) -> None:
    text = str(error)
    assert text.startswith("authentication failed "), text
    assert f"for user {user!r}" in text, text
    for part in (at, what, advice):
        assert part in text, text
    assert "unreachable" not in text, text
    assert error.user == user
    assert isinstance(error, hybridlock.BackendUnavailableError)
    assert isinstance(error, ConnectionError)
    for secret in SECRETS:
        assert secret not in text, f"a password is shown: {text}"
        assert secret not in repr(error), f"a password is shown: {error!r}"
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.user, again.key) == (type(error), text, user, error.key)


# -- one server ------------------------------------------------------------------------------------------------------


async def test_no_password_is_told_so(protected: EmbeddedServer) -> None:
    error = await refused(url_of(protected))
    check(error, user="default", at=url_of(protected), what="no password was given", advice=URL_ADVICE)
    assert error.key == "job"


async def test_a_wrong_password_is_told_so(protected: EmbeddedServer) -> None:
    error = await refused(url_of(protected, f":{WRONG}@"))
    check(error, user="default", at=url_of(protected), what="the password given was refused", advice=URL_ADVICE)


async def test_a_users_wrong_password_names_the_user(protected: EmbeddedServer) -> None:
    error = await refused(url_of(protected, f"locker:{WRONG}@"))
    check(error, user="locker", at=url_of(protected), what="the password given was refused", advice=URL_ADVICE)
    await take(url_of(protected, f"locker:{USER_PASSWORD}@"))


async def test_a_client_passed_in_is_told_the_same(protected: EmbeddedServer) -> None:
    client = redis.asyncio.Redis(
        host="127.0.0.1",
        port=protected.port,
        username="locker",
        password=WRONG,
        socket_timeout=5,
        socket_connect_timeout=5,
        retry=retries.Retry(NoBackoff(), 1),
    )
    try:
        error = await refused(client)
    finally:
        await client.aclose()
    check(error, user="locker", at=url_of(protected), what="the password given was refused", advice="password=...")


async def test_a_password_changed_while_held_fails_the_renewal_as_refused(protected: EmbeddedServer) -> None:
    async with hybridlock.AsyncLockRegistry(url_of(protected, f":{PASSWORD}@")) as registry:
        lock = registry.obtain("job")
        await lock.acquire()
        with redis.Redis.from_url(url_of(protected, f":{PASSWORD}@")) as admin:
            admin.config_set("requirepass", "a-new-one")
            admin.client_kill_filter(_type="normal", skipme=False)  # every connection logs in again
        with pytest.raises(hybridlock.AuthenticationFailedError) as excinfo:
            await lock.renew()
        check(excinfo.value, user="default", at=url_of(protected), what="the password given was refused", advice="URL")
        assert excinfo.value.key == "job"
        with pytest.raises(hybridlock.BackendUnavailableError):
            await lock.release()


# -- Sentinel --------------------------------------------------------------------------------------------------------


def sentinel_url(service: object, userinfo: str = "", query: str = "") -> str:
    url: str = service.url()  # type: ignore[attr-defined]
    return url.replace("redis+sentinel://", f"redis+sentinel://{userinfo}") + query


@pytest.mark.sentinel
@pytest.mark.parametrize(
    ("userinfo", "what"), [("", "no password was given"), (f":{WRONG}@", "the password given was refused")]
)
async def test_the_masters_password_under_sentinel(protected_sentinel: object, userinfo: str, what: str) -> None:
    url = sentinel_url(protected_sentinel, userinfo, f"?sentinel_password={SENTINEL_PASSWORD}")
    error = await refused(url)
    check(error, user="default", at="the master of sentinel://hybridlock-test/0", what=what, advice=SENTINEL_ADVICE)


@pytest.mark.sentinel
@pytest.mark.parametrize(
    ("query", "what"),
    [("", "no password was given"), (f"?sentinel_password={WRONG}", "the password given was refused")],
)
async def test_the_sentinels_password(protected_sentinel: object, query: str, what: str) -> None:
    error = await refused(sentinel_url(protected_sentinel, f":{MASTER_PASSWORD}@", query))
    ports = [sentinel.port for sentinel in protected_sentinel.sentinels]  # type: ignore[attr-defined]
    at = f"the sentinels of sentinel://hybridlock-test/0 ({', '.join(f'127.0.0.1:{port}' for port in ports)})"
    check(error, user="default", at=at, what=what, advice=SENTINELS_ADVICE)


@pytest.mark.sentinel
async def test_the_right_passwords_under_sentinel_take_the_lock(protected_sentinel: object) -> None:
    url = sentinel_url(protected_sentinel, f":{MASTER_PASSWORD}@", f"?sentinel_password={SENTINEL_PASSWORD}")
    await take(url)


# -- Cluster ---------------------------------------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("userinfo", "what"), [("", "no password was given"), (f":{WRONG}@", "the password given was refused")]
)
async def test_a_clusters_password(protected_cluster: object, userinfo: str, what: str) -> None:
    url = protected_cluster.url.replace("redis+cluster://", f"redis+cluster://{userinfo}")  # type: ignore[attr-defined]
    error = await refused(url)
    check(error, user="default", at="redis+cluster://", what=what, advice=CLUSTER_ADVICE)
    right = url.replace(f"//{userinfo}", f"//:{CLUSTER_PASSWORD}@")
    await take(right)


# -- a quorum --------------------------------------------------------------------------------------------------------


@pytest.fixture
def protected_three() -> Iterator[list[EmbeddedServer]]:
    servers: list[EmbeddedServer] = []
    try:
        for _ in range(3):
            servers.append(EmbeddedServer(extra_args=("--requirepass", PASSWORD)).start())
        yield servers
    finally:
        for server in servers:
            server.stop()


async def test_a_quorum_refused_by_its_servers(protected_three: list[EmbeddedServer]) -> None:
    # Two of three refuse (a wrong password, none): no majority, and only refused logins cost it.
    urls = [url_of(protected_three[0], f":{WRONG}@"), url_of(protected_three[1]), url_of(protected_three[2])]
    urls[2] = url_of(protected_three[2], f":{PASSWORD}@")
    error = await refused(urls)
    check(error, user="default", at="at 2 of the quorum's 3 servers", what="fewer than a majority", advice=URL_ADVICE)
    for server in protected_three[:2]:
        assert f"{url_of(server)}: authentication failed" in str(error)


async def test_a_quorum_short_of_a_majority_for_other_reasons_too_is_unavailable(
    protected_three: list[EmbeddedServer],
) -> None:
    down = EmbeddedServer().start()
    port = down.port
    down.stop()  # nothing listens there now
    urls = [url_of(protected_three[0]), f"redis://127.0.0.1:{port}/0", url_of(protected_three[2], f":{PASSWORD}@")]
    with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
        await take(urls)
    assert type(excinfo.value) is hybridlock.BackendUnavailableError
    assert f"{url_of(protected_three[0])}: authentication failed" in str(excinfo.value)
