"""What a lock tells an observer: the events, the ``LockObserver`` protocol, and the guard that calls it.

An observer (``LockRegistry(..., observer=...)``, the same for ``AsyncLockRegistry``) is told, synchronously and
from the thread (or task) where it happened, of every acquire and release of a hold, every renewal round, and every
lease found lost. It is how metrics are exported (``hybridlock.metrics.prometheus``) without the library depending
on any metrics package.

Pure: the events are plain values, timings are handed in by the lock (``time.monotonic()`` differences, in
seconds), and nothing here waits or does I/O. The guard that calls an observer (``ObserverHook``) logs, so it lives
with the locks, in ``observing``.

Cost: a registry without an observer pays one attribute check per acquire and release (and one per renewal
round). With one, each event is one small object and one method call; an observer must return quickly (it runs
while the lock's caller waits) and may be called from several threads at once.

Failure modes
-------------
* The observer raises: the error is logged once per observer (logger ``hybridlock.observer``, ERROR, with the
  traceback) and ignored from then on; the lock carries on as if no observer were there. An observer can never
  make an acquire fail or a lock stay held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AcquireEvent",
    "AcquireOutcome",
    "LockKind",
    "LockObserver",
    "LossEvent",
    "OBSERVER_METHODS",
    "ReleaseEvent",
    "ReleaseOutcome",
    "RenewalEvent",
]

#: Which kind of lock an event is about: a plain lock, a half of a read-write lock, or a multi-key lock.
LockKind = Literal["lock", "read", "write", "multi", "semaphore"]
#: How an acquire ended: ``"timed_out"`` also covers a non-blocking attempt that found the lock busy;
#: ``"cancelled"`` is a ``BaseException`` that is not an ``Exception`` (asyncio's cancellation, KeyboardInterrupt).
AcquireOutcome = Literal["acquired", "timed_out", "error", "cancelled"]
#: How a release ended: ``"lost"`` when it raised ``LockLostError`` (the lease had ended while held).
ReleaseOutcome = Literal["released", "lost", "error", "cancelled"]


@dataclass(frozen=True)
class AcquireEvent:
    """One acquire of a hold finished (a reentrant acquire, which only counts, is not reported).

    ``via`` says where an acquired lock came from: ``"server"`` (a round trip to the lock server took it) or
    ``"local"`` (no round trip: a thread here passed it on with the server lease still held, a lease kept idle by
    ``retain_for`` was reused, or a reader joined this process's read hold); None when not acquired.
    ``server_attempts`` counts the attempts sent to the server, and a grant of the lock to this one's place in the
    queue (a release took the lock for it in the server): more than one means another owner held the lock and this
    one waited for it. ``local_wait`` is the time spent queued behind threads of this process,
    ``remote_wait`` the time from the first server attempt to the end; together they make ``duration``. For a
    multi-key lock ``key`` is its keys in their global order, joined by ``","``.
    """

    registry_key: str
    key: str
    kind: LockKind
    outcome: AcquireOutcome
    via: Literal["server", "local"] | None
    duration: float
    local_wait: float
    remote_wait: float
    server_attempts: int
    error: BaseException | None = None

    @property
    def handoff(self) -> Literal["local", "remote"] | None:
        """``"local"``: handed over by a thread of this process with the lease kept (or a retained lease reused);
        ``"remote"``: taken in the server after waiting for another owner to let go; None otherwise (free at once,
        not acquired, or a reader joining this process's read hold: shared, not handed over)."""
        if self.outcome != "acquired":
            return None
        if self.via == "local":
            return None if self.kind == "read" else "local"
        return "remote" if self.server_attempts > 1 else None


@dataclass(frozen=True)
class ReleaseEvent:
    """One hold was given up: the final release of a thread's (or task's) reentrant hold.

    ``held_for`` is the seconds since its acquire returned (None when the acquire was not observed, for instance
    for a lock taken before ``Condition.wait`` put it back). ``"released"`` does not say whether the lease went back
    to the server or passed to a thread here: that shows in the next holder's ``AcquireEvent.via``."""

    registry_key: str
    key: str
    kind: LockKind
    outcome: ReleaseOutcome
    held_for: float | None
    error: BaseException | None = None


@dataclass(frozen=True)
class RenewalEvent:
    """One renewal round of the registry's renewer (the leases it asked the server to extend, in one call).

    ``renewed`` leases were extended, ``lost`` were found gone or another owner's (one whose holder was giving it
    back as the round ran counts here too, but is no loss: ``LossEvent`` is the count of losses). A round that
    failed as a whole (the server out of reach) has ``error`` set and ``renewed == lost == 0``; the renewer retries
    it."""

    registry_key: str
    leases: int
    renewed: int
    lost: int
    duration: float
    error: BaseException | None = None


@dataclass(frozen=True)
class LossEvent:
    """A held lease was found lost (by a renewal: the key gone or another owner's, or its ``valid_until`` passed
    without a successful renewal). Reported once per tenancy, when ``lock.lost`` becomes True."""

    registry_key: str
    key: str
    kind: LockKind


class LockObserver:
    """The instrumentation hook: subclass it and override the calls you need (each does nothing here).

    Any object with some of these methods will do (a missing one is skipped). Each is called synchronously from
    the thread or task where the event happened, so it must be quick and thread-safe; an exception it raises is
    logged once and otherwise ignored."""

    def on_acquire(self, event: AcquireEvent) -> None:
        """An acquire finished: acquired, timed out, failed or cancelled."""

    def on_release(self, event: ReleaseEvent) -> None:
        """A hold was released (or its release raised)."""

    def on_renewal(self, event: RenewalEvent) -> None:
        """A renewal round ended."""

    def on_loss(self, event: LossEvent) -> None:
        """A held lease was found lost."""


OBSERVER_METHODS = ("on_acquire", "on_release", "on_renewal", "on_loss")
