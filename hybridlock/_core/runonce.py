"""The two bounds of a run-once job (``registry.run_once``), and what it reports: pure values and arithmetic.

``at_least_for``: the key stays taken that long after the run started, even when the function ends sooner, so a
replica whose clock or schedule is a little late skips the occurrence instead of running it again.
``at_most_for``: the hold never lasts longer than that after the start, even while the function still runs, so
a stuck run cannot keep every later occurrence out. Both count from when ``run_once`` asked for the lock (a
``monotonic()`` reading passed in as ``start``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import InvalidArgumentError
from .config import MIN_LEASE, validate_seconds

__all__ = ["RunOnceBounds", "RunOnceResult", "kept_marker", "ran_by"]

T = TypeVar("T")

#: Below this many milliseconds of ``at_least_for`` left when the function ends, the key is released at once
#: rather than kept (the server counts expiry in whole milliseconds).
_KEEP_AT_LEAST_MS = 1

_KEPT_SUFFIX = ":ran"  # (a client id is a UUID's hex: it never ends so)


@dataclass(frozen=True)
class RunOnceResult(Generic[T]):
    """What ``run_once`` (and a ``runs_once`` function) returns: whether this call ran the function, and its result.

    ``ran`` is False when the occurrence was skipped: another owner held the key (running it, or keeping it for
    ``at_least_for`` after its run); ``result`` is then None. The object is true exactly when it ran, so
    ``if registry.run_once(...):`` reads as "if it ran here". (A bare return value could not tell a skip from a
    function that returns None.)"""

    ran: bool
    result: T | None = None

    def __bool__(self) -> bool:
        return self.ran


@dataclass(frozen=True)
class RunOnceBounds:
    """``at_least_for`` and ``at_most_for`` in seconds, checked (``at_most_for`` None: no bound but the lease)."""

    at_least_for: float
    at_most_for: float | None

    @classmethod
    def checked(cls, at_least_for: object, at_most_for: object) -> RunOnceBounds:
        """``InvalidArgumentError`` naming the setting for anything but positive, finite seconds, and for an
        ``at_most_for`` shorter than ``at_least_for`` (the key would have to be kept after the hold must end) or
        than ``MIN_LEASE`` (0.1 s: the shortest lease the server is asked for)."""
        least = validate_seconds("at_least_for", at_least_for)
        most = validate_seconds("at_most_for", at_most_for, allow_none=True, minimum=MIN_LEASE)
        if most is not None and most < least:
            raise InvalidArgumentError(
                f"at_most_for ({most:g} s) must not be shorter than at_least_for ({least:g} s): the key is kept "
                "at_least_for after the start, and no hold outlasts at_most_for"
            )
        return cls(least, most)

    def hold_until(self, start: float) -> float | None:
        """The ``monotonic()`` time by which the hold must end (None: no bound)."""
        return None if self.at_most_for is None else start + self.at_most_for

    def keep_ms(self, start: float, now: float) -> int:
        """How many milliseconds the key is still to be kept when the function ends at ``now`` (0: release it)."""
        left_ms = int((start + self.at_least_for - now) * 1000)
        return left_ms if left_ms >= _KEEP_AT_LEAST_MS else 0


def kept_marker(client_id: str) -> str:
    """The value a kept key holds once its run is over: not ``client_id`` itself, which the owner's next acquire
    would take over as its own (see ``scripts.ACQUIRE``), so that a later occurrence in the same process skips too.
    It names the owner that ran, for people reading the server."""
    return f"{client_id}{_KEPT_SUFFIX}"


def ran_by(value: str) -> str | None:
    """The owner id in a kept key's value (``kept_marker``), or None for any other value (a holder's own id)."""
    return value[: -len(_KEPT_SUFFIX)] if value.endswith(_KEPT_SUFFIX) else None
