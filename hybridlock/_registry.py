"""LockRegistry: one lock object per key, one owner identity per registry, and the registry's background work.

A registry is one *owner* in the lock server: its ``client_id`` (a random UUID) is the value of every server key
it holds. Two registries exclude each other through the server even inside one process, as two processes do.

What the registry keeps:

* an identity map of key -> lock, held weakly, so a lock the program still references is the only one for its
  key, and a lock nobody references (and nobody holds) is reclaimed at once, as a ``threading.RLock`` would be.
  There is no cache of recently used locks: ``obtain`` in a loop that drops its lock each time builds a new
  (cheap) object each time;
* strong references to held locks, by server key (a held lock never disappears, and is never duplicated);
* background threads, none per lock or per wait: the lease renewer and (in the Redis backend) the pub/sub
  listener, plus the retention reaper when ``retain_for`` is used, and the wait keeper
  (``hybridlock._wait_keeper``) while some thread of the registry waits in the server. Each starts when there is
  something to do (a lease to renew, a channel to listen on, a lease retained, a place in a server queue to
  keep), stops a fraction of a second after there is nothing left, and starts again on demand; ``close()``
  stops them all. A program that holds no lock and waits for none has no hybridlock thread running.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from ._core.config import MIN_LEASE, LockType, RegistryConfig, validate_seconds
from ._core.names import LockNames, lock_names, read_write_names, validate_key
from ._decorator import execute_locked, synchronized
from ._lease import LostCallback
from ._lock import HybridLock
from ._multi import MultiLock
from ._renewal import HeldLease, LeaseRenewer
from ._retention import RetentionReaper
from ._rwlock import ReadWriteLock
from ._wait_keeper import WaitingPlace, WaitKeeper
from .backends.base import AcquireResult, LockBackend, ReleaseWatch
from .backends.memory import MemoryBackend
from .errors import (
    BackendUnavailableError,
    HybridLockError,
    InvalidArgumentError,
    LockLostError,
    LockNotOwnedError,
    RegistryClosedError,
)

__all__ = ["LocalLockRegistry", "LockRegistry"]

logger = logging.getLogger("hybridlock")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

class LockRegistry:
    """Hands out one :class:`HybridLock` per key, all sharing this registry's server connection and identity.

    ``connection`` is a ``redis.Redis`` or ``valkey.Valkey`` client, a ``redis://`` / ``rediss://`` / ``unix://``
    URL, or a :class:`~hybridlock.backends.LockBackend`. Asyncio clients and cluster clients are refused
    (``InvalidArgumentError``): an asyncio API is planned, and so is cluster support. ``registry_key`` prefixes
    every server key (it must not contain ``{`` or ``}``). ``expire_after`` is the lease in seconds (millisecond
    precision), at least ``MIN_LEASE`` (0.1 s: it is renewed every third of itself, so a shorter one is lost
    whenever a renewal is a little late).

    Every duration (``expire_after``, ``max_hold``, the hand-off windows, ``retain_for``, and every ``timeout``)
    is at most ``threading.TIMEOUT_MAX`` seconds (about 292 years on Linux and macOS, 49 days on Windows), the
    longest wait Python's threads accept; anything larger raises ``InvalidArgumentError`` (a timeout of -1 or
    ``math.inf`` waits forever). Keys and ``registry_key`` must be encodable as UTF-8.

    ``lock_type="pubsub"`` (default) wakes waiters on release notifications; ``"spin"`` polls with backoff.
    ``auto_renew`` keeps the leases of held locks alive from one background thread; ``max_hold`` (seconds) stops
    renewing a lock held longer than that, so a stuck holder cannot keep it forever.

    Local hand-off: when a thread releases a lock that other threads of this registry are queued for, the server
    lease is kept and the lock passed to the next thread (in arrival order) with no round trip, at most
    ``handoff_limit`` times and for ``handoff_window`` seconds per server tenancy, and never once another owner
    is known to be waiting. Either at 0 switches it off (one server release per final release).

    ``handoff_barge_window`` (seconds) trades a little of that arrival order for throughput: during a hand-off
    streak, a thread that releases and at once takes the lock again may go ahead of the longest-waiting thread, for
    at most this long; then that thread is handed the lock. Threads that are waiting are always served in arrival
    order. 0 makes every local hand-off strictly first come, first served.

    ``retain_for`` (seconds, default 0: off) keeps the server lease after the last local release, idle, so a thread
    here that takes the lock again within that time pays no round trip. Another owner's failed attempt ends the
    retention at once (with ``lock_type="pubsub"``; with ``"spin"`` only the deadline does), and the hand-off
    budget bounds it. While a lease is retained, another owner's non-blocking attempt fails. See
    ``hybridlock._retention``.
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
        handoff_barge_window: float = 0.002,
        retain_for: float = 0.0,
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
                handoff_barge_window=handoff_barge_window,
                retain_for=retain_for,
            ),
            connection,
        )

    def _setup(self, config: RegistryConfig, connection: Any) -> None:
        self._config = config
        self._registry_key = config.registry_key
        self._expire_after = config.expire_after
        self._lease_ms = config.lease_ms
        self._lock_type = config.lock_type
        self._max_hold = config.max_hold
        self._handoff_window = config.handoff_window
        self._handoff_limit = config.handoff_limit
        self._handoff_barge_window = config.handoff_barge_window
        self._retain_for = config.retain_for
        self._backend = _make_backend(connection)
        self._init_state()
        self._closed = False
        self._closed_event = threading.Event()
        self._wait_policy = config.wait_policy
        self._lost_callbacks: list[LostCallback] = []
        self._renewer = LeaseRenewer(self) if config.auto_renew else None
        self._retention = RetentionReaper(self)
        self._wait_keeper = WaitKeeper(self)
        if self._retain_for and config.lock_type == "pubsub":
            self._backend.on_wanted(self._retention.poke)
        _live_registries.add(self)

    def _init_state(self) -> None:
        # Everything that must be new in a forked child.
        self._client_id = str(uuid.uuid4())
        self._mutex = threading.Lock()
        self._locks: weakref.WeakValueDictionary[str, HybridLock] = weakref.WeakValueDictionary()
        self._rw_locks: weakref.WeakValueDictionary[str, ReadWriteLock] = weakref.WeakValueDictionary()
        # Everything holding a lease in the server, by server key: plain locks and read-write halves.
        self._held: dict[str, HeldLease] = {}

    # -- public surface ------------------------------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """This registry's owner identity in this process: the value of every server key it holds."""
        return self._client_id

    @property
    def registry_key(self) -> str:
        return self._registry_key

    @property
    def expire_after(self) -> float:
        return self._expire_after

    @property
    def server(self) -> str:
        """The lock server's address, as error messages give it."""
        return self._backend.address

    @property
    def backend(self) -> LockBackend:
        return self._backend

    @property
    def closed(self) -> bool:
        return self._closed

    def obtain(self, key: str) -> HybridLock:
        """The lock for ``key``: the same object for as long as the program references it or anyone holds it."""
        key = validate_key(key)
        self._check_open(key)
        with self._mutex:
            lock = self._locks.get(key)
            if lock is None:
                lock = HybridLock(self, self._names(key))
                self._locks[key] = lock
            return lock

    def obtain_read_write(self, key: str) -> ReadWriteLock:
        """The read-write lock for ``key`` (a separate lock from ``obtain(key)``): the same object while
        referenced. ``rw.read_lock()`` admits many readers, ``rw.write_lock()`` one writer."""
        key = validate_key(key)
        self._check_open(key)
        with self._mutex:
            rw = self._rw_locks.get(key)
            if rw is None:
                rw = self._rw_locks[key] = ReadWriteLock(self, read_write_names(self._registry_key, key))
            return rw

    def obtain_many(self, keys: Iterable[str]) -> MultiLock:
        """A lock over several keys, taken all or nothing in one global order (no deadlock between callers
        asking for overlapping sets in different orders); its timeout covers the whole attempt."""
        self._check_open()
        return MultiLock(self, keys)

    def _names(self, key: str) -> LockNames:
        return lock_names(self._registry_key, key)

    def expire_unused_older_than(self, age: float) -> int:
        """Kept for compatibility; does nothing and returns 0.

        The registry holds no lock it does not need: one nobody references and nobody holds is reclaimed by the
        garbage collector at once, and one still referenced or held must stay the lock for its key (a second
        object for a key would let a second thread in). So there is nothing left to forget. ``age`` is still
        checked (a non-negative number of seconds)."""
        if isinstance(age, bool) or not isinstance(age, (int, float)) or age < 0:
            raise InvalidArgumentError(f"age must be a non-negative number of seconds, not {age!r}")
        return 0

    def renew_lock(self, key: str, expire_after: float | None = None) -> None:
        """Renew the lease of ``key``'s lock, held by some thread of this registry, by hand (see
        ``HybridLock.renew``)."""
        key = validate_key(key)
        lock = self._held.get(self._names(key).lock)
        if lock is None:
            raise LockNotOwnedError("cannot renew a lock this registry does not hold", key=key, server=self.server)
        self._renew_by_hand(lock, expire_after)

    def synchronized(self, template: str, *, timeout: float | None = None) -> Callable[[F], F]:
        """Decorator: run the function holding the lock whose key ``template`` builds from its arguments.

        ``@registry.synchronized("order:{order_id}", timeout=5)``; placeholders may use attribute access
        (``{self.account}``, ``{invoice.id}``) and are checked against the signature when decorating. Raises
        ``LockTimeoutError`` (a ``TimeoutError``) naming the key when ``timeout`` seconds pass first."""
        return synchronized(self, template, timeout=timeout)

    def execute_locked(
        self, key: str, function: Callable[..., T], *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> T:
        """Run ``function(*args, **kwargs)`` holding ``key``'s lock and return its result (Spring's
        ``executeLocked``); ``LockTimeoutError`` when ``timeout`` seconds pass first."""
        return execute_locked(self, key, function, *args, timeout=timeout, **kwargs)  # type: ignore[no-any-return]

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lock)`` for every lock of this registry found lost while held."""
        if not callable(callback):
            raise InvalidArgumentError("on_lost needs a callable")
        self._lost_callbacks.append(callback)

    def held_locks(self) -> list[HeldLease]:
        """The locks some thread of this registry holds right now (not leases kept idle by ``retain_for``)."""
        with self._mutex:
            return [lease for lease in self._held.values() if lease._retained_until is None]

    def _server_leases(self) -> list[HeldLease]:
        """Every lease this registry holds in the server, retained ones included (for the renewer)."""
        with self._mutex:
            return list(self._held.values())

    def __len__(self) -> int:
        """How many lock objects the registry knows (held, or still referenced)."""
        return len(self._locks)

    def __iter__(self) -> Iterator[HybridLock]:
        return iter(list(self._locks.values()))

    def close(self) -> None:
        """Stop the background threads and release the registry's connection (if it made it from a URL).

        Afterwards ``obtain`` and ``acquire`` raise ``RegistryClosedError``. Locks still held stay held until
        their holders release them (the compare-and-delete is still sent, so no key is left behind) or their
        lease ends, since nothing renews them any more. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closed_event.set()
        self._retention.stop()  # give retained leases back while the connection is still open
        self._wait_keeper.stop()
        if self._renewer is not None:
            self._renewer.stop()
        self._backend.close()
        _live_registries.discard(self)

    def __enter__(self) -> LockRegistry:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._held)} held"
        return (
            f"<hybridlock.{type(self).__name__} {self._registry_key!r} on {self.server} client_id={self._client_id} "
            f"{state}>"
        )

    # -- used by the locks ---------------------------------------------------------------------------------------

    def _check_open(self, key: str | None = None) -> None:
        if self._closed:
            raise RegistryClosedError("the lock registry is closed", key=key, server=self.server)

    def _acquire_remote(
        self,
        names: LockNames,
        blocking: bool,
        deadline: float | None,
        attempt: Callable[[], AcquireResult] | None = None,
        blocked_on: Callable[[], LockNames] | None = None,
        give_up: Callable[[], None] | None = None,
        queues: bool = True,
    ) -> AcquireResult | None:
        """Take the server lock, waiting (for a wake-up, the holder's lease end, or a backoff) until ``deadline``.

        ``attempt`` makes one try (default: the plain lock's). After a failed try, ``blocked_on()`` names the lock
        whose release to wait for (default: ``names``; a multi-key attempt is blocked by one key at a time).
        ``give_up()`` is called when a blocking wait ends without the lock, to leave the server's queue (default:
        the plain lock's queue). ``queues``: a refused blocking attempt takes a place in the queue of the lock
        ``blocked_on()`` names (for the write half of a read-write lock, ``names`` is ``rw_names.write``), which
        the wait keeper keeps alive while this wait lasts; False for attempts that take none (readers). Returns the
        successful result, or None when not blocking or out of time."""
        backend = self._backend
        if attempt is None:

            def attempt() -> AcquireResult:
                return backend.try_acquire(names, self._client_id, self._lease_ms, blocking)

        if give_up is None:

            def give_up() -> None:
                backend.cancel_wait(names, self._client_id)

        queued = False  # a refused blocking attempt put us in the server's queue
        place: WaitingPlace | None = None  # kept alive by the wait keeper while we wait

        def tracked_attempt() -> AcquireResult:
            nonlocal queued, place
            result = attempt()
            if blocking and not result.acquired:
                queued = True
                if queues:
                    target = names if blocked_on is None else blocked_on()
                    if place is None:
                        place = self._wait_keeper.begin(target)
                    else:
                        place.names = target
            return result

        try:
            result = self._wait_for_lock(names, blocking, deadline, tracked_attempt, blocked_on)
        except BackendUnavailableError:
            raise  # the server is out of reach: our place in its queue lapses by itself
        except BaseException:
            if queued:
                self._give_up_quietly(give_up)
            raise
        finally:
            if place is not None:
                self._wait_keeper.end(place)
        if result is None and queued:
            self._give_up_quietly(give_up)
        return result

    @staticmethod
    def _give_up_quietly(give_up: Callable[[], None]) -> None:
        try:
            give_up()
        except HybridLockError:
            pass  # best effort: a place left in the queue lapses by itself within seconds

    def _wait_for_lock(
        self,
        names: LockNames,
        blocking: bool,
        deadline: float | None,
        attempt: Callable[[], AcquireResult],
        blocked_on: Callable[[], LockNames] | None,
    ) -> AcquireResult | None:
        backend = self._backend

        watch: ReleaseWatch | None = None
        watching: str | None = None  # the channel ``watch`` listens on
        tries = 0
        notified_wakeup = False  # the last wait ended on a notification
        spurious = 0  # notified wake-ups in a row whose retry was refused
        try:
            while True:
                epoch_before = None if watch is None else watch.epoch()
                result = attempt()
                if result.acquired:
                    return result
                if not blocking:
                    return None
                spurious = spurious + 1 if notified_wakeup else 0
                notified_wakeup = False
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                target = names if blocked_on is None else blocked_on()
                if self._lock_type == "pubsub" and watching != target.channel:
                    if watch is not None:
                        watch.close()
                    watch, watching = backend.watch(target, self._client_id), target.channel
                    if watch is not None:
                        # Subscribed now: try once more before sleeping, or a release that landed between the
                        # failed attempt and the subscription would never wake us.
                        continue
                epoch = None if watch is None else watch.epoch()
                if epoch is not None and epoch != epoch_before:
                    continue  # the subscription came (back) up after that attempt: same reasoning, retry first
                notified = epoch is not None
                delay = self._wait_policy.delay(tries, result.holder_ttl, notified)
                tries += 1
                if deadline is not None:
                    delay = min(delay, deadline - now)
                if watch is not None:
                    # Spurious wake-ups (faked announcements, or another owner got in first) back off as polling
                    # does before the next notification is acted on: a flood costs at most the spin rate.
                    pause = min(self._wait_policy.pause_after_spurious(spurious, result.holder_ttl), delay)
                    if pause > 0 and self._closed_event.wait(pause):
                        self._check_open(names.key)
                    # Also returns early when the subscription's state changes, or at once for a notification that
                    # arrived during the pause.
                    notified_wakeup = watch.wait(delay - pause)
                else:
                    self._closed_event.wait(delay)
                self._check_open(names.key)
        finally:
            if watch is not None:
                watch.close()

    def _contention_watch(self, names: LockNames) -> ReleaseWatch | None:
        """A subscription that tells a holder passing the lock around when another owner wants it."""
        return self._backend.watch(names, self._client_id) if self._lock_type == "pubsub" else None

    def _release_remote(self, names: LockNames) -> bool:
        return self._backend.release(names, self._client_id, notify=True)

    def _valid_until(self, start: float, lease: float | None = None) -> float:
        return self._config.valid_until(start, lease)

    def _track_held(self, lock: HeldLease) -> None:
        """From now until ``_untrack_held``, ``lock`` holds a lease in the server that the renewer keeps alive."""
        with self._mutex:
            self._held[lock._names.lock] = lock
        if self._renewer is not None:
            self._renewer.ensure_started()

    def _untrack_held(self, lock: HeldLease) -> None:
        with self._mutex:
            if self._held.get(lock._names.lock) is lock:
                del self._held[lock._names.lock]
            nothing_held = not self._held
        if nothing_held and self._renewer is not None:
            self._renewer.nothing_held()  # so that its thread can end soon instead of sleeping a whole period

    def _renew_by_hand(self, lock: Any, expire_after: float | None) -> None:
        lease = (
            self._expire_after
            if expire_after is None
            else validate_seconds("expire_after", expire_after, minimum=MIN_LEASE)
        )
        assert lease is not None
        if lock._owner is None:
            raise LockNotOwnedError(
                "cannot renew a lock this registry does not hold", key=lock.key, server=self.server
            )
        if lock.lost:
            raise LockLostError("the lock's lease has already ended", key=lock.key, server=self.server)
        start = time.monotonic()
        tenancy = lock._tenancy
        if self._lease_ms is None:
            # A registry without expiry (LocalLockRegistry): its leases never end, and renewing must not give them
            # an end either.
            lock._renewed(tenancy, start)
            return
        (renewed,) = self._backend.renew([lock._names], self._client_id, max(1, round(lease * 1000)))
        if not renewed:
            lock._mark_lost(tenancy)
            raise LockLostError(
                "the lock's lease had ended before renewal: another owner may have held it meanwhile",
                key=lock.key,
                server=self.server,
            )
        lock._renewed(tenancy, start, lease)

    def _report_lost(self, lock: Any, callbacks: list[LostCallback]) -> None:
        logger.warning("hybridlock: lease of %r on %s was lost while held", lock.key, self.server)
        for callback in callbacks + self._lost_callbacks:
            try:
                callback(lock)
            except Exception:
                logger.exception("hybridlock: on_lost callback %r failed for %r", callback, lock.key)

    # -- fork ------------------------------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        locks = list(self._locks.values())
        rw_locks = list(self._rw_locks.values())
        self._init_state()
        for lock in locks:
            lock._reset_after_fork()
            self._locks[lock.key] = lock
        for rw in rw_locks:
            rw._reset_after_fork()
            self._rw_locks[rw.key] = rw
        if self._renewer is not None:
            self._renewer.after_fork_in_child()
        self._retention.after_fork_in_child()
        self._wait_keeper.after_fork_in_child()
        after_fork = getattr(self._backend, "after_fork_in_child", None)
        if after_fork is not None:
            after_fork()


