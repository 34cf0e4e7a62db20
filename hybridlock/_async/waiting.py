"""The remote wait: take a server lock, waiting for a wake-up, the holder's lease end or a backoff, until a deadline.

Only the caller at the head of a key's local queue runs this (the others wait on the local mutex and cost the
server nothing). The waiting protocol that loses no wake-up is ``AsyncReleaseWatch``'s (note the epoch, try,
then wait only if the epoch is unchanged); how long each wait lasts is ``WaitPolicy``'s (``_core/policy.py``). A
blocking attempt that is refused holds a place in the server queue, which the wait keeper keeps alive while we
wait and which we leave when we give up.

A plain lock's wait on a server that grants (``AsyncLockBackend.grants``), in a registry whose renewer can extend
a lease, holds a place named after the wait (``grants.place_name``): whoever frees the lock while that place heads
the queue writes our owner id into the lock key, mints our token and pushes the grant to our box in the server; we
read it there (``await_grant``) and hold the lock. The grant's lease is provisional: it ends when our place would
have lapsed (``QUEUE_PLACE_KEEP_MS``, so a waiter that died just then holds nobody up for longer), or after our own
lease if sooner; we know a lower bound of both (``config.grant_valid_until``). Shorter than a lease renewed on
schedule ever has left, it is extended to our own lease at once, one round trip after the grant was read.
Other waits (several keys at once, the halves of a read-write lock, a server that cannot grant) are woken and take
the lock themselves.

Interrupted waits leave nothing behind: a caller cancelled (or, on threads, interrupted by ``KeyboardInterrupt``)
while an attempt was in flight may have been granted the lock by it, so the attempt's ``undo`` gives it back, and
a place in the queue is left (giving back a grant made to it meanwhile); both shielded from a second cancellation.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from .._core.config import CLOCK_RATE_MARGIN, QUEUE_PLACE_KEEP_MS, grant_valid_until
from .._core.names import LockNames
from .._core.results import AcquireResult
from .._protocol.grants import place_name as place_name_of
from ..errors import BackendUnavailableError, HybridLockError
from ._compat import Thunk, cancel_requests, monotonic, raise_swallowed_cancel, shielded
from .backends.base import AsyncReleaseWatch
from .observing import AcquireProbe
from .wait_keeper import WaitingPlace

if TYPE_CHECKING:
    from collections.abc import Callable

    from .context import LockContext

__all__ = ["Grant", "WaitHint", "acquire_remote", "contention_watch", "release_remote", "wanted_before_heard"]

logger = logging.getLogger("hybridlock.lock")


class Grant(NamedTuple):
    """A successful remote acquire: the attempt's result and when its request was sent."""

    result: AcquireResult
    #: ``monotonic()`` just before the granting attempt's request left: the server started the lease no earlier, so
    #: a lease counted from here errs early (the safe side), by at most that attempt's round trip. Not the start of
    #: the acquire: the local wait and the refused attempts before it are no part of the lease.
    sent_at: float
    #: For a lock granted to our place in the queue (see the module docstring): the ``monotonic()`` deadline before
    #: which its provisional lease certainly runs, which the renewer must extend; None for a lock we took ourselves
    #: (its lease counts from ``sent_at``).
    valid_until: float | None = None
    #: What the lock key holds while it is ours, where that is not our owner id alone: "<client_id>|<token>" for a
    #: lock granted to our place (see ``scripts.grant``); "" otherwise.
    tenancy: str = ""


#: How long a granted place lives past the last request that took or kept it (the provisional lease's first bound).
_PLACE_KEEP = QUEUE_PLACE_KEEP_MS / 1000.0


class WaitHint:
    """What one lock's last remote wait tells its next one, kept by the lock and read and written here only: whether
    to expect a wait (then a plain lock's first attempt waits for the grant in the same round trip, where the
    backend can: ``LockBackend.acquire_and_await``)."""

    __slots__ = ("expect_wait",)

    def __init__(self) -> None:
        self.expect_wait = False


#: How long the wait for a grant pipelined after a first attempt lasts (then the wait goes on, one BLPOP at a time):
#: long enough for a busy lock's queue to move on by a few owners, short enough that a cold script cache (which
#: makes the pop wait its whole timeout for nothing) costs little.
PIPELINED_WAIT = 0.1
#: A lock taken with less than this left of the lease we can show is ours (or half its lease, if that is less) has
#: its lease extended at once.
EXTEND_AT_ONCE = 0.5


_wait_ids = itertools.count(1)


