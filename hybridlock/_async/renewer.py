"""The lease renewer: one background worker per registry keeps every held lock's lease alive.

Every ``expire_after / 3`` seconds it renews all the locks the registry holds in one backend call (one round
trip on a single server, one per slot on a cluster), so 10,000 held locks cost what one does. A lock whose
renewal finds the key gone or another owner's is marked lost at once (``lock.lost``, its ``on_lost`` callbacks,
``LockLostError`` at release).

The worker is the ``AsyncWorker`` shim (a task of the registry's event loop; a daemon thread on the sync side):
it runs while there is a lease to renew and ends a moment after the last one is given back.

Failure modes
-------------
* A cluster node is out of reach while the others answer: the leases on the others are renewed, those on that
  node are treated as in a failed round (next bullet), and the round is retried as one.
* The server is unreachable, or the round fails in any other way (an error the client does not translate, a
  command a cluster client refuses, a bug): the failure is logged once per streak and the round retried at the
  next period, or just at the earliest ``valid_until`` if that comes first. The worker itself never ends on an
  error.
* Loss is a deadline, not a reply: the leases keep running out while a round is in flight, and a round can take
  as long as the client's socket timeout (a server cut off without a reset answers nothing). So a *deadline
  watch* (``AsyncAlarm``: a timer of the loop; a thread of its own on the sync side) wakes at the earliest
  ``valid_until`` of the held leases, whatever the worker is doing, and marks lost (``lost``, ``on_lost``,
  ``LockLostError`` at release) every lease whose ``valid_until`` has passed without a successful renewal,
  because another owner may have taken it by then. A reply that comes later for that tenancy changes nothing:
  a lease marked lost stays lost. The worker arms the watch before each round (it looks at every lease then
  anyway), so the acquire and release paths do nothing for it.
* The process is paused (GC, SIGSTOP) longer than the lease: nothing can renew; on resuming the renewal finds the
  keys gone or taken and reports the loss. Fencing tokens are the defence for the resource.
* ``max_hold``: locks held longer than that (since the server granted them: ``_acquired_at``) are no longer renewed
  and end with their lease.
* A lease with a bound of its own (``_hold_until``: ``run_once``'s ``at_most_for``) is renewed with the registry's
  lease until less than that is left before the bound, then (each round, on its own) with only what is left, so
  the server key ends at the bound (counted from when the renewal left) and the deadline watch reports it lost.
* A holder ends (its thread, or task) without releasing: its hold is no longer renewed and ends with its lease,
  released by this worker then (``owners.py``). So the worker also runs in a registry that renews nothing
  (``auto_renew=False``, every ``expire_after / 3``; ``LocalLockRegistry``, every second), only to look for those.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import BackendUnavailableError, HybridLockError, ReplicationNotConfirmedError
from ._compat import AsyncAlarm, AsyncWorker, monotonic, new_guard
from .owners import watch_owner

if TYPE_CHECKING:
    from .roles import HeldLease, RenewerContext

__all__ = ["LeaseRenewer"]

logger = logging.getLogger("hybridlock.renewer")

_IDLE_LINGER = 0.15  # seconds the worker waits, with nothing held, before it ends (a quick re-acquire reuses it)
_RETRY_MIN = 0.05  # seconds: the shortest wait before retrying a failed round
_STOP_TIMEOUT = 5.0  # seconds stop() waits for a round in progress (bounded by the client's socket timeout)
_DESCRIBE_AFTER = 1.0  # seconds into a new worker's first period at which it describes the holders
_WATCH_PERIOD = 1.0  # seconds between looks for holders that are gone, in a registry without leases (owners.py)
# A worker that only watches (nothing to renew) lingers longer: in a registry whose acquires cost microseconds
# (LocalLockRegistry), a thread started again at every acquire after a short pause would cost more than they do.
_WATCH_LINGER = 5.0


class LeaseRenewer:
    """Renews every lease of one registry, from one worker that runs while there is a lease to renew.

    The worker starts at the first lease (``ensure_started``), ends about ``_IDLE_LINGER`` seconds after the last
    one is given back (``nothing_held``), and starts again at the next. It never dies of an error: a round that
    fails, whatever the reason, is logged (once per streak of failures) and retried, and a lease that could not
    be renewed before its ``valid_until`` is reported lost to its holder like any other loss, as that deadline
    passes (the deadline watch, see the module docstring), not when the round gives up.

    ``ensure_started`` and ``nothing_held`` are plain calls that never wait (the lock makes them mid-acquire and
    mid-release); ``stop`` and ``renew_once`` wait for I/O (coroutines on the async side)."""

    def __init__(self, context: RenewerContext) -> None:
        self._context = context
        config = context.config
        # Whether it renews: else (auto_renew=False, or no leases at all) it only looks for holders that are gone.
        self._renews = config.auto_renew and config.lease is not None
        self._period = _WATCH_PERIOD if config.lease is None else config.renew_period
        self._abandoned_until: float | None = None  # the earliest end of an abandoned hold still held (owners.py)
        self._linger = _IDLE_LINGER if self._renews else _WATCH_LINGER
        self._linger_until = 0.0  # (monotonic) when a worker lingering with nothing held ends
        # (monotonic) when the registry last gave back its last lease: the worker ends only after a whole linger with
        # nothing held since, so that a process that takes a lock now and then (a prefork worker's turn in a busy
        # lock's queue) does not start a thread at every other acquire.
        self._emptied_at = 0.0
        self._guard = new_guard()
        # The latest worker (it stays here after it ends, until the next one starts).
        self._worker: AsyncWorker | None = None
        # Whether the worker will see a lease added now. Cleared (under the guard) *before* the worker's last look
        # at the registry's leases, so ensure_started() can read it without the guard: a lease added before that
        # look is seen by the worker, one added after finds False and starts a new worker.
        self._live = False
        self._stopped = False
        self._sleeping_with_leases = False  # nothing_held() must wake the worker, or it sleeps a whole period
        self._lingering = False  # the worker's last sleep began with nothing held
        self._round_due = False  # the worker's last sleep began with leases held: renew when it ends
        self._failing = False  # in a streak of failed rounds (logged once per streak)
        # A new worker describes the holders once, _DESCRIBE_AFTER into its first period (see describer.py).
        self._describe_pending = False
        self._describe_due = False
        self._delay = self._period  # until the next round
        # A lease that ends sooner than a period from its start (a grant's provisional lease): the next round must
        # come by this monotonic() time (None: at the period). Cleared as a round starts.
        self._due: float | None = None
        self._round_at = 0.0  # when the round the worker sleeps towards is planned (with _round_due)
        self._rescheduled = False  # the worker was woken only to plan its round earlier
        # The deadline watch: rings at the earliest valid_until of the held leases (see the module docstring).
        self._watch = AsyncAlarm(self._at_deadline, name=f"hybridlock-deadlines-{context.config.registry_key}")
        #: Completed renewal rounds and backend calls made (for statistics and benchmarks).
        self.rounds = 0

    def ensure_started(self) -> None:
        """A lease is now held (already in the registry's table): make sure a worker will renew it."""
        if self._live:
            return
        with self._guard:
            if not self._live and not self._stopped:
                self._lingering = self._round_due = False
                self._describe_pending = True
                self._describe_due = False
                self._worker = AsyncWorker(self._step, name=f"hybridlock-renewer-{self._context.config.registry_key}")
                self._live = True
                self._worker.start()

    def renew_before(self, deadline: float) -> None:
        """A lease just began that ends at ``deadline`` (``monotonic()``), sooner than the next round would come (a
        grant's provisional lease): plan a round for when a third of its time is used up, as rounds come every third
        of a lease, so that it is extended with two thirds of it still to run. A plain call that never waits."""
        now = monotonic()
        at = now + (deadline - now) / 3
        with self._guard:
            if self._due is not None and self._due <= at:
                return
            self._due = at
            if self._sleeping_with_leases and self._round_due and self._round_at > at and self._worker is not None:
                self._round_at = at
                self._rescheduled = True
                self._worker.wake()

    def nothing_held(self) -> None:
        """The registry's last lease was given back: let the worker end soon (it may be in a long sleep)."""
        self._emptied_at = monotonic()
        if self._sleeping_with_leases:
            with self._guard:
                if self._sleeping_with_leases and self._worker is not None:
                    self._sleeping_with_leases = False
                    self._worker.wake()

    async def stop(self) -> None:
        """End the worker (after the round in progress, if any) and start none again: the registry closes."""
        with self._guard:
            self._stopped = True
            worker = self._worker
        if worker is not None:
            await worker.stop(timeout=_STOP_TIMEOUT)
        await self._watch.stop(timeout=_STOP_TIMEOUT)

    def watch(self, until: float | None) -> None:
        """A held lease's ``valid_until`` was brought down to ``until`` (a shorter renewal by hand): make sure the
        deadline watch wakes by then. A plain call that never waits."""
        if until is not None and not self._stopped:
            self._watch.ring_by(until)

    def _arm_watch(self) -> None:
        """Make sure the deadline watch wakes by the earliest ``valid_until`` of the leases held now."""
        earliest: float | None = None
        for lock in self._context.leases.in_server():
            until = lock._valid_until
            if until is not None and not lock.lost and (earliest is None or until < earliest):
                earliest = until
        if earliest is not None:
            self._watch.ring_by(earliest)

    async def _at_deadline(self) -> float | None:
        """The deadline watch's ring: mark lost every lease whose ``valid_until`` has passed (without a successful
        renewal: one would have moved it), and return when to look again. Never raises."""
        try:
            now = monotonic()
            earliest: float | None = None
            leases = self._context.leases.in_server()
            for lock in leases:
                tenancy, until = lock._tenancy, lock._valid_until
                if until is None or lock.lost:
                    continue
                if until <= now:
                    await lock._mark_lost(tenancy)
                elif earliest is None or until < earliest:
                    earliest = until
        except Exception:
            # A bug here must not end the watch: look again a moment later.
            logger.exception("hybridlock: the deadline watch of registry %r failed", self._context.config.registry_key)
            return monotonic() + _RETRY_MIN
        if self._stopped:
            return None
        if earliest is None:
            # Nothing to watch right now. The worker arms the watch again before its next round; until then, look
            # now and then, in case the worker is held up in I/O while new leases are taken (soon, when nothing is
            # held at all: the worker is about to end, and cancels the watch as it does).
            return now + (self._period if leases else min(self._period, _IDLE_LINGER))
        return earliest

    async def _step(self) -> float | None:
        """The worker's body: a round if one is due, then how long to sleep (None: nothing held, end)."""
        with self._guard:
            # Awake: a release emptying the table from now on finds us looking (or about to), not asleep.
            self._sleeping_with_leases = False
            if self._rescheduled:
                # Woken only to bring the planned round forward (renew_before): sleep until its new time.
                self._rescheduled = False
                left = self._round_at - monotonic()
                if left > 0 and not self._stopped:
                    self._sleeping_with_leases = True
                    return left
        at_round, at_describe = self._round_due, self._describe_due
        self._round_due = self._describe_due = False
        if at_round:
            await self.renew_once()
        if (at_round or at_describe) and not self._failing and self._renews:
            if not at_round:
                # A new worker's first description comes before its first round, which arms the deadline watch: arm
                # it here, or a server gone silent would keep the holders untold until the description gives up.
                self._arm_watch()
            # Off the hot path: describe the holders for operators (describer.py); nothing is sent when nothing changed.
            # Not after a failed round: the description is best effort, and a call to a server (a cluster node) that
            # is out of reach would hold back the next renewal by a socket timeout.
            await self._context.describer.describe()
        leases = self._context.leases
        with self._guard:
            if self._stopped:
                self._watch.cancel()
                return None
            # Set before looking, so a release emptying the table after the look sees it and wakes us.
            self._sleeping_with_leases = True
            if not leases:
                self._sleeping_with_leases = False
                now = monotonic()
                if not self._lingering:
                    self._lingering = True
                    self._linger_until = now + self._linger
                elif now >= self._linger_until and self._emptied_at + self._linger > now:
                    # Leases came and went during the linger: linger on from the last one given back.
                    self._linger_until = self._emptied_at + self._linger
                elif now >= self._linger_until:
                    self._live = False  # from here on, a new lease starts a new worker (see __init__)
                    if not leases:
                        # The new worker arms the watch again at its first round (or a renewal by hand does).
                        self._watch.cancel()
                        return None
                    self._live = True
                # Looking again at least every period meanwhile: a lease taken during a long linger (a watching
                # worker's) is looked at a period later, not at the linger's end.
                return min(max(self._linger_until - now, 0.0), self._period)
            if self._lingering:
                # Every lease now held was taken during the linger, at most a linger ago: renew it a period
                # from now, not at once.
                self._lingering = False
                self._delay = self._period
            if self._describe_pending:
                self._describe_pending = False
                if self._delay > _DESCRIBE_AFTER and self._renews:
                    # A new worker: describe the holders a moment after their leases began (a hold shorter than
                    # that is never described, and costs the server nothing), then renew at the period as usual.
                    self._describe_due = True
                    self._delay -= _DESCRIBE_AFTER
                    return _DESCRIBE_AFTER
            self._round_due = True
            delay = self._delay
            if self._due is not None:
                delay = max(0.0, min(delay, self._due - monotonic()))
            self._round_at = monotonic() + delay
            return delay

    async def renew_once(self) -> None:
        """Renew every held lease once (the worker's body; also callable from tests). Never raises.

        A round that fails for any reason (the server is out of reach, the client refused a command, a bug) is
        logged once per streak of failures and retried at the next period, or sooner: just at the earliest
        ``valid_until``, so that a lease the failure keeps from being renewed is reported lost as it ends."""
        try:
            asked = await self._renew_all()
        except Exception as exc:
            if not self._failing:
                self._failing = True
                # An expected event (the server out of reach, a refusal): one line, its traceback only at DEBUG.
                # Anything else is a bug, and keeps its traceback.
                expected = isinstance(exc, HybridLockError)
                logger.warning(
                    "hybridlock: renewing the leases of registry %r on %s failed (%s: %s); retrying (logged once "
                    "until it works again)",
                    self._context.config.registry_key,
                    self._context.server,
                    type(exc).__name__,
                    " ".join(str(exc).split()),
                    exc_info=None if expected else exc,
                )
                if expected:
                    logger.debug("hybridlock: the failed renewal round's traceback", exc_info=exc)
            self._delay = self._soonest(self._retry_delay())
            return
        if asked and self._failing:
            self._failing = False
            logger.warning(
                "hybridlock: renewing the leases of registry %r on %s works again",
                self._context.config.registry_key,
                self._context.server,
            )
        self._delay = self._soonest(self._period)

    def _soonest(self, delay: float) -> float:
        """``delay``, or less when an abandoned hold's lease ends sooner (the worker ends it then)."""
        until = self._abandoned_until
        if until is None:
            return delay
        return min(delay, max(until - monotonic(), _RETRY_MIN))

    async def _renew_all(self) -> bool:
        """One round; returns whether it asked the server (False: nothing to renew)."""
        context = self._context
        with self._guard:
            self._due = None  # this round renews every lease held now; one granted from here on plans its own
        now = monotonic()
        max_hold = context.config.max_hold
        locks = []
        bounded: list[tuple[HeldLease, int]] = []  # leases whose bound comes within a lease: (lease, tenancy)
        lease = context.config.lease
        earliest: float | None = None
        abandoned_until: float | None = None
        for lock in context.leases.in_server():
            if await watch_owner(lock, context, now):
                # Its holders are gone: left to run out, then ended (owners.py).
                until = lock._valid_until
                if lock._abandoned and until is not None and (abandoned_until is None or until < abandoned_until):
                    abandoned_until = until
                continue
            if not self._renews:
                continue
            tenancy, acquired_at, valid_until = lock._tenancy, lock._acquired_at, lock._valid_until
            if lock.lost:
                continue
            if valid_until is not None and (earliest is None or valid_until < earliest):
                earliest = valid_until
            if max_hold is not None and acquired_at is not None and now - acquired_at >= max_hold:
                # No longer renewed; once its lease has certainly run out, the holder must hear it is lost.
                if valid_until is not None and valid_until <= now:
                    await lock._mark_lost(tenancy)
                continue
            hold_until = lock._hold_until
            if hold_until is not None and lease is not None and hold_until - now < lease:
                bounded.append((lock, tenancy))
                continue
            locks.append((lock, tenancy))
        if earliest is not None:
            # Before the round leaves: it may not come back before some of these deadlines.
            self._watch.ring_by(earliest)
        self._abandoned_until = abandoned_until
        for lock, tenancy in bounded:
            await self._renew_to_bound(lock, tenancy)
        lease_ms = context.config.lease_ms
        if not locks or lease_ms is None:  # (nothing to renew, or a registry whose leases never end)
            return False
        start = monotonic()
        try:
            flags = await context.backend.renew([lock._names for lock, _ in locks], context.client_id, lease_ms)
        except Exception as exc:
            verdicts = exc.renewed if isinstance(exc, ReplicationNotConfirmedError) else None
            if context.observer is not None:
                lost_count = verdicts.count(False) if verdicts is not None else 0
                context.observer.renewal(len(locks), 0, lost_count, monotonic() - start, exc)
            if verdicts is not None:
                # Not confirmed by the replicas, but the master answered: a lease it reported gone is lost now.
                for (lock, tenancy), alive in zip(locks, verdicts, strict=True):
                    if not alive:
                        await lock._mark_lost(tenancy)
            # Whatever the cause (an unreachable server, an untranslated client error): the leases keep running
            # out, and any that certainly ended is lost, because another owner may have taken the key by now.
            await self._mark_ended_lost(locks)
            raise
        self.rounds += 1
        unreached: list[tuple[HeldLease, int]] = []
        late: list[tuple[HeldLease, int]] = []
        for (lock, tenancy), renewed in zip(locks, flags, strict=True):
            if renewed:
                lock._renewed(tenancy, start)
                if lock.lost:
                    late.append((lock, tenancy))  # (renewed after its loss was told: given back below)
            elif renewed is None:
                unreached.append((lock, tenancy))  # its node or servers were out of reach: as for a failed round
            else:
                await lock._mark_lost(tenancy)
        for lock, tenancy in late:
            await lock._give_back_after_loss(tenancy)
        error: BackendUnavailableError | None = None
        if unreached:
            await self._mark_ended_lost(unreached)
            error = BackendUnavailableError(
                f"{len(unreached)} of {len(locks)} leases could not be renewed: their servers are out of reach",
                key=unreached[0][0].key,
                server=context.server,
            )
        if context.observer is not None:
            renewed_count = sum(1 for renewed in flags if renewed)
            lost_count = sum(1 for renewed in flags if renewed is False)
            context.observer.renewal(len(locks), renewed_count, lost_count, monotonic() - start, error)
        if error is not None:
            raise error
        return True

    async def _renew_to_bound(self, lock: HeldLease, tenancy: int) -> None:
        """Renew ``lock`` for the time left before its bound only (not at all under a millisecond), counted as the
        request leaves: the key then ends at the bound (later only by the request's one-way delay to the server),
        and the deadline watch reports the lease lost as its ``valid_until`` passes."""
        context = self._context
        hold_until = lock._hold_until
        lease = context.config.lease
        if hold_until is None or lease is None or not lock._is_current(tenancy):
            return  # (ended during the round: a new tenancy's bound, if any, is the next round's)
        start = monotonic()
        left = min(hold_until - start, lease)
        if left < 0.001:
            return
        try:
            (renewed,) = await context.backend.renew([lock._names], context.client_id, int(left * 1000))
        except Exception:
            # As for a failed round: the lease keeps running out, and is lost once it certainly has.
            logger.debug("hybridlock: could not renew %r up to its bound", lock.key, exc_info=True)
            renewed = None
        if renewed:
            lock._renewed(tenancy, start, left)
            await lock._give_back_after_loss(tenancy)  # (if renewed after its loss was told)
        elif renewed is None:
            await self._mark_ended_lost([(lock, tenancy)])
        else:
            await lock._mark_lost(tenancy)

    @staticmethod
    async def _mark_ended_lost(locks: list[tuple[HeldLease, int]]) -> None:
        after = monotonic()
        for lock, tenancy in locks:
            until = lock._valid_until
            if until is not None and until <= after:
                await lock._mark_lost(tenancy)

    def _retry_delay(self) -> float:
        """After a failed round: the next period, or the earliest ``valid_until`` if that comes first (at least
        ``_RETRY_MIN``, so a round that fails at once does not spin)."""
        now = monotonic()
        delay = self._period
        try:
            for lock in self._context.leases.in_server():
                until = lock._valid_until
                if until is not None and not lock.lost:
                    delay = min(delay, until - now)
        except Exception:  # a bug here must not end the worker either: fall back to the period
            logger.debug("hybridlock: could not compute the retry delay", exc_info=True)
        return max(delay, _RETRY_MIN)
