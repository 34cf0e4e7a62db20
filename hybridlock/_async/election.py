"""AsyncLeaderElection: one leader at a time among the candidates that share a name, on the registry's lock.

A candidate is a background worker (a task here, a thread on the sync side) that takes the lock
``election:<name>`` with a blocking acquire (so it queues in the server and is woken as soon as the leader lets go
or its lease ends), holds it while it leads, and lets it go when it stops, yields or loses it. The registry's one
renewer keeps the lease; the lease's fencing token is the leader's **epoch**, which grows with every term, so
whatever the leader writes can be fenced against a deposed one. The worker owns the lock: every acquire and
release happens on it.

Failure modes
-------------
* The leader stops (``stop``, leaving the ``async with``) or yields: ``on_revoked`` runs, then the lock is
  released, which hands it at once to the candidate at the head of the server's queue. (A candidate waits in
  slices of ``CANDIDATE_SLICE`` and queues again at the back after each: among candidates that waited longer than
  that, the head is the one whose slice began first, not the one that has waited longest.)
* The leader's process dies: nobody renews the lease; the next candidate is elected when it ends (within
  ``expire_after``, plus the time the server takes to notice, plus one renewal period at most).
* Renewals fail (a partition, a server that is slow or failing over, a pause of this process): the leader steps
  down by its own clock, without waiting for any reply, once its lease has less than a sixth of ``expire_after``
  left (``valid_until`` minus that margin: the lease's deadline counts from when the renewal was *sent*, less a
  clock-drift margin, so it is never later than the server's). So ``on_revoked`` starts while the lease is still
  certainly ours in the server, and no other candidate can be elected before it has *started*; it must finish in
  that margin for the terms not to overlap. A renewal refused (the lease is already gone: someone deleted the key,
  a failover lost it) is reported at once, but another leader may already have been elected.
* This process is paused (SIGSTOP, a long GC, a VM migration) past its lease: nothing in it runs, so nothing can
  step down in time. What bounds it is ``valid_until``: ``is_leader`` reads the clock and says False from the
  lease's deadline on, so a leader that checks ``is_leader`` (or compares ``epoch``-fenced writes) before each side
  effect never acts beside its successor; ``on_revoked`` runs when the process resumes.
* A callback is user code and runs on the worker: while it runs, the worker cannot notice a loss. Keep them
  short; put long work in a task (thread) of your own that ``on_revoked`` stops, or in an
  ``election.until_lost()`` scope.

Work that must stop with the term: ``election.until_lost()`` and ``election.ensure_held()`` watch the current term
(a ``_Term``), as ``lock.until_lost()`` watches a lease (``scope.py``). The term ends, and tells the scopes watching
it, when its lease is found lost (from the renewer, before the worker hears of it) or as the worker begins to step
down for any reason (stop, yield, a lease not renewed in time, a failed ``on_elected``): before ``on_revoked`` runs.
"""

from __future__ import annotations

import logging
import math
import weakref
from typing import TYPE_CHECKING, Any

from ..errors import HybridLockError, InvalidArgumentError, LockLostError, LockNotOwnedError, RegistryClosedError
from ._compat import AsyncEvent, AsyncWorker, Thunk, current_owner, monotonic, new_guard, sleep
from .scope import LossWatching

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from .context import LockContext
    from .lock import AsyncHybridLock
    from .scope import WatchedLease

__all__ = ["AsyncLeaderElection", "election_key"]

logger = logging.getLogger("hybridlock.election")

#: How long a candidate's acquire waits in one go: it then looks whether it was asked to stop, and queues again.
#: (A thread blocked in an acquire cannot be interrupted, so this bounds how long ``stop`` waits for a candidate.)
CANDIDATE_SLICE = 1.0
#: How long a candidate waits before trying again after its server could not be reached.
RETRY_DELAY = 0.5
#: The longest the leader's worker sleeps in one go (a registry without expiry has no deadline to wake for).
_LONGEST_NAP = 3600.0

# The election running now for each lock (per registry and name): one candidate per name per registry, since two
# would pass the lease between them without a new term (a local hand-off keeps the fencing token).
_running: weakref.WeakKeyDictionary[Any, AsyncLeaderElection] = weakref.WeakKeyDictionary()
_running_guard = new_guard()