def _new_wait_id() -> str:
    """A name for one wait's place, never used twice by an owner (a registry lives in one process; a forked child
    is another owner). It only tells an owner's waits apart, so that a grant to one that ended unread is not taken
    for the grant of the next: it need not be secret (only a write to the lock's keys grants anything)."""
    return f"{next(_wait_ids):x}"


async def acquire_remote(
    context: LockContext,
    names: LockNames,
    blocking: bool,
    deadline: float | None,
    attempt: Thunk[AcquireResult] | None = None,
    blocked_on: Callable[[], LockNames] | None = None,
    give_up: Thunk[None] | None = None,
    undo: Thunk[object] | None = None,
    queues: bool = True,
    probe: AcquireProbe | None = None,
    hint: WaitHint | None = None,
    on_watch: Callable[[AsyncReleaseWatch | None], None] | None = None,
) -> Grant | None:
    """Take the server lock, waiting (for a wake-up, the holder's lease end, or a backoff) until ``deadline``.

    ``attempt`` makes one try (default: the plain lock's). After a failed try, ``blocked_on()`` names the lock
    whose release to wait for (default: ``names``; a multi-key attempt is blocked by one key at a time).
    ``give_up()`` is called when a blocking wait ends without the lock, to leave the server's queue (default:
    the plain lock's queue). ``undo()`` gives back what an attempt interrupted in flight may have taken (default:
    the plain lock's release). ``queues``: a refused blocking attempt takes a place in the queue of the lock
    ``blocked_on()`` names (for the write half of a read-write lock, ``names`` is ``rw_names.write``), which
    the wait keeper keeps alive while this wait lasts; False for attempts that take none (readers). ``probe``
    (only when the registry has an observer) counts the attempts. ``hint``: the lock's ``WaitHint``, read and updated
    here. ``on_watch(watch)`` is told of each subscription the wait sleeps on (None once it no longer does), for a
    caller that may wake it (``AsyncReleaseWatch.poke``). Returns the successful result with the time its request
    was sent (``Grant``), or None when not blocking or out of time."""
    backend = context.backend
    # A plain lock's blocking wait on a server that grants: our place is named after this wait, and a release that
    # finds it at the head of the queue grants us the lock (see the module docstring).
    # (A provisional lease must be extended by the renewer: a registry without one, or without leases, is woken.)
    lease_ms = context.config.lease_ms
    grants = (
        attempt is None
        and blocking
        and backend.grants
        and context.config.lock_type == "pubsub"
        and lease_ms is not None
        and context.config.auto_renew
    )
    place_name = place_name_of(context.client_id, _new_wait_id(), lease_ms) if grants and lease_ms else None
    if attempt is None:

        async def attempt() -> AcquireResult:
            return await backend.try_acquire(names, context.client_id, context.config.lease_ms, blocking, place_name)

    if give_up is None:

        async def give_up() -> None:
            await backend.cancel_wait(names, context.client_id, place_name)

    if undo is None:

        async def undo() -> object:
            return await release_remote(context, names)

    cancels = cancel_requests()  # (see raise_swallowed_cancel)
    queued = False  # a refused blocking attempt put us in the server's queue
    in_flight = False  # an attempt was sent and its reply not yet read
    place: WaitingPlace | None = None  # kept alive by the wait keeper while we wait
    sent_at = 0.0  # when the latest attempt's request was sent (attempts run one at a time)
    grant_wait = _GrantWait(context, names, place_name) if place_name is not None else None
    # The first attempt waits for the grant in the same round trip when a wait is expected.
    pipelined = grant_wait is not None and hint is not None and hint.expect_wait and backend.pipelines_waits

    async def tracked_attempt() -> AcquireResult:
        nonlocal queued, place, in_flight, sent_at, pipelined
        if probe is not None:
            probe.attempt()
        in_flight = True
        sent_at = monotonic()
        if pipelined and grant_wait is not None:
            pipelined = False
            result = await grant_wait.attempt_and_wait(deadline)
        else:
            result = await attempt()
        raise_swallowed_cancel(cancels)  # (still in flight: what it took is given back)
        in_flight = False
        if grant_wait is not None and result.queued_at is not None:
            grant_wait.arrival = result.queued_at
        if blocking and not result.acquired:
            queued = True
            if queues:
                target = names if blocked_on is None else blocked_on()
                if place is None:
                    place = context.wait_keeper.begin(target, place_name)
                    if grant_wait is not None:
                        grant_wait.place = place
                else:
                    place.names = target
                # The attempt took or kept our place: it lapses no sooner than PLACE_KEEP after it was sent.
                place.kept(sent_at)
        return result

    try:
        result = await _wait_for_lock(
            context, names, blocking, deadline, tracked_attempt, blocked_on, grant_wait, on_watch
        )
        if result is not None:
            in_flight = True  # (taken, by an attempt or a grant: given back below if we were cancelled meanwhile)
            raise_swallowed_cancel(cancels)
            in_flight = False
    except BackendUnavailableError:
        raise  # the server is out of reach: what we may hold or hold a place in lapses by itself
    except BaseException:
        if in_flight:
            await shielded(partial(_quietly, undo))
        if queued or (in_flight and blocking):
            # A blocking attempt cut off in flight may have been refused and queued us without our reading it; a
            # grant to our place, read or not, is given back by leaving the queue.
            await shielded(partial(_quietly, give_up))
        raise
    finally:
        if place is not None:
            context.wait_keeper.end(place)
    granted_until = None if grant_wait is None else grant_wait.valid_until
    tenancy = ""
    if result is not None and granted_until is not None:
        # (A grant writes "<owner>|<token>" into the key: our renewals and release compare that, so a later grant
        # to a stale place of ours, after a failover, is never taken for this tenancy.)
        tenancy = f"{context.client_id}|{result.fencing_token}"
        names = replace(names, tenancy=tenancy)
        undo = partial(release_remote, context, names)
    try:
        return await _taken(
            context, names, result, grant_wait, granted_until, tenancy, sent_at, queued, give_up, undo, probe, hint
        )
    except BaseException:
        # Interrupted once taken (on threads, an exception a signal handler raises; a cancel at an await): what we
        # took is given back, else it would stay held by nobody.
        if result is not None:
            await shielded(partial(_quietly, undo))
        raise


