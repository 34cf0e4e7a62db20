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
announcement pokes it. It never ends a retention a thread of this process has picked up again: it takes the
lock's local mutex without blocking, and only then gives the lease back (see ``HybridLock._end_retention``).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._lock import HybridLock
    from ._registry import LockRegistry

__all__ = ["RetentionReaper"]

_BUSY_RETRY = 0.001  # seconds


class RetentionReaper:
    def __init__(self, registry: LockRegistry) -> None:
        self._registry = registry
        self._cond = threading.Condition(threading.Lock())
        self._retained: dict[HybridLock, None] = {}  # an ordered set
        self._poked = False
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
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"hybridlock-retention-{self._registry.registry_key}", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return True

    def poke(self) -> None:
        """Another owner announced it wants some lock: check the retained ones now (called by the backend)."""
        with self._cond:
            if self._retained:
                self._poked = True
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                due = self._take_due_locked()
                while not due and not self._stopped:
                    deadlines = [until for lock in self._retained if (until := lock._retained_until) is not None]
                    timeout = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
                    self._cond.wait(timeout)
                    due = self._take_due_locked()
                if self._stopped and not due:
                    return
            busy = [lock for lock in due if not lock._end_retention()]
            if busy:
                # Caught mid-release or mid-acquire (see HybridLock._end_retention): look again in a moment.
                time.sleep(_BUSY_RETRY)
                with self._cond:
                    for lock in busy:
                        self._retained[lock] = None
                    self._poked = True

    def _take_due_locked(self) -> list[HybridLock]:
        """Retained locks whose retention must end now, removed from the set; also drops those picked up again."""
        if self._stopped:
            due = list(self._retained)
            self._retained.clear()
            return due
        poked, self._poked = self._poked, False
        now = time.monotonic()
        due = []
        for lock in list(self._retained):
            until = lock._retained_until
            if until is None:
                del self._retained[lock]  # a thread of this process took it again
            elif until <= now or (poked and lock._wanted_elsewhere()):
                del self._retained[lock]
                due.append(lock)
        return due

    def stop(self) -> None:
        """Give every retained lease back (the registry is closing) and end the thread."""
        with self._cond:
            self._stopped = True
            due = list(self._retained)
            self._retained.clear()
            thread = self._thread
            self._cond.notify()
        for lock in due:
            for _ in range(1000):  # a busy lock settles within microseconds; give up after a second
                if lock._end_retention():
                    break
                time.sleep(_BUSY_RETRY)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def after_fork_in_child(self) -> None:
        # The child holds none of its parent's leases, and the parent's thread does not exist here.
        self._cond = threading.Condition(threading.Lock())
        self._retained = {}
        self._poked = False
        self._thread = None
