"""What a remote attempt reports back: plain values, shared by every backend and every lock kind."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["AcquireManyResult", "AcquireResult", "PermitResult"]


class AcquireResult(NamedTuple):
    """What one remote acquire attempt found.

    ``acquired`` is True when the caller now owns the key; ``fencing_token`` is then the token minted for this
    tenancy. When False, ``holder_ttl`` is how many seconds the current holder's lease still runs (``None`` when
    the holder's key has no expiry or the time is unknown): a waiter never needs to sleep past it.

    Owners that wait form a queue in the server, in arrival order: while it is not empty a free lock goes only to
    its head, and a release wakes only the head. A refused blocking attempt joins the queue (for
    ``QUEUE_PLACE_KEEP_MS``, refreshed by ``LockBackend.keep_waiting`` while the waiter lives: a waiter that
    vanishes drops out by itself) and announces that on the lock's
    channel, so a holder that passes the lock between its own threads knows to let other owners in (see
    ``contended`` and ``ReleaseWatch.contended``).
    """

    acquired: bool
    fencing_token: int | None = None
    holder_ttl: float | None = None
    #: On success: other owners are queued for this lock.
    contended: bool = False
    #: Refused, on a backend that grants: when the server took a new place for us in the queue (its time, ms), as a
    #: grant to that place will name it; None when the attempt kept the place we had (or took none).
    queued_at: int | None = None
    #: A grant read (``await_grant``) whose lease the backend already extended to the caller's own lease (to
    #: confirm it with the replicas): when that request was sent (``time.monotonic()``); None otherwise.
    extended_at: float | None = None


class AcquireManyResult(NamedTuple):
    """What one all-or-nothing attempt on several locks found: ``parts`` (one ``AcquireResult`` per lock, in
    order) when all were taken; else the index of a lock another owner holds and that holder's lease left."""

    acquired: bool
    parts: tuple[AcquireResult, ...] = ()
    blocked_by: int = 0
    holder_ttl: float | None = None


class PermitResult(NamedTuple):
    """What one attempt at a semaphore's permit found: ``slot`` (the permit slot taken) and ``fencing_token`` when
    ``acquired``; else ``holder_ttl``, the seconds until the soonest held permit's lease ends (None: unknown)."""

    acquired: bool
    slot: int = -1
    fencing_token: int | None = None
    holder_ttl: float | None = None
