"""The wait keeper: one background worker per registry keeps the server-queue places of its live waiters.

A refused blocking attempt takes a place in the lock's server queue (or, for a writer of a read-write lock, a
record among its waiting writers) that lapses ``QUEUE_PLACE_KEEP_MS`` (3 s) later unless refreshed. That bound is
what stops a waiter that crashed from keeping a free lock from everyone: its place heads the queue for at most 3 s
more. A live waiter may wait much longer (for a holder's whole lease), so while at least one of this registry's
threads (or tasks) waits in the server, this worker refreshes every place the registry waits in, in one backend
call (one round trip per cluster slot), every ``REFRESH_INTERVAL`` seconds. A place is only refreshed while its
owner still holds it: one it left, took the lock from, or that lapsed is never brought back.

The worker (the ``AsyncWorker`` shim: a task of the registry's loop, a daemon thread on the sync side) starts when
the first wait begins and ends ``IDLE_LINGER`` seconds after the last one ends (after a refresh in flight, if any,
within the client's socket timeout), so an idle registry runs no worker here, and a process that waits again and
again (a prefork worker on a busy key waits on every cycle) does not start a thread per wait. Only the thread at the
head of a key's local queue waits in the server, so a registry has few places at a time.

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
import math
from typing import TYPE_CHECKING

from ..errors import HybridLockError
from ._compat import AsyncWorker, monotonic, new_guard

if TYPE_CHECKING:
    from .._core.names import LockNames
    from .roles import KeeperContext

__all__ = ["REFRESH_INTERVAL", "WaitKeeper", "WaitingPlace"]

logger = logging.getLogger("hybridlock.waiting")

#: Seconds between refreshes: a third of ``QUEUE_PLACE_KEEP_MS``, so one slow or failed refresh loses no place.
REFRESH_INTERVAL = 1.0
#: Seconds the worker stays after the last wait ended, for the next one.
IDLE_LINGER = 1.0
_STOP_TIMEOUT = 5.0  # seconds stop() waits for a refresh in flight


class WaitingPlace:
    """One wait in progress: the lock whose queue it holds a place in (it may move: a multi-key wait queues for
    whichever key blocks it), the place's name there (None: the owner's id), and since when it is known kept."""

    __slots__ = ("kept_at", "lost", "name", "names")

    def __init__(self, names: LockNames, name: str | None = None) -> None:
        self.names = names
        self.name = name
        #: ``monotonic()`` when the latest request that took or kept the place was sent (an attempt that queued us,
        #: or a refresh the server confirmed): the place lapses no sooner than ``QUEUE_PLACE_KEEP_MS`` after it.
        self.kept_at = -math.inf
        #: A refresh found the place gone (lapsed, its queue deleted, or granted the lock): the waiter should attempt
        #: again rather than wait for a grant or wake-up that may never come.
        self.lost = False

    def kept(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` took or kept the place."""
        if sent_at > self.kept_at:
            self.kept_at = sent_at
        self.lost = False


class WaitKeeper:
    """Keeps the places of a registry's waits in progress alive; see the module docstring.

    ``begin`` and ``end`` are plain calls that never wait (a waiter makes them around its wait); ``stop`` waits
    for I/O (a coroutine on the async side)."""

    def __init__(self, context: KeeperContext) -> None:
        self._context = context
        self._guard = new_guard()
        self._places: set[WaitingPlace] = set()
        self._worker: AsyncWorker | None = None  # the latest worker (kept after it ends)
        self._live = False  # a worker runs and will look at the places again (cleared when it decides to end)
        self._stopped = False
        self._next_refresh = 0.0  # monotonic(): when the worker refreshes next
        self._idle_since: float | None = None  # monotonic(): since when the worker has had no place to keep

    def begin(self, names: LockNames, name: str | None = None) -> WaitingPlace:
        """A wait now holds a place in ``names``'s queue (named ``name``; None: the owner's id); keep it until
        ``end``."""
        place = WaitingPlace(names, name)
        with self._guard:
            if self._stopped:
                return place
            first = not self._places
            self._places.add(place)
            if first:
                # The first refresh a whole interval from now: the place was just taken, fresh for 3 s.
                self._next_refresh = monotonic() + REFRESH_INTERVAL
            if not self._live:
                self._worker = AsyncWorker(self._step, name="hybridlock-wait-keeper")
                self._live = True
                self._worker.start()
        return place

    def end(self, place: WaitingPlace) -> None:
        """The wait is over (the lock taken, or given up): stop keeping its place. (The worker notices at its next
        step, and ends IDLE_LINGER later if no wait began meanwhile.)"""
        with self._guard:
            self._places.discard(place)

    async def stop(self) -> None:
        """The registry closes: keep nothing any more, and end the worker (after a refresh in flight, if any)."""
        with self._guard:
            self._stopped = True
            self._places.clear()
            worker = self._worker
        if worker is not None and await worker.stop(timeout=_STOP_TIMEOUT):
            with self._guard:
                self._live = False  # (it may have been stopped between two steps, before looking again)

    @property
    def running(self) -> bool:
        """Whether the keeper's worker runs: some wait of this registry holds a place in a server queue."""
        with self._guard:
            return self._live

    async def _step(self) -> float | None:
        """The worker's body: refresh the places if it is time, then how long to sleep (None: no wait left, end)."""
        with self._guard:
            now = monotonic()
            if not self._places:
                if self._idle_since is None:
                    self._idle_since = now
                linger = self._idle_since + IDLE_LINGER - now
                if linger > 0 and not self._stopped:
                    return linger
                self._idle_since = None
                self._live = False  # from here on, begin() starts a new worker
                return None
            self._idle_since = None
            wait = self._next_refresh - now
            if wait > 0:
                return wait  # a place taken since the last refresh is kept from its first interval on
            places = list({(place.names.queue, place.name): place for place in self._places}.values())
        context = self._context
        sent_at = monotonic()
        try:
            kept = await context.backend.keep_waiting(
                [place.names for place in places], context.client_id, [place.name for place in places]
            )
            for place, flag in zip(places, kept, strict=True):
                if flag:
                    place.kept(sent_at)
                elif place.kept_at < sent_at:  # (not taken again by an attempt meanwhile)
                    place.lost = True
        except HybridLockError:
            logger.debug("hybridlock: could not keep waiting places on %s", context.server, exc_info=True)
        except Exception:  # a bug must not end the worker while waits still count on it
            logger.exception("hybridlock: keeping waiting places on %s failed", context.server)
        # Off the hot path: say who waits, for operators (describer.py; nothing is sent unless it is due).
        await context.describer.describe()
        with self._guard:
            self._next_refresh = monotonic() + REFRESH_INTERVAL
        return REFRESH_INTERVAL
