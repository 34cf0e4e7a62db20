"""HybridLock: a per-key local lock in front of a lease in the lock server.

Acquiring takes the key's local mutex first, then the server lock; releasing does the reverse. So:

* threads of one process queue on the local mutex and send nothing to the server while they wait; only the
  thread at the head of that queue talks to the server;
* a reentrant acquire or release by the owning thread only counts, locally;
* the final release deletes the server key only if it still holds this registry's ``client_id`` and releases
  the local mutex whatever the server said;
* except when the server lease is kept for this process: passed to a thread queued here (local hand-off, within
  the budget, and within a shorter one once another owner is known to want the lock), or, with ``retain_for``
  and while no other owner is known to want it, kept idle for the
  next thread here that asks (``_retention.py``). A thread that takes the lock with the lease already held pays no
  round trip; the lease (and its fencing token) is one tenancy across all of them.

Failure modes
-------------
* The lease ends while the lock is held (the holder was paused longer than the lease, renewal could not reach
  the server, or someone deleted the key): another owner may enter. The holder learns it at the next renewal
  (``lost``, ``on_lost`` callbacks) and at the final release (``LockLostError``). Leases cannot prevent this;
  fencing tokens (``fencing_token``) let the protected resource reject the stale holder's writes.
* The server is unreachable: ``acquire`` raises ``BackendUnavailableError`` with the local mutex released, never
  returning True without the server lock; ``release`` releases locally, then raises the same error (the key ends
  with its lease), or ``LockLostError`` if the lease was already known lost.
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass, replace
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._core.config import validate_timeout
from .._core.names import LockNames
from .._core.policy import may_keep_lease
from ..errors import (
    HybridLockError,
    InvalidArgumentError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
)
from ._compat import (
    AsyncFifoMutex,
    asking_owner,
    current_owner,
    describe_owner,
    monotonic,
    owner_alive,
    owner_ident,
    owner_name,
    refuse_a_task_of_its_own,
    refuse_in_event_loop,
    returned_to_with,
    shielded,
)
from .backends.base import AsyncReleaseWatch
from .lease import ServerLease
from .observing import AcquireProbe, observe_acquire, observe_release
from .owners import Site, caller_frame, caller_site, site_text
from .scope import LossWatching
from .waiting import Grant, WaitHint, acquire_remote, contention_watch, release_remote, wanted_before_heard

if TYPE_CHECKING:
    from .context import LockContext

__all__ = ["AsyncHybridLock", "AsyncJavaStyleLock", "AsyncTimedHold", "LockStatistics"]

logger = logging.getLogger("hybridlock.lock")

_HOST = socket.gethostname()

# What the local half of an acquire achieved (see HybridLock._enter_locally).
_HELD, _TIMED_OUT, _NEEDS_SERVER = "held", "timed out", "needs server"


@dataclass(frozen=True)
class LockStatistics:
    """A snapshot of one lock's state in this process (``HybridLock.statistics()``), for logs and debugging."""

    key: str
    owner_thread: object | None  # the holder here, if any: its thread's ident (the task, for an asyncio lock)
    hold_count: int  # that thread's reentrancy depth
    local_waiters: int  # threads of this process queued for it
    holds_server_lease: bool
    fencing_token: int | None
    lost: bool
    local_passes: int  # hand-offs between local threads (and re-takes after retention) in the current tenancy
    retained: bool  # the lease is kept idle (retain_for) with no thread here holding the lock
    # Who the holder is, as ``hybridlock inspect`` shows it to other processes (see describer.py):
    owner_name: str | None = None  # the holding thread's name (the task's, for an asyncio lock)
    acquired_at: float | None = None  # when the server granted the current tenancy (time.time()), while held here
    client_id: str = ""  # this registry's owner identity in the server
    host: str = ""
    pid: int = 0
    # The holder's thread has ended (its task is done) without releasing the lock: the lease is no longer renewed
    # and ends by itself within expire_after (see hybridlock._async.owners); found by the registry's next round.
    abandoned: bool = False
    acquired_from: str | None = None  # where the holder took the lock ("file:line" of the first frame outside)


_L = TypeVar("_L", bound="AsyncJavaStyleLock")


