"""AsyncSemaphore: at most N holders at once across every process, each permit a lease of its own.

Obtain it from a registry (``registry.obtain_semaphore(key, permits=N)``). Each ``acquire`` takes one permit in the
server for the calling task: a permit slot key holding this registry's ``client_id`` with the registry's lease as
its TTL (see ``hybridlock._core.names`` and ``scripts.ACQUIRE_PERMIT``), with a fencing token minted from the key's
counter. To the registry a permit is one more held lease (``_Permit``): the one renewer renews it, loss is reported
as for a lock (``lost``, ``on_lost``, ``LockLostError`` at release), ``close()`` warns about it, and a holder that
ends without releasing has its permit left to run out.

Each permit belongs to the task that took it (a task may take several, as with ``threading.Semaphore``), but the
tasks of a process share its permits without a round trip of their own where it is safe: a release made while other
tasks here wait gives the permit back and, in the same round trip, takes it for the first of them the server's own
rule admits (``_hand_over``, ``scripts.TRANSFER_PERMIT``), so fairness across processes and the limit hold as for
their own attempts; only a permit still free after that wakes anyone. Waiters are served in
arrival order across processes: a blocking attempt that is refused takes a place in the semaphore's queue in the
server, and with R permits free only the first R places may take one (an attempt without a place, a non-blocking
one, counts as behind them all), so a stream of newcomers cannot starve a waiter. A waiter then waits for a
release's announcement on the semaphore's channel (or polls with the lock's backoff), and attempts again at least
every ``_PLACE_REFRESH`` seconds, which keeps its place (a place lapses ``QUEUE_PLACE_KEEP_MS`` after the attempt
that kept it: a waiter that died holds nobody up for longer); one that gives up leaves the queue.

Failure modes
-------------
* A holder's process dies (SIGKILL) or is paused longer than the lease: its permit is not renewed and its slot key
  expires within ``expire_after``; the next acquire finds the slot free. A paused holder learns at its next renewal
  or release that the permit is lost.
* A permit's slot key is deleted or evicted while held: the renewer finds it gone and reports the loss (``lost``,
  ``on_lost``); its ``release`` raises ``LockLostError``. Another owner may hold that permit meanwhile.
* The limit is lowered (``set_permits``) below the permits held: none is revoked; they stay valid and renewed until
  released, and no permit is given out until fewer than the new limit are held.
* A waiter that gives up (out of time, cancelled) while a release here attempts for it: the release gives back the
  permit it took for it as soon as it hears (a waiter makes no attempt of its own meanwhile, so it is never granted
  two). If the release's request fails, what it may have taken under the waiter's tag is given back the same way as
  an interrupted attempt's (below), and the waiter goes on under a new tag.
* An acquire interrupted (cancelled; ``KeyboardInterrupt`` on threads) while its attempt was in flight may have been
  granted a permit it never learns of: each acquire is tagged, the tag is written beside the permit it is granted,
  and the interrupted acquire gives back the permit of its tag, or marks the tag given up so that the attempt takes
  nothing if it reaches the server later (``scripts.GIVE_BACK_ATTEMPT``). If the server cannot be reached for that,
  the permit is not renewed and lapses within ``expire_after``.
"""

from __future__ import annotations

import itertools
import logging
import math
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._core.config import QUEUE_PLACE_KEEP_MS, validate_timeout
from .._core.names import LockNames, SemaphoreNames
from .._core.results import AcquireResult, PermitResult
from .._protocol.scripts import MAX_PERMITS
from ..errors import HybridLockError, InvalidArgumentError, LockNotOwnedError, LockTimeoutError
from ._compat import (
    AsyncEvent,
    asking_owner,
    current_owner,
    monotonic,
    new_guard,
    owner_alive,
    refuse_a_task_of_its_own,
    refuse_in_event_loop,
    returned_to_with,
    shielded,
)
from .lease import ServerLease
from .leases import LostCallback
from .lock import AsyncJavaStyleLock, AsyncTimedHold
from .owners import Site, caller_frame, caller_site
from .scope import LossWatching
from .waiting import acquire_remote

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .backends.base import AsyncReleaseWatch
    from .context import LockContext
    from .scope import WatchedLease

