"""AsyncLockRegistry: one lock object per key, one owner identity per registry, and the registry's background work.

A registry is one *owner* in the lock server: its ``client_id`` (a random UUID) is the value of every server key
it holds. Two registries exclude each other through the server even inside one process, as two processes do.

What the registry keeps:

* an identity map of key -> lock, held weakly, so a lock the program still references is the only one for its
  key, and a lock nobody references (and nobody holds) is reclaimed at once, as a ``threading.RLock`` would be.
  There is no cache of recently used locks: ``obtain`` in a loop that drops its lock each time builds a new
  (cheap) object each time;
* strong references to held locks, by server key (a held lock never disappears, and is never duplicated);
* background threads, none per lock or per wait: the lease renewer (with its deadline watch, a thread of its own
  once the first renewal round has run) and (in the Redis backend) the pub/sub listener, plus the retention
  reaper when ``retain_for`` is used, and the wait keeper (``wait_keeper.py``) while some thread of the registry
  waits in the server. Each starts when there is something to do (a lease to renew, a channel to listen on, a
  lease retained, a place in a server queue to keep), stops a fraction of a second after there is nothing left,
  and starts again on demand; ``close()`` stops them all. A program that holds no lock and waits for none has no
  hybridlock thread running.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from .._core.config import (
    QUORUM_FENCE_RETENTION,
    LockType,
    RegistryConfig,
    ReplicaConfirmation,
    fence_retention_ms,
    long_lease_note,
)
from .._core.names import LockNames, lock_names, read_write_names, semaphore_names, validate_key
from .._core.runonce import RunOnceBounds, RunOnceResult
from ..errors import InvalidArgumentError, LockNotOwnedError, LocksHeldAtCloseWarning, LongLeaseWarning
from ._compat import at_exit, monotonic, new_guard
from .backends.base import AsyncLockBackend
from .backends.memory import AsyncMemoryBackend
from .context import LockContext
from .decorator import execute_locked, synchronized
from .election import AsyncLeaderElection
from .leases import HeldLease, LostCallback
from .lock import AsyncHybridLock
from .multi import AsyncMultiLock
from .observing import ObserverHook
from .runonce import run_once, runs_once
from .rwlock import AsyncReadWriteLock
from .semaphore import AsyncSemaphore, validate_permits

__all__ = ["AsyncLocalLockRegistry", "AsyncLockRegistry", "AsyncQuorumLockRegistry"]

logger = logging.getLogger("hybridlock.registry")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


class AsyncLockRegistry:
    """Hands out one [AsyncHybridLock][hybridlock.AsyncHybridLock] per key, all sharing this registry's server
    connection and identity.

    ``connection`` is a client (``redis.asyncio.Redis``, a cluster client ``redis.asyncio.RedisCluster``, or either
    one's valkey-py twin; a Sentinel-managed master from ``Sentinel(...).master_for(service)`` too), a ``redis://``
    / ``rediss://`` / ``unix://`` URL, a cluster URL (``redis+cluster://host:port[,host:port...]``;
    ``rediss+cluster://`` over TLS), a ``redis+sentinel://host:port,.../service[/db]`` URL, or a backend
    ([AsyncLockBackend][hybridlock.backends.AsyncLockBackend]). A client of the other API's kind is refused with the
    class to use instead (``InvalidArgumentError``). ``registry_key`` prefixes every server key (it must not
    contain ``{`` or ``}``). ``expire_after`` is the lease in seconds (millisecond precision), at least
    ``MIN_LEASE`` (0.1 s: it is renewed every third of itself, so a shorter one is lost whenever a renewal is a
    little late); 1000 s or more draws a ``LongLeaseWarning`` (it looks like milliseconds, as Spring takes them).

    An asyncio registry belongs to the event loop it is first used in (its connections and background tasks live
    there): from another loop, every call raises ``EventLoopMismatchError``. Make one per event loop, inside the
    coroutine that ``asyncio.run()`` runs. (A thread registry serves every thread of the process.)

    Every duration (``expire_after``, ``max_hold``, the hand-off windows, ``retain_for``, and every ``timeout``)
    is at most ``threading.TIMEOUT_MAX`` seconds (about 292 years on Linux and macOS, 49 days on Windows), the
    longest wait Python's threads accept; anything larger raises ``InvalidArgumentError`` (a timeout of -1 or
    ``math.inf`` waits forever). Keys and ``registry_key`` must be encodable as UTF-8.

    ``lock_type="pubsub"`` (default) wakes waiters on release notifications; ``"spin"`` polls with backoff.
    ``auto_renew`` keeps the leases of held locks alive from one background worker; ``max_hold`` (seconds) stops
    renewing a lock held longer than that (counted from the server's grant, not from the start of the wait for
    it), so a stuck holder cannot keep it forever.

    Local hand-off: when a thread (a task, on the asyncio side) releases a lock that others of this registry are
    queued for, the server lease is kept and the lock passed to the next one (in arrival order) with no round
    trip, at most ``handoff_limit`` times and for ``handoff_window`` seconds per server tenancy. Once another owner
    is known to be waiting, the streak goes on for at most ``handoff_contended_window`` seconds from the server's
    grant (at most ``handoff_window``; 0: it ends at the next release), then the lock goes to that owner: a short
    batch of local passes amortises the costly hand-off between processes (lock cohorting), and its bound bounds
    the other owner's wait. ``handoff_limit`` or ``handoff_window`` at 0 switches hand-off off (one server release
    per final release).

    ``handoff_barge_window`` (seconds) trades a little of that arrival order for throughput: during a hand-off
    streak, a thread that releases and at once takes the lock again may go ahead of the longest-waiting thread, for
    at most this long; then that thread is handed the lock. Threads that are waiting are always served in arrival
    order. 0 makes every local hand-off strictly first come, first served.

    ``confirm_replicas`` (default 0: off) makes every acquire and renewal count only once that many replicas
    acknowledged it (``WAIT``, sent on the same connection right after the script), waiting at most
    ``confirm_timeout`` seconds (default: 0.5 s or ``expire_after / 6``, whichever is shorter; it must be shorter than
    ``expire_after / 3``). An acquire not confirmed is given back and raises ``ReplicationNotConfirmedError``; a
    renewal not confirmed does not extend the lease, which is reported lost if none is confirmed before it ends.
    For a master with replicas, typically Sentinel-managed (``redis+sentinel://`` URLs, ``Sentinel.master_for``).
    ``confirm_fsync=True`` asks for more: ``WAITAOF``, the write fsynced to the append-only file of the master and of
    ``confirm_replicas`` replicas (servers with ``appendonly yes`` and ``WAITAOF``: Redis 7.2+, Valkey).

    ``retain_for`` (seconds, default 0: off) keeps the server lease after the last local release, idle, so a thread
    here that takes the lock again within that time pays no round trip. Another owner's failed attempt ends the
    retention at once (with ``lock_type="pubsub"``; with ``"spin"`` only the deadline does), and the hand-off
    budget bounds it. While a lease is retained, another owner's non-blocking attempt fails.

    ``fence_retention`` (seconds; default ``FENCE_RETENTION``, a day, or the lease if longer) is how long a lock's
    fencing counter (``<lock key>:fence``, 72-88 bytes by ``MEMORY USAGE``) stays in the server after the key's
    last acquisition: every distinct key leaves one for that long. At least ``expire_after``. The counter keeps
    fencing tokens increasing across a server clock that steps back by less than the retention; past it, tokens
    rest on the server clock alone (see ``docs/tuning.md``). A registry given a backend object refuses it (give it
    to the backend).

    ``observer`` (a ``hybridlock.metrics.LockObserver``, or any object with some of its methods) is told of every
    acquire and release of a hold, every renewal round and every lease found lost, for metrics
    (``hybridlock.metrics.prometheus.PrometheusObserver``). Without one, the instrumentation costs one attribute
    check per acquire and release. An observer that raises is logged once and ignored.
    """

    def __init__(
        self,
        connection: Any,
        registry_key: str = "hybridlock",
        expire_after: float = 30.0,
        *,
        lock_type: LockType = "pubsub",
        auto_renew: bool = True,
        max_hold: float | None = None,
        handoff_limit: int = 64,
        handoff_window: float = 0.05,
        handoff_contended_window: float = 0.02,
        handoff_barge_window: float = 0.002,
        retain_for: float = 0.0,
        confirm_replicas: int = 0,
        confirm_timeout: float | None = None,
        confirm_fsync: bool = False,
        fence_retention: float | None = None,
        observer: Any = None,
    ) -> None:
        self._setup(
            RegistryConfig.checked(
                registry_key,
                expire_after,
                lock_type=lock_type,
                auto_renew=auto_renew,
                max_hold=max_hold,
                handoff_limit=handoff_limit,
                handoff_window=handoff_window,
                handoff_contended_window=handoff_contended_window,
                handoff_barge_window=handoff_barge_window,
                retain_for=retain_for,
                confirm_replicas=confirm_replicas,
                confirm_timeout=confirm_timeout,
                confirm_fsync=confirm_fsync,
                fence_retention=fence_retention,
            ),
            connection,
            observer,
        )
        _warn_if_long(self._config)

    def _setup(self, config: RegistryConfig, connection: Any, observer: Any) -> None:
        self._config = config
        hook = ObserverHook.checked(observer, config.registry_key)
        self._context = LockContext(config, _make_backend(connection, config), self, observer=hook)
        self._mutex = new_guard()
        self._locks: weakref.WeakValueDictionary[str, AsyncHybridLock] = weakref.WeakValueDictionary()
        self._rw_locks: weakref.WeakValueDictionary[str, AsyncReadWriteLock] = weakref.WeakValueDictionary()
        self._semaphores: weakref.WeakValueDictionary[str, AsyncSemaphore] = weakref.WeakValueDictionary()
        if config.retain_for and config.lock_type == "pubsub":
            # Through the registry, so the child of a fork pokes its own context's reaper.
            self._context.backend.on_wanted(lambda: self._context.retention.poke())
        _live_registries.add(self)

    # -- public surface ------------------------------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """This registry's owner identity in this process: the value of every server key it holds."""
        return self._context.client_id

    @property
    def registry_key(self) -> str:
        return self._config.registry_key

    @property
    def expire_after(self) -> float:
        """The lease in seconds (``inf`` for a registry whose locks never expire)."""
        return self._config.expire_after

    @property
    def fence_retention(self) -> float:
        """How long (seconds) a lock's fencing counter is kept in the server after the key's last acquisition (the
        ``fence_retention`` given, or the topology's default)."""
        backend_retention = getattr(self._context.backend, "fence_retention", None)
        return self._config.fence_retention if backend_retention is None else backend_retention

    @property
    def server(self) -> str:
        """The lock server's address, as error messages give it."""
        return self._context.server

    @property
    def backend(self) -> AsyncLockBackend:
        return self._context.backend

    @property
    def observer(self) -> Any:
        """The ``observer=`` given at construction (None without one)."""
        hook = self._context.observer
        return None if hook is None else hook.observer

    @property
    def closed(self) -> bool:
        return self._context.closed.is_set()

    async def ping(self) -> float:
        """Check, before the first lock, that the lock server would serve this registry; returns the round trip in
        seconds.

        One script run (``EVALSHA``, ``EVAL`` when the server lacks it), as a lock's first acquire sends: it reads
        the server clock and writes then deletes ``<registry_key>:ping`` (a key no lock uses), so it needs what
        every lock needs: the server reachable within the client's timeouts, the login accepted, the commands and
        keys the registry's ACL must allow, a server recent enough for the scripts (Redis 6.2+, Valkey), a master.
        What fails raises what the first acquire would have (``BackendUnavailableError``,
        ``AuthenticationFailedError``, a ``HybridLockError`` for a refused command), for the operation "ping",
        naming the server and no key. Over a quorum every server is asked at once: it raises unless a majority
        answers (as an acquire would), and logs the minority that did not; the time is until that majority
        answered. On a cluster, the master of the probe key's slot answers. A local registry
        (``AsyncLocalLockRegistry``) has nothing to reach. Raises ``RegistryClosedError`` once closed. It does not
        check replica confirmation or pub/sub."""
        self._check_open()
        self._context.check_loop()
        start = monotonic()
        await self._context.backend.ping(f"{self.registry_key}:ping")
        return monotonic() - start

    def obtain(self, key: str) -> AsyncHybridLock:
        """The lock for ``key``: the same object for as long as the program references it or anyone holds it."""
        key = validate_key(key)
        self._check_open(key)
        with self._mutex:
            lock = self._locks.get(key)
            if lock is None:
                lock = AsyncHybridLock(self._context, self._names(key))
                self._locks[key] = lock
            return lock

    def obtain_read_write(self, key: str) -> AsyncReadWriteLock:
        """The read-write lock for ``key`` (a separate lock from ``obtain(key)``): the same object while
        referenced. ``rw.read_lock()`` admits many readers, ``rw.write_lock()`` one writer."""
        key = validate_key(key)
        self._check_open(key)
        with self._mutex:
            rw = self._rw_locks.get(key)
            if rw is None:
                rw = self._rw_locks[key] = AsyncReadWriteLock(self._context, read_write_names(self.registry_key, key))
            return rw

    def obtain_semaphore(self, key: str, permits: int) -> AsyncSemaphore:
        """The semaphore for ``key`` (apart from ``obtain(key)``): at most ``permits`` holders at once across every
        owner, each permit a lease of its own (see ``AsyncSemaphore``); the same object while referenced. Asking
        again with another ``permits`` raises ``InvalidArgumentError`` (change it with ``set_permits``)."""
        key = validate_key(key)
        permits = validate_permits(permits)
        self._check_open(key)
        if not self._context.backend.semaphores:
            raise InvalidArgumentError("semaphores are not available on this backend", key=key, server=self.server)
        with self._mutex:
            semaphore = self._semaphores.get(key)
            if semaphore is None:
                semaphore = AsyncSemaphore(self._context, semaphore_names(self.registry_key, key), permits)
                self._semaphores[key] = semaphore
            elif semaphore.permits != permits:
                raise InvalidArgumentError(
                    f"the semaphore was obtained with permits={semaphore.permits}, not {permits}: change the limit "
                    "with set_permits()",
                    key=key,
                    server=self.server,
                )
            return semaphore

    def obtain_many(self, keys: Iterable[str]) -> AsyncMultiLock:
        """A lock over several keys, taken all or nothing in one global order (no deadlock between callers
        asking for overlapping sets in different orders); its timeout covers the whole attempt."""
        if isinstance(keys, str):
            raise InvalidArgumentError("obtain_many needs a collection of keys, not one str")
        locks = {lock.key: lock for lock in map(self.obtain, keys)}
        if not locks:
            self._check_open()
            raise InvalidArgumentError("obtain_many needs at least one key")
        return AsyncMultiLock(self._context, list(locks.values()))

    def _names(self, key: str) -> LockNames:
        return lock_names(self.registry_key, key)

    def expire_unused_older_than(self, age: float) -> int:
        """Kept for compatibility; does nothing and returns 0.

        The registry holds no lock it does not need: one nobody references and nobody holds is reclaimed by the
        garbage collector at once, and one still referenced or held must stay the lock for its key (a second
        object for a key would let a second thread in). So there is nothing left to forget. ``age`` is still
        checked (a non-negative number of seconds)."""
        if isinstance(age, bool) or not isinstance(age, (int, float)) or age < 0:
            raise InvalidArgumentError(f"age must be a non-negative number of seconds, not {age!r}")
        return 0

    async def renew_lock(self, key: str, expire_after: float | None = None) -> None:
        """Renew the lease of ``key``'s lock, held by some thread of this registry, by hand (see
        ``AsyncHybridLock.renew``)."""
        key = validate_key(key)
        leases = self._context.leases
        lock = leases.get(self._names(key))
        if lock is None:
            raise LockNotOwnedError("cannot renew a lock this registry does not hold", key=key, server=self.server)
        await leases.renew_by_hand(lock, expire_after)

    def synchronized(self, template: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function holding the lock whose key ``template`` builds from its arguments.

        ``@registry.synchronized("order:{order_id}", timeout=5)``; placeholders may use attribute access
        (``{self.account}``, ``{invoice.id}``) and are checked against the signature when decorating. Raises
        ``LockTimeoutError`` (a ``TimeoutError``) naming the key when ``timeout`` seconds pass first."""
        return synchronized(self, template, timeout=timeout)

    async def execute_locked(
        self, key: str, function: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Run ``function(*args, **kwargs)`` holding ``key``'s lock and return its result (Spring's
        ``executeLocked``); ``LockTimeoutError`` when ``timeout`` seconds pass first."""
        return await execute_locked(self, key, function, *args, timeout=timeout, **kwargs)

    def leader_election(
        self, name: str, on_elected: Callable[[int | None], Any] | None = None, on_revoked: Any = None
    ) -> AsyncLeaderElection:
        """A candidate for leadership of ``name`` (see [AsyncLeaderElection][hybridlock.AsyncLeaderElection]):
        ``async with registry.leader_election("scheduler", on_elected=..., on_revoked=...) as election:``."""
        return AsyncLeaderElection(self, name, on_elected, on_revoked)

    async def run_once(
        self,
        key: str,
        function: Callable[..., Any],
        *args: Any,
        at_least_for: float,
        at_most_for: float | None = None,
        **kwargs: Any,
    ) -> RunOnceResult[Any]:
        """Run ``function(*args, **kwargs)`` unless another owner has ``key`` (running it, or ran it less than
        ``at_least_for`` seconds ago): one replica per occurrence of a scheduled job, ShedLock's two bounds. Never
        waits: ``RunOnceResult(ran=False)`` when skipped, ``RunOnceResult(ran=True, result=...)`` when run. The
        key stays taken ``at_least_for`` seconds after the start however soon the function ends, and the hold ends
        ``at_most_for`` seconds after it (None: renewed while it runs) even while the function still runs, which
        then raises ``LockLostError`` as it ends. See docs/run-once.md."""
        return await run_once(self, key, function, RunOnceBounds.checked(at_least_for, at_most_for), *args, **kwargs)

    def runs_once(self, template: str, *, at_least_for: float, at_most_for: float | None = None) -> Callable[[F], F]:
        """Decorator: each call runs as ``run_once`` with the key ``template`` filled from the call's arguments (as
        ``synchronized`` fills it) and returns a ``RunOnceResult``."""
        return runs_once(self, template, RunOnceBounds.checked(at_least_for, at_most_for))

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lock)`` for every lock of this registry found lost while held."""
        if not callable(callback):
            raise InvalidArgumentError("on_lost needs a callable")
        self._context.leases.lost_callbacks.append(callback)

    def held_locks(self) -> list[HeldLease]:
        """The locks some thread of this registry holds right now (not leases kept idle by ``retain_for``)."""
        return self._context.leases.held()

    def __len__(self) -> int:
        """How many lock objects the registry knows (held, or still referenced)."""
        return len(self._locks)

    def __iter__(self) -> Iterator[AsyncHybridLock]:
        return iter(list(self._locks.values()))

    async def aclose(self) -> None:
        """Stop the background threads and release the registry's connection (if it made it from a URL).

        Afterwards ``obtain`` and ``acquire`` raise ``RegistryClosedError``. Locks still held stay held until
        their holders release them (the compare-and-delete is still sent, so no key is left behind) or their
        lease ends, since nothing renews them any more: closing them would let the next owner in beside a holder
        still at work. So closing with locks held warns (``LocksHeldAtCloseWarning``, naming them). Leases kept
        idle by ``retain_for`` are given back. Idempotent."""
        await self._close(stacklevel=3)

    async def _close(self, stacklevel: int) -> None:
        context = self._context
        if context.closed.is_set():
            return
        context.check_loop()
        # (A hold whose holders have all ended was warned about as such: see owners.py.)
        held = [lease for lease in context.leases.held() if not lease._holders_gone()]
        context.closed.set()
        await context.retention.stop()  # give retained leases back while the connection is still open
        await context.wait_keeper.stop()
        if context.renewer is not None:
            await context.renewer.stop()
        await context.describer.forget()
        await context.backend.aclose()
        _live_registries.discard(self)
        if held:  # (once closed: a warning turned into an error must not leave the registry half-open)
            warnings.warn(LocksHeldAtCloseWarning(_held_at_close(self, held)), stacklevel=stacklevel)

    async def __aenter__(self) -> AsyncLockRegistry:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._close(stacklevel=3)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._context.leases)} held"
        return (
            f"<hybridlock.{type(self).__name__} {self.registry_key!r} on {self.server} client_id={self.client_id} "
            f"{state}>"
        )

    def _check_open(self, key: str | None = None) -> None:
        # (Not the event loop: obtain() may run outside any loop; the lock's first call checks it.)
        self._context.check_not_closed(key)

    # -- fork ------------------------------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        # The child holds none of its parent's leases and runs none of its threads: it continues with a new
        # context (a new owner identity), which every lock is handed as it forgets its parent's state.
        self._context = context = self._context.forked()
        self._mutex = new_guard()
        for lock in list(self._locks.values()):
            lock._reset_after_fork(context)
        for rw in list(self._rw_locks.values()):
            rw._reset_after_fork(context)
        for semaphore in list(self._semaphores.values()):
            semaphore._reset_after_fork(context)
        after_fork = getattr(context.backend, "after_fork_in_child", None)
        if after_fork is not None:
            after_fork()


class AsyncLocalLockRegistry(AsyncLockRegistry):
    """The same API in one process, with no server: locks never expire (like ``threading.RLock``), and
    ``renew()`` leaves them so.

    Spring's ``DefaultLockRegistry``. Useful where a program runs as one process, and as a test double."""

    def __init__(self, registry_key: str = "hybridlock", *, observer: Any = None) -> None:
        self._setup(RegistryConfig.checked(registry_key, 30.0, never_expires=True), AsyncMemoryBackend(), observer)


class AsyncQuorumLockRegistry(AsyncLockRegistry):
    """Locks held in a majority of N independent Redis/Valkey servers (Redlock), with fencing tokens that increase
    across the quorum: ``AsyncQuorumLockRegistry(["redis://a:6379", "redis://b:6379", "redis://c:6379"])``.

    ``servers``: URLs, ``redis.asyncio.Redis`` clients or ``AsyncRedisBackend``s, one per independent server (not
    replicas of each other); 3 or 5 of them. Every other option is ``AsyncLockRegistry``'s. Each lock is the local
    lock, then the lease on a majority of the servers, taken in parallel: it survives any minority of the servers
    failing (down, cut off, restarted empty under the delayed-restart rule), and ``lock.fencing_token`` increases
    from one tenancy to the next whichever majority grants it. Read-write locks are refused (``obtain_read_write``
    raises ``InvalidArgumentError``); ``obtain_many`` takes its keys one by one in a global order. Owners waiting
    in different processes poll with jittered backoff (no server queue, no release notifications): see
    ``hybridlock._async.backends.quorum`` and, for the argument, ``hybridlock._core.quorum``.

    ``fence_retention`` defaults to ``QUORUM_FENCE_RETENTION`` (a week) here: the quorum's tokens rest on its
    counters (see ``hybridlock._core.quorum``, "Lost counters").

    A restarted server that lost its data must not rejoin before the longest lease has passed since it went down
    (or run the servers with ``appendfsync always``): see docs/guarantees.md."""

    def __init__(
        self,
        servers: Any,
        registry_key: str = "hybridlock",
        expire_after: float = 30.0,
        *,
        auto_renew: bool = True,
        max_hold: float | None = None,
        handoff_limit: int = 64,
        handoff_window: float = 0.05,
        handoff_barge_window: float = 0.002,
        retain_for: float = 0.0,
        handoff_contended_window: float = 0.02,
        fence_retention: float | None = None,
        observer: Any = None,
    ) -> None:
        config = RegistryConfig.checked(
            registry_key,
            expire_after,
            lock_type="spin",  # no release notifications across a quorum: waiters poll
            auto_renew=auto_renew,
            max_hold=max_hold,
            handoff_limit=handoff_limit,
            handoff_window=handoff_window,
            handoff_barge_window=handoff_barge_window,
            retain_for=retain_for,
            handoff_contended_window=handoff_contended_window,
            fence_retention=fence_retention,
            default_fence_retention=QUORUM_FENCE_RETENTION,
        )
        from .backends.quorum import AsyncQuorumBackend  # imports the client library: only when used

        if isinstance(servers, AsyncQuorumBackend):
            _refuse_retention_for_a_backend(config, servers)
            backend = servers
        else:
            backend = AsyncQuorumBackend(servers, fence_retention=config.fence_retention)
        self._setup(config, backend, observer)
        _warn_if_long(config)

    def obtain_read_write(self, key: str) -> AsyncReadWriteLock:
        """Refused: read-write locks are not available over a quorum (``InvalidArgumentError``)."""
        from .backends.quorum import READ_WRITE_REFUSED

        key = validate_key(key)
        self._check_open(key)
        raise InvalidArgumentError(READ_WRITE_REFUSED, key=key, server=self.server)

    def obtain_semaphore(self, key: str, permits: int) -> AsyncSemaphore:
        """Refused: semaphores are not available over a quorum (``InvalidArgumentError``)."""
        key = validate_key(key)
        self._check_open(key)
        raise InvalidArgumentError(
            "semaphores are not available over a quorum (a permit would need a majority's count of holders); use a "
            "AsyncLockRegistry on one server, Sentinel or Cluster",
            key=key,
            server=self.server,
        )


def _warn_if_long(config: RegistryConfig) -> None:
    """``LongLeaseWarning`` for an ``expire_after`` that looks like milliseconds, pointing at the registry's
    caller (this runs in the registry's ``__init__``)."""
    note = None if config.lease is None else long_lease_note("expire_after", config.lease)
    if note is not None:
        silence = "warnings.filterwarnings('ignore', category=hybridlock.LongLeaseWarning)"
        warnings.warn(LongLeaseWarning(f"{note}. If it is meant to be that long: {silence}"), stacklevel=3)


def _held_at_close(registry: AsyncLockRegistry, held: list[HeldLease]) -> str:
    """What ``LocksHeldAtCloseWarning`` says: which locks, and what becomes of them."""
    kinds = [getattr(lease, "kind", "lock") for lease in held]  # a read-write lock's halves are named as such
    shown = [lease.key if kind == "lock" else f"{lease.key} ({kind})" for lease, kind in zip(held, kinds, strict=True)]
    keys = ", ".join(repr(key) for key in shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")
    lease = registry.expire_after
    fate = (
        "they stay held until their holders release them"
        if lease == float("inf")
        else "nothing renews their leases any more: each stays held until its holder releases it (which still "
        f"works) or its lease ends (within {lease:g} s), and then another owner may take it while its holder still "
        "runs"
    )
    return (
        f"{type(registry).__name__} {registry.registry_key!r} closed while this process still holds {len(held)} "
        f"lock(s): {keys}. Closing does not release them; {fate}. Release locks before closing their registry "
        "(async with lock: inside async with registry:)"
    )


def _refuse_confirmation_on_a_cluster(confirmation: ReplicaConfirmation | None, server: str) -> None:
    # Replica confirmation is built for one master (WAIT on the connection that wrote); a cluster backend does not
    # send it, so accepting the option would promise a safety it does not give.
    if confirmation is not None:
        raise InvalidArgumentError("confirm_replicas is not supported on a cluster yet", server=server)


def _refuse_retention_for_a_backend(config: RegistryConfig, backend: AsyncLockBackend) -> None:
    # A backend object keeps its counters as it was built to (a registry may share it with others).
    own = getattr(backend, "fence_retention", None)
    # (Compared as the server takes them, in whole milliseconds: the backend keeps no finer.)
    if config.fence_retention_given and (
        own is None or fence_retention_ms(own) != fence_retention_ms(config.fence_retention)
    ):
        raise InvalidArgumentError(
            f"fence_retention={config.fence_retention:g} differs from the backend object's own ({own} s): give it to "
            "the backend (AsyncRedisBackend(client, fence_retention=...)), or a client or a URL to the registry",
            server=backend.address,
        )
    if own is not None and config.lease is not None and own < config.lease:
        raise InvalidArgumentError(
            f"the backend object's fence_retention ({own:g} s) must be at least expire_after ({config.lease:g} s): a "
            "fencing counter that ends before the lease it fenced could let the next token go below one still held",
            server=backend.address,
        )


def _make_backend(connection: Any, config: RegistryConfig) -> AsyncLockBackend:
    confirmation = config.confirmation
    retention = config.fence_retention
    if isinstance(connection, AsyncLockBackend):
        _refuse_retention_for_a_backend(config, connection)
        if confirmation is not None:
            # The backend was built without it, and a backend of another kind may have no replicas at all.
            raise InvalidArgumentError(
                "confirm_replicas needs a client or a URL, not a backend object (the registry builds the backend "
                "that confirms)",
                server=connection.address,
            )
        return connection
    from ..backends import clients
    from ..backends.clients import check_client_settings, redacted, redacted_url
    from .backends.cluster import AsyncRedisClusterBackend, is_cluster_url, redis_cluster_client_from_url
    from .backends.redis import AsyncRedisBackend, redis_client_from_url

    if isinstance(connection, str):
        if not connection:
            raise InvalidArgumentError("the server URL must not be empty")
        cluster = is_cluster_url(connection)
        if cluster:
            _refuse_confirmation_on_a_cluster(confirmation, redacted_url(connection))
        try:
            client = (redis_cluster_client_from_url if cluster else redis_client_from_url)(connection)
        except ValueError as exc:
            shown, detail = redacted_url(connection), redacted(str(exc), connection)
            raise InvalidArgumentError(f"not a valid server URL: {shown!r} ({detail})") from None
        if cluster:
            return AsyncRedisClusterBackend(
                client, owns_client=True, address=redacted_url(connection), fence_retention=retention
            )
        return AsyncRedisBackend(client, owns_client=True, confirmation=confirmation, fence_retention=retention)
    clients.asyncio_client_family(connection)  # a client of the other kind is refused here
    if clients.is_cluster_client(connection):
        cluster_backend = AsyncRedisClusterBackend(connection, fence_retention=retention)
        _refuse_confirmation_on_a_cluster(confirmation, cluster_backend.address)
        check_client_settings(connection, cluster_backend.address)
        return cluster_backend
    if hasattr(connection, "evalsha") and hasattr(connection, "connection_pool"):
        backend = AsyncRedisBackend(connection, confirmation=confirmation, fence_retention=retention)
        check_client_settings(connection, backend.address)
        return backend
    raise InvalidArgumentError(
        "connection must be a redis.asyncio.Redis client (or valkey's twin), a redis:// URL or a backend "
        f"(AsyncLockBackend), not {type(connection).__name__}"
    )


# Every open registry, so a forked child can reset them all, and an exiting process give back retained leases.
_live_registries: weakref.WeakSet[AsyncLockRegistry] = weakref.WeakSet()


async def _give_back_retained_leases_at_exit() -> None:
    # A program that ends without close() would otherwise leave its idle retained leases to expire, keeping
    # other owners out for up to a whole lease. (A crash still does; so does os._exit.)
    for registry in list(_live_registries):
        try:
            await registry._context.retention.stop()
        except Exception:  # at exit there is nobody left to raise to
            logger.debug("hybridlock: could not give back retained leases at exit", exc_info=True)


at_exit(_give_back_retained_leases_at_exit)


# The locks held across a fork (see _hold_clients_before_fork), by each forking thread (two threads may fork at once).
_forking = threading.local()
#: How long a fork waits for another thread to leave a client's connection pool (it never holds it longer than a
#: few lines of the client library's code); past that it forks anyway.
_FORK_PATIENCE = 5.0


def _hold_clients_before_fork() -> None:
    # A thread of a registry (its subscriber connecting, a renewal) inside a client's connection pool at fork time
    # would leave the pool's lock held for ever in the child, whose first command would then hang: the forking thread
    # holds those locks across the fork, and lets go of them on both sides.
    held: list[Any] = []
    _forking.held = held
    seen: set[int] = set()
    for registry in list(_live_registries):
        guards = getattr(registry._context.backend, "fork_guards", None)
        for lock in guards() if guards is not None else ():
            if id(lock) not in seen and lock.acquire(timeout=_FORK_PATIENCE):
                seen.add(id(lock))
                held.append(lock)


def _let_go_after_fork() -> None:
    held: list[Any] = getattr(_forking, "held", [])
    while held:
        held.pop().release()


def _reset_registries_in_child() -> None:
    _let_go_after_fork()
    for registry in list(_live_registries):
        registry._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_clients_before_fork,
        after_in_parent=_let_go_after_fork,
        after_in_child=_reset_registries_in_child,
    )
