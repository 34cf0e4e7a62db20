"""The locks under test, each behind the same small interface, and how their round trips are counted.

A *contender* is one lock library used the way its documentation shows, with its default settings except the
lease. A :class:`Session` is one process's use of it: its client (and registry, for hybridlock), a factory of lock
objects, and, for the libraries that do not renew leases themselves, a by-hand renewal as a user would write it.

Round trips are counted on the client side, by :class:`CountingConnection`: one count per write to the socket, so
a pipeline counts once and the commands a Lua script runs inside the server do not count at all (``INFO
commandstats`` counts those too, which is why the workloads report both). The connection handshake (``HELLO``,
``CLIENT SETINFO``, ``SELECT``) is not counted: it happens once per pooled connection, not per lock operation.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.metadata
import threading
import warnings
from typing import Any, ClassVar, Protocol

import redis
import redis.asyncio

__all__ = [
    "CONTENDERS",
    "AsyncCountingConnection",
    "AsyncSession",
    "CountingConnection",
    "LockLike",
    "Session",
    "contender_available",
    "make_session",
    "round_trips_sent",
]


class LockLike(Protocol):
    def acquire(self) -> Any: ...

    def release(self) -> Any: ...


class CountingConnection(redis.Connection):
    """A redis-py connection that counts its writes (round trips) in a per-process total, handshake excluded."""

    _total_lock = threading.Lock()
    _total = 0
    _handshaking = 0

    def on_connect(self, *args: Any, **kwargs: Any) -> Any:
        self._handshaking += 1
        try:
            return super().on_connect(*args, **kwargs)
        finally:
            self._handshaking -= 1

    if hasattr(redis.Connection, "on_connect_check_health"):  # redis-py 6+: on_connect delegates to this one

        def on_connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
            self._handshaking += 1
            try:
                return super().on_connect_check_health(*args, **kwargs)
            finally:
                self._handshaking -= 1

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._handshaking:
            with CountingConnection._total_lock:
                CountingConnection._total += 1
        super().send_packed_command(command, check_health)


class AsyncCountingConnection(redis.asyncio.Connection):
    """The asyncio twin of :class:`CountingConnection`: one count per write to the socket, handshake excluded.

    Its total is kept apart from the threads' (one event loop writes it, so it needs no lock);
    :func:`round_trips_sent` adds the two."""

    _total = 0
    _handshaking = 0

    async def on_connect_check_health(self, *args: Any, **kwargs: Any) -> Any:
        # redis.asyncio's on_connect() delegates to this one; the handshake (HELLO, CLIENT SETINFO) goes through it.
        self._handshaking += 1
        try:
            return await super().on_connect_check_health(*args, **kwargs)
        finally:
            self._handshaking -= 1

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._handshaking:
            AsyncCountingConnection._total += 1
        await super().send_packed_command(command, check_health)


def round_trips_sent() -> int:
    """Round trips sent so far by every counting client of this process (threads' and event loops' alike)."""
    return CountingConnection._total + AsyncCountingConnection._total


#: The connection class of the contenders' clients made in this process: ``CountingConnection``, or a subclass of it
#: (``benchmarks/breakdown.py`` sets one that also timestamps each request and reply, in its own processes only).
client_connection_class: type[CountingConnection] = CountingConnection


def counting_client(url: str) -> redis.Redis:
    # Every contender gets the same client settings: redis-py's defaults, plus the counting connection class.
    return redis.Redis.from_url(url, connection_class=client_connection_class)


#: The asyncio clients' pool size: redis.asyncio's default (100 connections).
ASYNC_POOL_SIZE = 100


def async_counting_client(url: str) -> redis.asyncio.Redis:
    # The asyncio contenders' client: redis.asyncio's defaults, plus the counting connection class, and one
    # adjustment: the pool (of the default 100 connections) makes a task wait for a free connection instead of
    # raising MaxConnectionsError. With a thousand tasks polling, redis-py's and pottery's locks overflow the
    # default pool, and pottery, which swallows the error on release, then leaves its lock held for the lease.
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        url, connection_class=AsyncCountingConnection, max_connections=ASYNC_POOL_SIZE, timeout=60
    )
    return redis.asyncio.Redis(connection_pool=pool)


class Session:
    """One process's use of one lock library."""

    #: Short id used in the results, and the display name.
    id: ClassVar[str]
    title: ClassVar[str]
    #: The module that must import for the contender to run, and the distribution whose version is reported.
    module: ClassVar[str | None] = None
    distribution: ClassVar[str | None] = None
    #: Whether locks live in the Redis server (False: the in-process floor).
    uses_server: ClassVar[bool] = True
    #: Whether a second acquire by the holding thread counts up instead of blocking.
    reentrant: ClassVar[bool] = False
    #: Whether holders of one key's ``lock`` may be inside together (a read lock): the contention workloads then
    #: read the counter (one GET) instead of incrementing it, and its count cannot check exclusion.
    shared: ClassVar[bool] = False
    #: Whether the library renews held leases on its own (else ``renew_by_hand`` is how a user would do it).
    renews_itself: ClassVar[bool] = False
    #: Whether its locks are awaited (an :class:`AsyncSession`, used from one event loop's tasks).
    is_async: ClassVar[bool] = False

    def __init__(self, url: str, lease: float) -> None:
        self.url = url
        self.lease = lease

    def lock(self, key: str) -> LockLike:
        """A lock object for ``key``, for use by the calling thread."""
        raise NotImplementedError

    def renewing_lock(self, key: str) -> LockLike:
        """A lock object for ``key`` whose lease is kept alive while held (by the library, or by
        ``renew_by_hand``)."""
        return self.lock(key)

    def read_write(self, key: str) -> tuple[LockLike, LockLike]:
        """The (read, write) locks for ``key``, for one thread. A library without read-write locks serves both
        with its plain lock: every reader then excludes every other reader."""
        lock = self.lock(key)
        return lock, lock

    def server_key(self, key: str) -> str | None:
        """The name of the key the lock for ``key`` keeps in the server while held (None: not in a server)."""
        return None

    def renew_by_hand(self, lock: LockLike) -> None:
        """Reset the held lock's lease, as a user of a library without renewal would; raises when it is no longer
        held (its lease ran out)."""
        raise NotImplementedError

    def lost(self, lock: LockLike) -> bool:
        """Whether the library itself reports the held lock as lost (only hybridlock can tell)."""
        return False

    def close(self) -> None:
        pass


