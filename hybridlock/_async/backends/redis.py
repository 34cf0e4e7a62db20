"""The Redis / Valkey backend: one server, reached through a redis-py or valkey-py client.

Failure modes
-------------
* The server is unreachable or does not answer within the client's ``socket_timeout``: every method raises
  :class:`~hybridlock.BackendUnavailableError` naming the key and the server. Nothing retries forever.
* A reply is lost after the server executed the command (a timeout, a dropped connection) and the client retries:
  a retried ACQUIRE finds our own ``client_id`` and takes the lock over (see ``scripts.ACQUIRE``); a retried
  RELEASE finds the key gone and reports the lock as lost. That false alarm errs on the safe side. A semaphore's
  retried ACQUIRE_PERMIT returns the permit slot its first run took under the acquire's tag, and a retried
  TRANSFER_PERMIT the hand-over its first run made (tests/_async/test_semaphore_retry.py); a retried
  RELEASE_PERMIT reports the permit lost, as RELEASE does.
* The server restarts without persistence: held keys vanish. Holders find out at their next renewal or release
  (``LockLostError``); fencing counters are re-seeded from the server clock and stay monotonic.
* Some of a lock's keys vanish (eviction, an operator's ``DEL``) or are overwritten with another type: the scripts
  read them as missing (see ``scripts``), so other owners go on; a holder whose lease key went is told as above.
* The server refuses a command (``OOM`` under ``maxmemory`` with ``noeviction``, a script error): a plain
  ``HybridLockError`` naming the operation, the key and the server; never a redis-py exception.
* A failover (Sentinel): a ``Sentinel.master_for`` client asks the sentinels where the master is whenever it makes
  a connection. A command on a connection to the old master fails (``READONLY`` from a demoted one, which redis-py
  reports as a dropped connection; refused by a dead one), and redis-py's own retry reconnects to the same
  address, so ``ScriptRunner`` tries once more, on a connection that asks the sentinels. A lease the promoted
  replica never received is gone: its holder is told at its next renewal. With replica confirmation
  (``confirmation``), an acquire or renewal counts only once ``WAIT`` says enough replicas have it; an acquire
  that is not confirmed is given back and raises :class:`~hybridlock.ReplicationNotConfirmedError`, a renewal
  that is not confirmed raises it too and the lease counts as not renewed.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import redis.asyncio
import redis.exceptions
from redis.crc import key_slot

from ..._core.config import FENCE_RETENTION, ReplicaConfirmation, checked_fence_retention, fence_retention_ms
from ..._core.names import LockNames, PermitNames, ReadWriteNames, SemaphoreNames
from ..._core.results import PermitResult
from ..._core.urls import SentinelURL, is_sentinel_url, parse_sentinel_url
from ..._protocol import scripts
from ..._protocol.grants import box_of, read_grant, wait_id_of
from ..._protocol.resp import pack_commands
from ...backends.clients import (
    ClientFamily,
    Login,
    asyncio_client_family,
    is_cluster_client,
    library_family,
    login_of,
    login_refused,
    server_name,
    unanswered_hint,
)
from ...errors import (
    BackendUnavailableError,
    FencingCounterError,
    HybridLockError,
    InvalidArgumentError,
    ReplicationNotConfirmedError,
)
from .._compat import AsyncCondition, monotonic, new_guard, shielded, sleep
from ._compat import connection_ready, packs_like_us
from .base import AcquireManyResult, AcquireResult, AsyncLockBackend, AsyncReleaseWatch
from .pubsub import Subscriber

logger = logging.getLogger("hybridlock.backend")

__all__ = [
    "About",
    "AsyncRedisBackend",
    "ScriptRunner",
    "Unreached",
    "client_address",
    "keys_of",
    "redis_client_from_url",
    "translated_errors",
]


def client_address(client: Any) -> str:
    """The server ``client`` talks to, for messages (see ``clients.server_name``): never with a password."""
    return server_name(client, asyncio_client_family(client))


@contextlib.contextmanager
def translated_errors(
    key: str | None,
    server: str,
    operation: str = "request",
    family: ClientFamily | None = None,
    login: Login | None = None,
) -> Iterator[None]:
    """The one place where the client library's exceptions become hybridlock's, naming the operation, the key and
    the server. ``family``: the client's library (``clients.asyncio_client_family``; default redis-py's); ``login``:
    what the client logs in with (``clients.login_of``), for a refused login's message.

    A plain context manager on both sides: it only catches, so ``with`` around an ``await`` is all it needs, and a
    cancellation (not a client error) passes through untouched.

    Any other error the server answers with (a script error, ``OOM`` under ``maxmemory`` with ``noeviction``, a
    refused command) becomes a plain :class:`HybridLockError`: the raw client exception stays attached as
    ``__cause__`` but never reaches the caller as such."""
    family = family or library_family("redis")
    try:
        yield
    except BaseException as exc:
        error = translated_error(exc, key, server, operation, family, login)
        if error is None:
            raise
        raise error from exc


def translated_error(
    exc: BaseException,
    key: str | None,
    server: str,
    operation: str,
    family: ClientFamily,
    login: Login | None = None,
) -> HybridLockError | None:
    """What ``translated_errors`` raises in place of ``exc`` (chained to it); None for an exception that is not the
    client library's (a cancellation, a bug), which passes through untouched. A refused login (the server's, or a
    Sentinel service's sentinels') is an ``AuthenticationFailedError`` saying how to give the password."""
    refused = login_refused(exc, family, login or Login(), operation=operation, key=key, server=server)
    if refused is not None:
        return refused
    if isinstance(exc, family.master_not_found):
        # The client's own text is the repr of every sentinel client it asked: say what it means instead.
        sentinels = f" ({', '.join(login.sentinels)})" if login is not None and login.sentinels else ""
        return BackendUnavailableError(
            f"no master found during {operation}: the sentinels{sentinels} could not be reached, or none knows a "
            "master for the service",
            key=key,
            server=server,
        )
    if isinstance(exc, family.unavailable):
        return BackendUnavailableError(
            f"lock server unreachable during {operation}: {exc}{unanswered_hint(exc, login)}", key=key, server=server
        )
    if isinstance(exc, family.busy_loading):
        return BackendUnavailableError(f"lock server is loading, {operation} refused: {exc}", key=key, server=server)
    if isinstance(exc, family.read_only):
        return BackendUnavailableError(
            f"lock server is a read-only replica, {operation} refused: {exc}", key=key, server=server
        )
    if isinstance(exc, family.any_error):
        return HybridLockError(f"lock server error during {operation}: {exc}", key=key, server=server)
    return None


class Unreached:
    """In ``ScriptRunner.run_many``'s replies, in place of a call's reply: the call could not be made, its server
    (one node of a cluster) being out of reach, while other calls of the batch went through. ``error`` says why."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"Unreached({self.error!r})"


