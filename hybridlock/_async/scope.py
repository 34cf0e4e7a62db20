"""Work that stops when the lease is lost: ``lock.until_lost()`` and ``lock.ensure_held()``.

A holder that goes on working after its lease ended works alongside whoever took the key next. The lock already
says when that happens (``lost``, ``on_lost``, ``valid_until``); these calls put it where the work is:

* ``lock.until_lost()`` is a scope (a context manager) for the work. For tasks (asyncio) it cancels the work
  inside it when the lease is found lost, and raises ``LockLostError`` out of it (not a bare ``CancelledError``),
  as ``asyncio.timeout`` turns its cancellation into ``TimeoutError``; a cancellation from outside still leaves it
  as ``CancelledError``; scopes nest (the innermost scope whose lease was lost raises, the ones around it go on).
  Threads cannot be interrupted: there the body watches ``scope.lost_event`` (a ``threading.Event`` set as the
  loss is found, to wait on or poll from any thread). On both sides the scope raises ``LockLostError`` at its exit
  if the lease was lost while it ran.
* ``lock.ensure_held()`` raises ``LockLostError`` if the lease is known lost or its ``valid_until`` has passed
  (``LockNotOwnedError`` if this thread does not hold it), for a loop to call before each side effect; it asks
  nothing of the server.

Failure modes
-------------
* The loss is found by the registry's renewer (``renewer.py``): a renewal round that finds the key gone or another
  owner's, or its deadline watch as a ``valid_until`` passes without a renewal (a partition, a server that went
  silent), whatever the round in flight is doing. The scope is told then (``ServerLease._watch_loss``), before the
  ``on_lost`` callbacks; nothing polls.
* In a registry that does not renew (``auto_renew=False``) the deadline watch does not run: the scope hears of a
  loss a renewal by hand finds, and ``ensure_held()``, which reads the clock, is the check at ``valid_until``.
* A process paused past its lease (GC, SIGSTOP) runs nothing while paused: the work goes on until the renewer runs
  again and finds the loss. Fencing tokens are the defence for the resource.
* Cancelling stops the work at its next ``await``; code between two awaits runs to the next one. What a cancelled
  task does in its ``finally`` blocks is its own.

Anything that holds leases like a lock joins by listing them in ``_watched_leases()``: each must have ``key``,
``lost``, ``_valid_until``, ``_watch_loss`` and ``_unwatch_loss`` (``ServerLease`` has them). A semaphore lists the
permits the calling task holds (``semaphore.py``); a leader election lists its current term (``election.py``), an
object of its own that ends (and tells its watchers) when the term ends for any reason, a loss or a step-down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, cast, final

from ..errors import LockLostError, LockNotOwnedError
from ._compat import AsyncEvent, AsyncLossCanceller, in_task, monotonic, outside_the_loop

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

__all__ = ["AsyncLossScope", "LossWatching", "WatchedLease"]


class _Server(Protocol):
    @property
    def server(self) -> str: ...


class WatchedLease(Protocol):
    """What a scope needs of each lease it watches (``ServerLease`` has it: a lock, a read or write half)."""

    @property
    def _valid_until(self) -> float | None: ...

    @property
    def _context(self) -> _Server: ...

    @property
    def key(self) -> str: ...

    @property
    def lost(self) -> bool: ...

    def _watch_loss(self, listener: Callable[[], None]) -> None: ...

    def _unwatch_loss(self, listener: Callable[[], None]) -> None: ...


class LossWatching:
    """What every kind that holds leases offers for work that must stop when they are lost (a mixin: the kind
    provides ``is_held_by_current_task()`` and, when it holds more than one lease, ``_watched_leases()``; one whose
    hold is not a task's, such as a leader's term, overrides ``_held_here()`` instead)."""

    __slots__ = ()

    #: How messages name the kind ("lock", "read lock", ...).
    _loss_what = "lock"
    #: Whether a hold is a task's (a thread's), so that only its task may check it; a leader's term is the process's.
    _held_by_a_task = True

    def is_held_by_current_task(self) -> bool:
        raise NotImplementedError

    def _held_here(self) -> bool:
        """Whether the caller may watch the leases: it holds them."""
        return self.is_held_by_current_task()

    def _watched_leases(self) -> Sequence[WatchedLease]:
        """The leases whose loss ends the work: the kind's own, by default."""
        return (cast("WatchedLease", self),)

    def _not_held_error(self, call: str) -> LockNotOwnedError:
        """What ``call`` raises when the caller does not hold what it watches."""
        first = self._watched_leases()[0]
        return LockNotOwnedError(
            f"{call} needs the {self._loss_what} held by this task, and it is not",
            key=first.key,
            server=first._context.server,
        )

    def _lost_in_scope_error(self, lease: WatchedLease) -> LockLostError:
        """What an ``until_lost()`` scope raises at its exit when ``lease`` was lost while it ran."""
        what = self._loss_what
        return LockLostError(
            f"the {what}'s lease was lost while the work in its until_lost() scope ran (its key gone or "
            "another owner's at a renewal, or its valid_until passed without one): another owner may hold "
            f"the key now. The {what} is still held here: release it (which raises LockLostError too)",
            key=lease.key,
            server=lease._context.server,
        )

    def until_lost(self) -> AsyncLossScope:
        """A scope for work that must stop when this task's hold is lost: ``async with lock.until_lost():``.

        Enter it while this task holds the lock (``LockNotOwnedError`` otherwise; ``LockLostError`` at once if the
        lease is already lost, or its ``valid_until`` has passed). When the lease is found lost inside it (the key
        gone or another owner's at a renewal, or its ``valid_until`` passed without one), the scope's
        ``lost_event`` is set and the scope raises ``LockLostError`` at its exit. On asyncio the work inside is also
        cancelled then, at the ``await`` it waits in (a cancellation from outside still leaves as
        ``CancelledError``); threads cannot be cancelled, so their work waits on or polls ``scope.lost_event``, or
        calls ``ensure_held()``. Either way the lock is still held after the scope: release it (which raises
        ``LockLostError`` too)."""
        return AsyncLossScope(self, self._loss_what)

    def ensure_held(self) -> None:
        """Raise ``LockLostError`` if the lease is known lost or its ``valid_until`` has passed (another owner may
        hold the key now), ``LockNotOwnedError`` if this task does not hold the lock; else return. For a loop to
        call before each side effect: no round trip, only the lock's state and the clock."""
        check_held(self, self._loss_what, "ensure_held()")