async def _taken(
    context: LockContext,
    names: LockNames,
    result: AcquireResult | None,
    grant_wait: _GrantWait | None,
    granted_until: float | None,
    tenancy: str,
    sent_at: float,
    queued: bool,
    give_up: Thunk[object],
    undo: Thunk[object],
    probe: AcquireProbe | None,
    hint: WaitHint | None,
) -> Grant | None:
    """What ``acquire_remote`` does once the wait is over: ``result`` (None: not taken) as a ``Grant``, the lease
    extended at once where it is short."""
    if probe is not None and granted_until is not None:
        probe.attempt()  # the release that granted us the lock took it in the server for us: an attempt of ours
    if hint is not None:
        # Granted after a wait, or taken with others queued (or out of time): the next acquire will likely wait too.
        hint.expect_wait = result is None or granted_until is not None or result.contended
    if result is None:
        if queued:
            await shielded(partial(_quietly, give_up))
        return None
    config = context.config
    if grant_wait is not None and config.lease_ms is not None:
        left = (config.valid_until(sent_at) if granted_until is None else granted_until) - monotonic()
        if granted_until is not None:
            # Granted by a release: the lease is provisional (it ends when our place would have lapsed, at most
            # QUEUE_PLACE_KEEP_MS, so that a waiter that died just then holds the queue up no longer). Shorter than
            # what a lease renewed on schedule always has left (a lease less a renewal period), it is extended now, as
            # a renewal does: a holder granted the lock has the lease expire_after promises from one round trip
            # after it read the grant, as one that took it with its own attempt has.
            short = left < config.expire_after - config.renew_period
        else:
            # Taken, but with less left than we can show than a renewer's round may take to come: the granting
            # request was held up, by a stalled server for instance, for about the lease.
            short = left < min(EXTEND_AT_ONCE, config.lease_ms / 2000.0)
        if short:
            extended_at = await _extend_at_once(context, names, undo)
            if extended_at is not None:
                return Grant(result, extended_at, None, tenancy)
    return Grant(result, sent_at, granted_until, tenancy)


async def _extend_at_once(context: LockContext, names: LockNames, undo: Thunk[object]) -> float | None:
    """Renew a lease just granted; returns when the renewal was sent, or None when the lease had already ended (it
    is then reported lost as usual). Cut off, it gives the lock back."""
    lease_ms = context.config.lease_ms
    assert lease_ms is not None
    sent_at = monotonic()
    try:
        (kept,) = await context.backend.renew([names], context.client_id, lease_ms)
    except BaseException:
        await shielded(partial(_quietly, undo))
        raise
    return sent_at if kept else None