__all__ = ["AsyncSemaphore", "validate_permits"]

logger = logging.getLogger("hybridlock.lock")

#: The longest a waiter goes without an attempt, each of which keeps its place in the queue (which lapses
#: ``QUEUE_PLACE_KEEP_MS`` after the last one): a third of that, as a lease is renewed.
_PLACE_REFRESH = QUEUE_PLACE_KEEP_MS / 3000.0

_wait_ids = itertools.count(1)  # (a place is named "<client_id>|<wait id>": unique in this owner)

# What a waiter of this process is doing (``_Waiter.state``): between attempts (a release here may attempt for it),
# attempting itself, attempted for by a release (it makes no attempt of its own until told the outcome), handed a
# permit it has not taken up yet, done (holding, or gone: a release that attempted for it gives back what it took).
_IDLE, _ATTEMPTING, _OFFERED, _HANDED, _DONE = range(5)
#: The most waiters one release attempts for (each costs the script a look at its place in the queue).
_HAND_OVER_TO = 16


class _Waiter:
    """A blocking acquire of this process waiting for a permit (see ``AsyncSemaphore._hand_over``). Its state is
    read and written under the semaphore's guard only."""

    __slots__ = ("decided", "handed", "place", "sent_at", "state", "tag", "watch")

    def __init__(self, place: str, tag: str) -> None:
        self.place = place
        self.tag = tag  # (a new one after an attempt for it whose outcome is unknown: see _hand_over)
        self.state = _IDLE
        self.watch: AsyncReleaseWatch | None = None  # what it sleeps on between attempts (None: it polls)
        self.decided = AsyncEvent()  # set when the release attempting for it knows the outcome (one per attempt)
        self.handed: PermitResult | None = None  # the permit a release took for it (``_HANDED``)
        self.sent_at = 0.0  # when that release's request was sent: the permit's lease counts from there


