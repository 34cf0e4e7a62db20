"""Reporting acquires and releases to the registry's observer (``LockRegistry(..., observer=...)``).

The locks call these only when their context has an observer (``context.observer is not None``, the one check a
registry without one pays); the calls wrap the lock's own acquire and release, time them, and tell the observer
how they ended, whatever they raised. Reentrant acquires and releases (which only count) are not reported: the
lock checks that before wrapping. See ``hybridlock._core.events`` for the events and what each field means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from .._core.events import LockKind, ObserverHook
from ..errors import LockLostError
from ._compat import Thunk, monotonic

__all__ = ["AcquireProbe", "observe_acquire", "observe_release"]


class AcquireProbe:
    """Filled in by the remote wait (``acquire_remote``) of an observed acquire: how many attempts went to the
    server, and when the first one did (the end of the local wait)."""

    __slots__ = ("attempts", "remote_started")

    def __init__(self) -> None:
        self.attempts = 0
        self.remote_started: float | None = None

    def attempt(self) -> None:
        if self.remote_started is None:
            self.remote_started = monotonic()
        self.attempts += 1


async def observe_acquire(
    hook: ObserverHook,
    lock: Any,
    key: str,
    kind: LockKind,
    me: object,
    start: float,
    acquire: Callable[[AcquireProbe], Any],
) -> bool:
    """Run ``acquire(probe)`` (a non-reentrant acquire of ``lock`` by ``me``, begun at ``start``; it returns whether
    it got the lock) and report it."""
    probe = AcquireProbe()
    try:
        acquired: bool = await acquire(probe)
    except Exception as exc:
        _report_acquire(hook, key, kind, "error", start, probe, exc)
        raise
    except BaseException as exc:
        _report_acquire(hook, key, kind, "cancelled", start, probe, exc)
        raise
    end = _report_acquire(hook, key, kind, "acquired" if acquired else "timed_out", start, probe, None)
    if acquired:
        _hold_starts(lock)[me] = end
    return acquired


def _report_acquire(
    hook: ObserverHook,
    key: str,
    kind: LockKind,
    outcome: Any,
    start: float,
    probe: AcquireProbe,
    error: BaseException | None,
) -> float:
    end = monotonic()
    remote_started = end if probe.remote_started is None else probe.remote_started
    via: Literal["server", "local"] | None = None
    if outcome == "acquired":
        via = "server" if probe.attempts else "local"
    hook.acquired(key, kind, outcome, via, end - start, remote_started - start, probe.attempts, error)
    return end


async def observe_release(
    hook: ObserverHook, lock: Any, key: str, kind: LockKind, me: object, release: Thunk[Any]
) -> None:
    """Run ``release()`` (the final release of ``me``'s hold of ``lock``) and report it, with the hold's length."""
    started = _hold_starts(lock).pop(me, None)
    held_for = None if started is None else monotonic() - started
    try:
        await release()
    except LockLostError as exc:
        hook.released(key, kind, "lost", held_for, exc)
        raise
    except Exception as exc:
        hook.released(key, kind, "error", held_for, exc)
        raise
    except BaseException as exc:
        hook.released(key, kind, "cancelled", held_for, exc)
        raise
    hook.released(key, kind, "released", held_for)


def _hold_starts(lock: Any) -> dict[object, float]:
    """When each holder's observed acquire returned: a table on the lock (``_observed_hold_starts``, None until its
    first observed acquire, so a lock of a registry without an observer carries nothing). Two threads creating it
    at once may lose one entry: that release then reports ``held_for=None``."""
    starts: dict[object, float] | None = lock._observed_hold_starts
    if starts is None:
        starts = lock._observed_hold_starts = {}
    return starts
