"""Lease retention: after the last local release, a registry may keep the server lease of a lock for a moment.

A loop that takes and releases the same key over and over pays two round trips per cycle for a lock nobody else
wants. With ``LockRegistry(retain_for=...)`` the final release keeps the server lease, marked idle in this
process, so the next acquire here costs no round trip. The lease goes back to the server when:

* ``retain_for`` seconds pass without a thread of this process taking the lock again;
* another owner fails to get the lock: its announcement reaches our subscription, and the retention ends at once
  (the owner, queued in the server, is woken by our release);
* the hand-off budget of the tenancy is spent (``handoff_limit`` / ``handoff_window``: retention is a hand-off to
  whichever thread of this process comes next);
* the registry is closed.

One ``RetentionReaper`` thread per registry ends retentions; it sleeps until the earliest deadline or until an
announcement pokes it, and ends a moment (``_IDLE_EXIT``) after nothing is retained any more; the next retention
starts it again. It never ends a retention a thread of this process has picked up again: it takes the
lock's local mutex without blocking, and only then gives the lease back (see ``HybridLock._end_retention``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import LockContext
    from .lock import HybridLock

__all__ = ["RetentionReaper"]

_BUSY_RETRY = 0.001  # seconds between attempts on a lock caught mid-release or mid-acquire
_IDLE_EXIT = 0.15  # seconds with nothing retained after which the thread ends (retain() starts a new one)

logger = logging.getLogger("hybridlock")


class RetentionReaper:
    # Lock order: the reaper's condition is never held while calling into a lock or the backend (the backend calls
    # poke() with its own lock held), except for _wanted_elsewhere(), which takes no lock.

    def __init__(self, context: LockContext) -> None:
        self._context = context
        self._cond = threading.Condition(threading.Lock())
        self._retained: dict[HybridLock, None] = {}  # an ordered set
        self._poked = False  # an announcement arrived: check the retained locks' watches
        self._changed = False  # retain() or poke() since the reaper last looked
        self._stopped = False
        self._thread: threading.Thread | None = None

    def retain(self, lock: HybridLock, until: float) -> bool:
        """Keep ``lock``'s lease idle until ``until`` (``time.monotonic()``), its holder releasing it locally
        right after; False (nothing changed) once the registry is closing: the holder must release in the
        server."""
        with self._cond:
            if self._stopped:
                return False
            lock._retained_until = until
            self._retained[lock] = None
            if lock._wanted_elsewhere():
                # Announced after the releasing thread looked, and poked before the lock was in our set: the count
                # is raised before the poke, so looking again here misses nothing.
                self._poked = True
            self._changed = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"hybridlock-retention-{self._context.config.registry_key}", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return True

    def poke(self) -> None:
        """Another owner announced it wants some lock: check the retained ones now (called by the backend, maybe
        with the backend's lock held: take nothing but our own condition)."""
        with self._cond:
            if self._retained:
                self._poked = self._changed = True
                self._cond.notify()

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._cond:
                if self._stopped:
                    return
                poked, self._poked, self._changed = self._poked, False, False
                candidates = list(self._retained)
            now = time.monotonic()
            due, done, deadlines = [], [], []
            for lock in candidates:
                until = lock._retained_until
                if until is None:
                    done.append(lock)  # a thread of this process took it again
                elif until <= now or (poked and lock._wanted_elsewhere()):
                    due.append(lock)
                else:
                    deadlines.append(until)
            with self._cond:
                for lock in done:
                    if lock._retained_until is None:  # not retained again meanwhile
                        self._retained.pop(lock, None)
                for lock in due:
                    self._retained.pop(lock, None)
            busy = [lock for lock in due if not self._end(lock)]
            with self._cond:
                for lock in busy:
                    # Caught mid-release or mid-acquire (see HybridLock._end_retention): look again in a moment.
                    self._retained[lock] = None
                    self._poked = True
                if self._stopped:
                    return
                if busy:
                    timeout: float | None = _BUSY_RETRY
                elif deadlines:
                    timeout = max(0.0, min(deadlines) - time.monotonic())
                elif self._retained:
                    timeout = None
                else:
                    # Nothing retained: end the thread after a while, so an unused registry is not kept alive by it.
                    idle_for = time.monotonic() - idle_since
                    if idle_for >= _IDLE_EXIT:
                        self._thread = None
                        return
                    timeout = _IDLE_EXIT - idle_for
                if not self._changed:
                    self._cond.wait(timeout)
                if self._retained:
                    idle_since = time.monotonic()

    def _end(self, lock: HybridLock) -> bool:
        try:
            return lock._end_retention()
        except Exception:
            # Never let one lock stop the thread: every other retained lease would then be kept (and renewed) for
            # good.
            logger.exception("hybridlock: ending the retention of %r failed", lock.key)
            return True

    def stop(self) -> None:
        """Give every retained lease back (the registry is closing) and end the thread."""
        with self._cond:
            self._stopped = True
            thread = self._thread
            self._cond.notify()
        # The thread first: a round of its own may be under way and put a busy lock back in the set.
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._cond:
            due = list(self._retained)
            self._retained.clear()
        for lock in due:
            for _ in range(1000):  # a busy lock settles within microseconds; give up after a second
                if self._end(lock):
                    break
                time.sleep(_BUSY_RETRY)