class AsyncJavaStyleLock:
    """The calls every lock kind offers on top of its own ``acquire(blocking, timeout)`` and ``release()``: the
    context manager and Java's ``lock`` / ``unlock`` / ``try_lock`` (alias ``tryLock``)."""

    # Each public way in reads the frame that called it, once (a few attribute reads): where a hold is taken is
    # recorded from it (owners.py), and `with lock.acquire(timeout=1):` is told apart by it (returned_to_with).

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        caller = caller_frame()
        return returned_to_with(self, await self._acquire_from(caller, blocking, timeout), caller)

    async def _acquire_from(self, caller: FrameType | None, blocking: bool, timeout: float) -> bool:
        """``acquire(blocking, timeout)`` called from the frame ``caller``."""
        raise NotImplementedError

    async def release(self) -> None:
        raise NotImplementedError

    async def try_lock(self, timeout: float | None = None) -> bool:
        """Java's ``tryLock``: with ``timeout`` None, 0 or below take the lock only if it is free now (as Java does
        for a wait <= 0), else wait up to ``timeout`` seconds. Returns whether the lock is now held. A timeout that
        is NaN or not a number raises ``InvalidArgumentError``."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise InvalidArgumentError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if timeout is not None and math.isnan(timeout):
            raise InvalidArgumentError("timeout must not be NaN")
        caller = caller_frame()
        if timeout is None or timeout <= 0:
            acquired = await self._acquire_from(caller, False, -1)
        else:
            acquired = await self._acquire_from(caller, True, timeout)
        return returned_to_with(self, acquired, caller)  # (`with lock.try_lock(5):` works as `with lock.acquire()`)

    tryLock = try_lock  # noqa: N815 - documented Java-style alias

    async def lock(self) -> None:
        """Java's ``lock()``: wait as long as it takes."""
        caller = caller_frame()
        held = returned_to_with(self, await self._acquire_from(caller, True, -1), caller)
        if held is not True:
            return held  # type: ignore[return-value]  # `with lock.lock():` (see acquire)

    async def unlock(self) -> None:
        """Java's ``unlock()``: ``release()``."""
        await self.release()

    async def __aenter__(self: _L) -> _L:
        await self._acquire_from(caller_frame(), True, -1)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.release()

    def __call__(self: _L, timeout: float | None = None, *, blocking: bool = True) -> AsyncTimedHold[_L]:
        """``async with lock(timeout=5):`` runs the block holding the lock, taken within ``timeout`` seconds, and
        releases it at the block's end; when the lock was not acquired in time the block does not run and
        ``LockTimeoutError`` (a ``TimeoutError``) names the key, the server and the time waited.

        ``timeout`` None waits as long as it takes (as ``async with lock:`` does); ``blocking=False`` takes the
        lock only if it is free now. Bad arguments raise ``InvalidArgumentError`` here, before anything is
        taken. The value of ``async with lock(...) as held:`` is the lock."""
        wait = -1 if timeout is None else timeout
        validate_timeout(blocking, wait)
        return AsyncTimedHold(self, blocking, wait)


class AsyncTimedHold(Generic[_L]):
    """What ``lock(timeout=...)`` returns: an asynchronous context manager that takes ``lock`` within the timeout
    or raises ``LockTimeoutError``, and releases it at the block's end. Single use, like the ``with`` it is for."""

    __slots__ = ("_blocking", "_lock", "_timeout")

    def __init__(self, lock: _L, blocking: bool, timeout: float) -> None:
        self._lock = lock
        self._blocking = blocking
        self._timeout = timeout

    async def __aenter__(self) -> _L:
        lock = self._lock
        start = monotonic()
        if await lock._acquire_from(caller_frame(), self._blocking, self._timeout):
            return lock
        waited = monotonic() - start
        keys: list[str] = getattr(lock, "keys", None) or [lock.key]  # type: ignore[attr-defined]
        noun = {"read": "read lock", "write": "write lock"}.get(getattr(lock, "kind", ""), "lock")
        what = f"{noun} {keys[0]!r}" if len(keys) == 1 else f"locks {keys!r} (all or none)"
        if not self._blocking:
            message = f"{what} busy: not acquired (blocking=False)"
        else:
            message = f"{what} not acquired within {self._timeout:g} s (waited {waited:.3f} s)"
        message += "; the with-block did not run"
        raise LockTimeoutError(message, key=keys[0], server=lock._context.server)  # type: ignore[attr-defined]

    async def __aexit__(self, *exc_info: object) -> None:
        await self._lock.release()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._lock!r} timeout={self._timeout!r} blocking={self._blocking!r}>"