def _wake_on_loss(lock: object) -> None:
    """The lock's ``on_lost`` callback (one per lock, whichever election registered it first): wake the election
    running on it now, if any, to step down."""
    election = _running.get(lock)
    if election is not None:
        election._lost()


class _Term:
    """One term of a leader, as ``until_lost()`` scopes watch it (the ``WatchedLease`` calls of ``scope.py``): it
    ends once, when its lease is found lost or as the leader steps down, and then tells its watchers."""

    __slots__ = ("_ended", "_guard", "_listeners", "_lock", "why")

    def __init__(self, lock: AsyncHybridLock) -> None:
        self._lock = lock
        self._guard = new_guard()
        self._listeners: list[Callable[[], None]] = []
        self._ended = False
        self.why = ""

    @property
    def key(self) -> str:
        return self._lock.key

    @property
    def _context(self) -> LockContext:
        return self._lock._context

    @property
    def lost(self) -> bool:
        """Whether the term has ended (lost or stepped down): its work must stop."""
        return self._ended

    @property
    def _valid_until(self) -> float | None:
        return self._lock._valid_until

    def end(self, why: str) -> None:
        """End the term (once) and tell its watchers. From any thread; quick; never raises."""
        with self._guard:
            if self._ended:
                return
            self._ended = True
            self.why = why
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            try:
                listener()
            except Exception:  # (a scope's listener only signals; a broken one must not stop the others)
                logger.exception("hybridlock: a listener of the leader's term of %r failed", self.key)

    def _lease_lost(self) -> None:
        self.end("its lease was found lost: its key gone or another owner's at a renewal, or its valid_until passed")

    def _watch_loss(self, listener: Callable[[], None]) -> None:
        with self._guard:
            if not self._ended:
                self._listeners.append(listener)
                return
        listener()

    def _unwatch_loss(self, listener: Callable[[], None]) -> None:
        with self._guard:
            try:
                self._listeners.remove(listener)
            except ValueError:
                pass  # already called, or never watched


def election_key(name: str) -> str:
    """The lock key an election named ``name`` takes (shown by ``hybridlock inspect``/``list``)."""
    return f"election:{name}"