class LocalLockRegistry(LockRegistry):
    """The same API in one process, with no server: locks never expire (like ``threading.RLock``), and
    ``renew()`` leaves them so.

    Spring's ``DefaultLockRegistry``. Useful where a program runs as one process, and as a test double."""

    def __init__(self, registry_key: str = "hybridlock") -> None:
        self._setup(RegistryConfig.checked(registry_key, 30.0, never_expires=True), MemoryBackend())


def _make_backend(connection: Any) -> LockBackend:
    if isinstance(connection, LockBackend):
        return connection
    from .backends.clients import check_client_settings, client_family, redacted, redacted_url
    from .backends.redis import RedisBackend, redis_client_from_url

    if isinstance(connection, str):
        if not connection:
            raise InvalidArgumentError("the server URL must not be empty")
        try:
            client = redis_client_from_url(connection)
        except ValueError as exc:
            shown, detail = redacted_url(connection), redacted(str(exc), connection)
            raise InvalidArgumentError(f"not a valid server URL: {shown!r} ({detail})") from None
        return RedisBackend(client, owns_client=True)
    client_family(connection)  # an asyncio or cluster client is refused here, with the reason
    if hasattr(connection, "evalsha") and hasattr(connection, "connection_pool"):
        backend = RedisBackend(connection)
        check_client_settings(connection, backend.address)
        return backend
    raise InvalidArgumentError(
        "connection must be a redis.Redis or valkey.Valkey client, a redis:// URL or a LockBackend, not "
        f"{type(connection).__name__}"
    )


# Every open registry, so a forked child can reset them all, and an exiting process give back retained leases.
_live_registries: weakref.WeakSet[LockRegistry] = weakref.WeakSet()


def _give_back_retained_leases_at_exit() -> None:
    # A program that ends without close() would otherwise leave its idle retained leases to expire, keeping
    # other owners out for up to a whole lease. (A crash still does; so does os._exit.)
    for registry in list(_live_registries):
        try:
            registry._retention.stop()
        except Exception:  # at exit there is nobody left to raise to
            logger.debug("hybridlock: could not give back retained leases at exit", exc_info=True)


atexit.register(_give_back_retained_leases_at_exit)


def _reset_registries_in_child() -> None:
    for registry in list(_live_registries):
        registry._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_registries_in_child)