class ScriptRunner:
    """Runs the Lua scripts of ``scripts`` on one client: EVALSHA first, EVAL when the server answers NOSCRIPT.

    The SHA1 digests are computed locally, so nothing is sent ahead of first use, and a server that lost its
    script cache (restart, ``SCRIPT FLUSH``, failover) costs one EVAL, after which EVALSHA works again.
    """

    def __init__(self, client: Any, family: ClientFamily | None = None) -> None:
        self._client = client
        family = family or asyncio_client_family(client)
        self._no_script = family.no_script
        self._sha: dict[str, str] = {}
        # After a failover, redis-py (5 to 8) retries a command that failed on the old master (READONLY from a
        # demoted one, refused by a dead one) on a connection to the *same* address: only a connection taken anew
        # from the pool asks the sentinels where the master is now. So for a Sentinel-managed client, one more
        # attempt when the connection failed outright; never after a timeout, which would double the wait.
        managed = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None) is not None
        self.failed_over: tuple[type[BaseException], ...] = (family.unavailable[0],) if managed else ()
        # The hot calls (a lone script, a script with a blocking pop) go over connections the runner takes from the
        # client's pool itself (see _exchange), where the client allows it (_own_pool); else through the client.
        self._pool = None if managed else _own_pool(client, family)
        self._response_error = family.response_error
        self._unavailable = family.unavailable
        self._spares: list[Any] = []  # connections of the pool kept between calls, each with no reply unread
        self._spares_pid = os.getpid()
        self._spares_guard = new_guard()  # over _spares and _closed (threads take and keep connections at once)
        self._closed = False  # from then on, every connection goes back to the pool after its call

    def _digest(self, source: str) -> str:
        sha = self._sha.get(source)
        if sha is None:
            sha = self._sha[source] = hashlib.sha1(source.encode()).hexdigest()
        return sha

    async def run_many(self, source: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Run ``source`` once per ``(keys, args)`` in one pipelined round trip (two if the server must first be
        sent the script); returns the replies in order."""
        return await self._pipelined(source, calls, None)

    async def run_confirmed(
        self, source: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], confirmation: ReplicaConfirmation
    ) -> tuple[list[Any], Any]:
        """As ``run_many``, then ``confirmation.command()`` (``WAIT`` or ``WAITAOF``) in the same pipeline: on the
        same connection, right after the scripts, so it waits for exactly their writes. Returns the scripts'
        replies and the command's reply, or the error the server answered it with (the scripts' writes are done
        then, and the caller must undo them)."""
        replies = await self._pipelined(source, calls, confirmation)
        return replies[:-1], replies[-1]

    async def _pipelined(
        self,
        source: str,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        confirmation: ReplicaConfirmation | None,
    ) -> list[Any]:
        try:
            return await self._pipelined_once(source, calls, confirmation)
        except self.failed_over:
            return await self._pipelined_once(source, calls, confirmation)

    async def _pipelined_once(
        self,
        source: str,
        calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
        confirmation: ReplicaConfirmation | None,
    ) -> list[Any]:
        sha = self._digest(source)
        for attempt in range(2):
            pipe = self._client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(sha, len(keys), *keys, *args)
            if confirmation is None:
                try:
                    return list(await pipe.execute())
                except self._no_script:
                    if attempt:
                        raise
                    await self._client.script_load(source)
                    continue
            # On NOSCRIPT nothing was written, so this WAIT returns at once; the retry sends its own.
            pipe.execute_command(*confirmation.command())
            # Errors as replies: a refused WAIT must not hide the lease its script took (the caller gives it back).
            replies = list(await pipe.execute(raise_on_error=False))
            errors = [reply for reply in replies[:-1] if isinstance(reply, Exception)]
            if any(isinstance(error, self._no_script) for error in errors) and not attempt:
                await self._client.script_load(source)
                continue
            if errors:
                raise errors[0]
            return replies
        raise AssertionError("unreachable")  # pragma: no cover

    async def run_then_pop(
        self,
        source: str,
        keys: Sequence[str],
        args: Sequence[Any],
        box: str,
        timeout: float,
        then: tuple[str, Sequence[str], Sequence[Any]] | None = None,
    ) -> tuple[Any, Any, Any] | None:
        """Run ``source`` and, pipelined right after it on the same connection, ``BLPOP box timeout``, then the
        script ``then`` if given (source, keys, args): one round trip, which lasts until the pop returns. Returns the
        three replies, the pop's as the error the server answered it with if it refused it (the script's writes are
        done then), ``then``'s as None if it did not run (NOSCRIPT, or refused) or was not given; None when the
        server's script cache was cold for ``source`` (NOSCRIPT: nothing ran, the pop waited out its timeout; the
        caller runs the script on its own)."""
        try:
            return await self._run_then_pop_once(source, keys, args, box, timeout, then)
        except self.failed_over:  # once more after a failover, as for every script (see __init__)
            return await self._run_then_pop_once(source, keys, args, box, timeout, then)

    async def _run_then_pop_once(
        self,
        source: str,
        keys: Sequence[str],
        args: Sequence[Any],
        box: str,
        timeout: float,
        then: tuple[str, Sequence[str], Sequence[Any]] | None,
    ) -> tuple[Any, Any, Any] | None:
        commands: list[tuple[Any, ...]] = [
            ("EVALSHA", self._digest(source), len(keys), *keys, *args),
            ("BLPOP", box, timeout),
        ]
        if then is not None:
            commands.append(("EVALSHA", self._digest(then[0]), len(then[1]), *then[1], *then[2]))
        replies = await self._in_one_write(commands)
        reply, popped = replies[0], replies[1]
        if isinstance(reply, self._no_script):
            return None
        if isinstance(reply, Exception):
            raise reply
        after = None
        if then is not None:
            after = await self._after_pop(replies[2], then[0])
        return reply, popped, after

    async def pop_then_run(
        self, box: str, timeout: float | None, source: str, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, Any]:
        """``BLPOP box timeout`` (``LPOP box`` for ``timeout`` None) and, pipelined right after it on the same
        connection, the script ``source``: one round trip, which lasts until the pop returns. Returns the pop's reply
        (a refusal raised) and the script's (None if it did not run: NOSCRIPT, or refused)."""
        try:
            return await self._pop_then_run_once(box, timeout, source, keys, args)
        except self.failed_over:  # once more after a failover, as for every script (see __init__)
            return await self._pop_then_run_once(box, timeout, source, keys, args)

    async def _pop_then_run_once(
        self, box: str, timeout: float | None, source: str, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, Any]:
        pop: tuple[Any, ...] = ("LPOP", box) if timeout is None else ("BLPOP", box, timeout)
        popped, reply = await self._in_one_write((pop, ("EVALSHA", self._digest(source), len(keys), *keys, *args)))
        if isinstance(popped, Exception):
            raise popped
        return popped, await self._after_pop(reply, source)

    async def _after_pop(self, reply: Any, source: str) -> Any:
        """The reply of a script pipelined after a pop, None if it did not run; a cold script cache (NOSCRIPT) is
        warmed for the next time (the caller does without it this once)."""
        if isinstance(reply, self._no_script):
            await self._client.script_load(source)
            return None
        return None if isinstance(reply, Exception) else reply

    async def _in_one_write(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write and read every reply, an error in its place."""
        if self._pool is not None:
            return await self._exchange(commands)
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute(raise_on_error=False))

    async def run(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            return await self._run_once(source, keys, args)
        except self.failed_over:
            return await self._run_once(source, keys, args)

    async def _run_once(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        sha = self._digest(source)
        if self._pool is not None:
            (reply,) = await self._exchange((("EVALSHA", sha, len(keys), *keys, *args),))
            if isinstance(reply, self._no_script):
                (reply,) = await self._exchange((("EVAL", source, len(keys), *keys, *args),))
            if isinstance(reply, BaseException):
                raise reply
            return reply
        try:
            return await self._client.evalsha(sha, len(keys), *keys, *args)
        except self._no_script:
            return await self._client.eval(source, len(keys), *keys, *args)

    async def _exchange(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send ``commands`` in one write on a connection of the client's pool and read every reply, a reply that is
        an error as its exception in its place. What the client's own ``execute_command`` (or a pipeline) does,
        minus its per-call work (taking a connection from the pool and giving it back, its metrics), which cost
        about half of a script call's client CPU: the runner keeps up to ``_SPARES`` connections between calls.

        The same retry: the client's connection retries a dropped connection or a timeout as the client would
        (``Retry`` on the connection), after dropping the connection. A connection cut off mid-call (an error, a
        cancellation) is dropped by the client library's read, and goes back to the pool rather than to the
        spares; the pool reconnects it at its next use. A kept connection is looked at as the pool looks at one it
        hands out (``connection_ready``): one the server closed meanwhile (its idle ``timeout``, a restart,
        ``CLIENT KILL``) is reconnected before the call."""
        pool = self._pool
        assert pool is not None
        pid = os.getpid()
        if pid != self._spares_pid:
            # A forked child: the parent's connections are not ours to use, and its guard may be held for ever.
            self._spares_guard = new_guard()
            self._spares = []
            self._spares_pid = pid
        with self._spares_guard:
            connection = self._spares.pop() if self._spares else None
        done = False
        try:
            if connection is None:
                connection = await pool.take()
            else:
                await connection_ready(connection, self._unavailable)
            replies: list[Any] = await connection.retry.call_with_retry(
                partial(self._send_and_read, connection, commands), partial(_drop, connection)
            )
            done = True
            return replies
        finally:
            if connection is not None:
                kept = False
                if done:
                    with self._spares_guard:
                        kept = not self._closed and len(self._spares) < pool.keep and self._spares_pid == pid
                        if kept:
                            self._spares.append(connection)
                if not kept:
                    await pool.give_back(connection)

    async def _send_and_read(self, connection: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
        # (Packed here when the connection would pack them the same way: a tenth of the client CPU of its packer.)
        packed = pack_commands(commands) if packs_like_us(connection) else None  # (one buffer, in a list)
        if packed is not None:
            await connection.send_packed_command([packed])
        elif len(commands) == 1:
            await connection.send_packed_command(connection.pack_command(*commands[0]))
        else:
            await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except self._response_error as exc:  # (the reply was read whole: the connection is still in step)
                replies.append(exc)
        return replies

    async def aclose(self) -> None:
        """Give the connections kept between calls back to the client's pool (a call made later still works)."""
        with self._spares_guard:
            self._closed = True
            spares, self._spares = self._spares, []
        if self._pool is not None and self._spares_pid == os.getpid():
            for connection in spares:
                with contextlib.suppress(Exception):
                    await self._pool.give_back(connection)


# The types of a blocking client's pool lock (see AsyncRedisBackend.fork_guards).
_THREAD_LOCKS = (type(threading.Lock()), type(threading.RLock()))

#: The most connections a script runner keeps between calls (see ScriptRunner._exchange): as many threads (or tasks)
#: as run scripts at once reuse them; the others go back to the pool. Never more than an eighth of a pool's limit
#: (``max_connections``), so that the client's other users (and the registry's subscriber) still find connections
#: in a small pool: none are kept in a pool of fewer than 8.
_SPARES = 4
_SPARES_SHARE = 8


async def _drop(connection: Any, error: BaseException) -> None:
    """What the client does to a connection before it retries a call that failed on it."""
    await connection.disconnect()


class _OwnPool:
    """The calls ``ScriptRunner`` makes on a client's connection pool, spelled for the client library's version."""

    __slots__ = ("_named", "_pool", "keep")

    def __init__(self, pool: Any, named: bool) -> None:
        self._pool = pool
        self._named = named  # its get_connection needs a command name (redis-py before 5.3)
        limit = getattr(pool, "max_connections", None)
        #: How many connections of this pool the runner may keep between calls.
        self.keep = _SPARES if not isinstance(limit, int) else max(0, min(_SPARES, limit // _SPARES_SHARE))

    async def take(self) -> Any:
        if self._named:
            return await self._pool.get_connection("EVALSHA")
        return await self._pool.get_connection()

    async def give_back(self, connection: Any) -> None:
        await self._pool.release(connection)


def _own_pool(client: Any, family: ClientFamily) -> _OwnPool | None:
    """The pool ``ScriptRunner`` may take connections from itself: that of a client of the library's own client
    class (not a subclass from elsewhere, such as fakeredis's, nor a stand-in) that is not bound to one connection
    (``single_connection_client``), whose connections have the calls it makes. None otherwise (the calls then go
    through the client)."""
    if type(client) not in (family.client, family.asyncio_client):
        return None
    # (The asyncio client makes its single connection at its first command: none may be there yet.)
    if getattr(client, "connection", None) is not None or getattr(client, "single_connection_client", False):
        return None
    pool = getattr(client, "connection_pool", None)
    connection_class = getattr(pool, "connection_class", None)
    if pool is None:
        return None
    needed = ("pack_command", "pack_commands", "send_packed_command", "read_response", "disconnect")
    if connection_class is None or not all(hasattr(connection_class, name) for name in needed):
        return None
    if not hasattr(pool, "get_connection") or not hasattr(pool, "release"):
        return None
    try:
        parameter = inspect.signature(pool.get_connection).parameters.get("command_name")
    except (TypeError, ValueError):
        return None
    return _OwnPool(pool, parameter is not None and parameter.default is inspect.Parameter.empty)


# Keys per RENEW script call (see AsyncRedisBackend.renew).
_RENEW_CHUNK = 500
# How long aclose() lets operations in progress finish before it closes a client it owns (each is bounded by the
# client's socket timeout anyway; 5 s with a client made from a URL).
_CLOSE_GRACE = 5.0


class AsyncRedisBackend(AsyncLockBackend):
    """Locks in one Redis or Valkey server. ``client`` is a ``redis.asyncio.Redis`` instance (or valkey-py's
    counterpart, or a compatible one), or the master of a Sentinel-managed service
    (``redis.asyncio.sentinel.Sentinel(...).master_for(service)``). An asyncio backend and its client serve one
    event loop.

    ``confirmation``: every acquire and renewal is followed, on the same connection, by ``WAIT`` for that many
    replicas (``LockRegistry(confirm_replicas=..., confirm_timeout=...)`` passes it). ``fence_retention``: how long
    (seconds) a lock's fencing counter is kept after its last acquisition (default ``FENCE_RETENTION``, a day; the
    registry's ``fence_retention`` explains it)."""

    def __init__(
        self,
        client: Any,
        *,
        owns_client: bool = False,
        confirmation: ReplicaConfirmation | None = None,
        fence_retention: float | None = None,
    ) -> None:
        # Refuses clients of the other side (asyncio vs blocking) with the one to use instead, and cluster clients.
        self._family = asyncio_client_family(client)
        if is_cluster_client(client):
            raise InvalidArgumentError(
                f"{type(client).__module__}.{type(client).__name__} is a cluster client: use AsyncRedisClusterBackend "
                "(a registry given the client picks it by itself)"
            )
        self.client = client
        self.address = server_name(client, self._family)
        self.login = login_of(client)  # for a refused login's message
        self.confirmation = confirmation
        self.fence_retention = checked_fence_retention(fence_retention, None, FENCE_RETENTION)
        self._owns_client = owns_client
        self._scripts = ScriptRunner(client, self._family)
        self._subscriber = Subscriber(client)
        self._blocking_slice = blocking_slice(client)
        self._cluster_mode: bool | None = None  # learnt from the server at the first renewal
        # Operations under way, so that aclose() does not cut a connection from under one (see aclose).
        self._in_flight = 0
        self._idle = AsyncCondition()
        self._closed = False

    @property
    def fence_retention(self) -> float:
        """How long (seconds) a lock's fencing counter is kept after its last acquisition (its ``PX``)."""
        return self._fence_retention_ms / 1000

    @fence_retention.setter
    def fence_retention(self, retention: float) -> None:
        self._fence_retention_ms = fence_retention_ms(retention)

    def fork_guards(self) -> list[Any]:
        """The thread lock of the client's connection pool, which the registry holds across a fork: a thread of ours
        (the subscriber connecting, a renewal) inside the pool at fork time would leave it held for ever in the
        child, whose first command would hang in the client library's reset of the pool. None for an asyncio
        client, whose pool an asyncio lock guards."""
        lock = getattr(getattr(self.client, "connection_pool", None), "_lock", None)
        return [lock] if isinstance(lock, _THREAD_LOCKS) else []

    def after_fork_in_child(self) -> None:
        self._subscriber.after_fork_in_child()
        self._in_flight = 0
        self._idle = AsyncCondition()

    @contextlib.asynccontextmanager
    async def _translated(self, about: About, operation: str) -> AsyncIterator[None]:
        """Around every operation on the locks ``about``: counts it as under way, and translates its errors
        (``translated_errors``)."""
        with self._idle:
            self._in_flight += 1
        try:
            # translated_errors' work inlined: this runs twice per lock cycle, and a nested generator-based context
            # manager (and the keys' description, needed only in a message) cost every cycle client CPU.
            with self._errors_at(about, operation):
                yield
        except BaseException as exc:
            error = translated_error(exc, keys_of(about), self.address, operation, self._family, self.login)
            if error is None:
                raise
            raise error from exc
        finally:
            with self._idle:
                self._in_flight -= 1
                idle = not self._in_flight
                # Only aclose() ever waits for idleness, and only after setting _closed (it reads _in_flight
                # under this same guard next): notifying before then would wake nobody, on every operation.
                if idle and self._closed:
                    self._idle.notify_all()
            if idle and self._closed and self._owns_client:
                # A call after aclose() (a holder releasing) reconnected the client: close that connection again,
                # or it stays open until the garbage collector finds it.
                with contextlib.suppress(Exception):
                    await self._disconnect_after_close()
                # (and a client made from a sentinel URL asked the sentinels where the master is)
                for sentinel in getattr(self._sentinel_manager(), "sentinels", ()):
                    with contextlib.suppress(Exception):
                        await sentinel.connection_pool.disconnect()

    async def _disconnect_after_close(self) -> None:
        await self.client.connection_pool.disconnect()

    def _errors_at(self, about: About, operation: str) -> contextlib.AbstractContextManager[None]:
        """What else translates errors about ``about`` (a cluster names the node); nothing on one server."""
        return contextlib.nullcontext()

    async def _announcement(self) -> str:
        """How the scripts announce on a lock's channel (see ``scripts``): PUBLISH on one server."""
        return "publish"

    def _sentinel_manager(self) -> Any:
        """The ``Sentinel`` that finds the master for a Sentinel-managed client; None for any other client."""
        return getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)

    async def _run_write(
        self, about: About, operation: str, source: str, keys: Sequence[str], args: Sequence[Any]
    ) -> tuple[Any, Any]:
        """Run a script that may take or extend a lease; with replica confirmation, ``WAIT`` (or ``WAITAOF``) right
        after it. Returns its reply and the confirmation's reply (None without confirmation; an exception when the
        server refused it)."""
        async with self._translated(about, operation):
            if self.confirmation is None:
                return await self._scripts.run(source, keys, args), None
            (reply,), confirmed = await self._scripts.run_confirmed(source, [(keys, args)], self.confirmation)
            return reply, confirmed

    def _confirmed(self, confirmation_reply: Any) -> bool:
        if self.confirmation is None:
            return True
        if isinstance(confirmation_reply, Exception):
            return False
        return self.confirmation.outcome(confirmation_reply)[0]

    async def _given_back(
        self, key: str | None, operation: str, confirmation_reply: Any, give_back: Callable[[], Any]
    ) -> ReplicationNotConfirmedError:
        """An acquire the replicas did not confirm: give the lease back (shielded, best effort: a lease that could
        not be given back lapses with its lease) and return the error to raise."""
        try:
            await shielded(give_back)
            back = "the lease was given back"
        except HybridLockError:
            back = "giving the lease back failed too; it ends with its lease"
        return self._not_confirmed(key, operation, confirmation_reply, back)

    def _not_confirmed(
        self, key: str | None, operation: str, confirmation_reply: Any, outcome: str
    ) -> ReplicationNotConfirmedError:
        assert self.confirmation is not None
        command = self.confirmation.command()[0]
        if isinstance(confirmation_reply, Exception):
            acknowledged, what = 0, f"the server refused {command}: {confirmation_reply}"
        else:
            _, acknowledged, what = self.confirmation.outcome(confirmation_reply)
        return ReplicationNotConfirmedError(
            f"{operation} not confirmed: {what}, so a failover could lose it; {outcome}",
            key=key,
            server=self.address,
            acknowledged=acknowledged,
            required=self.confirmation.replicas,
        )

    grants = True

    async def _acquire_args(
        self, names: LockNames, owner: str, lease_ms: int | None, queue: bool, place: str | None, pushed: str = ""
    ) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        keys = (names.lock, names.fence, names.queue, names.queue_until)
        args = (
            owner,
            lease_ms or 0,
            self._fence_retention_ms,
            names.channel,
            await self._announcement(),
            int(queue),
            place or "",
            pushed,
        )
        return keys, args

    def _acquire_result(self, names: LockNames, reply: Any) -> AcquireResult:
        if isinstance(reply, int):
            return AcquireResult(True, reply, None, False)  # the token alone: nobody else queues (the common case)
        if reply[0] == scripts.OUT_OF_RANGE:
            raise self._out_of_range(names, reply[1], "acquire")
        if reply[0]:
            return AcquireResult(True, int(reply[1]), None, bool(reply[2]))
        pttl, arrival = reply[1], reply[2] if len(reply) > 2 else 0
        return AcquireResult(False, None, None if pttl < 0 else pttl / 1000.0, queued_at=arrival or None)

    async def try_acquire(
        self, names: LockNames, owner: str, lease_ms: int | None, queue: bool, place: str | None = None
    ) -> AcquireResult:
        keys, args = await self._acquire_args(names, owner, lease_ms, queue, place)
        reply, acknowledged = await self._run_write(names, "acquire", scripts.ACQUIRE, keys, args)
        result = self._acquire_result(names, reply)
        if not result.acquired:
            return result
        if not self._confirmed(acknowledged):
            raise await self._given_back(
                names.key, "acquire", acknowledged, lambda: self.release(names, owner, notify=True)
            )
        return result

    async def can_acquire_together(self, names: Sequence[LockNames]) -> bool:
        async with self._translated(None, "check of cluster slots"):
            return len(await self._by_slot(names)) == 1

    async def try_acquire_many(
        self, names: Sequence[LockNames], owner: str, lease_ms: int | None, queue: bool
    ) -> AcquireManyResult:
        keys = [name for n in names for name in (n.lock, n.fence, n.queue, n.queue_until)]
        args = [
            owner,
            lease_ms or 0,
            self._fence_retention_ms,
            int(queue),
            await self._announcement(),
            *(n.channel for n in names),
        ]
        reply, acknowledged = await self._run_write(names, "acquire of several locks", scripts.ACQUIRE_MANY, keys, args)
        if reply[0] == scripts.OUT_OF_RANGE:
            raise self._out_of_range(names[reply[2] - 1], reply[1], "acquire of several locks")
        if reply[0] and not self._confirmed(acknowledged):
            announcement = await self._announcement()

            async def give_back() -> None:
                async with self._translated(names, "release of several locks"):
                    await self._scripts.run_many(
                        scripts.RELEASE,
                        [
                            (
                                (n.lock, n.queue, n.queue_until, n.fence),
                                (owner, n.channel, announcement, self._fence_retention_ms),
                            )
                            for n in names
                        ],
                    )

            raise await self._given_back(keys_of(names), "acquire of several locks", acknowledged, give_back)
        if reply[0]:
            parts = tuple(AcquireResult(True, int(reply[i]), None, bool(reply[i + 1])) for i in range(1, len(reply), 2))
            return AcquireManyResult(True, parts)
        pttl, index = reply[1], reply[2] - 1
        return AcquireManyResult(False, (), index, None if pttl < 0 else pttl / 1000.0)

    async def release(self, names: LockNames, owner: str, notify: bool) -> bool:
        return await self._release(names, owner, notify)

    async def release_late(self, names: LockNames, owner: str, token: int) -> bool:
        return await self._release(names, owner, True, str(token))

    async def _release(self, names: LockNames, owner: str, notify: bool, token: str = "") -> bool:
        """RELEASE of ``names.tenancy`` (or ``owner``'s bare id), only while the fencing counter holds ``token`` if
        one is given (see ``release_late``)."""
        async with self._translated(names, "release"):
            released = await self._scripts.run(
                scripts.RELEASE,
                (names.lock, names.queue, names.queue_until, names.fence),
                (
                    owner,
                    names.channel,
                    await self._announcement() if notify else "",
                    self._fence_retention_ms,
                    names.tenancy,
                    token,
                ),
            )
        return bool(released)

    keeps_keys = True

    async def keep_for(self, names: LockNames, owner: str, marker: str, keep_ms: int) -> bool:
        async with self._translated(names, "keep of a run's key"):
            kept = await self._scripts.run(scripts.KEEP_FOR, (names.lock,), (owner, marker, keep_ms, names.tenancy))
        return bool(kept)

    async def cancel_wait(self, names: LockNames, owner: str, place: str | None = None) -> None:
        async with self._translated(names, "cancel of a wait"):
            await self._scripts.run(
                scripts.CANCEL_WAIT,
                (names.lock, names.queue, names.queue_until, names.fence),
                (owner, names.channel, await self._announcement(), self._fence_retention_ms, place or ""),
            )

    async def keep_waiting(
        self, names: Sequence[LockNames], owner: str, places: Sequence[str | None] | None = None
    ) -> list[bool]:
        if not names:
            return []
        named = list(zip(names, places or [None] * len(names), strict=True))
        async with self._translated(names, "keep of waiting places"):
            # One script per slot, all pipelined in one round trip, as for renew (a registry waits for few locks).
            groups: dict[int, list[tuple[LockNames, str | None]]] = {}
            for n, place in named:
                groups.setdefault(await self._slot_of(n.queue), []).append((n, place))
            announcement = await self._announcement()
            calls = [
                (
                    [
                        key
                        for n, _ in group
                        # (a read-write lock's waiting writers: one set, and no lock to serve from here)
                        for key in (
                            n.queue,
                            n.queue_until,
                            *((n.queue, n.queue) if n.queue == n.queue_until else (n.lock, n.fence)),
                        )
                    ],
                    (
                        owner,
                        self._fence_retention_ms,
                        announcement,
                        *(arg for n, place in group for arg in (place or "", n.channel)),
                    ),
                )
                for group in groups.values()
            ]
            if len(calls) == 1:
                replies = [await self._scripts.run(scripts.KEEP_WAITING, *calls[0])]
            else:
                replies = await self._scripts.run_many(scripts.KEEP_WAITING, calls)
        kept: dict[tuple[str, str | None], bool] = {}
        for group, flags in zip(groups.values(), replies, strict=True):
            if isinstance(flags, Unreached):
                # A cluster node out of reach: not known to be lost, and the next attempt queues again anyway.
                kept.update(((n.queue, place), True) for n, place in group)
            else:
                kept.update(zip(((n.queue, place) for n, place in group), (bool(flag) for flag in flags), strict=True))
        return [kept[n.queue, place] for n, place in named]

    @property
    def pipelines_waits(self) -> bool:
        """Whether ``acquire_and_await`` saves a round trip here (one server, no replica confirmation)."""
        return self.confirmation is None and self.grants

    @property
    def grant_wait_limit(self) -> float:
        return self._blocking_slice

    @property
    def grant_wait_lateness(self) -> float:
        return _SERVER_TICK  # (a blocking pop times out at the server's next tick; a shorter wait does not block)

    async def acquire_and_await(
        self, names: LockNames, owner: str, lease_ms: int | None, place: str, timeout: float
    ) -> tuple[AcquireResult, AcquireResult | None]:
        if not self.pipelines_waits or timeout < _SERVER_TICK:
            return await super().acquire_and_await(names, owner, lease_ms, place, timeout)
        wait_id = wait_id_of(place)
        keys, args = await self._acquire_args(names, owner, lease_ms, True, place, wait_id)
        extend = self._extension(names, owner, lease_ms)
        sent_at = monotonic()
        async with self._translated(names, "acquire"):
            replies = await self._scripts.run_then_pop(
                scripts.ACQUIRE, keys, args, box_of(names.lock, owner), timeout, extend
            )
        if replies is None:  # a cold script cache: the script did not run
            return await self.try_acquire(names, owner, lease_ms, True, place), None
        reply, popped, extended = replies
        result = self._acquire_result(names, reply)
        if result.acquired:
            return result, None  # (the pop took our own grant, pushed by the script; or it was refused: see below)
        if isinstance(popped, Exception):
            return result, await self._pop_refused(names, owner, popped)
        if popped is None:
            return result, None
        return result, self._extended(self._grant_read(popped[1], wait_id, result.queued_at), owner, extended, sent_at)

    @staticmethod
    def _extension(
        names: LockNames, owner: str, lease_ms: int | None
    ) -> tuple[str, Sequence[str], Sequence[Any]] | None:
        """The script pipelined after a pop of our grant box: the extension of a grant's provisional lease to our
        own (``scripts.EXTEND_GRANT``); None without a lease."""
        return None if not lease_ms else (scripts.EXTEND_GRANT, (names.lock,), (owner, lease_ms))

    @staticmethod
    def _extended(result: AcquireResult, owner: str, extended: Any, sent_at: float) -> AcquireResult:
        """``result`` (a grant read) marked extended to our own lease by the request sent at ``sent_at`` if the
        extension pipelined after the pop extended this very grant (the key held "<owner>|<token>" of it)."""
        if not result.acquired or extended is None:
            return result
        if _text(extended) != f"{owner}|{result.fencing_token}":
            return result  # (not this grant: the caller extends it on its own, or finds it lost)
        return result._replace(extended_at=sent_at)

    def _grant_read(self, message: Any, wait_id: str, arrival: int | None) -> AcquireResult:
        """What a grant popped from our box says (``grants.read_grant``): acquired, with its token and whether others
        queue; or refused, so that the caller attempts again now: a grant to an earlier wait or place of ours, never
        read (the lock may be ours by it), an entry that is no grant, or our turn with no token to give (the counter
        is out of range, which the attempt reports)."""
        grant = read_grant(_text(message), wait_id, arrival)
        if grant is None or grant.token is None:
            return AcquireResult(False)
        return AcquireResult(True, grant.token, None, grant.contended)

    async def _pop_refused(self, names: LockNames, owner: str, error: BaseException) -> AcquireResult | None:
        """The server refused a blocking pop of our box with ``error``: what the wait does instead. A connection
        that broke under it (a restart, CLIENT KILL, a network fault), or a pop the server ended (``UNBLOCKED``: a
        master turned replica in a failover): attempt again, which takes over a grant the pop may have taken and not
        delivered (or reports the server unreachable). A box of another type (not ours): delete it, and attempt
        again. BLPOP refused (an ACL of an earlier release, a server or proxy without it): wait as a poller does
        from now on (grants to our places still happen, and an attempt takes one over). Anything else is raised,
        translated."""
        translated = translated_error(error, names.key, self.address, "wait for a grant", self._family, self.login)
        if isinstance(translated, BackendUnavailableError):
            return AcquireResult(False)
        text = str(error)
        if text.startswith("UNBLOCKED"):
            # The server stopped serving the pop (a master turned replica in a failover, or CLIENT UNBLOCK ERROR):
            # attempt again, at whichever server serves the lock now.
            return AcquireResult(False)
        if "WRONGTYPE" in text:
            async with self._translated(names, "wait for a grant"):
                await self.client.delete(box_of(names.lock, owner))
            return AcquireResult(False)
        if "NOPERM" in text or "no permissions" in text or "unknown command" in text:
            if self.grants:
                self.grants = False
                logger.warning(
                    "hybridlock: the lock server %s refused BLPOP (%s): waiters poll instead of reading their grants; "
                    "allow +blpop for the lock user (see docs/acl.md)",
                    self.address,
                    error,
                )
            return AcquireResult(False)
        raise translated or error

    async def await_grant(
        self, names: LockNames, owner: str, place: str, timeout: float, lease_ms: int, arrival: int | None = None
    ) -> AcquireResult | None:
        box = box_of(names.lock, owner)
        wait_id = wait_id_of(place)
        # (Without replica confirmation, the extension of a grant's provisional lease to ours is pipelined after the
        # pop, in the same round trip; with it, a confirmed renewal follows below.)
        extend = self._extension(names, owner, lease_ms) if self.pipelines_waits else None
        extended: Any = None
        sent_at = 0.0
        try:
            async with self._translated(names, "wait for a grant"):
                if timeout < _SERVER_TICK:
                    # The server times a blocking pop out at its next tick (up to 100 ms late on an idle server): a
                    # wait this short sleeps here, then looks once without blocking.
                    await sleep(timeout)
                    sent_at = monotonic()
                    if extend is not None:
                        popped, extended = await self._scripts.pop_then_run(box, None, *extend)
                    else:
                        popped = await self.client.lpop(box)
                    reply = None if popped is None else (box, popped)
                else:
                    # BLPOP takes seconds (a fraction since Redis 6); 0 would wait for ever. Kept well inside the
                    # client's socket timeout (grant_wait_limit), which its read of the reply must not run into.
                    sent_at = monotonic()
                    if extend is not None:
                        reply, extended = await self._scripts.pop_then_run(box, timeout, *extend)
                    else:
                        reply = await self.client.blpop([box], timeout=timeout)
        except HybridLockError as exc:
            return await self._pop_refused(names, owner, exc.__cause__ or exc)
        if reply is None:
            return None
        result = self._extended(self._grant_read(reply[1], wait_id, arrival), owner, extended, sent_at)
        if result.acquired and self.confirmation is not None:
            # Confirmed like an acquire: a write of ours after the grant (extending its lease to ours) reaching the
            # replicas means the grant before it did too (one replication stream).
            extended_at = monotonic()
            tenancy = f"{owner}|{result.fencing_token}"  # (what a grant writes: see scripts.grant)
            reply, acknowledged = await self._run_write(
                names, "acquire", scripts.RENEW, (names.lock,), (owner, lease_ms, 1, 0, tenancy)
            )
            if not reply[0]:
                return AcquireResult(False)  # the grant's lease ended before we read it: attempt again
            if not self._confirmed(acknowledged):
                granted = replace(names, tenancy=tenancy)
                raise await self._given_back(
                    names.key, "acquire", acknowledged, lambda: self.release(granted, owner, notify=True)
                )
            return result._replace(extended_at=extended_at)
        return result

    async def renew(self, names: Sequence[LockNames], owner: str, lease_ms: int) -> list[bool | None]:
        if not names:
            return []
        acknowledged: Any = None
        async with self._translated(names, "renewal"):
            # One script per slot and per _RENEW_CHUNK keys, all in one pipelined round trip: a server runs one
            # script at a time, so chunks keep each stall of other clients short even for 10,000 held locks.
            chunks = [
                group[i : i + _RENEW_CHUNK]
                for group in await self._by_slot(names)
                for i in range(0, len(group), _RENEW_CHUNK)
            ]
            tenancies = {n.lock: n.tenancy for n in names if n.tenancy}
            configs = {n.lock: n.config for n in names if isinstance(n, PermitNames)}
            calls = [self._renewal(chunk, tenancies, configs, owner, lease_ms) for chunk in chunks]
            if self.confirmation is not None:
                replies, acknowledged = await self._scripts.run_confirmed(scripts.RENEW, calls, self.confirmation)
            elif len(calls) == 1:
                replies = [await self._scripts.run(scripts.RENEW, *calls[0])]
            else:
                replies = await self._scripts.run_many(scripts.RENEW, calls)
        renewed: dict[str, bool | None] = {}
        for chunk, flags in zip(chunks, replies, strict=True):
            if isinstance(flags, Unreached):
                renewed.update(dict.fromkeys(chunk))  # a cluster node out of reach: neither renewed nor known lost
            else:
                renewed.update(zip(chunk, (bool(flag) for flag in flags), strict=True))
        if not self._confirmed(acknowledged):
            # Not renewed as far as a failover is concerned: the replicas still have the old expiry. A lease the
            # master itself reported gone is lost all the same: the error carries that answer to the caller.
            error = self._not_confirmed(keys_of(names), "renewal", acknowledged, "the leases count as not renewed")
            error.renewed = [renewed[n.lock] is not False for n in names]
            raise error
        return [renewed[n.lock] for n in names]

    def _renewal(
        self, chunk: list[str], tenancies: dict[str, str], configs: dict[str, str], owner: str, lease_ms: int
    ) -> tuple[Sequence[str], Sequence[Any]]:
        """RENEW's keys and arguments for the leases ``chunk`` (lock names of one slot; ``tenancies``: what the
        keys among all leases hold while ours, where that is not the owner id alone; ``configs``: permit slot -> its
        semaphore's config). A lease is renewed under its tenancy (a lock granted by a release, a permit), not the
        owner id alone; a semaphore's config is kept alive by its permits' renewals (``fence_retention`` from the
        last), so that the limit set for it is not forgotten while they are held. (A config shares its permits' hash
        tag: the call stays in one slot.)"""
        kept = list(dict.fromkeys(configs[lock] for lock in chunk if lock in configs)) if configs else []
        values = [tenancies.get(lock, "") for lock in chunk] if tenancies else []
        if not kept and not any(values):
            return chunk, (owner, lease_ms)
        return [*chunk, *kept], (owner, lease_ms, len(chunk), self._fence_retention_ms, *values)

    async def _by_slot(self, names: Sequence[LockNames]) -> list[list[str]]:
        """Lock names grouped so that one script call never crosses a cluster slot: one group on a plain server,
        one per slot on a server in cluster mode."""
        groups: dict[int, list[str]] = {}
        for n in names:
            groups.setdefault(await self._slot_of(n.lock), []).append(n.lock)
        return list(groups.values())

    async def _slot_of(self, name: str) -> int:
        """``name``'s cluster slot on a server in cluster mode; 0 for every name on a plain server."""
        if self._cluster_mode is None:
            try:
                info = await self.client.info("cluster")
            except self._family.response_error:
                info = {}  # a server or stand-in without INFO (fakeredis, some proxies) is taken as a single node
            self._cluster_mode = bool(int(info.get("cluster_enabled", 0)))
        return key_slot(name.encode()) if self._cluster_mode else 0

    async def try_acquire_read(self, names: ReadWriteNames, owner: str, lease_ms: int | None) -> AcquireResult:
        lease_ms = self._rw_lease(names, lease_ms)
        reply, acknowledged = await self._run_write(
            names,
            "read acquire",
            scripts.ACQUIRE_READ,
            (names.writer, names.readers, names.writers_waiting),
            (owner, lease_ms),
        )
        if reply[0] and not self._confirmed(acknowledged):
            raise await self._given_back(
                names.key, "read acquire", acknowledged, lambda: self.release_read(names, owner)
            )
        return _rw_result(reply)

    async def try_acquire_write(
        self, names: ReadWriteNames, owner: str, lease_ms: int | None, wait: bool
    ) -> AcquireResult:
        lease_ms = self._rw_lease(names, lease_ms)
        reply, acknowledged = await self._run_write(
            names,
            "write acquire",
            scripts.ACQUIRE_WRITE,
            (names.writer, names.readers, names.writers_waiting, names.fence),
            (owner, lease_ms, self._fence_retention_ms, names.channel, await self._announcement(), int(wait)),
        )
        if reply[0] == scripts.OUT_OF_RANGE:
            raise self._out_of_range(names, reply[1], "write acquire")
        if reply[0] and not self._confirmed(acknowledged):
            raise await self._given_back(
                names.key, "write acquire", acknowledged, lambda: self.release_write(names, owner)
            )
        return _rw_result(reply)

    def _rw_lease(self, names: ReadWriteNames, lease_ms: int | None) -> int:
        # Read holds live in a sorted set scored by their expiry, so a hold without one has no representation here.
        if lease_ms is None:
            raise InvalidArgumentError(
                "read-write locks in a server need a lease (expire_after)", key=names.key, server=self.address
            )
        return lease_ms

    async def release_write(self, names: ReadWriteNames, owner: str) -> bool:
        async with self._translated(names, "write release"):
            released = await self._scripts.run(
                scripts.RELEASE_WRITE, (names.writer,), (owner, names.channel, await self._announcement())
            )
        return bool(released)

    async def release_read(self, names: ReadWriteNames, owner: str) -> bool:
        async with self._translated(names, "read release"):
            released = await self._scripts.run(
                scripts.RELEASE_READ,
                (names.writer, names.readers, names.writers_waiting),
                (owner, names.channel, await self._announcement()),
            )
        return bool(released)

    async def cancel_write_wait(self, names: ReadWriteNames, owner: str) -> None:
        async with self._translated(names, "cancel of a write wait"):
            await self._scripts.run(
                scripts.CANCEL_WRITE_WAIT, (names.writers_waiting,), (owner, names.channel, await self._announcement())
            )

    semaphores = True

    async def try_acquire_permit(
        self,
        names: SemaphoreNames,
        owner: str,
        lease_ms: int | None,
        permits: int,
        skip: Sequence[int],
        place: str | None = None,
        tag: str = "",
    ) -> PermitResult:
        about = names.waiting  # (errors name the semaphore's key; on a cluster, its slot)
        reply, acknowledged = await self._run_write(
            about,
            "semaphore acquire",
            scripts.ACQUIRE_PERMIT,
            (names.config, names.fence, names.queue, names.queue_until),
            (owner, lease_ms or 0, self._fence_retention_ms, permits, names.slot_prefix, place or "", tag, *skip),
        )
        if reply[0] == scripts.OUT_OF_RANGE:
            raise scripts.fencing_counter_error(
                reply[1], key=names.key, counter=names.fence, server=self.address, operation="semaphore acquire"
            )
        if not reply[0]:
            return PermitResult(False, holder_ttl=None if reply[1] < 0 else reply[1] / 1000.0)
        slot = int(reply[1])
        if not self._confirmed(acknowledged):
            raise await self._given_back(
                names.key, "semaphore acquire", acknowledged, lambda: self.release_permit(names, slot, tag)
            )
        return PermitResult(True, slot, int(reply[2]))

    async def give_back_attempt(self, names: SemaphoreNames, owner: str, tag: str, lease_ms: int | None) -> bool:
        async with self._translated(names.waiting, "give-back of an interrupted semaphore acquire"):
            given = await self._scripts.run(
                scripts.GIVE_BACK_ATTEMPT,
                (names.config,),
                (owner, names.slot_prefix, tag, lease_ms or 30_000, names.channel, await self._announcement()),
            )
        return bool(given)

    async def leave_permit_queue(self, names: SemaphoreNames, place: str) -> None:
        async with self._translated(names.waiting, "semaphore wait's end"):
            await self._scripts.run(
                scripts.LEAVE_PERMIT_QUEUE,
                (names.queue, names.queue_until),
                (place, names.channel, await self._announcement()),
            )

    async def release_permit(self, names: SemaphoreNames, slot: int, tenancy: str) -> bool:
        async with self._translated(names.waiting, "semaphore release"):
            released = await self._scripts.run(
                scripts.RELEASE_PERMIT,
                (names.slot(slot), names.queue, names.queue_until, names.config),
                (tenancy, names.channel, await self._announcement(), names.slot_prefix),
            )
        return bool(released)

    async def transfer_permit(
        self,
        names: SemaphoreNames,
        slot: int,
        tenancy: str,
        lease_ms: int | None,
        permits: int,
        skip: Sequence[int],
        waiters: Sequence[tuple[str, str]],
    ) -> tuple[bool, PermitResult, int]:
        reply, acknowledged = await self._run_write(
            names.waiting,
            "semaphore release",
            scripts.TRANSFER_PERMIT,
            (names.slot(slot), names.config, names.fence, names.queue, names.queue_until),
            (
                tenancy,
                names.channel,
                await self._announcement(),
                names.slot_prefix,
                lease_ms or 0,
                self._fence_retention_ms,
                permits,
                len(waiters),
                *(part for waiter in waiters for part in waiter),
                *skip,
            ),
        )
        if not reply[0]:
            return False, PermitResult(False), -1
        if reply[1] < 0:
            return True, PermitResult(False), -1
        taken, to = int(reply[1]), int(reply[3])
        if not self._confirmed(acknowledged):
            # (The release is done. The waiter's own attempt meets the same confirmation, and raises if it fails.)
            await self._given_back(
                names.key, "semaphore acquire", acknowledged, lambda: self.release_permit(names, taken, waiters[to][1])
            )
            return True, PermitResult(False), -1
        return True, PermitResult(True, taken, int(reply[2])), to

    async def set_permits(self, names: SemaphoreNames, permits: int) -> int:
        async with self._translated(names.waiting, "change of a semaphore's permits"):
            old = await self._scripts.run(
                scripts.SET_PERMITS,
                (names.config,),
                (permits, self._fence_retention_ms, names.channel, await self._announcement()),
            )
        return int(old)

    async def is_locked(self, names: LockNames) -> bool:
        async with self._translated(names, "lock query"):
            try:
                return bool(await self.client.exists(names.lock))
            except self._scripts.failed_over:  # once more after a failover, as for scripts (see ScriptRunner)
                return bool(await self.client.exists(names.lock))

    async def has_waiters(self, names: LockNames) -> bool:
        async with self._translated(names, "queue query"):
            try:
                return bool(await self.client.zcard(names.queue))
            except self._scripts.failed_over:  # once more after a failover, as for scripts (see ScriptRunner)
                return bool(await self.client.zcard(names.queue))

    async def is_read_locked(self, names: ReadWriteNames) -> bool:
        async with self._translated(names, "read lock query"):
            return bool(await self._scripts.run(scripts.READ_HELD, (names.readers,), ()))

    async def describe_owner(self, key: str, fields: Mapping[str, str], gone: Sequence[str], ttl_ms: int) -> None:
        async with self._translated(None, "description of the owner"):
            pipe = self.client.pipeline(transaction=False)
            if fields:
                pipe.hset(key, mapping=dict(fields))
            if gone:
                pipe.hdel(key, *gone)
            pipe.pexpire(key, ttl_ms)
            await pipe.execute()

    async def ping(self, probe: str) -> None:
        # One script, as a lock's first acquire sends one: the same connection, login, EVALSHA (EVAL on NOSCRIPT),
        # the same translation of what goes wrong (named "ping", with no key).
        async with self._translated(None, "ping"):
            await self._scripts.run(scripts.PING, (probe,), ())

    async def raise_fence(self, names: LockNames, token: int) -> None:
        """Raise the fencing counter of ``names`` to at least ``token`` (a quorum acquire's write-back).
        ``FencingCounterError`` when the counter holds a number outside the exact range (left alone)."""
        async with self._translated(names, "fencing write-back"):
            reply = await self._scripts.run(scripts.RAISE_FENCE, (names.fence,), (token, self._fence_retention_ms))
        if reply != 1:
            raise self._out_of_range(names, reply[1], "fencing write-back")

    def _out_of_range(self, names: LockNames | ReadWriteNames, stored: Any, operation: str) -> FencingCounterError:
        """A script refused the fencing counter of ``names`` (``{OUT_OF_RANGE, stored}``): see ``scripts``."""
        return scripts.fencing_counter_error(
            stored, key=names.key, counter=names.fence, server=self.address, operation=operation
        )

    async def watch(self, names: LockNames, owner: str) -> AsyncReleaseWatch | None:
        return await self._subscriber.watch(names.channel, owner)

    def on_wanted(self, callback: Callable[[], None]) -> bool:
        self._subscriber.wanted_listeners.append(callback)
        return True

    async def aclose(self) -> None:
        with self._idle:  # (see _translated: an operation ending from now on notifies)
            self._closed = True
        await self._subscriber.aclose()
        await self._scripts.aclose()
        if self._owns_client:
            # A registry's close wakes its waiters, which then leave their queues on this client: closing it under
            # such a call would fail it with a raw socket error, not a hybridlock one. So let the calls under way
            # finish first. A call that starts later still works: the client reconnects (a holder may release
            # after the close, and its compare-and-delete must still reach the server).
            with self._idle:
                await self._idle.wait_for(lambda: not self._in_flight, _CLOSE_GRACE)
            with contextlib.suppress(Exception):
                await self.client.aclose()
            # A client made from a sentinel URL also holds connections to the sentinels. (Sentinel.aclose is new in
            # redis-py 8.1: before, close each sentinel's connections, or they stay open until garbage collected.)
            manager = self._sentinel_manager()
            if manager is not None and hasattr(manager, "aclose"):
                with contextlib.suppress(Exception):
                    await manager.aclose()
            else:
                for sentinel in getattr(manager, "sentinels", ()):
                    with contextlib.suppress(Exception):
                        await sentinel.connection_pool.disconnect()


# What an operation is about: one lock, one read-write lock, several locks, or none in particular.
About = LockNames | ReadWriteNames | Sequence[LockNames] | None


def keys_of(about: About) -> str | None:
    """The keys an operation was about, for its error message (the first few of many)."""
    if about is None or isinstance(about, (LockNames, ReadWriteNames)):
        return None if about is None else about.key
    shown = ", ".join(n.key for n in about[:5])
    return shown if len(about) <= 5 else f"{shown}, ... ({len(about)} keys)"


#: The longest BLPOP of a wait for a grant: a closed registry is noticed within it (on threads), and the client's
#: socket timeout must leave room for it (see ``blocking_slice``).
GRANT_WAIT_SLICE = 0.5
#: How late a server may time a blocking command out: it does so at its next event-loop tick, every 100 ms at the
#: default ``hz`` when nothing else wakes it.
_SERVER_TICK = 0.1


def blocking_slice(client: Any) -> float:
    """The longest blocking command (BLPOP) worth sending on ``client``: ``GRANT_WAIT_SLICE``, or half the client's
    socket timeout if that is shorter, so that the wait never runs into it (redis-py would report a timeout, and drop
    the connection)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None) or {}
    timeout = kwargs.get("socket_timeout")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        return GRANT_WAIT_SLICE
    return max(0.001, min(GRANT_WAIT_SLICE, timeout / 2))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _rw_result(reply: Sequence[Any]) -> AcquireResult:
    if reply[0]:
        return AcquireResult(True, int(reply[1]) if len(reply) > 1 else None)
    wait_ms = reply[1]
    return AcquireResult(False, None, None if wait_ms < 0 else wait_ms / 1000.0)


def redis_client_from_url(url: str, *, decode_responses: bool = False) -> redis.asyncio.Redis:
    """A client for ``url`` with hybridlock's defaults: 5 s timeouts, and one immediate retry on a broken
    connection only (it reconnects a pooled connection the server dropped). A *timeout* is not retried, so an
    unresponsive server costs one socket timeout, not several. Making it does no I/O.

    ``redis+sentinel://`` and ``rediss+sentinel://`` URLs (see ``hybridlock._core.urls``) give the master of a
    Sentinel-managed service, with the same defaults for the sentinels; ``InvalidArgumentError`` (a
    ``ValueError``) for a malformed one. ``decode_responses`` as redis-py's (the command line reads text)."""
    # Spelled so that the imports stay sorted on both sides (redis.asyncio.retry becomes redis.retry).
    from redis.asyncio import retry as retries
    from redis.backoff import NoBackoff

    retry = retries.Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
    if is_sentinel_url(url):
        return _sentinel_master(parse_sentinel_url(url), retry, decode_responses)
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=5.0, socket_connect_timeout=5.0, retry=retry, decode_responses=decode_responses
    )


def _sentinel_master(url: SentinelURL, retry: Any, decode_responses: bool = False) -> redis.asyncio.Redis:
    """The master of ``url.service``, found through ``url.sentinels``: a client that asks the sentinels where the
    master is whenever it (re)connects, so it follows a failover. Owned by the backend, which closes the sentinel
    connections too."""
    from redis.asyncio.sentinel import Sentinel

    timeouts: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
    tls: dict[str, Any] = {"ssl": True} if url.tls else {}
    sentinel_login = {"username": url.sentinel_username, "password": url.sentinel_password}
    manager = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(url.sentinels),
        sentinel_kwargs={**timeouts, **tls, "retry": retry, **{k: v for k, v in sentinel_login.items() if v}},
        **timeouts,
        retry=retry,
    )
    login = {"username": url.username, "password": url.password}
    master_kwargs: dict[str, Any] = {
        "db": url.db,
        "decode_responses": decode_responses,
        **tls,
        **{k: v for k, v in login.items() if v},
    }
    client: redis.asyncio.Redis = manager.master_for(url.service, **master_kwargs)  # type: ignore[no-untyped-call,unused-ignore]
    return client