class _ClientSession(Session):
    """A session over one counting client of its own, closed with the session."""

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        self.client = counting_client(url)

    def close(self) -> None:
        self.client.close()


class HybridlockSession(_ClientSession):
    id = "hybridlock"
    title = "hybridlock"
    module = "hybridlock"
    distribution = "hybridlock"
    reentrant = True
    renews_itself = True
    lock_type = "pubsub"
    #: LockRegistry options beyond the defaults (the variants below set them).
    registry_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, url: str, lease: float) -> None:
        import hybridlock

        super().__init__(url, lease)
        self.registry = hybridlock.LockRegistry(
            self.client, registry_key="bench", expire_after=lease, lock_type=self.lock_type, **self.registry_options
        )

    def lock(self, key: str) -> LockLike:
        # One object per key, shared by the threads of the process: that is the registry's design.
        return self.registry.obtain(key)

    def server_key(self, key: str) -> str:
        # Documented layout (hybridlock/_core/names.py): "<registry_key>:{<key>}".
        return f"bench:{{{key}}}"

    def lost(self, lock: Any) -> bool:
        return bool(lock.lost)

    def close(self) -> None:
        self.registry.close()
        super().close()


class HybridlockSpinSession(HybridlockSession):
    id = "hybridlock-spin"
    title = 'hybridlock (lock_type="spin")'
    lock_type = "spin"


class HybridlockNoHandoffSession(HybridlockSession):
    id = "hybridlock-nohandoff"
    title = "hybridlock (hand-off off)"
    # The documented switch: every final release goes to the server, as before local hand-off existed.
    registry_options: ClassVar[dict[str, Any]] = {"handoff_limit": 0}


class HybridlockStrictFifoSession(HybridlockSession):
    id = "hybridlock-fifo"
    title = "hybridlock (strict FIFO hand-off)"
    # No barge window: every local hand-off goes to the longest-waiting thread, even when the releasing thread
    # comes straight back (the default lets it go first for up to 2 ms).
    registry_options: ClassVar[dict[str, Any]] = {"handoff_barge_window": 0}


