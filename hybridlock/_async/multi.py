"""MultiLock: hold several keys at once, all or nothing.

Every caller takes the keys' local locks in one global order (sorted by their server names), so two callers
asking for overlapping sets in different orders can never wait on each other in a cycle: the first key they share
is taken in the same order by both. The server side is taken

* atomically, in one script and one round trip, where the backend can (a plain server; on a cluster, keys that
  share a hash slot): either every key is taken or none, and a busy key is waited for like a single lock;
* otherwise key by key in the same global order, releasing what was taken (newest first) when one fails.

A failed or timed-out attempt leaves nothing behind; the timeout covers the whole attempt.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING

from .._core.config import validate_timeout
from .._core.names import LockNames
from .._core.results import AcquireManyResult, AcquireResult
from ..errors import HybridLockError, LockLostError, LockNotOwnedError
from ._compat import (
    current_owner,
    monotonic,
    refuse_a_task_of_its_own,
    refuse_in_event_loop,
    returned_to_with,
    shielded,
)
from .lock import _NEEDS_SERVER, _TIMED_OUT, AsyncHybridLock, AsyncJavaStyleLock
from .observing import AcquireProbe, observe_acquire, observe_release
from .owners import Site, caller_frame, caller_site
from .scope import LossWatching, WatchedLease
from .waiting import acquire_remote

if TYPE_CHECKING:
    from .context import LockContext

__all__ = ["AsyncMultiLock"]


class AsyncMultiLock(AsyncJavaStyleLock, LossWatching):
    """Several registry locks taken and released as one. Reentrant per thread, like its parts."""

    def __init__(self, context: LockContext, locks: Iterable[AsyncHybridLock]) -> None:
        """Over ``locks`` (distinct keys of one registry, at least one: ``registry.obtain_many`` checks)."""
        # The global order: by server name, which is what every process sorts by too.
        self._locks: list[AsyncHybridLock] = sorted(locks, key=lambda lock: lock._names.lock)
        self._context = context
        self._atomic: bool | None = None  # whether the backend takes all keys in one step (asked at first use)
        self._observed_hold_starts: dict[object, float] | None = None  # (see ServerLease)

    @property
    def keys(self) -> list[str]:
        """The keys, in the order they are taken."""
        return [lock.key for lock in self._locks]

    @property
    def locks(self) -> list[AsyncHybridLock]:
        return list(self._locks)

    @property
    def hold_count(self) -> int:
        """How many times the current thread holds every key at once (0 when it does not hold them all)."""
        return min(lock.hold_count for lock in self._locks)

    async def locked(self) -> bool:
        """Whether anyone holds any of the keys (see ``HybridLock.locked``)."""
        for lock in self._locks:  # (any() cannot await; this asks no more keys than it must)
            if await lock.locked():
                return True
        return False

    @property
    def lost(self) -> bool:
        """True when the lease of any key was found lost while held (see ``HybridLock.lost``)."""
        return any(lock.lost for lock in self._locks)

    _loss_what = "multi-key lock"

    def _watched_leases(self) -> list[WatchedLease]:
        return list(self._locks)  # (until_lost() and ensure_held() watch every key's lease)

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take every key or none. Returns False (holding nothing new) when ``timeout`` runs out first. (On the thread
        side ``with locks.acquire(timeout=5):`` works too: see ``HybridLock.acquire``.)"""
        caller = caller_frame()
        return returned_to_with(self, await self._acquire_from(caller, blocking, timeout), caller)

    async def _acquire_from(self, caller: FrameType | None, blocking: bool, timeout: float) -> bool:
        wait = validate_timeout(blocking, timeout)
        refuse_in_event_loop(self.keys[0], self._context.server)
        deadline = None if wait is None else monotonic() + wait
        # Refuse before the first use asks the server anything (that would reconnect a closed registry's client).
        self._context.check_open(self.keys[0])
        if self._atomic is None:
            self._atomic = await self._context.backend.can_acquire_together([lock._names for lock in self._locks])
        me = current_owner()
        if min(lock._count if lock._owner == me else 0 for lock in self._locks):
            return await self._acquire(blocking, deadline)  # reentrant: only counts (and is not reported)
        refuse_a_task_of_its_own("multi-key lock", self.keys[0], self._context)
        site = caller_site(caller)
        observer = self._context.observer
        if observer is not None:
            start = monotonic()
            acquire = partial(self._acquire, blocking, deadline, site=site)
            return await observe_acquire(observer, self, ",".join(self.keys), "multi", current_owner(), start, acquire)
        return await self._acquire(blocking, deadline, site=site)

    async def _acquire(
        self, blocking: bool, deadline: float | None, probe: AcquireProbe | None = None, site: Site = None
    ) -> bool:
        if self._atomic:
            return await self._acquire_together(blocking, deadline, probe, site)
        return await self._acquire_in_order(blocking, deadline, probe, site)

    async def _acquire_together(
        self, blocking: bool, deadline: float | None, probe: AcquireProbe | None, site: Site
    ) -> bool:
        me = current_owner()
        entered: list[AsyncHybridLock] = []  # done locally: reentrant, or passed on with the server lease
        pending: list[AsyncHybridLock] = []  # local mutex held, server lock still to take
        done = False
        try:
            for lock in self._locks:
                state = await lock._enter_locally(me, blocking, deadline, site)
                if state == _TIMED_OUT:
                    return False
                (pending if state == _NEEDS_SERVER else entered).append(lock)
            if pending and not await self._take_in_server(pending, blocking, deadline, me, probe, site):
                return False
            done = True
        finally:
            if not done:  # timed out, refused, or interrupted: give back everything taken so far
                self._release_mutexes(pending)
                await shielded(partial(self._roll_back, entered, me))
        try:
            for lock in pending:
                await lock._listen_for_contention()
        except BaseException:
            # Held now, but interrupted before the caller could learn it: nobody would ever release it.
            await shielded(partial(self._roll_back, entered + pending, me))
            raise
        return True

    async def _take_in_server(
        self,
        pending: list[AsyncHybridLock],
        blocking: bool,
        deadline: float | None,
        me: object,
        probe: AcquireProbe | None,
        site: Site,
    ) -> bool:
        """One atomic attempt for all of ``pending`` at a time, waiting on whichever key blocks it. Every key's
        lease counts from when the granting attempt was sent (see ``ServerLease._begin_lease``)."""
        context = self._context
        names = [lock._names for lock in pending]
        outcome: list[AcquireManyResult] = []
        queued_for: set[int] = set()

        async def attempt() -> AcquireResult:
            # Until the reply is read, any key may have queued us: give_up() then leaves every queue.
            known = set(queued_for)
            if blocking:
                queued_for.update(range(len(names)))
            result = await context.backend.try_acquire_many(names, context.client_id, context.config.lease_ms, blocking)
            queued_for.intersection_update(known)
            outcome[:] = [result]
            if not result.acquired:
                queued_for.add(result.blocked_by)
            return AcquireResult(result.acquired, None, result.holder_ttl)

        def blocked_on() -> LockNames:
            return names[outcome[0].blocked_by]

        async def give_up() -> None:
            for index in sorted(queued_for):
                await context.backend.cancel_wait(names[index], context.client_id)

        async def undo() -> None:
            for lock_names in names:
                await context.backend.release(lock_names, context.client_id, notify=True)

        grant = await acquire_remote(
            context, names[0], blocking, deadline, attempt, blocked_on, give_up, undo, probe=probe
        )
        if grant is None:
            return False
        for lock, part in zip(pending, outcome[0].parts, strict=True):
            lock._start_tenancy(me, part.fencing_token, part.contended, grant.sent_at, site)
        return True

    @staticmethod
    def _release_mutexes(pending: list[AsyncHybridLock]) -> None:
        for lock in reversed(pending):
            lock._mutex.release()

    async def _acquire_in_order(
        self, blocking: bool, deadline: float | None, probe: AcquireProbe | None, site: Site
    ) -> bool:
        me = current_owner()
        taken: list[AsyncHybridLock] = []
        try:
            for lock in self._locks:
                # Each key as its own acquire would take it, but unreported: the observer hears of the whole.
                ok = await lock._acquire(me, blocking, deadline, probe, site)
                if not ok:
                    await self._roll_back(taken, me)
                    return False
                taken.append(lock)
        except BaseException:
            await shielded(partial(self._roll_back, taken, me))
            raise
        return True

    @staticmethod
    async def _roll_back(taken: list[AsyncHybridLock], me: object) -> None:
        for lock in reversed(taken):
            try:
                await lock._release_by(me)
            except HybridLockError:
                pass  # the attempt failed anyway; a part lost meanwhile has nothing left to give back

    async def release(self) -> None:
        """Release every key (newest first), then raise what went wrong: ``LockLostError`` if any key's lease was
        lost (whatever else failed), else the first error met."""
        not_held = [lock.key for lock in self._locks if not lock.is_held_by_current_task()]
        if not_held:
            # ``key`` names the first key not held, as a single lock's error names its key.
            raise LockNotOwnedError(
                f"cannot release keys this task does not hold: {not_held}",
                key=not_held[0],
                server=self._context.server,
            )
        me = current_owner()
        observer = self._context.observer
        if observer is not None and self.hold_count == 1:  # (a reentrant release is not reported)
            release = partial(self._release_all, me)
            await observe_release(observer, self, ",".join(self.keys), "multi", me, release)
            return
        await self._release_all(me)

    async def _release_all(self, me: object) -> None:
        async def release_all() -> HybridLockError | None:
            first_error: HybridLockError | None = None
            for lock in reversed(self._locks):
                try:
                    await lock._release_by(me)
                except HybridLockError as exc:
                    # A loss outranks an unreachable server: someone else may have held that key meanwhile.
                    if first_error is None or (
                        isinstance(exc, LockLostError) and not isinstance(first_error, LockLostError)
                    ):
                        first_error = exc
            return first_error

        # Shielded as a whole: a cancel between two keys' releases would leave the rest held.
        first_error = await shielded(release_all)
        if first_error is not None:
            raise first_error

    def is_held_by_current_task(self) -> bool:
        """Whether this task holds every key (no round trip)."""
        return all(lock.is_held_by_current_task() for lock in self._locks)

    def __repr__(self) -> str:
        held = "held by this task" if self.is_held_by_current_task() else "not held by this task"
        return f"<hybridlock.AsyncMultiLock {self.keys!r} {held}>"