def check_held(holder: LossWatching, what: str, call: str) -> tuple[WatchedLease, ...]:
    """``ensure_held()``'s check of the leases ``holder`` watches now; returns them."""
    if holder._held_by_a_task and not in_task():
        named = holder._not_held_error(call)  # (for its key and server)
        raise LockNotOwnedError(outside_the_loop(call, what), key=named.key, server=named.server)
    leases = tuple(holder._watched_leases())
    if not leases or not holder._held_here():
        raise holder._not_held_error(call)
    now = monotonic()
    for lease in leases:
        until = lease._valid_until
        if lease.lost:
            raise _lost(lease, what, "was found lost")
        if until is None or not now < until:
            raise _lost(lease, what, "passed its valid_until without a renewal")
    return leases


def _lost(lease: WatchedLease, what: str, how: str) -> LockLostError:
    return LockLostError(
        f"the {what}'s lease {how}: another owner may hold the key now, so work that needs the {what} must stop",
        key=lease.key,
        server=lease._context.server,
    )


@final
class AsyncLossScope:
    """``async with lock.until_lost() as scope:``: see ``AsyncHybridLock.until_lost``. One use only.

    ``lost_event`` (an ``AsyncEvent``, with ``threading.Event``'s calls) is set as the loss is found, and ``lost``
    reads it."""

    __slots__ = ("_canceller", "_holder", "_leases", "_what", "lost_event")

    def __init__(self, holder: LossWatching, what: str) -> None:
        self._holder = holder
        self._leases: tuple[WatchedLease, ...] = ()  # (read at entry: what the caller holds then)
        self._what = what
        self._canceller: AsyncLossCanceller | None = None
        self.lost_event = AsyncEvent()

    @property
    def lost(self) -> bool:
        """Whether a lease this scope watches was found lost while it ran."""
        return self.lost_event.is_set()

    async def __aenter__(self) -> AsyncLossScope:
        if self._canceller is not None:
            first = self._leases[0]
            raise LockNotOwnedError(
                "an until_lost() scope is entered once: call until_lost() again for another",
                key=first.key,
                server=first._context.server,
            )
        self._leases = check_held(self._holder, self._what, "until_lost()")
        self._canceller = AsyncLossCanceller()
        for lease in self._leases:
            lease._watch_loss(self._on_lost)
        return self

    def _on_lost(self) -> None:
        # From whoever found the loss (the renewer, as a rule): only signal.
        self.lost_event.set()
        canceller = self._canceller
        if canceller is not None:
            canceller.fire()

    async def __aexit__(
        self, error_type: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for lease in self._leases:
            lease._unwatch_loss(self._on_lost)
        canceller = self._canceller
        ours = canceller is not None and canceller.close(error)
        if ours or (error is None and self.lost_event.is_set()):
            lost = next((lease for lease in self._leases if lease.lost), self._leases[0])
            raise self._holder._lost_in_scope_error(lost) from error

    def __repr__(self) -> str:
        state = "lost" if self.lost else "watching" if self._canceller is not None else "not entered"
        keys = ", ".join(repr(lease.key) for lease in self._leases) or "nothing yet"
        return f"<hybridlock.{type(self).__name__} {state} over {keys}>"
