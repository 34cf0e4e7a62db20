"""The narrow interface between lock logic and a lock server.

The lock classes decide *what* to do (reentrancy, timeouts, waiting, renewal, loss); a backend only *does* it,
one atomic server operation per method. A backend:

* never blocks longer than its client's own socket timeout;
* translates every failure to reach its server into
  [BackendUnavailableError][hybridlock.errors.BackendUnavailableError] carrying the key and the server address
  (this is the one place where client exceptions are translated);
* keeps all the names one lock uses in one place (``hybridlock._core.names.LockNames``), so every operation on
  one lock touches a single Redis Cluster slot.

Every method that may talk to the server or wait is ``async def``; what only reads or changes local state
(``epoch``, ``contended``, a watch's ``close``, ``on_wanted``) is a plain method, callable from anywhere, so the
lock logic can ask it without yielding to the loop.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence

from ..._core.config import QUEUE_PLACE_KEEP_MS
from ..._core.names import LockNames, ReadWriteNames, SemaphoreNames
from ..._core.results import AcquireManyResult, AcquireResult, PermitResult
from ...errors import InvalidArgumentError

__all__ = ["QUEUE_PLACE_KEEP_MS", "AcquireManyResult", "AcquireResult", "AsyncLockBackend", "AsyncReleaseWatch"]


class AsyncReleaseWatch(abc.ABC):
    """A subscription to release notifications for one lock, open while a task waits for it.

    The waiting protocol that loses no wake-up: note ``epoch()``, try to acquire, and only if ``epoch()`` is
    still the same and not None, ``wait`` for a notification; a release that lands after the attempt has then
    been recorded by the watch. A None epoch means the subscription is down (or not yet confirmed): back off.
    """

    @abc.abstractmethod
    def epoch(self) -> int | None:
        """An id of the current confirmed subscription, changing whenever it is (re-)established; None while
        the subscription is down or not yet confirmed."""

    @abc.abstractmethod
    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a release or a change of the subscription's state; True if one
        happened since the watch opened or ``wait`` last returned True. Cancelling the wait leaves the watch as
        it was (still open, nothing consumed)."""

    def contended(self) -> bool:
        """Whether another owner announced, since the watch opened, that it failed to get the lock (or may have: a
        watch that cannot hear announcements yet, or for now, counts as contended)."""
        return False

    async def heard(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until announcements on the lock's channel reach this watch (the server
        confirmed the subscription); True if they do. False at once while the subscription is down after a failure
        (waiting would cost every caller the whole timeout)."""
        return True

    #: Whether ``poke`` wakes the waiter (else it does nothing: the waiter finds out at its next look).
    pokes: bool = False

    def poke(self) -> None:
        """Make the wait in progress, or the next one, return True at once: a task of this process has news for the
        waiter (a semaphore's permit handed to it by a release, see ``AsyncSemaphore``). Never does I/O; may be
        called from another task (thread)."""
        return None  # (this watch cannot be woken so: pokes is False)

    @abc.abstractmethod
    def close(self) -> None:
        """Stop watching; idempotent. Never does I/O (a channel nobody watches is dropped later, by the
        listener), so it may be called from cleanup code that must not wait."""


class AsyncLockBackend(abc.ABC):
    """A lock server: in memory, one Redis/Valkey server, a Redis/Valkey cluster, and later quorum variants."""

    #: Human-readable server address, used in error messages (``redis://127.0.0.1:6379/0``, ``memory``).
    address: str = "unknown"

    #: Whether a release grants the lock to the head of its queue when that is a single lock's wait (a place named by
    #: ``grants.place_name``, see ``try_acquire``), which then reads its grant with ``await_grant`` instead of being
    #: woken and acquiring again. False: waiters are woken (``watch``) or poll.
    grants: bool = False

    @abc.abstractmethod
    async def try_acquire(
        self, names: LockNames, owner: str, lease_ms: int | None, queue: bool, place: str | None = None
    ) -> AcquireResult:
        """Take ``names.lock`` for ``owner`` for ``lease_ms`` milliseconds (None: no expiry), in one round trip,
        minting a fencing token on success. Never waits for the lock; when refused and ``queue`` is true, joins
        the lock's queue (a caller that then gives up calls ``cancel_wait``), under the name ``place`` (None:
        ``owner``; on a backend that ``grants``, a name made by ``grants.place_name`` asks for the lock to be granted
        to this wait when its turn comes: a refused result then says when the server took the place, ``queued_at``)."""

    @abc.abstractmethod
    async def cancel_wait(self, names: LockNames, owner: str, place: str | None = None) -> None:
        """``owner`` no longer waits for ``names.lock`` (under ``place``, as given to ``try_acquire``): leave its
        queue (serving the next owner if the lock is free), and give the lock back if it was granted to ``place``
        meanwhile."""

    @abc.abstractmethod
    async def keep_waiting(
        self, names: Sequence[LockNames], owner: str, places: Sequence[str | None] | None = None
    ) -> list[bool]:
        """``owner`` still waits: push the lapse of each of its places back to ``QUEUE_PLACE_KEEP_MS`` from now,
        in one round trip (one per cluster slot, pipelined). A place is a position in a plain lock's queue
        (``names.queue`` / ``names.queue_until``, named as given to ``try_acquire``: ``places``, one per lock, None
        for ``owner``) or, for the write half of a read-write lock (``rw_names.write``), a record in its waiting
        writers (``queue`` and ``queue_until`` are then both that set). Only a place ``owner`` still holds is kept:
        one it left, that lapsed or that ended when it took (or was granted) the lock is not brought back (its next
        attempt queues afresh, at the back). Returns one flag per place: True if kept."""

    async def acquire_and_await(
        self, names: LockNames, owner: str, lease_ms: int | None, place: str, timeout: float
    ) -> tuple[AcquireResult, AcquireResult | None]:
        """``try_acquire`` queueing under ``place`` (only where ``grants``), then, if refused, ``await_grant`` for up
        to ``timeout`` seconds: in one round trip where the backend can (``pipelines_waits``), for a waiter that
        expects to wait. Returns the attempt's result, and what the wait for the grant returned (None when the
        attempt succeeded, or the time ran out)."""
        result = await self.try_acquire(names, owner, lease_ms, True, place)
        if result.acquired or lease_ms is None:
            return result, None
        return result, await self.await_grant(names, owner, place, timeout, lease_ms, result.queued_at)

    @property
    def pipelines_waits(self) -> bool:
        """Whether ``acquire_and_await`` takes one round trip rather than two."""
        return False

    @property
    def grant_wait_limit(self) -> float:
        """The longest wait ``await_grant`` and ``acquire_and_await`` may be asked for at once (their callers wait
        longer in several)."""
        return 0.5

    @property
    def grant_wait_lateness(self) -> float:
        """How long past its ``timeout`` a wait of ``await_grant`` may come back (a wait this short or shorter comes
        back on time)."""
        return 0.0

    async def await_grant(
        self, names: LockNames, owner: str, place: str, timeout: float, lease_ms: int, arrival: int | None = None
    ) -> AcquireResult | None:
        """Wait ``timeout`` seconds (at most ``grant_wait_limit``) for the lock to be granted to ``place`` (a wait of
        ``owner`` queued by ``try_acquire``, whose place the server took at ``arrival``, as the attempt reported it;
        only where ``grants``). Returns the grant (acquired, with its token and whether others queue; with replica
        confirmation, confirmed like an acquire and its lease extended to ``lease_ms``); a refused result when the
        caller should attempt again now (a grant to an earlier wait or place of ``owner`` was found instead, and the
        lock may be ours by it; or the wait could not go on: its connection broke, or the server refused it); None
        when no grant came in that time."""
        raise NotImplementedError

    async def can_acquire_together(self, names: Sequence[LockNames]) -> bool:
        """Whether ``try_acquire_many`` may take all of ``names`` in one atomic step (on a cluster: one slot)."""
        return False

    async def try_acquire_many(
        self, names: Sequence[LockNames], owner: str, lease_ms: int | None, queue: bool
    ) -> AcquireManyResult:
        """Take every lock of ``names`` or none, as ``try_acquire`` does for one; only where
        ``can_acquire_together(names)``."""
        raise NotImplementedError

    @abc.abstractmethod
    async def release(self, names: LockNames, owner: str, notify: bool) -> bool:
        """Delete ``names.lock`` only if its value is ``owner`` (and then, if ``notify``, wake waiters). Returns
        False when the key was gone or held by someone else: the caller's lease had ended."""

    async def release_late(self, names: LockNames, owner: str, token: int) -> bool:
        """Give back ``owner``'s lease of ``names.lock`` (the tenancy ``names.tenancy`` says, or ``owner``) only if
        the key still holds it and no tenancy of the key was taken since the one whose fencing token is ``token``:
        a lease a renewal extended after its holder was told it was lost. Returns whether it did; False where the
        backend cannot tell (the lease then ends with its lease)."""
        return False

    #: Whether ``keep_for`` is available (``registry.run_once``): in every built-in backend.
    keeps_keys: bool = False

    async def keep_for(self, names: LockNames, owner: str, marker: str, keep_ms: int) -> bool:
        """End ``owner``'s hold of ``names.lock`` but keep the key, holding ``marker``, for ``keep_ms`` more
        milliseconds (``run_once``'s ``at_least_for``), waking nobody. False when the key was gone or held by
        someone else: the caller's lease had ended. Only where ``keeps_keys``."""
        raise InvalidArgumentError(
            f"run_once is not available on {type(self).__name__}", key=names.key, server=self.address
        )

    @abc.abstractmethod
    async def renew(self, names: Sequence[LockNames], owner: str, lease_ms: int) -> Sequence[bool | None]:
        """Reset the lease of every lock in ``names`` still held by ``owner`` to ``lease_ms``, in as few round
        trips as the server allows (one per cluster node, one script per slot). Returns one flag per lock: False
        means it was lost; None that it was not renewed and is not known lost: on a cluster, its node was out of
        reach while others answered; over a quorum, too few servers renewed it but its last holders keep it until
        their deadline. Raises ``BackendUnavailableError`` when no lock could be asked about."""

    # -- read-write locks: both kinds of hold are renewed with ``renew`` (``names.read`` / ``names.write``).

    @abc.abstractmethod
    async def try_acquire_read(self, names: ReadWriteNames, owner: str, lease_ms: int | None) -> AcquireResult:
        """Add ``owner``'s read hold for ``lease_ms`` (None: no expiry, where the backend has such holds) unless
        another owner writes or waits to write. One round trip."""

    @abc.abstractmethod
    async def try_acquire_write(
        self, names: ReadWriteNames, owner: str, lease_ms: int | None, wait: bool
    ) -> AcquireResult:
        """Take the write hold (for ``lease_ms``; None: no expiry, as for ``try_acquire_read``) if no other owner
        writes and nobody (``owner`` included) reads, minting a fencing token; else, if ``wait``, record ``owner``
        as waiting to write for ``QUEUE_PLACE_KEEP_MS`` (refreshed by ``keep_waiting`` with ``names.write``), which
        holds back new readers (a caller that then gives up calls ``cancel_write_wait``). One round trip."""

    @abc.abstractmethod
    async def release_write(self, names: ReadWriteNames, owner: str) -> bool:
        """Give back ``owner``'s write hold and wake every waiter; False if it had already ended (lost)."""

    @abc.abstractmethod
    async def release_read(self, names: ReadWriteNames, owner: str) -> bool:
        """Remove ``owner``'s read hold; False if it had already ended (the lease was lost)."""

    @abc.abstractmethod
    async def cancel_write_wait(self, names: ReadWriteNames, owner: str) -> None:
        """``owner`` no longer waits to write (it gave up): let readers in again."""

    # -- semaphores: a permit is a slot held as a plain lock key (``names.permit(slot)``), renewed with ``renew``.

    #: Whether this backend has semaphores (a quorum has not: ``obtain_semaphore`` refuses it).
    semaphores: bool = False

    async def try_acquire_permit(
        self,
        names: SemaphoreNames,
        owner: str,
        lease_ms: int | None,
        permits: int,
        skip: Sequence[int],
        place: str | None = None,
        tag: str = "",
    ) -> PermitResult:
        """Take a free permit slot of the semaphore ``names`` for ``owner`` for ``lease_ms`` milliseconds (None: no
        expiry), minting a fencing token, if fewer permits than its limit are held and none of the free ones is owed
        to an owner queued before ``place``; never a slot in ``skip`` (those ``owner`` still has a holder for).
        Refused, ``place`` (None: do not queue) takes or keeps its place in the queue for ``QUEUE_PLACE_KEEP_MS``
        (a caller that gives up calls ``leave_permit_queue``). ``permits``: the limit to store when none is (see
        ``scripts.ACQUIRE_PERMIT``). ``tag``: names this acquire, for ``give_back_attempt``, and is the tenancy the
        slot it is granted holds (what ``release_permit`` and the renewal compare). One round trip; never waits."""
        raise NotImplementedError

    async def give_back_attempt(self, names: SemaphoreNames, owner: str, tag: str, lease_ms: int | None) -> bool:
        """An acquire tagged ``tag`` was cut off while an attempt was in flight: give back the permit it was granted,
        if any (True), else make sure the attempt takes nothing should it still reach the server (for ``lease_ms``)."""
        raise NotImplementedError

    async def leave_permit_queue(self, names: SemaphoreNames, place: str) -> None:
        """``place`` no longer waits for a permit of ``names``: leave the queue, waking those behind it."""
        raise NotImplementedError

    async def release_permit(self, names: SemaphoreNames, slot: int, tenancy: str) -> bool:
        """Give back permit slot ``slot`` held under ``tenancy`` (the tag of the acquire it was granted to) and wake
        the semaphore's waiters; False if it had already ended (lost), a later grant of the slot (another tenancy,
        of this owner too) left as it is."""
        raise NotImplementedError

    async def transfer_permit(
        self,
        names: SemaphoreNames,
        slot: int,
        tenancy: str,
        lease_ms: int | None,
        permits: int,
        skip: Sequence[int],
        waiters: Sequence[tuple[str, str]],
    ) -> tuple[bool, PermitResult, int]:
        """``release_permit`` of slot ``slot`` held under ``tenancy`` and, in the same atomic step,
        ``try_acquire_permit`` for the first of this owner's ``waiters`` (each a place and a tag, in that order; with
        ``skip``) the semaphore's rule admits; a place refused is neither taken nor kept. The waiters owed a permit
        still free afterwards are woken (a permit handed over wakes nobody). One round trip. Returns whether the slot
        was released (False: it had ended; nothing taken), the result (refused without ``holder_ttl``) and the index of
        the waiter it was taken for (-1: none)."""
        raise NotImplementedError

    async def set_permits(self, names: SemaphoreNames, permits: int) -> int:
        """Set the semaphore's limit to ``permits`` (held permits past it stay valid until released) and wake its
        waiters. Returns the limit it replaced (0: none was stored)."""
        raise NotImplementedError

    @abc.abstractmethod
    async def is_locked(self, names: LockNames) -> bool:
        """Whether anyone holds ``names.lock`` right now."""

    @abc.abstractmethod
    async def is_read_locked(self, names: ReadWriteNames) -> bool:
        """Whether any owner holds a live read hold of the read-write lock ``names``."""

    async def has_waiters(self, names: LockNames) -> bool:
        """Whether another owner has a place in ``names.lock``'s queue (it was refused and waits, or did not leave
        its place yet). Asked by a holder once its watch is confirmed, for an owner refused before it was (whose
        announcement nobody heard). Backends whose ``watch`` is None are never asked."""
        return False

    async def watch(self, names: LockNames, owner: str) -> AsyncReleaseWatch | None:
        """Start watching ``names`` for releases meant for ``owner`` (addressed to it as the queue's head, or to
        everyone), or None when this backend cannot notify (callers then back off and retry at the holder's lease
        end). The caller closes the watch it got (``AsyncReleaseWatch.close``) when it stops waiting."""
        return None

    def on_wanted(self, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` whenever a watched lock is announced wanted by an owner that failed to get it, from
        the backend's listener (a thread on the sync side, a task on the asyncio side) or from the failed attempt
        itself, so it must be quick and must not block. Returns False when this backend cannot notify; holders
        then learn of contention only by polling ``AsyncReleaseWatch.contended``."""
        return False

    async def ping(self, probe: str) -> None:  # noqa: B027 - optional: a backend in memory has nothing to reach
        """Ask the server for what a lock's first operation needs of it (reachable, the login accepted, the scripts
        allowed and working, a master), without touching any lock; ``probe`` is a key of the registry's namespace
        that no lock uses, which the backend may write and delete. Raises what that first operation would have
        raised (``BackendUnavailableError``, ``AuthenticationFailedError``, a ``HybridLockError`` for a refused
        command), naming the server and no key. Default: nothing."""

    async def describe_owner(  # noqa: B027 - optional: a backend nobody else can read needs no description
        self, key: str, fields: Mapping[str, str], gone: Sequence[str], ttl_ms: int
    ) -> None:
        """Set ``fields`` of the owner-description hash ``key``, delete its fields ``gone``, and make it expire in
        ``ttl_ms`` milliseconds (0: delete it now), in one round trip (see ``hybridlock._async.describer``). Default:
        nothing."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends own nothing to close
        """Release what the backend owns (connections, its listener). Idempotent."""