class HybridlockRetainSession(HybridlockSession):
    id = "hybridlock-retain"
    title = "hybridlock (retain_for=0.05)"
    # Lease retention: the last local release keeps the server lease idle for up to 50 ms (or until another
    # owner asks), so re-taking the lock here costs no round trip.
    registry_options: ClassVar[dict[str, Any]] = {"retain_for": 0.05}


class HybridlockReadWriteSession(HybridlockSession):
    id = "hybridlock-rw"
    title = "hybridlock read-write lock"

    def read_write(self, key: str) -> tuple[LockLike, LockLike]:
        # One object per key, shared by the threads: the process's reader threads share one remote read hold.
        rw = self.registry.obtain_read_write(key)
        return rw.read_lock(), rw.write_lock()


class HybridlockWriteSession(HybridlockSession):
    id = "hybridlock-write"
    title = "hybridlock read-write lock, write half"

    def lock(self, key: str) -> LockLike:
        # The write half of the key's one read-write lock, shared by the threads of the process.
        return self.registry.obtain_read_write(key).write_lock()


class HybridlockReadSession(HybridlockSession):
    id = "hybridlock-read"
    title = "hybridlock read-write lock, read half (shared)"
    # Readers are let in together: with nobody writing, every read acquire is granted at once.
    shared = True

    def lock(self, key: str) -> LockLike:
        # The read half of the key's one read-write lock: the process's reader threads share one read hold.
        return self.registry.obtain_read_write(key).read_lock()


class PerThreadHoldsSession(Session):
    """A model of Redisson's read-write lock, where every reader *thread* holds its own remote read hold (its
    owner id is the client's id plus the thread's): here each thread gets a registry of its own, and a registry is
    one owner in the server, so each reader thread takes and gives back its own read hold, and writers of one
    process meet only in the server."""

    id = "per-thread-holds"
    title = "per-thread read holds (Redisson-style model)"
    module = "hybridlock"
    distribution = "hybridlock"
    reentrant = True
    renews_itself = True

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        self._mutex = threading.Lock()
        self._owners: list[tuple[Any, redis.Redis]] = []

    def _registry(self) -> Any:
        import hybridlock

        client = counting_client(self.url)
        with warnings.catch_warnings():
            # Every contender runs on redis-py's default client settings; the retry policy hybridlock warns about
            # only matters when the server fails, which no workload here does.
            warnings.simplefilter("ignore", hybridlock.ClientSettingsWarning)
            registry = hybridlock.LockRegistry(client, registry_key="bench", expire_after=self.lease)
        with self._mutex:
            self._owners.append((registry, client))
        return registry

    def lock(self, key: str) -> LockLike:
        return self._registry().obtain(key)

    def read_write(self, key: str) -> tuple[LockLike, LockLike]:
        rw = self._registry().obtain_read_write(key)
        return rw.read_lock(), rw.write_lock()

    def close(self) -> None:
        with self._mutex:
            owners, self._owners = self._owners, []

        def close_one(registry: Any, client: redis.Redis) -> None:
            registry.close()
            client.close()

        # A registry's close() waits for its pub/sub listener to wake from its poll (up to a second): close them
        # side by side rather than one after another.
        closers = [threading.Thread(target=close_one, args=owner, daemon=True) for owner in owners]
        for thread in closers:
            thread.start()
        for thread in closers:
            thread.join(timeout=10)


class RedisPySession(_ClientSession):
    id = "redis-py"
    title = "redis-py Lock"
    module = "redis"
    distribution = "redis"

    def lock(self, key: str) -> LockLike:
        # Default settings (sleep=0.1, thread_local=True); a Lock keeps one token per thread, so one object per
        # thread is the same as sharing one.
        return self.client.lock(self.server_key(key), timeout=self.lease)

    def server_key(self, key: str) -> str:
        return f"bench-redispy:{key}"

    def renewing_lock(self, key: str) -> LockLike:
        # Renewed by hand from another thread, which a thread-local token forbids: the documented way out.
        return self.client.lock(self.server_key(key), timeout=self.lease, thread_local=False)

    def renew_by_hand(self, lock: LockLike) -> None:
        lock.reacquire()  # type: ignore[attr-defined]  # resets the TTL to `timeout`: one EVALSHA


