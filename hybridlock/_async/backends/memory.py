"""An in-process lock server: the backend of ``LocalLockRegistry`` and of fast unit tests.

Two registries built on one ``AsyncMemoryBackend`` behave like two processes sharing one Redis server (each
registry has its own ``client_id``), which lets the lock logic be tested quickly without a server. Leases use
``time.monotonic()``; a lease of ``None`` never expires.

All state changes under one guard (``AsyncCondition``: a ``threading.Condition`` on the sync side, where threads
share the backend; nothing at all on the asyncio side, where a block with no ``await`` is already atomic), so no
method awaits anything but a watch's ``wait``. The asyncio backend serves the tasks of one event loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..._core.names import LockNames, ReadWriteNames, SemaphoreNames
from ..._core.results import PermitResult
from ..._protocol.scripts import MAX_PERMITS
from .._compat import AsyncCondition, monotonic
from .base import QUEUE_PLACE_KEEP_MS, AcquireManyResult, AcquireResult, AsyncLockBackend, AsyncReleaseWatch

__all__ = ["AsyncMemoryBackend"]

# How long a place in a queue (or a waiting writer's record) is kept, in seconds, as in the Redis scripts.
_PLACE_KEEP = QUEUE_PLACE_KEEP_MS / 1000.0


class _Entry:
    __slots__ = ("expires_at", "owner")

    def __init__(self, owner: str, expires_at: float | None) -> None:
        self.owner = owner
        self.expires_at = expires_at


class AsyncMemoryBackend(AsyncLockBackend):
    """Keeps locks in a dict guarded by one condition variable."""

    address = "memory"
    #: Fencing counters are kept for the backend's life (see ``__init__``).
    fence_retention = math.inf

    def __init__(self) -> None:
        # Not reentrant: no method calls another public one under it (try_acquire_many uses the helpers), and the
        # "wanted" listeners it calls under it take only locks of their own.
        self._cond = AsyncCondition()
        self._entries: dict[str, _Entry] = {}
        # Fencing counters are kept for the backend's life: an in-process store has no restart to survive.
        self._fences: dict[str, int] = {}
        # The queue of owners waiting for each plain lock: owner -> when its wish lapses, in arrival order.
        self._queues: dict[str, dict[str, float]] = {}
        # Per watched channel: releases for everyone, releases addressed to one owner, "wanted" announcements;
        # and how many watches use the channel (all dropped at zero).
        self._release_counts: dict[str, int] = {}
        self._addressed: dict[str, dict[str, int]] = {}
        self._wanted_counts: dict[str, int] = {}
        # Read-write locks: reader holds and waiting writers per lock, owner -> expiry (monotonic seconds).
        self._readers: dict[str, dict[str, float]] = {}
        self._writers_waiting: dict[str, dict[str, float]] = {}
        self._watchers: dict[str, int] = {}
        # Semaphores: config name -> [limit, span] (permits are entries named after their slots, as locks are).
        self._semaphores: dict[str, list[int]] = {}
        self._given_up: set[str] = set()  # tags of acquires given up while in flight (give_back_attempt)
        self._wanted_listeners: list[Callable[[], None]] = []

    def _live_entry(self, name: str, now: float) -> _Entry | None:
        entry = self._entries.get(name)
        if entry is not None and entry.expires_at is not None and entry.expires_at <= now:
            del self._entries[name]
            return None
        return entry

    def _queue(self, names: LockNames, now: float) -> dict[str, float]:
        queue = self._queues.setdefault(names.queue, {})
        for waiter, until in list(queue.items()):
            if until <= now:
                del queue[waiter]
        return queue

    def _blocked_for(self, names: LockNames, owner: str, now: float) -> float | None:
        """None if ``owner`` may take the lock now, else seconds to wait (inf: no expiry); see scripts.ACQUIRE."""
        entry = self._live_entry(names.lock, now)
        if entry is not None and entry.owner != owner:
            return float("inf") if entry.expires_at is None else max(0.0, entry.expires_at - now)
        if entry is None:
            queue = self._queue(names, now)
            first = next(iter(queue), None)
            if first is not None and first != owner:
                return queue[first] - now
        return None

    def _refuse(self, names: LockNames, owner: str, wait: float, now: float, queue: bool) -> AcquireResult:
        if queue:
            # Arrival order is the dict's order: a refreshed place keeps its position.
            self._queue(names, now)[owner] = now + _PLACE_KEEP
        self._announce_wanted(names.channel)
        return AcquireResult(False, None, None if wait == float("inf") else wait)

    def _take(self, names: LockNames, owner: str, lease_ms: int | None, now: float) -> AcquireResult:
        expires_at = None if lease_ms is None else now + lease_ms / 1000.0
        self._entries[names.lock] = _Entry(owner, expires_at)
        token = self._fences.get(names.fence, 0) + 1
        self._fences[names.fence] = token
        queue = self._queue(names, now)
        queue.pop(owner, None)
        return AcquireResult(True, token, None, bool(queue))

    async def try_acquire(
        self, names: LockNames, owner: str, lease_ms: int | None, queue: bool, place: str | None = None
    ) -> AcquireResult:
        now = monotonic()
        with self._cond:
            wait = self._blocked_for(names, owner, now)
            if wait is not None:
                return self._refuse(names, owner, wait, now, queue)
            return self._take(names, owner, lease_ms, now)

    async def can_acquire_together(self, names: Sequence[LockNames]) -> bool:
        return True

    async def try_acquire_many(
        self, names: Sequence[LockNames], owner: str, lease_ms: int | None, queue: bool
    ) -> AcquireManyResult:
        now = monotonic()
        with self._cond:  # one step, as the script is in Redis: check all, then take all
            for index, n in enumerate(names):
                wait = self._blocked_for(n, owner, now)
                if wait is not None:
                    refused = self._refuse(n, owner, wait, now, queue)
                    return AcquireManyResult(False, (), index, refused.holder_ttl)
            return AcquireManyResult(True, tuple(self._take(n, owner, lease_ms, now) for n in names))

    async def release(self, names: LockNames, owner: str, notify: bool) -> bool:
        now = monotonic()
        with self._cond:
            entry = self._live_entry(names.lock, now)
            if entry is None or entry.owner != owner:
                return False
            del self._entries[names.lock]
            if notify:
                self._announce_release(names.channel, next(iter(self._queue(names, now)), None))
            return True

    async def cancel_wait(self, names: LockNames, owner: str, place: str | None = None) -> None:
        now = monotonic()
        with self._cond:
            queue = self._queue(names, now)
            if queue.pop(owner, None) is not None and self._live_entry(names.lock, now) is None:
                self._announce_release(names.channel, next(iter(queue), None))

    async def keep_waiting(
        self, names: Sequence[LockNames], owner: str, places: Sequence[str | None] | None = None
    ) -> list[bool]:
        now = monotonic()
        kept = []
        with self._cond:
            for n in names:
                # A plain lock's queue, or (for the write half of a read-write lock) its waiting writers.
                held = self._queues.get(n.queue)
                if held is None:
                    held = self._writers_waiting.get(n.queue, {})
                ok = held.get(owner, 0.0) > now
                if ok:
                    held[owner] = now + _PLACE_KEEP
                kept.append(ok)
        return kept

    # Watches are keyed by channel, as in Redis: both halves of a read-write lock share one.
    def _announce_release(self, channel: str, to: str | None = None) -> None:
        """Wake the watches of ``channel``: all of them, or only ``to``'s (the queue's head)."""
        if channel not in self._release_counts:
            return
        if to is None:
            self._release_counts[channel] += 1
        else:
            addressed = self._addressed[channel]
            addressed[to] = addressed.get(to, 0) + 1
        self._cond.notify_all()

    def _announce_wanted(self, channel: str) -> None:
        if channel in self._wanted_counts:
            self._wanted_counts[channel] += 1
            for listener in self._wanted_listeners:
                listener()

    def after_fork_in_child(self) -> None:
        # Another thread of the parent may have held the condition's lock at fork time; the child starts with its
        # own (a copy of the store that only this process sees from now on).
        self._cond = AsyncCondition()

    def on_wanted(self, callback: Callable[[], None]) -> bool:
        with self._cond:
            self._wanted_listeners.append(callback)
        return True

    keeps_keys = True

    async def keep_for(self, names: LockNames, owner: str, marker: str, keep_ms: int) -> bool:
        now = monotonic()
        with self._cond:
            entry = self._live_entry(names.lock, now)
            if entry is None or entry.owner != owner:
                return False
            self._entries[names.lock] = _Entry(marker, now + keep_ms / 1000.0)
            return True

    async def renew(self, names: Sequence[LockNames], owner: str, lease_ms: int) -> list[bool]:
        now = monotonic()
        renewed = []
        with self._cond:
            for n in names:
                readers = self._readers.get(n.lock)
                if readers is not None:
                    ok = readers.get(owner, 0.0) > now
                    if ok:
                        readers[owner] = now + lease_ms / 1000.0
                    renewed.append(ok)
                    continue
                entry = self._live_entry(n.lock, now)
                # (A permit slot holds its tenancy, as in scripts.RENEW: only that tenancy is renewed.)
                ok = entry is not None and entry.owner == (getattr(n, "tenancy", "") or owner)
                if ok:
                    assert entry is not None
                    entry.expires_at = now + lease_ms / 1000.0
                renewed.append(ok)
        return renewed

    @staticmethod
    def _pruned(holds: dict[str, float], now: float) -> dict[str, float]:
        for owner, until in list(holds.items()):
            if until <= now:
                del holds[owner]
        return holds

    async def try_acquire_read(self, names: ReadWriteNames, owner: str, lease_ms: int | None) -> AcquireResult:
        now = monotonic()
        with self._cond:
            writer = self._live_entry(names.writer, now)
            if writer is not None and writer.owner != owner:
                return AcquireResult(False, None, None if writer.expires_at is None else writer.expires_at - now)
            waiting = self._pruned(self._writers_waiting.setdefault(names.writers_waiting, {}), now)
            others = {o: until for o, until in waiting.items() if o != owner}
            if writer is None and others:
                return AcquireResult(False, None, min(others.values()) - now)
            self._pruned(self._readers.setdefault(names.readers, {}), now)[owner] = _until(now, lease_ms)
            return AcquireResult(True)

    async def try_acquire_write(
        self, names: ReadWriteNames, owner: str, lease_ms: int | None, wait: bool
    ) -> AcquireResult:
        now = monotonic()
        with self._cond:
            writer = self._live_entry(names.writer, now)
            readers = self._pruned(self._readers.setdefault(names.readers, {}), now)
            blocked_for: float | None = None
            if writer is not None and writer.owner != owner:
                blocked_for = 3600.0 if writer.expires_at is None else writer.expires_at - now
            elif readers:
                blocked_for = min(readers.values()) - now
            waiting = self._pruned(self._writers_waiting.setdefault(names.writers_waiting, {}), now)
            if blocked_for is not None:
                if wait:
                    waiting[owner] = now + _PLACE_KEEP
                    self._announce_wanted(names.channel)
                return AcquireResult(False, None, blocked_for)
            waiting.pop(owner, None)
            self._entries[names.writer] = _Entry(owner, None if lease_ms is None else now + lease_ms / 1000.0)
            token = self._fences.get(names.fence, 0) + 1
            self._fences[names.fence] = token
            return AcquireResult(True, token)

    async def release_write(self, names: ReadWriteNames, owner: str) -> bool:
        with self._cond:
            entry = self._live_entry(names.writer, monotonic())
            if entry is None or entry.owner != owner:
                return False
            del self._entries[names.writer]
            self._announce_release(names.channel)
            return True

    async def release_read(self, names: ReadWriteNames, owner: str) -> bool:
        now = monotonic()
        with self._cond:
            readers = self._pruned(self._readers.setdefault(names.readers, {}), now)
            if readers.pop(owner, None) is None:
                return False
            if not readers:
                self._announce_release(names.channel)
            return True

    async def cancel_write_wait(self, names: ReadWriteNames, owner: str) -> None:
        with self._cond:
            if self._writers_waiting.get(names.writers_waiting, {}).pop(owner, None) is not None:
                self._announce_release(names.channel)

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
        with self._cond:  # as scripts.ACQUIRE_PERMIT
            return self._admit_permit(names, owner, lease_ms, permits, skip, place, tag, monotonic(), queue=True)

    def _admit_permit(
        self,
        names: SemaphoreNames,
        owner: str,
        lease_ms: int | None,
        permits: int,
        skip: Sequence[int],
        place: str | None,
        tag: str,
        now: float,
        queue: bool,
    ) -> PermitResult:
        """ACQUIRE_PERMIT's step, under ``self._cond``; ``queue``: whether a refused ``place`` takes or keeps its
        place (False for a transfer's attempt)."""
        if tag and tag in self._given_up:
            return PermitResult(False)
        limits = self._semaphores.setdefault(names.config, [permits, permits])
        limit, span = limits
        held, free, soonest, last = 0, None, None, -1
        for index in range(span):
            entry = self._live_entry(names.slot(index), now)
            if entry is None:
                if free is None and index < limit and index not in skip:
                    free = index
                continue
            held += 1
            last = index
            if entry.expires_at is not None and (soonest is None or entry.expires_at - now < soonest):
                soonest = entry.expires_at - now
        if span > limit and last < span - 1:
            limits[1] = max(limit, last + 1)
        # The queue (place -> lapse, in arrival order): with R permits free, only its first R live places may
        # take one; an attempt without a place counts as behind them all.
        waiting = self._queues.setdefault(names.queue, {})
        for waiter, until in list(waiting.items()):
            if until <= now:
                del waiting[waiter]
        rank = list(waiting).index(place) if place is not None and place in waiting else len(waiting)
        if held >= limit or free is None or rank >= limit - held:
            if place is not None and queue:
                waiting[place] = now + _PLACE_KEEP  # (a refreshed place keeps its position)
            return PermitResult(False, holder_ttl=soonest)
        if place is not None:
            waiting.pop(place, None)
        # (The slot holds the tenancy, the acquire's tag, as in scripts.ACQUIRE_PERMIT.)
        self._entries[names.slot(free)] = _Entry(tag or owner, None if lease_ms is None else now + lease_ms / 1000.0)
        token = self._fences.get(names.fence, 0) + 1
        self._fences[names.fence] = token
        return PermitResult(True, free, token)

    async def give_back_attempt(self, names: SemaphoreNames, owner: str, tag: str, lease_ms: int | None) -> bool:
        with self._cond:  # as scripts.GIVE_BACK_ATTEMPT (a mark that lives as long as the backend)
            now = monotonic()
            for index in range(self._semaphores.get(names.config, [MAX_PERMITS, MAX_PERMITS])[1]):
                entry = self._live_entry(names.slot(index), now)
                if entry is not None and entry.owner == tag:
                    del self._entries[names.slot(index)]
                    self._announce_release(names.channel)
                    return True
            self._given_up.add(tag)
            return False

    async def leave_permit_queue(self, names: SemaphoreNames, place: str) -> None:
        with self._cond:
            if self._queues.get(names.queue, {}).pop(place, None) is not None:
                self._announce_release(names.channel)

    async def release_permit(self, names: SemaphoreNames, slot: int, tenancy: str) -> bool:
        with self._cond:
            if not self._drop_permit(names, slot, tenancy):
                return False
            self._wake_permit_waiters(names, monotonic())
            return True

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
        with self._cond:  # as scripts.TRANSFER_PERMIT
            if not self._drop_permit(names, slot, tenancy):
                return False, PermitResult(False), -1
            now = monotonic()
            taken, index = PermitResult(False), -1
            for at, (place, tag) in enumerate(waiters):
                result = self._admit_permit(
                    names, tenancy.partition("|")[0], lease_ms, permits, skip, place, tag, now, queue=False
                )
                if result.acquired:
                    taken, index = PermitResult(True, result.slot, result.fencing_token), at
                    break
            self._wake_permit_waiters(names, now)
            return True, taken, index

    def _drop_permit(self, names: SemaphoreNames, slot: int, tenancy: str) -> bool:
        """Under ``self._cond``: end permit slot ``slot`` held under ``tenancy``; False if it was not."""
        entry = self._live_entry(names.slot(slot), monotonic())
        if entry is None or entry.owner != tenancy:
            return False
        del self._entries[names.slot(slot)]
        return True

    def _wake_permit_waiters(self, names: SemaphoreNames, now: float) -> None:
        """Under ``self._cond``: wake the owners of the first R live places, R the permits free (as
        scripts.RELEASE_PERMIT)."""
        limit, span = self._semaphores.get(names.config, [1, 1])
        room = limit - sum(1 for index in range(span) if self._live_entry(names.slot(index), now) is not None)
        live = [place for place, until in self._queues.get(names.queue, {}).items() if until > now]
        for owner in dict.fromkeys(place.partition("|")[0] for place in live[: max(room, 0)]):
            self._announce_release(names.channel, owner)
        if room > len(live):
            self._announce_release(names.channel)

    async def set_permits(self, names: SemaphoreNames, permits: int) -> int:
        with self._cond:
            limits = self._semaphores.get(names.config)
            old = 0 if limits is None else limits[0]
            span = permits if limits is None else max(limits[1], permits)
            self._semaphores[names.config] = [permits, span]
            self._announce_release(names.channel)
            return old

    async def is_locked(self, names: LockNames) -> bool:
        with self._cond:
            return self._live_entry(names.lock, monotonic()) is not None

    async def has_waiters(self, names: LockNames) -> bool:
        with self._cond:
            return bool(self._queue(names, monotonic()))

    async def is_read_locked(self, names: ReadWriteNames) -> bool:
        with self._cond:
            return bool(self._pruned(self._readers.get(names.readers, {}), monotonic()))

    def delete(self, names: LockNames) -> None:
        """Remove a lock whoever holds it: what an operator or an expiry does behind a holder's back (tests)."""
        with self._cond:
            self._entries.pop(names.lock, None)

    async def aclose(self) -> None:
        # A registry on this backend closed: wake every waiter so that its own ones notice (the others retry once
        # and wait again).
        with self._cond:
            for channel in self._release_counts:
                self._release_counts[channel] += 1
            self._cond.notify_all()

    async def watch(self, names: LockNames, owner: str) -> AsyncReleaseWatch:
        return _MemoryWatch(self, names.channel, owner)


class _MemoryWatch(AsyncReleaseWatch):
    def __init__(self, backend: AsyncMemoryBackend, channel: str, owner: str) -> None:
        self._backend = backend
        self._channel = channel
        self._owner = owner
        self._closed = False
        self._poked = False  # (see poke)
        with backend._cond:
            backend._watchers[channel] = backend._watchers.get(channel, 0) + 1
            backend._release_counts.setdefault(channel, 0)
            backend._addressed.setdefault(channel, {})
            backend._wanted_counts.setdefault(channel, 0)
            self._seen = self._releases()
            self._wanted_seen = backend._wanted_counts[channel]

    def _releases(self) -> tuple[int, int]:
        backend = self._backend
        return backend._release_counts[self._channel], backend._addressed[self._channel].get(self._owner, 0)

    def epoch(self) -> int | None:
        return 0  # an in-process notification cannot be lost

    def contended(self) -> bool:
        # No lock: asked at every local hand-off and by the retention reaper, which must never wait for the
        # backend's lock (the backend calls the reaper's poke() while holding it). One dict read is atomic; a
        # channel dropped by close() reads as unchanged.
        return self._backend._wanted_counts.get(self._channel, self._wanted_seen) != self._wanted_seen

    async def wait(self, timeout: float) -> bool:
        with self._backend._cond:
            await self._backend._cond.wait_for(lambda: self._poked or self._releases() != self._seen, timeout)
            current = self._releases()
            woken, self._seen = self._poked or current != self._seen, current
            self._poked = False
            return woken

    pokes = True

    def poke(self) -> None:
        with self._backend._cond:
            self._poked = True
            self._backend._cond.notify_all()

    def close(self) -> None:
        backend = self._backend
        with backend._cond:
            if self._closed:
                return
            self._closed = True
            left = backend._watchers[self._channel] - 1
            if left:
                backend._watchers[self._channel] = left
            else:
                del backend._watchers[self._channel]
                del backend._release_counts[self._channel]
                del backend._addressed[self._channel]
                del backend._wanted_counts[self._channel]


def _until(now: float, lease_ms: int | None) -> float:
    """When a hold taken at ``now`` for ``lease_ms`` ends (inf: a registry without expiry, LocalLockRegistry)."""
    return float("inf") if lease_ms is None else now + lease_ms / 1000.0
