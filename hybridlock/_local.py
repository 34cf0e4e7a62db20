"""The per-key local mutex: first come, first served among the threads of one process.

``threading.Lock`` lets a releasing thread take the lock straight back (barging), so under contention one thread
can wait for seconds while others cycle. Here a release hands the mutex directly to the longest-waiting thread,
so a thread's wait is bounded by the critical sections queued before it.
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["FifoMutex"]


class FifoMutex:
    """A non-reentrant mutex with FIFO hand-off; ``acquire(blocking, timeout)`` as ``threading.Lock``."""

    __slots__ = ("_guard", "_locked", "_waiters")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locked = False
        # One pre-acquired lock per waiting thread; releasing it hands the mutex over.
        self._waiters: deque[threading.Lock] = deque()

    @property
    def waiting(self) -> int:
        """How many threads are queued."""
        return len(self._waiters)

    def locked(self) -> bool:
        return self._locked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        with self._guard:
            if not self._locked:
                self._locked = True
                return True
            if not blocking:
                return False
            ticket = threading.Lock()
            ticket.acquire()
            self._waiters.append(ticket)
        try:
            if ticket.acquire(True, timeout):
                return True
        except BaseException:
            # Interrupted (KeyboardInterrupt, say): leave the queue, or pass on a hand-off that already came.
            if not self._abandon(ticket):
                self.release()
            raise
        return not self._abandon(ticket)

    def _abandon(self, ticket: threading.Lock) -> bool:
        """Leave the queue after a timeout or an interruption. Returns True if we left it, False if the mutex was
        handed to us in the meantime (we own it now: a timeout keeps it, a hair late; an interruption passes it
        on)."""
        with self._guard:
            try:
                self._waiters.remove(ticket)
            except ValueError:
                return False
            return True

    def pass_to_waiter(self) -> bool:
        """Hand the mutex to the longest-waiting thread if there is one (True); else keep it locked (False)."""
        with self._guard:
            if not self._waiters:
                return False
            self._waiters.popleft().release()
            return True

    def release(self) -> None:
        with self._guard:
            if not self._locked:
                raise RuntimeError("release of an unlocked FifoMutex")
            if self._waiters:
                self._waiters.popleft().release()  # ownership passes directly; _locked stays True
            else:
                self._locked = False