class AsyncLeaderElection(LossWatching):
    """A candidate for leadership of ``name`` among every registry (process) that runs one for the same name
    against the same server: ``registry.leader_election(name, on_elected=..., on_revoked=...)``.

    ``await start()`` enters the candidacy (a background task takes the lock when it can); ``await stop()``
    leaves it, handing leadership over at once if held; ``async with election:`` does both. While leading,
    ``is_leader`` is True and ``epoch`` is the term's fencing token (a number greater than every earlier term's);
    otherwise ``epoch`` is None.

    ``on_elected(epoch)`` and ``on_revoked()`` run on the candidate's worker (coroutine functions, awaited, on the
    asyncio side; plain callables on the thread side): ``on_elected`` when a term begins, ``on_revoked`` when it
    ends, whatever ends it (stop, ``yield_leadership``, a loss), always before the lock is released, so a successor
    is elected only after it has run (or, for a lost lease, after it has started; see the module docstring). Each
    term that calls ``on_elected`` calls ``on_revoked`` once. An exception from ``on_elected`` is logged and ends
    the term at once (``on_revoked`` runs, to undo what ``on_elected`` began, and the candidate sits out a renewal
    period before it tries again, as after ``yield_leadership``); one from ``on_revoked`` is logged and ignored (the
    term is over all the same).

    Work that must stop with the term: ``async with election.until_lost():``, entered while leading, cancels the work
    inside it as the term ends (its lease found lost, or the leader stepping down for any reason: stop, yield, a
    lease not renewed in time) and raises ``LockLostError`` out of it; ``election.ensure_held()`` raises
    ``LockLostError`` once the term's lease is lost or past its ``valid_until``. Both raise ``LockNotOwnedError``
    when this candidate does not lead (never elected, or its term already over). Any task (thread) of the process
    may use them: the term is the process's.

    Raises ``InvalidArgumentError`` for a registry that does not renew (``auto_renew=False``) and, at ``start``,
    for a second candidate of the same name in the same registry (a process is one candidate).
    """

    def __init__(
        self,
        registry: Any,
        name: str,
        on_elected: Callable[[int | None], Any] | None = None,
        on_revoked: Thunk[Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"an election needs a non-empty str name, not {name!r}")
        for what, callback in (("on_elected", on_elected), ("on_revoked", on_revoked)):
            if callback is not None and not callable(callback):
                raise InvalidArgumentError(f"{what} must be callable, not {callback!r}", key=election_key(name))
        config = registry._config
        if not config.auto_renew and config.lease is not None:
            raise InvalidArgumentError(
                "leader election needs a registry that renews its leases (auto_renew=True): a leader's lease would "
                "end under it",
                key=election_key(name),
                server=registry.server,
            )
        self.name = name
        self._registry = registry
        self._lock: AsyncHybridLock = registry.obtain(election_key(name))
        self._on_elected = on_elected
        self._on_revoked = on_revoked
        lease = config.lease
        # Step down when less than this is left of the lease with no renewal in (see the module docstring).
        self._margin = 0.0 if lease is None else lease / 6
        self._pause = 0.0 if lease is None else config.renew_period
        self._worker: AsyncWorker | None = None
        self._worker_owner: object = None  # the worker's task (thread), once it runs: it owns the lock
        self._ended = AsyncEvent()  # the worker has let go of everything and will do nothing more
        self._stopping = False
        self._yield_for: float | None = None  # asked to yield, and then to sit out this long
        # Whether it leads and whether a yield is asked for change together: a yield is asked for a term that is
        # still on, never left pending for the next one (a step-down by itself, racing the ask, serves it).
        self._yield_guard = new_guard()
        self._terms_ended = 0  # counts the terms over (their lock released), for yield_leadership to wait on
        self._leading = False
        self._term: _Term | None = None  # the current term, while leading
        self._epoch: int | None = None
        self._retry_at = 0.0  # a candidate does not try before this monotonic() time
        if _wake_on_loss not in self._lock._callbacks:  # (one per lock: elections come and go, the lock stays)
            self._lock.on_lost(_wake_on_loss)

    def __repr__(self) -> str:
        state = "stopped" if self._worker is None else f"leader (epoch {self._epoch})" if self._leading else "candidate"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    # -- what callers read -------------------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The lock key this election takes."""
        return self._lock.key

    @property
    def is_leader(self) -> bool:
        """Whether this candidate leads now: elected, not revoked, and its lease's ``valid_until`` still ahead by
        this process's clock (so it turns False as the deadline passes, before the worker has noticed)."""
        if not self._leading:
            return False
        until = self._lock.valid_until
        return until is not None and not self._lock.lost and monotonic() < until

    @property
    def epoch(self) -> int | None:
        """The current term's fencing token while this candidate leads (``is_leader``), else None. It is greater
        than the epoch of every earlier term of this election: pass it with each write the leader makes, and
        have the resource refuse a write with an epoch lower than one it has seen (see ``hybridlock.fencing``)."""
        return self._epoch if self.is_leader else None

    @property
    def valid_until(self) -> float | None:
        """The leader's lease deadline (``time.monotonic()``), as ``lock.valid_until``; None when not leading."""
        return self._lock.valid_until if self._leading else None

    @property
    def running(self) -> bool:
        """Whether the candidate's worker runs: from ``start()`` until it has ended (it let go of the lock after a
        ``stop()``, or its registry was closed)."""
        return self._worker is not None and not self._ended.is_set()

    # -- work that stops with the term (scope.py) ----------------------------------------------------------------

    _loss_what = "leadership"

    def is_held_by_current_task(self) -> bool:
        """Whether this candidate leads now (``is_leader``): the term is the process's, so any task (thread) may
        watch it."""
        return self.is_leader

    _held_by_a_task = False  # (any thread or task of the process may check the term)

    def _held_here(self) -> bool:
        return self._term is not None

    def _watched_leases(self) -> Sequence[WatchedLease]:
        term = self._term
        return () if term is None else (term,)

    def _not_held_error(self, call: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"{call} needs this candidate to lead election {self.name!r}, and it does not (never elected, or its term "
            "is over)",
            key=self.key,
            server=self._registry.server,
        )

    def _lost_in_scope_error(self, lease: WatchedLease) -> LockLostError:
        why = lease.why if isinstance(lease, _Term) else ""
        return LockLostError(
            f"the leader's term of election {self.name!r} ended while the work in its until_lost() scope ran "
            f"({why or 'its lease was lost'}): another candidate may lead now",
            key=self.key,
            server=self._registry.server,
        )

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Enter the candidacy: a background task waits for the lock and leads while it holds it. Returns at
        once (watch ``is_leader`` or ``on_elected``). Raises ``InvalidArgumentError`` if this election or another of
        the same name in this registry is running."""
        if self._registry.closed:
            raise RegistryClosedError("the registry is closed", key=self.key, server=self._registry.server)
        with _running_guard:
            other = _running.get(self._lock)
            if other is not None or (self._worker is not None and not self._ended.is_set()):
                raise InvalidArgumentError(
                    "an election of this name is already running in this registry: a process is one candidate "
                    "(stop it first)",
                    key=self.key,
                    server=self._registry.server,
                )
            _running[self._lock] = self
            self._worker = AsyncWorker(self._step, name=f"hybridlock-election-{self.name}")
        self._stopping = False
        self._ended.clear()
        self._retry_at = 0.0
        self._worker.start()

    async def stop(self) -> None:
        """Leave the candidacy; a leader hands over at once (``on_revoked`` runs, then the lock is released, waking
        the next candidate). Waits for the worker to end: a candidate waiting for the lock ends within about a
        second (``CANDIDATE_SLICE``), a leader once ``on_revoked`` returns. Called from a callback, it only asks
        (the worker ends once the callback returns). Idempotent."""
        worker = self._worker
        if worker is None:
            return
        self._stopping = True
        worker.wake()
        if current_owner() == self._worker_owner:
            return  # from a callback, on the worker itself: it ends when the callback returns
        await self._ended.wait()
        await worker.stop()
        with _running_guard:
            if _running.get(self._lock) is self:
                del _running[self._lock]
        self._worker = None

    async def yield_leadership(self, pause: float | None = None) -> None:
        """Hand leadership over now: ``on_revoked`` runs, the lock is released (the candidate at the head of the
        server's queue is elected at once), and this candidate does not try again for ``pause`` seconds (default: the
        registry's renewal period, a third of ``expire_after``), so that another one wins. Waits until the lock is
        released, except when called from a callback (then it happens once the callback returns). Does nothing when this
        candidate does not lead."""
        if pause is not None and (isinstance(pause, bool) or not isinstance(pause, (int, float)) or pause < 0):
            raise InvalidArgumentError(f"pause must be a non-negative number of seconds, not {pause!r}", key=self.key)
        worker = self._worker
        if worker is None:
            return
        with self._yield_guard:
            if not self._leading:
                return
            ended = self._terms_ended
            self._yield_for = self._pause if pause is None else float(pause)
        worker.wake()
        if current_owner() == self._worker_owner:
            return  # from a callback: the worker steps down once it returns
        while self._terms_ended == ended and not self._ended.is_set():
            await sleep(0.005)

    async def __aenter__(self) -> AsyncLeaderElection:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- the worker --------------------------------------------------------------------------------------------------

    def _lost(self) -> None:
        """The renewer found the lease lost: wake the worker to step down."""
        worker = self._worker
        if self._leading and worker is not None:
            worker.wake()

    async def _step(self) -> float | None:
        self._worker_owner = current_owner()
        try:
            if self._leading:
                return await self._lead()
            return await self._campaign()
        except Exception:
            # Nothing should get here (each step handles the errors it expects); if something does, the candidacy
            # ends, and must leave nothing held: a lock still renewed by nobody's worker would be a leader forever.
            logger.exception("hybridlock: election %r failed; it leaves the candidacy", self.name)
            try:
                await self._finish()
            finally:
                self._ended.set()
            return None

    async def _campaign(self) -> float | None:
        """One try for the lock, as a candidate; returns how long to wait before the next step."""
        if self._stopping:
            await self._finish()
            return None
        wait = self._retry_at - monotonic()
        if wait > 0:
            return wait
        try:
            acquired = await self._lock.acquire(timeout=CANDIDATE_SLICE)
        except RegistryClosedError:
            logger.warning("hybridlock: election %r ends: its registry was closed", self.name)
            await self._finish()
            return None
        except HybridLockError as exc:
            logger.warning("hybridlock: election %r could not reach its server, will try again: %s", self.name, exc)
            return RETRY_DELAY
        if not acquired:
            return 0.0
        if self._stopping:
            # Asked to stop while waiting: this term never began; let the next candidate have it.
            await self._let_go()
            return 0.0
        self._epoch = self._lock.fencing_token
        term = self._term = _Term(self._lock)
        self._lock._watch_loss(term._lease_lost)  # (told by whoever finds the loss, before the worker wakes)
        self._leading = True
        logger.info("hybridlock: elected leader of %r (epoch %s)", self.name, self._epoch)
        if self._on_elected is not None:
            try:
                await self._on_elected(self._epoch)
            except Exception:
                logger.exception("hybridlock: on_elected of election %r failed; the term ends", self.name)
                await self._step_down(self._pause, "its on_elected failed")
                return 0.0
        return 0.0

    async def _lead(self) -> float | None:
        """One look, as the leader: step down if asked to or if the lease is in doubt, else sleep until the
        moment it would be (an on_lost callback, ``stop`` and ``yield_leadership`` wake us sooner)."""
        if self._stopping:
            await self._step_down(0.0, "the candidate stopped")
            await self._finish()
            return None
        yield_for = self._yield_for
        if yield_for is not None:
            self._yield_for = None
            await self._step_down(yield_for, "the leader yielded")
            return 0.0
        lock = self._lock
        until = lock.valid_until
        if until is None or lock.lost:
            logger.warning("hybridlock: the leader of %r lost its lease; it steps down", self.name)
            await self._step_down(0.0, "its lease was found lost")
            return 0.0
        if math.isinf(until):
            return _LONGEST_NAP
        left = until - self._margin - monotonic()
        if left <= 0:
            logger.warning(
                "hybridlock: the leader of %r steps down: its lease was not renewed in time (ends in %.3f s)",
                self.name,
                until - monotonic(),
            )
            await self._step_down(0.0, "its lease was not renewed in time: the leader stepped down")
            return 0.0
        return min(left, _LONGEST_NAP)

    async def _step_down(self, pause: float, why: str) -> None:
        """End the term: tell its scopes, ``on_revoked``, then let the lock go; try again no sooner than ``pause``
        seconds."""
        with self._yield_guard:
            self._leading = False
            self._yield_for = None  # (a yield asked for now is served: this is the term it meant)
        term, self._term = self._term, None
        if term is not None:
            self._lock._unwatch_loss(term._lease_lost)
            term.end(why)  # (the work in its scopes is cancelled as on_revoked begins)
        epoch, self._epoch = self._epoch, None
        logger.info("hybridlock: leadership of %r (epoch %s) revoked", self.name, epoch)
        if self._on_revoked is not None:
            try:
                await self._on_revoked()
            except Exception:
                logger.exception("hybridlock: on_revoked of election %r failed (the term is over)", self.name)
        await self._let_go()
        self._retry_at = monotonic() + pause
        self._terms_ended += 1

    async def _let_go(self) -> None:
        """Release the lock in the server now (not kept for this process by ``retain_for``)."""
        lock = self._lock
        try:
            await lock.release()
        except LockLostError:
            pass  # already known: the term was ended for it
        except HybridLockError as exc:
            logger.warning(
                "hybridlock: election %r could not release its lock (it ends with its lease): %s", self.name, exc
            )
        if lock._retained_until is not None:
            # Kept idle for this process: the next term must be a new tenancy (a new epoch), and the other
            # candidates must not wait for the retention to end.
            try:
                await lock._end_retention()
            except HybridLockError as exc:
                logger.warning("hybridlock: election %r could not give back its lease: %s", self.name, exc)

    async def _finish(self) -> None:
        if self._leading:
            await self._step_down(0.0, "the candidacy ended")
        with _running_guard:
            if _running.get(self._lock) is self:
                del _running[self._lock]  # another election of this name may start now
        self._ended.set()
