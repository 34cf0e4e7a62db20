"""The remote wait: take a server lock, waiting for a wake-up, the holder's lease end or a backoff, until a deadline.

Only the caller at the head of a key's local queue runs this (the others wait on the local mutex and cost the
server nothing). The waiting protocol that loses no wake-up is ``AsyncReleaseWatch``'s (note the epoch, try,
then wait only if the epoch is unchanged); how long each wait lasts is ``WaitPolicy``'s (``_core/policy.py``). A
blocking attempt that is refused holds a place in the server queue, which the wait keeper keeps alive while we
wait and which we leave when we give up.

Interrupted waits leave nothing behind: a caller cancelled (or, on threads, interrupted by ``KeyboardInterrupt``)
while an attempt was in flight may have been granted the lock by it, so the attempt's ``undo`` gives it back, and
a place in the queue is left; both shielded from a second cancellation.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from .._core.names import LockNames
from .._core.results import AcquireResult
from ..errors import BackendUnavailableError, HybridLockError
from ._compat import Thunk, monotonic, shielded
from .backends.base import AsyncReleaseWatch
from .observing import AcquireProbe
from .wait_keeper import WaitingPlace

if TYPE_CHECKING:
    from collections.abc import Callable

    from .context import LockContext

__all__ = ["Grant", "acquire_remote", "contention_watch", "release_remote"]


class Grant(NamedTuple):
    """A successful remote acquire: the attempt's result and when its request was sent."""

    result: AcquireResult
    #: ``monotonic()`` just before the granting attempt's request left: the server started the lease no earlier, so
    #: a lease counted from here errs early (the safe side), by at most that attempt's round trip. Not the start of
    #: the acquire: the local wait and the refused attempts before it are no part of the lease.
    sent_at: float


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
) -> Grant | None:
    """Take the server lock, waiting (for a wake-up, the holder's lease end, or a backoff) until ``deadline``.

    ``attempt`` makes one try (default: the plain lock's). After a failed try, ``blocked_on()`` names the lock
    whose release to wait for (default: ``names``; a multi-key attempt is blocked by one key at a time).
    ``give_up()`` is called when a blocking wait ends without the lock, to leave the server's queue (default:
    the plain lock's queue). ``undo()`` gives back what an attempt interrupted in flight may have taken (default:
    the plain lock's release). ``queues``: a refused blocking attempt takes a place in the queue of the lock
    ``blocked_on()`` names (for the write half of a read-write lock, ``names`` is ``rw_names.write``), which
    the wait keeper keeps alive while this wait lasts; False for attempts that take none (readers). ``probe``
    (only when the registry has an observer) counts the attempts. Returns the successful result with the time its
    request was sent (``Grant``), or None when not blocking or out of time."""
    backend = context.backend
    if attempt is None:

        async def attempt() -> AcquireResult:
            return await backend.try_acquire(names, context.client_id, context.config.lease_ms, blocking)

    if give_up is None:

        async def give_up() -> None:
            await backend.cancel_wait(names, context.client_id)

    if undo is None:

        async def undo() -> object:
            return await release_remote(context, names)

    queued = False  # a refused blocking attempt put us in the server's queue
    in_flight = False  # an attempt was sent and its reply not yet read
    place: WaitingPlace | None = None  # kept alive by the wait keeper while we wait
    sent_at = 0.0  # when the latest attempt's request was sent (attempts run one at a time)

    async def tracked_attempt() -> AcquireResult:
        nonlocal queued, place, in_flight, sent_at
        if probe is not None:
            probe.attempt()
        in_flight = True
        sent_at = monotonic()
        result = await attempt()
        in_flight = False
        if blocking and not result.acquired:
            queued = True
            if queues:
                target = names if blocked_on is None else blocked_on()
                if place is None:
                    place = context.wait_keeper.begin(target)
                else:
                    place.names = target
        return result

    try:
        result = await _wait_for_lock(context, names, blocking, deadline, tracked_attempt, blocked_on)
    except BackendUnavailableError:
        raise  # the server is out of reach: what we may hold or hold a place in lapses by itself
    except BaseException:
        if in_flight:
            await shielded(partial(_quietly, undo))
        if queued or (in_flight and blocking):
            # A blocking attempt cut off in flight may have been refused and queued us without our reading it.
            await shielded(partial(_quietly, give_up))
        raise
    finally:
        if place is not None:
            context.wait_keeper.end(place)
    if result is None:
        if queued:
            await shielded(partial(_quietly, give_up))
        return None
    return Grant(result, sent_at)


async def _quietly(call: Thunk[object]) -> None:
    try:
        await call()
    except HybridLockError:
        pass  # best effort: a place left in the queue, or a lease, lapses by itself


async def _wait_for_lock(
    context: LockContext,
    names: LockNames,
    blocking: bool,
    deadline: float | None,
    attempt: Thunk[AcquireResult],
    blocked_on: Callable[[], LockNames] | None,
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
            spurious = spurious + 1 if notified_wakeup else 0
            notified_wakeup = False
            now = monotonic()
            if deadline is not None and now >= deadline:
                return None
            target = names if blocked_on is None else blocked_on()
            if context.config.lock_type == "pubsub" and watching != target.channel:
                if watch is not None:
                    watch.close()
                watch, watching = await backend.watch(target, context.client_id), target.channel
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
            watch.close()


async def contention_watch(context: LockContext, names: LockNames) -> AsyncReleaseWatch | None:
    """A subscription that tells a holder passing the lock around when another owner wants it."""
    if context.config.lock_type != "pubsub":
        return None
    return await context.backend.watch(names, context.client_id)


async def release_remote(context: LockContext, names: LockNames) -> bool:
    """Release ``names.lock`` in the server if it is still ours, waking its next waiter."""
    return await context.backend.release(names, context.client_id, notify=True)