class _GrantWait:
    """Reads the grant of the lock to one wait's place (see the module docstring)."""

    def __init__(self, context: LockContext, names: LockNames, place_name: str) -> None:
        self._context = context
        self._names = names
        self._place_name = place_name
        self.place: WaitingPlace | None = None  # set once an attempt queued us
        #: When the server took our current place (its clock, ms), as its grant names it (from the attempt's reply).
        self.arrival: int | None = None
        #: Until when the lease of the grant read is certainly ours (None: none read).
        self.valid_until: float | None = None
        self._pending: AcquireResult | None = None  # what the pipelined attempt's wait read
        self._unread_since = -math.inf  # no grant was pushed to our box before this (see _looked)

    async def attempt_and_wait(self, deadline: float | None) -> AcquireResult:
        """The first attempt, and if refused a short wait for the grant in the same round trip (see
        ``LockBackend.acquire_and_await``), never past ``deadline``; what the wait read is returned by the next
        call."""
        context = self._context
        timeout = min(PIPELINED_WAIT, context.backend.grant_wait_limit)
        if deadline is not None:
            # Never past the deadline, even coming back late (see _await_grant).
            left, lateness = max(0.0, deadline - monotonic()), context.backend.grant_wait_lateness
            timeout = min(timeout, left - lateness if left >= lateness else left)
        sent_at = monotonic()
        result, self._pending = await context.backend.acquire_and_await(
            self._names, context.client_id, context.config.lease_ms, self._place_name, timeout
        )
        if not result.acquired and self._pending is None:
            self._looked(sent_at, timeout)
        return result

    def _looked(self, sent_at: float, timeout: float) -> None:
        """A look at our box sent at ``sent_at`` found it empty for its whole ``timeout`` (a blocking pop that came
        back empty; a plain pop is one of no time): any grant to come is pushed later than that, by the server's
        clock, whose rate may differ from ours by the drift margin's."""
        self._unread_since = max(self._unread_since, sent_at + timeout * (1 - CLOCK_RATE_MARGIN))

    async def __call__(self, timeout: float) -> AcquireResult | None:
        """Wait up to ``timeout`` for the grant (see ``LockBackend.await_grant``)."""
        context, place = self._context, self.place
        lease_ms = context.config.lease_ms
        assert place is not None  # (we wait for a grant only once an attempt queued us)
        assert lease_ms is not None  # (and only with a lease)
        result, self._pending = self._pending, None
        if result is None:
            if place.lost:
                return AcquireResult(False)  # our place is gone: nothing will be granted to it; attempt again
            timeout = min(timeout, context.backend.grant_wait_limit)
            sent_at = monotonic()
            result = await context.backend.await_grant(
                self._names, context.client_id, self._place_name, timeout, lease_ms, self.arrival
            )
            if result is None:
                self._looked(sent_at, timeout)
        if result is not None and result.acquired:
            if result.extended_at is not None:  # (already our own lease: confirmed with the replicas)
                self.valid_until = context.config.valid_until(result.extended_at)
            else:
                self.valid_until = grant_valid_until(place.kept_at, self._unread_since, lease_ms / 1000.0, _PLACE_KEEP)
        return result


async def _quietly(call: Thunk[object]) -> None:
    try:
        await call()
    except (HybridLockError, OSError, ValueError):
        # Best effort: a place left in the queue, or a lease, lapses by itself. (OSError, ValueError: a connection
        # the registry's close() shut under this call, which must not hide the error that made it.)
        pass


async def _wait_for_lock(
    context: LockContext,
    names: LockNames,
    blocking: bool,
    deadline: float | None,
    attempt: Thunk[AcquireResult],
    blocked_on: Callable[[], LockNames] | None,
    wait_for_grant: _GrantWait | None = None,
    on_watch: Callable[[AsyncReleaseWatch | None], None] | None = None,
) -> AcquireResult | None:
    backend = context.backend
    policy = context.config.wait_policy

    watch: AsyncReleaseWatch | None = None
    watching: str | None = None  # the channel ``watch`` listens on
    tries = 0
    notified_wakeup = False  # the last wait ended on a notification
    spurious = 0  # notified wake-ups in a row whose retry was refused
    try:
        while True:
            epoch_before = None if watch is None else watch.epoch()
            result = await attempt()
            if result.acquired:
                return result
            if not blocking:
                return None
            if wait_for_grant is not None and backend.grants:
                # Our place is granted the lock when it heads the queue and the lock is freed; nothing to listen to
                # but our box. Come back to attempt again at the holder's lease end (a holder that crashed frees
                # the lock without a release), or at notified_cap when its lease has no end.
                granted = await _await_grant(context, names, deadline, result.holder_ttl, wait_for_grant)
                if granted is not None and granted.acquired:
                    return granted
                if deadline is not None and monotonic() >= deadline:
                    return None
                continue
            spurious = spurious + 1 if notified_wakeup else 0
            notified_wakeup = False
            now = monotonic()
            if deadline is not None and now >= deadline:
                return None
            target = names if blocked_on is None else blocked_on()
            # (A wait for a grant that cannot read it polls: a release grants the lock without announcing it.)
            if context.config.lock_type == "pubsub" and wait_for_grant is None and watching != target.channel:
                if watch is not None:
                    watch.close()
                watch, watching = await backend.watch(target, context.client_id), target.channel
                if on_watch is not None:
                    on_watch(watch)
                if watch is not None:
                    # Subscribed now: try once more before sleeping, or a release that landed between the
                    # failed attempt and the subscription would never wake us.
                    continue
            epoch = None if watch is None else watch.epoch()
            if epoch is not None and epoch != epoch_before:
                continue  # the subscription came (back) up after that attempt: same reasoning, retry first
            notified = epoch is not None
            delay = policy.delay(tries, result.holder_ttl, notified)
            tries += 1
            if deadline is not None:
                delay = min(delay, deadline - now)
            if watch is not None:
                # Spurious wake-ups (faked announcements, or another owner got in first) back off as polling
                # does before the next notification is acted on: a flood costs at most the spin rate.
                pause = min(policy.pause_after_spurious(spurious, result.holder_ttl), delay)
                if pause > 0 and await context.closed.wait(pause):
                    context.check_open(names.key)
                # Also returns early when the subscription's state changes, or at once for a notification that
                # arrived during the pause.
                notified_wakeup = await watch.wait(delay - pause)
            else:
                await context.closed.wait(delay)
            context.check_open(names.key)
    finally:
        if watch is not None:
            if on_watch is not None:
                on_watch(None)
            watch.close()


