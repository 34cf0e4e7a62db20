"""Lease retention: after the last local release, a registry may keep the server lease of a lock for a moment.

A loop that takes and releases the same key over and over pays two round trips per cycle for a lock nobody else
wants. With ``LockRegistry(retain_for=...)`` the final release keeps the server lease, marked idle in this
process, so the next acquire here costs no round trip. The lease goes back to the server when:

* ``retain_for`` seconds pass without a thread (or task) of this process taking the lock again;
* another owner fails to get the lock: its announcement reaches our subscription, and the retention ends at once
  (the owner, queued in the server, is woken by our release);
* the hand-off budget of the tenancy is spent (``handoff_limit`` / ``handoff_window``: retention is a hand-off to
  whichever thread of this process comes next);
* the registry is closed.

One ``RetentionReaper`` worker per registry (the ``AsyncWorker`` shim: a task of the registry's loop, a daemon
thread on the sync side) ends retentions; it sleeps until the earliest deadline or until an announcement pokes it,
and ends a moment (``_IDLE_EXIT``) after nothing is retained any more; the next retention starts it again. It never
ends a retention a thread of this process has picked up again: it takes the lock's local mutex without blocking, and
only then gives the lease back (see ``HybridLock._end_retention``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ._compat import AsyncWorker, monotonic, new_guard, sleep

if TYPE_CHECKING:
    from .roles import PieceContext

__all__ = ["RetainedLock", "RetentionReaper"]

_BUSY_RETRY = 0.001  # seconds between attempts on a lock caught mid-release or mid-acquire
_IDLE_EXIT = 0.15  # seconds with nothing retained after which the worker ends (retain() starts a new one)
# How long the worker sleeps with locks retained but no deadline among those it looked at: those were retained
# after its look, and retain() woke it, so this sleep is cut short at once. A bound, not a schedule.
_UNTIL_WOKEN = 3600.0
_STOP_TIMEOUT = 5.0  # seconds stop() waits for a round in progress

logger = logging.getLogger("hybridlock.retention")


class RetainedLock(Protocol):
    """What the reaper needs of a lock whose lease it keeps (``HybridLock``)."""

    _retained_until: float | None  # set by retain(); cleared by whoever takes the lock again or ends the retention

    @property
    def key(self) -> str: ...

    def _wanted_elsewhere(self) -> bool: ...

    # Takes the lock's local mutex without waiting, then sends the release: a coroutine on the async side.
    async def _end_retention(self) -> bool: ...


class RetentionReaper:
    """Ends the retentions of one registry's locks; see the module docstring.

    ``retain`` and ``poke`` are plain calls (a releasing lock calls the first; the backend's announcement listener
    the second), and never wait; ``stop`` waits for I/O (a coroutine on the async side)."""

    # Lock order: the reaper's guard is never held while calling into a lock or the backend (the backend calls
    # poke() with its own lock held), except for _wanted_elsewhere(), which takes no lock.

    def __init__(self, context: PieceContext) -> None:
        self._context = context
        self._guard = new_guard()
        self._retained: dict[RetainedLock, None] = {}  # an ordered set
        self._poked = False  # an announcement arrived: check the retained locks' watches
        self._stopped = False
        self._worker: AsyncWorker | None = None  # the latest worker (kept after it ends)
        self._live = False  # the worker will look at the retained set again (cleared when it decides to end)
        self._idle_since = 0.0  # since when the worker has seen nothing retained

    def retain(self, lock: RetainedLock, until: float) -> bool:
        """Keep ``lock``'s lease idle until ``until`` (``monotonic()``), its holder releasing it locally right
        after; False (nothing changed) once the registry is closing: the holder must release in the server."""
        with self._guard:
            if self._stopped:
                return False
            lock._retained_until = until
            self._retained[lock] = None
            if lock._wanted_elsewhere():
                # Announced after the releasing thread looked, and poked before the lock was in our set: the count
                # is raised before the poke, so looking again here misses nothing.
                self._poked = True
            worker = self._worker
            if worker is None or not self._live or not worker.running:
                # (not running although live: it ended on an error its step let through; start afresh.)
                self._idle_since = monotonic()
                worker = self._worker = AsyncWorker(
                    self._step, name=f"hybridlock-retention-{self._context.config.registry_key}"
                )
                self._live = True
                worker.start()
            else:
                worker.wake()
        return True

    def poke(self) -> None:
        """Another owner announced it wants some lock: check the retained ones now (called by the backend, maybe
        with the backend's lock held: take nothing but our own guard)."""
        with self._guard:
            if self._retained and self._worker is not None:
                self._poked = True
                self._worker.wake()

    async def _step(self) -> float | None:
        """The worker's body: end the retentions that are due, then how long to sleep (None: end)."""
        with self._guard:
            if self._stopped:
                return None
            if self._retained:
                self._idle_since = monotonic()
            poked, self._poked = self._poked, False
            candidates = list(self._retained)
        now = monotonic()
        due, done, deadlines = [], [], []
        for lock in candidates:
            until = lock._retained_until
            if until is None:
                done.append(lock)  # a thread of this process took it again
            elif until <= now or (poked and lock._wanted_elsewhere()):
                due.append(lock)
            else:
                deadlines.append(until)
        with self._guard:
            for lock in done:
                if lock._retained_until is None:  # not retained again meanwhile
                    self._retained.pop(lock, None)
            for lock in due:
                self._retained.pop(lock, None)
        busy = [lock for lock in due if not await self._end(lock)]
        with self._guard:
            for lock in busy:
                # Caught mid-release or mid-acquire (see HybridLock._end_retention): look again in a moment.
                self._retained[lock] = None
                self._poked = True
            if self._stopped:
                return None
            if busy:
                return _BUSY_RETRY
            if deadlines:
                return max(0.0, min(deadlines) - monotonic())
            if self._retained:
                return _UNTIL_WOKEN
            # Nothing retained: end the worker after a while, so an unused registry is not kept alive by it.
            idle_for = monotonic() - self._idle_since
            if idle_for >= _IDLE_EXIT:
                self._live = False  # from here on, retain() starts a new worker
                return None
            return _IDLE_EXIT - idle_for

    async def _end(self, lock: RetainedLock) -> bool:
        try:
            return await lock._end_retention()
        except Exception:
            # Never let one lock stop the worker: every other retained lease would then be kept (and renewed) for
            # good.
            logger.exception("hybridlock: ending the retention of %r failed", lock.key)
            return True

    async def stop(self) -> None:
        """Give every retained lease back (the registry is closing) and end the worker."""
        with self._guard:
            self._stopped = True
            worker = self._worker
        # The worker first: a round of its own may be under way and put a busy lock back in the set.
        if worker is not None:
            await worker.stop(timeout=_STOP_TIMEOUT)
        with self._guard:
            due = list(self._retained)
            self._retained.clear()
        for lock in due:
            for _ in range(1000):  # a busy lock settles within microseconds; give up after a second
                if await self._end(lock):
                    break
                await sleep(_BUSY_RETRY)