class PythonRedisLockSession(_ClientSession):
    id = "python-redis-lock"
    title = "python-redis-lock"
    module = "redis_lock"
    distribution = "python-redis-lock"
    renews_itself = True

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        # Its expire is whole seconds.
        self.expire = max(1, round(lease))
        self._renewal_client: redis.Redis | None = None

    def lock(self, key: str) -> LockLike:
        import redis_lock

        # A Lock's id is per object: a thread needs its own object.
        return redis_lock.Lock(self.client, self._name(key), expire=self.expire)

    def renewing_lock(self, key: str) -> LockLike:
        import redis_lock

        # auto_renewal starts one thread per held lock, renewing every expire * 2/3. Thousands of renewal threads
        # overflow redis-py's default pool (100 connections: MaxConnectionsError, and the thread dies), so they
        # share a blocking pool instead, where a renewal waits for a free connection.
        if self._renewal_client is None:
            pool = redis.BlockingConnectionPool.from_url(
                self.url, connection_class=CountingConnection, max_connections=50, timeout=20
            )
            self._renewal_client = redis.Redis(connection_pool=pool)
        return redis_lock.Lock(self._renewal_client, self._name(key), expire=self.expire, auto_renewal=True)

    @staticmethod
    def _name(key: str) -> str:
        return f"bench-prl:{key}"

    def server_key(self, key: str) -> str:
        return f"lock:{self._name(key)}"

    def close(self) -> None:
        super().close()
        if self._renewal_client is not None:
            self._renewal_client.close()


class PotterySession(_ClientSession):
    id = "pottery"
    title = "pottery Redlock (1 master)"
    module = "pottery"
    distribution = "pottery"

    def lock(self, key: str) -> LockLike:
        # A Redlock's token is per object: a thread needs its own object.
        return self._redlock(key)

    def renewing_lock(self, key: str) -> LockLike:
        # extend() refuses after num_extensions (default 3); a long-held lock needs a higher limit.
        return self._redlock(key, num_extensions=10**6)

    def _redlock(self, key: str, **options: Any) -> LockLike:
        from pottery import Redlock

        return Redlock(key=self._name(key), masters={self.client}, auto_release_time=self.lease, **options)

    @staticmethod
    def _name(key: str) -> str:
        return f"bench-pottery:{key}"

    def server_key(self, key: str) -> str:
        return f"redlock:{self._name(key)}"

    def renew_by_hand(self, lock: LockLike) -> None:
        lock.extend()  # type: ignore[attr-defined]  # one EVALSHA (from a thread pool of its own)


class RLockSession(Session):
    id = "rlock"
    title = "threading.RLock (floor)"
    uses_server = False
    reentrant = True

    _locks: dict[str, threading.RLock]

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        self._locks = {}
        self._mutex = threading.Lock()

    def lock(self, key: str) -> LockLike:
        with self._mutex:
            return self._locks.setdefault(key, threading.RLock())


# ---------------------------------------------------------------------------------------------------------------
# asyncio: the same libraries' asyncio locks, used by the tasks of one event loop


class AsyncLockLike(Protocol):
    async def acquire(self) -> Any: ...

    async def release(self) -> Any: ...


class AsyncSession(Session):
    """One process's use of an asyncio lock library: made, used and closed (``aclose``) inside one event loop.
    ``lock(key)`` gives a lock object for use by the calling *task*."""

    is_async = True

    def lock(self, key: str) -> AsyncLockLike:
        raise NotImplementedError

    async def acquire_within(self, lock: Any, timeout: float) -> bool:
        """``lock.acquire()`` waiting at most ``timeout`` seconds (each library names its timeout its own way)."""
        return bool(await lock.acquire(timeout=timeout))

    async def aclose(self) -> None:
        pass


class _AsyncClientSession(AsyncSession):
    """An asyncio session over one counting client of its own, closed with the session."""

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        self.client = async_counting_client(url)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.client.connection_pool.disconnect()  # a pool passed in is not closed with its client


