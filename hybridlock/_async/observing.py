"""Reporting acquires and releases to the registry's observer (``LockRegistry(..., observer=...)``).

The locks call these only when their context has an observer (``context.observer is not None``, the one check a
registry without one pays); the calls wrap the lock's own acquire and release, time them, and tell the observer
how they ended, whatever they raised. Reentrant acquires and releases (which only count) are not reported: the
lock checks that before wrapping. See ``hybridlock._core.events`` for the events and what each field means, and
for what happens when an observer raises (``ObserverHook``, here, logs it once).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, Literal

from .._core.events import (
    OBSERVER_METHODS,
    AcquireEvent,
    AcquireOutcome,
    LockKind,
    LossEvent,
    ReleaseEvent,
    ReleaseOutcome,
    RenewalEvent,
)
from ..errors import InvalidArgumentError, LockLostError
from ._compat import Thunk, monotonic

__all__ = ["AcquireProbe", "ObserverHook", "observe_acquire", "observe_release"]

logger = logging.getLogger("hybridlock.observer")


class ObserverHook:
    """The registry's side of an observer: the observer's methods looked up once, each call guarded.

    Locks hold this (in their context) only when the registry has an observer, so the check on the hot path is
    ``context.observer is not None``."""

    __slots__ = ("_failed", "_on_acquire", "_on_loss", "_on_release", "_on_renewal", "observer", "registry_key")

    def __init__(self, observer: Any, registry_key: str) -> None:
        self.observer = observer
        self.registry_key = registry_key
        self._on_acquire = getattr(observer, "on_acquire", None)
        self._on_release = getattr(observer, "on_release", None)
        self._on_renewal = getattr(observer, "on_renewal", None)
        self._on_loss = getattr(observer, "on_loss", None)
        self._failed = False

    @classmethod
    def checked(cls, observer: Any, registry_key: str) -> ObserverHook | None:
        """The hook for a registry's ``observer=`` argument (None for None); ``InvalidArgumentError`` for
        something that cannot be one (a class instead of an instance, or an object with none of the methods)."""
        if observer is None:
            return None
        if isinstance(observer, type) or not any(callable(getattr(observer, name, None)) for name in OBSERVER_METHODS):
            raise InvalidArgumentError(
                f"observer must be an object with at least one of {', '.join(OBSERVER_METHODS)} (see "
                f"hybridlock.metrics.LockObserver), not {observer!r}"
            )
        coroutines = [name for name in OBSERVER_METHODS if inspect.iscoroutinefunction(getattr(observer, name, None))]
        if coroutines:
            # Called synchronously, they would only make coroutines nobody awaits: nothing would be observed.
            raise InvalidArgumentError(
                f"observer methods are called synchronously (by the asyncio API too) and must not be coroutine "
                f"functions: {', '.join(coroutines)}"
            )
        return cls(observer, registry_key)

    def acquired(
        self,
        key: str,
        kind: LockKind,
        outcome: AcquireOutcome,
        via: Literal["server", "local"] | None,
        duration: float,
        local_wait: float,
        server_attempts: int,
        error: BaseException | None = None,
    ) -> None:
        if self._on_acquire is not None:
            local_wait = min(max(local_wait, 0.0), duration)
            event = AcquireEvent(
                self.registry_key,
                key,
                kind,
                outcome,
                via,
                duration,
                local_wait,
                duration - local_wait,
                server_attempts,
                error,
            )
            self._call(self._on_acquire, event)

    def released(
        self,
        key: str,
        kind: LockKind,
        outcome: ReleaseOutcome,
        held_for: float | None,
        error: BaseException | None = None,
    ) -> None:
        if self._on_release is not None:
            self._call(self._on_release, ReleaseEvent(self.registry_key, key, kind, outcome, held_for, error))

    def renewal(
        self, leases: int, renewed: int, lost: int, duration: float, error: BaseException | None = None
    ) -> None:
        if self._on_renewal is not None:
            self._call(self._on_renewal, RenewalEvent(self.registry_key, leases, renewed, lost, duration, error))

    def lost(self, key: str, kind: LockKind) -> None:
        if self._on_loss is not None:
            self._call(self._on_loss, LossEvent(self.registry_key, key, kind))

    def _call(self, method: Any, event: object) -> None:
        try:
            method(event)
        except Exception:
            # A broken observer must not break locks, nor flood the log once per event.
            if not self._failed:
                self._failed = True
                logger.exception(
                    "hybridlock: observer %r failed on %s; its errors are ignored from now on (logged once)",
                    self.observer,
                    type(event).__name__,
                )


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