def validate_permits(permits: object) -> int:
    """``permits`` as a semaphore's limit: a whole number from 1 to ``MAX_PERMITS`` (an acquire looks at every
    permit slot, so its cost grows with it)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise InvalidArgumentError(f"permits must be an int, not {type(permits).__name__}")
    if not 1 <= permits <= MAX_PERMITS:
        raise InvalidArgumentError(f"permits must be from 1 to {MAX_PERMITS}, not {permits}")
    return permits


class _Permit(ServerLease):
    """One permit held by one task: a lease in the server, as the lease table and the renewer see it."""

    kind = "semaphore"

    def __init__(self, semaphore: AsyncSemaphore, slot: int, tenancy: str, owner: object, site: Site) -> None:
        super().__init__(semaphore._context, semaphore._names.permit(slot, tenancy))
        self._semaphore = semaphore
        self.slot = slot
        # What the slot holds while it is this permit's: the tag of the acquire it was granted to. The renewal, the
        # release and the hand-over act on this tenancy only, never on a later grant of the same slot to another
        # task of this registry (which shares the client_id).
        self.tenancy = tenancy
        self._owner: object | None = owner
        self._site = site
        self._callbacks = semaphore._callbacks  # (the same list: sem.on_lost covers every permit)

    def __repr__(self) -> str:
        state = " lost" if self._lost else ""
        return f"<hybridlock permit {self.slot} of semaphore {self.key!r}{state} at {id(self):#x}>"

    def _holder(self) -> object | None:
        return self._owner

    def _holder_site(self) -> Site:
        return self._site

    def _find_abandoned(self) -> list[tuple[object, Site]]:
        owner = self._owner
        if owner is None or owner_alive(owner) or not self._in_server:
            return []
        self._abandoned = True
        self._abandoned_by = (owner, self._site)
        return [self._abandoned_by]

    async def _end_abandoned(self) -> None:
        """Give back a permit whose holder ended without releasing it (its lease has run out by now)."""
        if not self._abandoned or self._owner is None:
            return
        self._semaphore._forget(self)
        self._owner = None
        self._give_back_lease()
        context = self._context
        try:
            # (Its slot has expired by now, unless the server clock runs slow: this gives back what may be left.)
            await shielded(partial(context.backend.release_permit, self._semaphore._names, self.slot, self.tenancy))
        except HybridLockError as exc:
            logger.warning("hybridlock: could not give back the abandoned permit of %r: %s", self.key, exc)
        finally:
            self._end_lease()

    async def _give_back_late(self, token: int | None, names: LockNames) -> bool:
        # (The slot holds this permit's tenancy: only it is given back, never a later grant of the slot.)
        return await self._context.backend.release_permit(self._semaphore._names, self.slot, self.tenancy)

    async def _mark_lost(self, tenancy: int) -> None:
        if self._claim_loss(tenancy):
            self._context.leases.report_lost(self._semaphore, list(self._callbacks))

    async def _give_back(self) -> None:
        """Release the permit in the server (shielded from a cancel), handing it to a waiter of this process where
        the server's rule admits it (``AsyncSemaphore._hand_over``), and end its tenancy. Raises ``LockLostError``
        when its lease had ended (the permit is given up all the same), ``BackendUnavailableError`` when the server
        could not be told (the slot ends with its lease)."""
        was_lost = self._give_back_lease()
        released = False
        unreachable: HybridLockError | None = None
        try:
            released = await shielded(partial(self._semaphore._hand_over, self.slot, self.tenancy))
        except HybridLockError as exc:
            if not was_lost:
                raise
            unreachable = exc  # known lost: the loss is what the caller must hear
        finally:
            self._end_lease()
        if was_lost or not released:
            raise self._lost_error("semaphore permit") from unreachable


class AsyncSemaphore(AsyncJavaStyleLock, LossWatching):
    """At most ``permits`` holders at once across every process sharing the server; each permit a lease renewed by
    the registry and given back within ``expire_after`` when its holder dies.

    ``threading.BoundedSemaphore``'s calls: ``acquire(blocking=True, timeout=None) -> bool``, ``release()`` and the
    context manager (``async with sem:`` here, coroutines); Java's ``try_acquire(timeout)`` (alias
    ``tryAcquire``); ``async with sem(timeout=5):``, which raises ``LockTimeoutError`` when no permit came in time.

    A permit belongs to the task that took it (unlike ``threading.Semaphore``'s, which any thread may give back):
    ``release()`` gives back the calling task's latest permit, and raises ``LockNotOwnedError`` (a
    ``RuntimeError``) when it holds none. A task may hold several.

    Work that must stop when a permit is lost: ``async with sem.until_lost():`` and ``sem.ensure_held()`` watch the
    permits the calling task holds (as ``lock.until_lost()`` does a lock's lease: see ``hybridlock._async.scope``)."""

    kind = "semaphore"

    def __init__(self, context: LockContext, names: SemaphoreNames, permits: int) -> None:
        self._context = context
        self._names = names
        self._permits = permits
        self._guard = new_guard()
        self._held: dict[object, list[_Permit]] = {}  # the permits each task here holds, oldest first
        self._waiters: dict[_Waiter, None] = {}  # the blocking acquires here, in arrival order
        self._callbacks: list[LostCallback] = []

    # -- what the semaphore is ------------------------------------------------------------------------------------

    @property
    def key(self) -> str:
        return self._names.key

    @property
    def permits(self) -> int:
        """The limit this process asks for: stored in the server by the first acquire (or ``set_permits``) and used
        by every owner from then on (while the server keeps it, ``fence_retention`` after the last acquire attempt,
        ``set_permits`` or renewal of a permit: an acquire that finds none stores its own)."""
        return self._permits

    @property
    def registry(self) -> Any:
        """The registry this semaphore came from."""
        return self._context.registry

    @property
    def hold_count(self) -> int:
        """How many permits the current task holds (no round trip)."""
        return len(self._held.get(asking_owner(), ()))

    @property
    def held_here(self) -> int:
        """How many permits the tasks of this process hold (no round trip)."""
        with self._guard:
            return sum(len(permits) for permits in self._held.values())

    def _latest(self) -> _Permit | None:
        permits = self._held.get(asking_owner())
        return permits[-1] if permits else None

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current task's latest permit (None when it holds none). Tokens of one key strictly
        increase across every grant (shared with the plain lock of the same key)."""
        permit = self._latest()
        return None if permit is None else permit._fencing_token

    @property
    def valid_until(self) -> float | None:
        """A ``time.monotonic()`` deadline before which the current task's latest permit is certainly still its own
        (see ``HybridLock.valid_until``); None when it holds none."""
        permit = self._latest()
        return None if permit is None else permit._valid_until

    @property
    def lost(self) -> bool:
        """Whether a permit the current task holds was found lost (its lease ended while held)."""
        return any(permit.lost for permit in self._held.get(asking_owner(), ()))

    # -- work that stops when a permit is lost (scope.py) ------------------------------------------------------------

    _loss_what = "semaphore permit"

    def is_held_by_current_task(self) -> bool:
        """Whether the current task holds a permit of this semaphore (no round trip)."""
        return bool(self._held.get(asking_owner()))

    def _watched_leases(self) -> Sequence[WatchedLease]:
        with self._guard:
            return tuple(self._held.get(current_owner(), ()))  # (every permit this task holds)

    def _not_held_error(self, call: str) -> LockNotOwnedError:
        return LockNotOwnedError(
            f"{call} needs a permit of this semaphore held by this task, and it holds none",
            key=self.key,
            server=self._context.server,
        )

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(semaphore)`` once per permit found lost, from the registry's renewer."""
        if not callable(callback):
            raise InvalidArgumentError("on_lost needs a callable", key=self.key)
        self._callbacks.append(callback)

    def __repr__(self) -> str:
        return (
            f"<hybridlock.AsyncSemaphore key={self.key!r} permits={self._permits} held_here={self.held_here} "
            f"at {id(self):#x}>"
        )

    # -- acquiring --------------------------------------------------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take a permit, as ``threading.BoundedSemaphore.acquire`` does: True once held, False when ``blocking`` is
        False and none is free, or when ``timeout`` seconds (None: no limit) passed without one.

        Raises ``BackendUnavailableError``, ``RegistryClosedError``, ``InvalidArgumentError`` for bad arguments
        (a timeout with ``blocking=False``, a negative one), ``FencingCounterError``."""
        caller = caller_frame()
        return returned_to_with(
            self, await self._acquire_from(caller, blocking, -1 if timeout is None else timeout), caller
        )

    async def try_acquire(self, timeout: float | None = None) -> bool:
        """Java's ``tryAcquire``: with ``timeout`` None, 0 or below take a permit only if one is free now, else wait
        up to ``timeout`` seconds. Returns whether a permit is now held."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise InvalidArgumentError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if timeout is not None and math.isnan(timeout):
            raise InvalidArgumentError("timeout must not be NaN")
        caller = caller_frame()
        if timeout is None or timeout <= 0:
            return await self._acquire_from(caller, False, -1)
        return await self._acquire_from(caller, True, timeout)

    tryAcquire = try_acquire  # noqa: N815 - documented Java-style alias

    async def _acquire_from(self, caller: FrameType | None, blocking: bool, timeout: float) -> bool:
        wait = validate_timeout(blocking, timeout)
        context = self._context
        refuse_in_event_loop(self.key, context.server)
        context.check_open(self.key)
        me = current_owner()
        refuse_a_task_of_its_own("permit of this semaphore", self.key, context)
        site = caller_site(caller)
        deadline = None if wait is None else monotonic() + wait
        # (the permit, its tenancy, when the release handing it was sent)
        won: list[tuple[PermitResult, str, float | None]] = []
        backend = context.backend
        tag = f"{context.client_id}|{next(_wait_ids)}"
        # A blocking acquire is a waiter a release here may attempt for (see _hand_over): it then makes no attempt
        # of its own until told the outcome, so that never two attempts are in flight for it.
        waiter = _Waiter(tag, tag) if blocking else None
        guard = self._guard

        async def attempt() -> AcquireResult:
            if waiter is not None:
                while True:
                    with guard:
                        if waiter.state == _HANDED:
                            handed, waiter.handed, waiter.state = waiter.handed, None, _DONE
                            assert handed is not None
                            won.append((handed, waiter.tag, waiter.sent_at))
                            return AcquireResult(True, handed.fencing_token)
                        if waiter.state != _OFFERED:
                            waiter.state = _ATTEMPTING
                            break
                        decided = waiter.decided
                    # (The release's round trip; at our deadline we leave it: what it takes for us it gives back.)
                    left = None if deadline is None else max(0.0, deadline - monotonic())
                    if not await decided.wait(left):
                        with guard:
                            if waiter.state == _OFFERED:
                                waiter.state = _DONE
                                return AcquireResult(False)
            sent_tag = tag if waiter is None else waiter.tag
            result = await backend.try_acquire_permit(
                self._names,
                context.client_id,
                context.config.lease_ms,
                self._permits,
                self._slots_here(),
                None if waiter is None else waiter.place,
                sent_tag,
            )
            if waiter is not None:
                with guard:
                    waiter.state = _DONE if result.acquired else _IDLE
            if not result.acquired:
                # Come back before our place lapses (and never past the soonest end of a held permit's lease).
                ttl = result.holder_ttl
                return AcquireResult(False, None, _PLACE_REFRESH if ttl is None else min(ttl, _PLACE_REFRESH))
            won.append((result, sent_tag, None))
            return AcquireResult(True, result.fencing_token)

        async def give_up() -> None:
            if waiter is not None:
                await backend.leave_permit_queue(self._names, waiter.place)

        async def undo() -> object:
            if waiter is not None:
                with guard:
                    if waiter.state == _OFFERED:
                        waiter.state = _DONE  # (the release attempting for us gives back what it takes)
                        return None
            return await backend.give_back_attempt(
                self._names, context.client_id, tag if waiter is None else waiter.tag, context.config.lease_ms
            )

        def on_watch(watch: AsyncReleaseWatch | None) -> None:
            if waiter is not None:
                with guard:
                    waiter.watch = watch

        if waiter is not None:
            with guard:
                self._waiters[waiter] = None
        try:
            grant = await acquire_remote(
                context,
                self._names.waiting,
                blocking,
                deadline,
                attempt=attempt,
                give_up=give_up,  # (leaves our place in the queue: out of time, cancelled, or an error)
                undo=undo,  # (an attempt cut off in flight: what it may have been granted is given back)
                queues=False,  # (each attempt keeps our place: no wait keeper)
                on_watch=on_watch,  # (a release handing us a permit wakes us: see _hand_over)
            )
        finally:
            unclaimed = None
            if waiter is not None:
                with guard:
                    del self._waiters[waiter]
                    if waiter.state == _HANDED:
                        unclaimed = waiter.handed  # handed to us after our last look: not ours to keep
                    waiter.state, waiter.handed, waiter.watch = _DONE, None, None
                if unclaimed is not None:
                    await shielded(partial(self._give_back_quietly, unclaimed.slot, waiter.tag))
        if grant is None:
            return False
        taken, tenancy, handed_at = won[-1]
        permit = _Permit(self, taken.slot, tenancy, me, site)
        with self._guard:
            self._held.setdefault(me, []).append(permit)
        # (A permit handed over by a release here counts its lease from that release's request.)
        permit._begin_lease(taken.fencing_token, grant.sent_at if handed_at is None else handed_at)
        return True

    async def _give_back_quietly(self, slot: int, tenancy: str) -> None:
        """Give back a permit slot taken under ``tenancy`` for a waiter that did not take it up (best effort: else
        it lapses)."""
        context = self._context
        try:
            await context.backend.release_permit(self._names, slot, tenancy)
        except HybridLockError as exc:
            logger.debug("hybridlock: could not give back a permit of %r handed to a waiter gone: %s", self.key, exc)

    async def _hand_over(self, slot: int, tenancy: str) -> bool:
        """Release permit slot ``slot`` (ours, under ``tenancy``) in the server and, in the same round trip, attempt for
        the waiters of this process that are between attempts (the first ``_HAND_OVER_TO``, in arrival order), by the
        server's own rule for each one's place (fairness across processes and the limit hold as for their own attempts):
        the first one it admits is handed the permit and woken, and only a permit still free wakes anyone else
        (``scripts.TRANSFER_PERMIT``). The waiters attempted for make no attempt of their own meanwhile. Without such a
        waiter (or with waits that cannot be woken here: they poll), a plain release. Returns whether the slot was still
        ours."""
        context = self._context
        backend = context.backend
        decided = AsyncEvent()
        if context.config.lock_type != "pubsub":  # (waiters poll: a permit handed over would wait for their next look)
            return await backend.release_permit(self._names, slot, tenancy)
        with self._guard:
            # (A waiter without a watch yet attempts as soon as it has one, and finds the permit then.)
            offered = [w for w in self._waiters if w.state == _IDLE and (w.watch is None or w.watch.pokes)]
            del offered[_HAND_OVER_TO:]
            for waiter in offered:
                waiter.state, waiter.decided = _OFFERED, decided
            skip = [permit.slot for permits in self._held.values() for permit in permits]
            asked = [(waiter.place, waiter.tag) for waiter in offered]
        if not offered:
            return await backend.release_permit(self._names, slot, tenancy)
        outcome: tuple[bool, PermitResult, int] | None = None
        sent_at = monotonic()
        try:
            outcome = await backend.transfer_permit(
                self._names, slot, tenancy, context.config.lease_ms, self._permits, skip, asked
            )
        finally:
            handed, to = (None, -1) if outcome is None else (outcome[1], outcome[2])
            gone = False
            watch: AsyncReleaseWatch | None = None
            with self._guard:
                for index, waiter in enumerate(offered):
                    if waiter.state != _OFFERED:  # it left meanwhile: what was taken for it is given back below
                        gone = gone or index == to
                    elif index == to and handed is not None:
                        waiter.state, waiter.handed, waiter.sent_at, watch = _HANDED, handed, sent_at, waiter.watch
                    else:
                        waiter.state = _IDLE
                        if outcome is None:
                            # The outcome is unknown (the request failed): what it may have taken under the tag is
                            # given back below, which retires the tag; the waiter goes on under a new one.
                            waiter.tag = f"{context.client_id}|{next(_wait_ids)}"
            decided.set()
            if outcome is None:
                for _, tag in asked:
                    try:
                        await backend.give_back_attempt(self._names, context.client_id, tag, context.config.lease_ms)
                    except HybridLockError as exc:  # (best effort: a permit it may have taken lapses with its lease)
                        logger.debug("hybridlock: could not undo a hand-over of a permit of %r: %s", self.key, exc)
            elif handed is not None and handed.acquired:
                if gone:
                    await self._give_back_quietly(handed.slot, asked[to][1])
                elif watch is not None:
                    watch.poke()  # (a waiter that no longer sleeps on it finds the permit at its next look)
        return outcome[0]

    def _slots_here(self) -> list[int]:
        """The slots some task here holds a permit in, lost ones included: not to be taken again under our id."""
        with self._guard:
            return [permit.slot for permits in self._held.values() for permit in permits]

    def __call__(self, timeout: float | None = None, *, blocking: bool = True) -> _TimedPermit:
        """``async with sem(timeout=5):`` runs the block holding a permit taken within ``timeout`` seconds (None: no
        limit; ``blocking=False``: only if one is free now) and gives it back at the block's end; when none came in
        time the block does not run and ``LockTimeoutError`` (a ``TimeoutError``) names the key, the server and the
        time waited."""
        wait = -1 if timeout is None else timeout
        validate_timeout(blocking, wait)
        return _TimedPermit(self, blocking, wait)

    # -- releasing --------------------------------------------------------------------------------------------------

    async def release(self) -> None:
        """Give back the current task's latest permit, and wake the owners waiting for one.

        Raises ``LockNotOwnedError`` (a ``RuntimeError``; ``threading.BoundedSemaphore`` raises ``ValueError``)
        when this task holds no permit of this semaphore, ``LockLostError`` when the permit's lease had ended (it
        is given up all the same), ``BackendUnavailableError`` when the server could not be told (given up here;
        the slot ends with its lease)."""
        me = current_owner()
        with self._guard:
            permits = self._held.get(me)
            if not permits:
                permit = None
            else:
                permit = permits.pop()
                if not permits:
                    del self._held[me]
        if permit is None:
            raise LockNotOwnedError(
                "cannot release a permit of this semaphore: this task holds none (released more often than acquired)",
                key=self.key,
                server=self._context.server,
            )
        permit._owner = None
        await permit._give_back()

    def _forget(self, permit: _Permit) -> None:
        """Drop ``permit`` from its holder's permits (its holder is gone)."""
        with self._guard:
            for owner, permits in list(self._held.items()):
                if permit in permits:
                    permits.remove(permit)
                    if not permits:
                        del self._held[owner]

    # -- the limit ----------------------------------------------------------------------------------------------------

    async def set_permits(self, permits: int) -> int:
        """Change the limit for every owner, in one round trip; returns the limit it replaced (0: none was stored).

        Raising it lets waiters in at once. Lowering it revokes nothing: permits held past the new limit stay valid
        (renewed, releasable) until released, and no permit is given out until fewer than the new limit are held.
        Other processes keep the ``permits`` they were obtained with only as the value to store should the server
        lose the limit."""
        permits = validate_permits(permits)
        self._context.check_open(self.key)
        old = await self._context.backend.set_permits(self._names, permits)
        self._permits = permits
        return old

    # -- fork ---------------------------------------------------------------------------------------------------------

    def _reset_after_fork(self, context: LockContext) -> None:
        # The child holds none of its parent's permits.
        self._context = context
        self._guard = new_guard()
        self._held = {}
        self._waiters = {}


class _TimedPermit(AsyncTimedHold[AsyncSemaphore]):
    """What ``sem(timeout=...)`` returns: takes a permit within the timeout or raises ``LockTimeoutError``."""

    __slots__ = ()

    async def __aenter__(self) -> AsyncSemaphore:
        semaphore = self._lock
        start = monotonic()
        if await semaphore._acquire_from(caller_frame(), self._blocking, self._timeout):
            return semaphore
        waited = monotonic() - start
        if not self._blocking:
            message = f"semaphore {semaphore.key!r}: no permit free (blocking=False)"
        else:
            message = f"semaphore {semaphore.key!r}: no permit within {self._timeout:g} s (waited {waited:.3f} s)"
        message += "; the with-block did not run"
        raise LockTimeoutError(message, key=semaphore.key, server=semaphore._context.server)
