"""The wait keeper: one background thread per registry keeps the server-queue places of its live waiters.

A refused blocking attempt takes a place in the lock's server queue (or, for a writer of a read-write lock, a
record among its waiting writers) that lapses ``QUEUE_PLACE_KEEP_MS`` (3 s) later unless refreshed. That bound is
what stops a waiter that crashed from keeping a free lock from everyone: its place heads the queue for at most 3 s
more. A live waiter may wait much longer (for a holder's whole lease), so while at least one of this registry's
threads waits in the server, this thread refreshes every place the registry waits in, in one backend call (one
round trip per cluster slot), every ``REFRESH_INTERVAL`` seconds. A place is only refreshed while its owner still
holds it: one it left, took the lock from, or that lapsed is never brought back.

The thread starts when the first wait begins and ends when the last one ends (within a moment: ending a wait
wakes it; a refresh in flight finishes first, within the client's socket timeout), so an idle registry runs no
thread here. Only the thread at the head of a key's local queue waits in the server, so a registry has few
places at a time.

Failure modes
-------------
* A refresh cannot reach the server (down, slow, partitioned): it is logged at debug level and tried again at
  the next interval. Places not refreshed within 3 s lapse; the waiter does not notice at once, and takes a new
  place, at the back of the queue, at its next attempt (when woken, or at the latest when the holder's lease it
  was told ends or the notified wait's cap passes). Its wait is then longer; nothing is held up or lost.
* The process is paused (GC, SIGSTOP) for more than 3 s: the same; the lock goes to the next in line meanwhile.
* The process crashes: nothing refreshes its places, which lapse within 3 s.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .._core.names import LockNames
from ..errors import HybridLockError

if TYPE_CHECKING:
    from .context import LockContext

__all__ = ["REFRESH_INTERVAL", "WaitKeeper", "WaitingPlace"]

logger = logging.getLogger("hybridlock")

#: Seconds between refreshes: a third of ``QUEUE_PLACE_KEEP_MS``, so one slow or failed refresh loses no place.
REFRESH_INTERVAL = 1.0


class WaitingPlace:
    """One wait in progress: the lock whose queue it holds a place in (it may move: a multi-key wait queues for
    whichever key blocks it)."""

    __slots__ = ("names",)

    def __init__(self, names: LockNames) -> None:
        self.names = names


class WaitKeeper:
    """Keeps the places of a registry's waits in progress alive; see the module docstring."""

    def __init__(self, context: LockContext) -> None:
        self._context = context
        self._init_state()

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._places: set[WaitingPlace] = set()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def begin(self, names: LockNames) -> WaitingPlace:
        """A wait now holds a place in ``names``'s queue; keep it until ``end``."""
        place = WaitingPlace(names)
        with self._cond:
            if self._stopped:
                return place
            self._places.add(place)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hybridlock-wait-keeper", daemon=True)
                self._thread.start()
        return place

    def end(self, place: WaitingPlace) -> None:
        """The wait is over (the lock taken, or given up): stop keeping its place."""
        with self._cond:
            self._places.discard(place)
            if not self._places:
                self._cond.notify_all()

    def stop(self) -> None:
        """The registry closes: keep nothing any more, and let the thread end."""
        with self._cond:
            self._stopped = True
            self._places.clear()
            self._cond.notify_all()

    @property
    def running(self) -> bool:
        """Whether the keeper thread is alive (for tests)."""
        with self._cond:
            return self._thread is not None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: not self._places, REFRESH_INTERVAL)
                if not self._places:
                    self._thread = None
                    return
                names = list({place.names.queue: place.names for place in self._places}.values())
            context = self._context
            try:
                context.backend.keep_waiting(names, context.client_id)
            except HybridLockError:
                logger.debug("hybridlock: could not keep waiting places on %s", context.server, exc_info=True)
            except Exception:  # a bug must not end the thread while waits still count on it
                logger.exception("hybridlock: keeping waiting places on %s failed", context.server)