class AsyncHybridLock(ServerLease, AsyncJavaStyleLock, LossWatching):
    """A reentrant lock that excludes threads of this process and every other owner of the same key.

    Obtain it from a registry (``registry.obtain(key)``). It has ``threading.RLock``'s calls and semantics:
    ``acquire(blocking, timeout)``, ``release()`` and the context manager, with an owner that is the current thread
    for the thread API and the current task for the asyncio API (whose calls are coroutines). The thread lock also
    works under ``threading.Condition(lock)``.
    """

    def __init__(self, context: LockContext, names: LockNames) -> None:
        super().__init__(context, names)
        self._mutex = AsyncFifoMutex(context.config.handoff_barge_window)
        self._owner: object | None = None  # the holder in this process (see current_owner)
        self._count = 0
        self._site: Site = None  # where the holder took the lock (owners.py)
        # Local hand-off (lock cohorting): while threads of this process queue for the key, the server lease is
        # kept and the local lock passed along, within a budget (see _may_keep_lease).
        self._contended = False  # another owner is known to want the lock during this tenancy
        self._passes = 0  # local hand-offs in this tenancy (whose windows count from ``_acquired_at``, the grant)
        self._contention_watch: AsyncReleaseWatch | None = None
        # Threads whose Condition.wait() could not take the lock back: their `with` exit will still call
        # release(), which must let the wait's own error through instead of raising LockNotOwnedError over it.
        self._failed_restores: set[object] = set()
        self._wait_hint = WaitHint()  # what the last remote wait tells the next (waiting.py's own)
        self.last_used = monotonic()

    # -- what the lock is -----------------------------------------------------------------------------------------

    @property
    def registry(self) -> Any:
        """The registry this lock came from (a ``LockRegistry``)."""
        return self._context.registry

    @property
    def hold_count(self) -> int:
        """The current thread's reentrancy depth (0 when it does not hold the lock)."""
        me = asking_owner()
        return self._count if me is not None and self._owner == me else 0

    def _holder(self) -> object | None:
        return self._owner

    def _recursion_count(self) -> int:
        """``threading.RLock``'s name (3.11+) for ``hold_count``: the current thread's depth, 0 if not the owner."""
        return self.hold_count

    def is_held_by_current_task(self) -> bool:
        """Whether this task holds the lock (no round trip). Asked from outside the lock's side (an asyncio lock by a
        thread), False: such a caller holds nothing."""
        me = asking_owner()
        return me is not None and self._owner == me

    async def locked(self) -> bool:
        """Whether anyone holds the lock: a thread of this process (no round trip) or another owner (one).

        A lease kept idle by ``retain_for`` does not count: any thread here would get the lock at once, and another
        owner's attempt ends the retention."""
        if self._owner is not None:
            return True
        if self._in_server:
            return self._retained_until is None or self._lost
        self._context.check_open(self.key)
        return await self._context.backend.is_locked(self._names)

    @property
    def fencing_token(self) -> int | None:
        """The fencing token minted when this process last took the server lock, while it holds it; else None.

        Tokens of one key strictly increase across every owner, so a resource that remembers the highest token it
        has seen can refuse a write carrying a lower one (see ``hybridlock.fencing``)."""
        return self._fencing_token if self._owner is not None else None

    @property
    def valid_until(self) -> float | None:
        """A ``time.monotonic()`` deadline before which the lease is certainly still ours, or None when not held.

        It is when the request of the last successful acquire attempt or renewal was sent, plus the lease (the
        registry's at most), minus a drift margin, so it errs early; a renewal by hand with a shorter lease lowers
        it before it is sent. (The time spent waiting for the lock is not counted against it.) Once the lease is
        found lost (``lost``) it is a time already past until the release. Check ``time.monotonic() <
        lock.valid_until`` before a side effect that must not happen after the lease ends.

        It covers the lease running out, not the server losing it: a key evicted under memory pressure, removed by
        ``DEL`` or ``FLUSHALL``, lost in a restart without persistence or in a failover to a replica that had not
        received it is gone at once, while this deadline still lies ahead. The holder learns of such a loss only at
        its next renewal (``lost``, ``on_lost``) or release; fencing tokens protect the resource meanwhile."""
        return self._valid_until if self._owner is not None else None

    def statistics(self) -> LockStatistics:
        """A snapshot of the lock's state here; costs no round trip."""
        owner = self._owner
        return LockStatistics(
            key=self.key,
            owner_thread=None if owner is None else owner_ident(owner),
            hold_count=self._count if owner is not None else 0,
            local_waiters=self._mutex.waiting,
            holds_server_lease=self._in_server,
            fencing_token=self._fencing_token if self._in_server else None,
            lost=self._lost,
            local_passes=self._passes if self._in_server else 0,
            retained=self._retained_until is not None and self._owner is None,
            owner_name=None if owner is None else owner_name(owner),
            acquired_at=self._granted_wall if self._in_server else None,
            client_id=self._context.client_id,
            host=_HOST,
            pid=os.getpid(),
            abandoned=self._abandoned,
            acquired_from=None if owner is None else site_text(self._site),
        )

    def __repr__(self) -> str:
        # threading.RLock's format (``<locked _thread.RLock object owner=... count=... at 0x...>``), which tools
        # and CPython's own tests match, with what is ours added before "at". "locked" means held by a thread of
        # this process: finding out about other owners would cost a round trip.
        owner = self._owner
        state = "unlocked" if owner is None else "locked"
        extra = ""
        if owner is not None and self._lost:
            extra += " lost"
        if self._abandoned:
            extra += " abandoned"
        if owner is None and self._retained_until is not None:
            extra += " retained"
        waiting = self._mutex.waiting
        if waiting:
            extra += f" waiting={waiting}"
        count = self._count if owner is not None else 0
        shown = 0 if owner is None else describe_owner(owner)
        return (
            f"<{state} hybridlock.AsyncHybridLock object key={self.key!r} owner={shown} count={count}{extra} "
            f"at {id(self):#x}>"
        )

    # -- acquiring --------------------------------------------------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the lock, as ``threading.RLock.acquire`` does.

        Returns True once both the local and the server lock are held (a reentrant acquire only counts, with no
        round trip), False when ``blocking`` is False and the lock is busy, or when ``timeout`` seconds passed.
        The timeout covers the local wait and the remote wait together.

        Raises ``BackendUnavailableError`` (the local lock is then released again), ``RegistryClosedError``,
        ``InvalidArgumentError`` for bad arguments, and ``LockLostError`` for a reentrant acquire of a lock whose
        lease is known lost (the hold is unchanged: release it, which raises ``LockLostError`` too).

        On the thread side, ``with lock.acquire(timeout=5):`` works too, as filelock's does: the block runs holding
        the lock and releases it at its end, or does not run at all (``LockTimeoutError``) when the lock was not
        acquired. Everywhere else the result is exactly True or False.
        """
        caller = caller_frame()
        return returned_to_with(self, await self._acquire_from(caller, blocking, timeout), caller)

    async def _acquire_from(self, caller: FrameType | None, blocking: bool, timeout: float) -> bool:
        wait = validate_timeout(blocking, timeout)
        refuse_in_event_loop(self.key, self._context.server)
        me = current_owner()
        start = monotonic()
        deadline = None if wait is None else start + wait
        if self._owner == me:  # reentrant: only counts (and is not reported); as _enter_locally does
            self._context.check_open(self.key)
            if self._lost:
                raise self._reentry_error()
            self._count += 1
            return True
        refuse_a_task_of_its_own("lock", self.key, self._context)
        site = caller_site(caller)
        observer = self._context.observer
        if observer is not None:
            acquire = partial(self._acquire, me, blocking, deadline, site=site)
            return await observe_acquire(observer, self, self.key, "lock", me, start, acquire)
        return await self._acquire(me, blocking, deadline, site=site)

    async def _acquire(
        self,
        me: object,
        blocking: bool,
        deadline: float | None,
        probe: AcquireProbe | None = None,
        site: Site = None,
    ) -> bool:
        entered = await self._enter_locally(me, blocking, deadline, site)
        if entered != _NEEDS_SERVER:
            return entered == _HELD
        try:
            self._context.check_open(self.key)
            grant = await acquire_remote(
                self._context, self._names, blocking, deadline, probe=probe, hint=self._wait_hint
            )
        except BaseException:
            self._mutex.release()
            raise
        if grant is None:
            self._mutex.release()
            return False
        try:
            result = grant.result
            self._start_tenancy(
                me, result.fencing_token, result.contended, grant.sent_at, site, grant.valid_until, grant.tenancy
            )
        except BaseException:
            # Interrupted between the server's grant and the local hold (on threads: an exception a signal handler
            # raises, KeyboardInterrupt or Celery's SoftTimeLimitExceeded): the lease would stay held by nobody.
            await shielded(partial(self._give_back_interrupted, me, grant))
            raise
        try:
            await self._listen_for_contention()
        except BaseException:
            # Held now, but interrupted before the caller could learn it: nobody would ever release it.
            await shielded(self._abandon)
            raise
        return True

    async def _enter_locally(self, me: object, blocking: bool, deadline: float | None, site: Site = None) -> str:
        """The local half of ``acquire``: ``_HELD`` (reentrant, or passed on with the server lease: done),
        ``_TIMED_OUT``, or ``_NEEDS_SERVER`` (we hold the local mutex; the server lock is still to be taken).
        ``site``: where ``me`` asked for it (``owners.caller_site``)."""
        self._context.check_open(self.key)
        if self._owner == me:
            if self._lost:
                # Counting would tell the caller it holds a lock another owner may hold now.
                raise self._reentry_error()
            self._count += 1
            return _HELD
        try:
            if deadline is None:
                got_local = await self._mutex.acquire()
            elif blocking:
                got_local = await self._mutex.acquire(True, max(0.0, deadline - monotonic()))
            else:
                got_local = await self._mutex.acquire(False)
        except BaseException:
            # Interrupted (cancelled; KeyboardInterrupt on threads) as the lock was handed to us with the server
            # lease: the mutex passed it on, and if nobody was left to take it, the lease would stay held with no
            # holder.
            await shielded(self._give_back_orphaned_lease)
            raise
        if not got_local:
            return _TIMED_OUT
        try:
            if self._in_server:
                # Passed to us by a thread of this process with the server lease still held, or retained idle
                # since the last release here: no round trip.
                self._retained_until = None
                if not self._lost:
                    self._failed_restores.discard(me)
                    self._owner = me
                    self._count = 1
                    self._site = site
                    self.last_used = monotonic()
                    return _HELD
                # NOTE: the lease ended during the streak. Nobody enters on a lost lease: end that tenancy (its
                # last holder has been or will be told by LockLostError) and take the lock afresh.
                self._end_tenancy()
            return _NEEDS_SERVER
        except BaseException:
            # Interrupted before acquire() could return: we hold nothing, so pass the mutex on, and the lease with
            # it if nobody is left to take it.
            self._owner = None
            self._count = 0
            self._mutex.release()
            await shielded(self._give_back_orphaned_lease)
            raise

    def _start_tenancy(
        self,
        me: object,
        token: int | None,
        contended: bool,
        sent_at: float,
        site: Site,
        valid_until: float | None = None,
        tenancy: str = "",
    ) -> None:
        """``me`` holds the lock in a fresh server tenancy, granted to the request sent at ``sent_at`` (the lease
        counts from there, the hold from now: see ``ServerLease._begin_lease``), or, for a lock granted to our place
        in the queue, valid until ``valid_until``, the key holding ``tenancy`` ("" for our owner id); ``me`` asked
        for it at ``site``."""
        self._failed_restores.discard(me)
        self._owner = me
        self._count = 1
        self._site = site
        self._contended = contended
        self._passes = 0
        self.last_used = monotonic()
        self._begin_lease(token, sent_at, valid_until, tenancy)

    async def _listen_for_contention(self) -> None:
        if self._context.config.retain_for and self._contention_watch is None:
            # Listen for other owners' announcements from the start, so that one made while we hold the lock ends
            # a retention at once instead of at its deadline. One refused between our acquire and the watch's
            # confirmation announced itself to nobody: its place in the queue tells (waiting.wanted_before_heard).
            watch = self._contention_watch = await contention_watch(self._context, self._names)
            if not self._contended and await wanted_before_heard(self._context, self._names, watch):
                self._contended = True

    async def _give_back_interrupted(self, me: object, grant: Grant) -> None:
        """Give back the tenancy ``grant`` gave ``me``, whose ``acquire`` was interrupted before its local hold was
        recorded (or while it was)."""
        if self._in_server and self._owner == me:
            await self._abandon()  # (recorded: released as a held lock)
            return
        try:
            await release_remote(self._context, replace(self._names, tenancy=grant.tenancy))
        except HybridLockError as exc:
            logger.warning(
                "hybridlock: could not give back the lease of %r after an interrupted acquire: %s", self.key, exc
            )
        finally:
            if self._in_server:
                self._end_tenancy()
            self._owner = None
            self._count = 0
            self._mutex.release()

    async def _abandon(self) -> None:
        """Give up a tenancy whose ``acquire`` was interrupted after the server granted it, before it returned:
        the caller does not know it holds the lock, so nobody would ever release it. (Passing it on to a waiter
        here is as good as releasing it.)"""
        try:
            await self._release_fully()
        except HybridLockError as exc:
            logger.warning(
                "hybridlock: could not give back the lease of %r after an interrupted acquire: %s", self.key, exc
            )

    def _end_tenancy(self) -> None:
        watch, self._contention_watch = self._contention_watch, None
        try:
            if watch is not None:
                watch.close()
        finally:
            self._end_lease()

    # -- releasing --------------------------------------------------------------------------------------------------

    async def release(self) -> None:
        """Undo one ``acquire`` by this thread; the last one releases the server lock, then the local lock.

        Raises ``LockNotOwnedError`` (a ``RuntimeError``) when the current thread does not hold the lock,
        ``LockLostError`` when the lease had ended before the final release (the lock is released all the same),
        ``BackendUnavailableError`` when the server could not be told (the lock is released locally; the server
        key ends with its lease). A lease already known lost raises ``LockLostError`` even when the server cannot be
        reached (the loss matters more; the server's error is its ``__cause__``): ``BackendUnavailableError`` means
        the lease was not known lost.
        """
        me = current_owner()
        observer = self._context.observer
        if observer is not None and self._owner == me and self._count == 1:  # (a reentrant release is not reported)
            await observe_release(observer, self, self.key, "lock", me, partial(self._release_by, me))
            return
        await self._release_by(me)

    async def _release_by(self, me: object) -> None:
        """``release`` on behalf of ``me`` (a multi-key lock rolling back runs its cleanup shielded, in a task of
        its own on the async side)."""
        if self._owner != me:
            if me in self._failed_restores:
                self._failed_restores.discard(me)
                return
            raise LockNotOwnedError(
                "cannot release a lock this task does not hold", key=self.key, server=self._context.server
            )
        if self._count > 1:
            self._count -= 1
            return
        await self._release_fully()

    async def _may_keep_lease(self, now: float) -> bool:
        """Whether the final release may keep the server lease, for a waiting thread here or (``retain_for``)
        for whichever thread here asks next.

        Only while the lease is sound and the budget is not spent: at most ``handoff_limit`` passes and
        ``handoff_window`` seconds per tenancy, and only ``handoff_contended_window`` seconds of it once another
        owner is known to want the lock (it failed to get it: the acquire script told us at the start of the
        tenancy, or its announcement reached our subscription since). A lease is never kept idle (``retain_for``)
        for a contended lock: the caller checks ``_contended`` after this."""
        watch = self._contention_watch
        if watch is not None and not self._contended and watch.contended():
            self._contended = True
        config = self._context.config
        if not may_keep_lease(
            lost=self._lost,
            in_server=self._in_server,
            contended=self._contended,
            passes=self._passes,
            acquired_at=self._acquired_at,
            now=now,
            handoff_limit=config.handoff_limit,
            handoff_window=config.handoff_window,
            contended_window=config.handoff_contended_window,
        ):
            return False
        if watch is None:
            # First pass of this tenancy: start listening for other owners' "wanted" announcements. (No look at the
            # queue for owners refused before: one that goes unheard waits at most handoff_window, not a retention.)
            self._contention_watch = await contention_watch(self._context, self._names)
        return True

    async def _release_fully(self) -> None:
        self.last_used = now = monotonic()
        context = self._context
        retain_for = context.config.retain_for
        try:
            keep = bool(self._mutex.waiting or retain_for) and await self._may_keep_lease(now)
        except BaseException:
            # Cut off while looking (a cancel, a KeyboardInterrupt, during the subscription made at the first
            # pass): the lock is still ours, and the caller will not come back to release it. Release it in full
            # (shielded), then let the interruption through.
            try:
                await self._release_in_server()
            except HybridLockError as exc:
                logger.warning("hybridlock: releasing %r after an interrupted release: %s", self.key, exc)
            raise
        if keep:
            # Keep the server lease (its renewal and fencing token carry on) and hand the local lock over.
            self._owner = None
            self._count = 0
            self._passes += 1
            if self._mutex.waiting and self._mutex.pass_on():  # (a cheap look first: retention's hot path)
                return
            if retain_for and not self._contended and context.retention.retain(self, now + retain_for):
                # Nobody here waits: the lease stays, idle, for whichever thread here asks next (_retention.py).
                self._mutex.release()  # a thread that queued meanwhile is handed the lock, lease and all
                return
            # The queued thread gave up (timed out) in the meantime: release in the server after all.
            self._passes -= 1
        await self._release_in_server()

    async def _release_in_server(self) -> None:
        """The end of a final release that keeps nothing: the server lease, then the local lock."""
        context = self._context
        released = False
        unreachable: HybridLockError | None = None
        was_lost = self._give_back_lease()
        try:
            # Shielded: a release cut off by a cancel could leave the server lease held by nobody until it expires.
            released = await shielded(partial(release_remote, context, self._names))
        except HybridLockError as exc:
            if not was_lost:
                raise
            unreachable = exc  # known lost: the loss is what the caller must hear; the failure stays its cause
        finally:
            self._owner = None
            self._count = 0
            self.last_used = monotonic()
            self._end_tenancy()
            self._mutex.release()
        if was_lost or not released:
            raise self._lost_error() from unreachable

    async def _release_kept(self, marker: str, keep_ms: int) -> None:
        """The final release of this task's only hold, leaving the server key taken (holding ``marker``) for
        ``keep_ms`` more milliseconds (``run_once``'s ``at_least_for``): never passed on or retained, nobody woken.
        Raises as ``release`` does (``LockLostError`` when the lease had ended)."""
        if self._owner != current_owner() or self._count != 1:
            raise LockNotOwnedError(
                "cannot end a run that is not this task's only hold of the lock",
                key=self.key,
                server=self._context.server,
            )
        context = self._context
        kept = False
        was_lost = self._give_back_lease()
        try:
            keep = partial(context.backend.keep_for, self._names, context.client_id, marker, keep_ms)
            kept = await shielded(keep)  # (as a release is: a cancel must not leave the lease held by nobody)
        finally:
            self._owner = None
            self._count = 0
            self.last_used = monotonic()
            self._end_tenancy()
            self._mutex.release()
        if was_lost or not kept:
            raise self._lost_error()

    # -- retention ------------------------------------------------------------------------------------------------

    def _wanted_elsewhere(self) -> bool:
        """Whether another owner is known to want the lock (for the retention reaper)."""
        if self._contended:
            return True
        watch = self._contention_watch
        return watch is not None and watch.contended()

    async def _end_retention(self) -> bool:
        """Give a retained idle lease back to the server (from the retention reaper, or at close). Returns False
        when it must be tried again in a moment.

        The local mutex is taken without waiting first: if a thread here holds it, the lock is in use again and its
        release decides what happens to the lease. The one exception is the instant between a release deciding to
        retain and its letting go of the mutex (or an acquire taking the mutex and clearing the retention): the
        retention is still on, so the caller retries."""
        if not await self._mutex.acquire(False):
            return self._retained_until is None
        try:
            if self._retained_until is not None and self._owner is None and self._in_server:
                await self._give_back_idle_lease()
            self._retained_until = None
        finally:
            self._mutex.release()
        return True

    async def _give_back_late(self, token: int | None, names: LockNames) -> bool:
        # (Only if the key holds this tenancy and its fencing counter still holds this tenancy's token: another
        # tenancy of this registry taken since holds the same owner id.)
        if token is None:
            return False
        context = self._context
        return await context.backend.release_late(names, context.client_id, token)

    async def _give_back_orphaned_lease(self) -> None:
        """If the lease is held but no thread here holds or waits for the lock, give it back to the server."""
        if not self._in_server or self._owner is not None or not await self._mutex.acquire(False):
            return  # nothing held, or a thread holds the mutex: its release decides
        try:
            if self._in_server and self._owner is None and not self._mutex.waiting:
                await self._give_back_idle_lease()
        finally:
            self._mutex.release()  # to a thread that queued meanwhile, if any: it takes the lock afresh

    async def _give_back_idle_lease(self) -> None:
        """Release the server lease of a lock no thread here holds (its tenancy's end clears any retention). Call
        with the local mutex held."""
        self._give_back_lease()
        try:
            await release_remote(self._context, self._names)
        except HybridLockError as exc:
            # Nobody holds the lock to be told; the key ends with its lease.
            logger.warning("hybridlock: could not give back the idle lease of %r: %s", self.key, exc)
        finally:
            self._end_tenancy()

    # -- a holder that is gone (owners.py) ----------------------------------------------------------------------------

    def _holder_site(self) -> Site:
        return self._site

    def _find_abandoned(self) -> list[tuple[object, Site]]:
        owner = self._owner
        # NOTE: read again once the owner is known to be gone. It may have released the lock (and ended) since the
        # first read; but a holder that is gone changes nothing any more, so a second read that still finds it is
        # final: the lock is abandoned. (While it is, no thread here can take the mutex: only _end_abandoned frees
        # it.)
        if owner is None or owner_alive(owner) or self._owner is not owner:
            return []
        self._abandoned = True
        self._abandoned_by = (owner, self._site)
        return [self._abandoned_by]

    async def _end_abandoned(self) -> None:
        """Release an abandoned hold in place of its holder, which left the local mutex held: in the server (its key
        is due to expire by now; this wakes whoever waits for it) and here, handing the mutex to the next thread
        queued, which takes the lock afresh."""
        owner = self._owner
        if not self._abandoned or owner is None:
            return
        self._give_back_lease()
        try:
            await shielded(partial(release_remote, self._context, self._names))
        except HybridLockError as exc:
            logger.warning("hybridlock: could not give back the abandoned lease of %r: %s", self.key, exc)
        finally:
            if self._observed_hold_starts:
                self._observed_hold_starts.pop(owner, None)
            self._failed_restores.discard(owner)
            self._owner = None
            self._count = 0
            self._site = None
            self.last_used = monotonic()
            self._end_tenancy()
            self._mutex.release()

    async def _mark_lost(self, tenancy: int) -> None:
        if self._retained_until is not None and self._owner is None and await self._mutex.acquire(False):
            # Perhaps an idle retained lease: with the mutex held, no thread can enter on it while we look.
            try:
                if self._retained_until is not None and self._owner is None:
                    # No holder to tell, and nobody entered on it: the next acquire here sees `lost` and takes the
                    # lock afresh; the reaper gives the tenancy up.
                    self._claim_loss(tenancy)
                    return
            finally:
                self._mutex.release()
        await super()._mark_lost(tenancy)

    # -- leases -------------------------------------------------------------------------------------------------------

    async def renew(self, expire_after: float | None = None) -> None:
        """Reset the lease to ``expire_after`` seconds (default: the registry's) from now, in one round trip.

        Any thread of this process may renew while some thread here holds the lock (a watchdog, say). Raises
        ``LockNotOwnedError`` when no thread here holds it, ``LockLostError`` when the server key is no longer
        ours (the lock is then marked lost)."""
        await self._context.leases.renew_by_hand(self, expire_after)

    # -- threading.Condition support ---------------------------------------------------------------------------------
    # Condition(lock) uses these when present, so that wait() releases every level of a reentrant hold (and the
    # server lock, letting other owners in while we wait) and restores the depth afterwards.

    def _is_owned(self) -> bool:
        me = asking_owner()
        return me is not None and self._owner == me

    async def _release_save(self) -> tuple[int, bool, Site]:
        if self._owner != current_owner():
            raise LockNotOwnedError(
                "cannot wait on a condition without holding its lock", key=self.key, server=self._context.server
            )
        count = self._count
        site = self._site  # the wait takes the lock back from its own line: keep where the caller first took it
        observer = self._context.observer
        try:
            if observer is None:
                await self._release_fully()
            else:
                await observe_release(observer, self, self.key, "lock", current_owner(), self._release_fully)
        except LockLostError:
            # Report it after the wait, once the lock is held again, so the caller's `with` exits cleanly.
            return count, True, site
        except BaseException:
            # Released locally but the wait is aborted: the `with` exit must let this error through.
            self._failed_restores.add(current_owner())
            raise
        return count, False, site

    async def _acquire_restore(self, state: tuple[int, bool, Site]) -> None:
        count, lost_before_wait, site = state
        try:
            await self.acquire()
        except BaseException:
            self._failed_restores.add(current_owner())
            raise
        self._count = count
        self._site = site
        if lost_before_wait:
            raise LockLostError(
                "the lock's lease had ended before Condition.wait() released it; it is held again now",
                key=self.key,
                server=self._context.server,
            )

    # -- fork ------------------------------------------------------------------------------------------------------

    def _reset_after_fork(self, context: LockContext) -> None:
        # The child process owns none of its parent's locks, not even in the thread that forked: it gets a fresh
        # mutex (the parent's may have been held at fork time) and the child's context (a new client_id).
        self._context = context
        self._mutex = AsyncFifoMutex(context.config.handoff_barge_window)
        self._owner = None
        self._count = 0
        self._site = None
        self._forget_lease_after_fork()
        self._failed_restores = set()
        self._contended = False
        self._passes = 0
        self._contention_watch = None  # the parent's subscription does not exist here