async def _await_grant(
    context: LockContext,
    names: LockNames,
    deadline: float | None,
    holder_ttl: float | None,
    wait_for_grant: _GrantWait,
) -> AcquireResult | None:
    """Wait for a grant to our place (in slices the backend chooses, so that a closed registry is noticed soon),
    until ``deadline`` or the holder's lease end (``holder_ttl`` seconds from now; None: ``notified_cap``).
    Returns the grant; a refused result when the server says to attempt again now (a grant to an earlier wait of
    ours was found: the lock may be ours); None when the time is up (the caller attempts again, or gives up at its
    deadline)."""
    policy = context.config.wait_policy
    until = monotonic() + policy.delay(0, holder_ttl, notified=True)
    if deadline is not None:
        until = min(until, deadline)
    # A look at our box may come back this late past its timeout: a look that would end at ``until`` ends that
    # much sooner, and the rest is looked at with one that comes back on time.
    lateness = context.backend.grant_wait_lateness
    while True:
        left = until - monotonic()
        if left <= 0:
            return None
        granted = await wait_for_grant(left - lateness if left >= lateness else left)
        context.check_open(names.key)
        if granted is not None:
            return granted


#: How long a holder that keeps its lease between tenancies (``retain_for``) waits, at its first acquire, for the
#: server to confirm its subscription to the lock's announcements (about one round trip; a connection to make first
#: takes a few).
HEARD_WITHIN = 1.0


async def contention_watch(context: LockContext, names: LockNames) -> AsyncReleaseWatch | None:
    """A subscription that tells a holder passing the lock around (or keeping its lease idle) when another owner
    wants it. Returned once the server has confirmed it, or ``HEARD_WITHIN`` has passed: an owner that announced
    itself before then would go unheard, and the lease kept idle for it to wait out (until then the watch counts as
    contended, so nothing is kept)."""
    if context.config.lock_type != "pubsub":
        return None
    watch = await context.backend.watch(names, context.client_id)
    if watch is not None:
        await watch.heard(HEARD_WITHIN)
    return watch


async def wanted_before_heard(context: LockContext, names: LockNames, watch: AsyncReleaseWatch | None) -> bool:
    """Whether an owner wanted the lock before ``watch`` could hear its announcement, which then went to nobody: its
    place in the server's queue is what is left of it. Asked once per tenancy, when a holder starts to watch after
    its acquire (one round trip). False while the watch is unconfirmed: it counts as contended by itself then. True
    when the server cannot be asked: the lock is held already, and only keeping it idle (or passing it on) hangs on
    the answer, so assume the worst instead of failing an acquire or a release over it."""
    if watch is None or not await watch.heard(0):
        return False
    try:
        return await context.backend.has_waiters(names)
    except HybridLockError as exc:
        logger.debug("hybridlock: could not look at the queue of %r (taken as wanted): %s", names.key, exc)
        return True


async def release_remote(context: LockContext, names: LockNames) -> bool:
    """Release ``names.lock`` in the server if it is still ours, waking its next waiter."""
    return await context.backend.release(names, context.client_id, notify=True)