class AsyncHybridlockSession(_AsyncClientSession):
    id = "hybridlock-async"
    title = "hybridlock (asyncio)"
    module = "hybridlock"
    distribution = "hybridlock"
    reentrant = True
    renews_itself = True

    def __init__(self, url: str, lease: float) -> None:
        import hybridlock

        super().__init__(url, lease)
        self.registry = hybridlock.AsyncLockRegistry(self.client, registry_key="bench", expire_after=lease)

    def lock(self, key: str) -> AsyncLockLike:
        # One object per key, shared by the tasks of the process: ownership and reentrancy are per task.
        return self.registry.obtain(key)

    def server_key(self, key: str) -> str:
        return f"bench:{{{key}}}"

    async def aclose(self) -> None:
        await self.registry.aclose()
        await super().aclose()


class AsyncRedisPySession(_AsyncClientSession):
    id = "redis-py-async"
    title = "redis-py asyncio Lock"
    module = "redis.asyncio.lock"
    distribution = "redis"

    def lock(self, key: str) -> AsyncLockLike:
        # Default settings (sleep=0.1). Its token is thread-local, and the tasks of a loop share one thread: a task
        # needs a Lock object of its own, as with pottery.
        return self.client.lock(self.server_key(key), timeout=self.lease)

    def server_key(self, key: str) -> str:
        return f"bench-redispy:{key}"

    async def acquire_within(self, lock: Any, timeout: float) -> bool:
        return bool(await lock.acquire(blocking_timeout=timeout))


class AsyncPotterySession(_AsyncClientSession):
    id = "pottery-async"
    title = "pottery AIORedlock (1 master)"
    module = "pottery"
    distribution = "pottery"

    def lock(self, key: str) -> AsyncLockLike:
        from pottery import AIORedlock

        # An AIORedlock's token is per object: a task needs its own object.
        return AIORedlock(key=self._name(key), masters={self.client}, auto_release_time=self.lease)

    @staticmethod
    def _name(key: str) -> str:
        return f"bench-pottery:{key}"

    def server_key(self, key: str) -> str:
        return f"redlock:{self._name(key)}"


class _FloorLock:
    """``asyncio.Lock`` behind the awaited interface (its own ``release()`` is a plain call)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    async def acquire(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return await self._lock.acquire()
        try:
            return await asyncio.wait_for(self._lock.acquire(), timeout)  # asyncio.Lock is cancellation-safe
        except TimeoutError:
            return False

    async def release(self) -> None:
        self._lock.release()


class AsyncioLockSession(AsyncSession):
    id = "asyncio-lock"
    title = "asyncio.Lock (floor)"
    uses_server = False

    def __init__(self, url: str, lease: float) -> None:
        super().__init__(url, lease)
        self._locks: dict[str, _FloorLock] = {}

    def lock(self, key: str) -> AsyncLockLike:
        # One object per key, shared by the tasks: the in-process floor.
        return self._locks.setdefault(key, _FloorLock())


CONTENDERS: dict[str, type[Session]] = {
    cls.id: cls
    for cls in (
        HybridlockSession,
        RedisPySession,
        PythonRedisLockSession,
        PotterySession,
        RLockSession,
        HybridlockSpinSession,
        HybridlockNoHandoffSession,
        HybridlockStrictFifoSession,
        HybridlockRetainSession,
        HybridlockReadWriteSession,
        HybridlockWriteSession,
        HybridlockReadSession,
        PerThreadHoldsSession,
        AsyncHybridlockSession,
        AsyncRedisPySession,
        AsyncPotterySession,
        AsyncioLockSession,
    )
}


def contender_available(contender_id: str) -> tuple[bool, str]:
    """(True, version) when the contender's library imports; (False, reason) when it does not."""
    cls = CONTENDERS[contender_id]
    if cls.module is None:
        return True, "stdlib"
    try:
        importlib.import_module(cls.module)
    except Exception as exc:  # any import failure means: skip it, say why
        return False, f"{cls.module} does not import: {exc!r}"
    version = "unknown"
    if cls.distribution is not None:
        try:
            version = importlib.metadata.version(cls.distribution)
        except importlib.metadata.PackageNotFoundError:
            pass
    return True, version


def make_session(contender_id: str, url: str, lease: float) -> Session:
    """A contender's session for this process (an :class:`AsyncSession`, for an asyncio contender, is made inside
    the event loop that uses it)."""
    return CONTENDERS[contender_id](url, lease)
