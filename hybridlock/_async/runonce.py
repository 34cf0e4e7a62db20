"""``registry.run_once(key, fn, at_least_for=..., at_most_for=...)``: run a scheduled job's occurrence on one
replica only (ShedLock's two bounds), and ``@registry.runs_once("report:{day}", ...)``, its decorator.

Every replica runs the same schedule and calls ``run_once`` for each occurrence; the first to take ``key`` runs
``fn``, every other skips at once (no waiting: ``RunOnceResult(ran=False)``). The key is the plain lock's, so a
``registry.obtain(key)`` lock (or ``hybridlock run KEY``) excludes the job too, and, while ``fn`` runs,
``registry.obtain(key)`` is the lock held for it (its ``fencing_token``, ``valid_until``, ``lost``).

The two bounds (``_core/runonce.py``), both counted from when ``run_once`` asked for the lock:

* ``at_least_for``: when ``fn`` ends sooner, the key is not deleted but kept that long after the start (``KEEP_FOR``:
  compare-and-set on our owner id, the value replaced by a marker so that our own later calls skip too), so a
  replica whose clock or schedule is a little late skips the occurrence. Kept after ``fn`` raised too (the
  occurrence was attempted, as ShedLock does). Past it already: released as a lock is.
* ``at_most_for``: the lease is renewed while ``fn`` runs, but never past ``start + at_most_for`` (the renewer asks
  only for what is left once less than a lease is: ``ServerLease._hold_until``); at the bound the lease is lost, as
  any lease is: ``lost``, ``on_lost`` callbacks, ``valid_until`` past. ``fn`` is not interrupted (nothing can stop a
  thread); when it ends, ``run_once`` raises ``LockLostError`` saying that it ran past ``at_most_for``.

Failure modes
-------------
* The replica running ``fn`` dies (SIGKILL, a crash): nothing renews its lease, which ends within ``expire_after``
  (never past ``at_most_for``); the next occurrence runs on time. The occurrence it was running is not finished,
  and a replica late enough to fire after the lease end may run it again: its key ends with the lease, not at
  ``at_least_for`` (a lease longer than ``at_least_for`` keeps it).
* The lease is lost while ``fn`` runs (partition, pause, the server losing the key): reported as for a lock;
  ``run_once`` raises ``LockLostError`` once ``fn`` ends (``fn``'s own exception, if any, is its ``__context__``).
* The server is unreachable: taking the key raises ``BackendUnavailableError`` (``fn`` does not run); at the end,
  the key is not kept and ends with its lease, and ``run_once`` raises the same error.
* Over a quorum, the key counts as kept only where a majority kept it (``AsyncQuorumBackend.keep_for``); too few
  answers raise ``BackendUnavailableError``, as at the end of a run on one server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._core.config import MIN_LEASE, lease_drift
from .._core.runonce import RunOnceBounds, RunOnceResult, kept_marker
from ..errors import HybridLockError, InvalidArgumentError, LockLostError
from ._compat import monotonic
from .decorator import keyed

if TYPE_CHECKING:
    from .lock import AsyncHybridLock

__all__ = ["run_once", "runs_once"]

F = TypeVar("F", bound=Callable[..., Any])


class _Registry(Protocol):
    """What a run-once job needs of a registry."""

    @property
    def server(self) -> str: ...

    def obtain(self, key: str) -> AsyncHybridLock: ...


def check_backend(registry: Any) -> None:
    """``InvalidArgumentError`` from a registry whose backend cannot keep a key (one written elsewhere)."""
    backend = registry._context.backend
    if not backend.keeps_keys:
        raise InvalidArgumentError(f"run_once is not available on {type(backend).__name__}", server=registry.server)


async def run_once(
    registry: _Registry, key: str, function: Callable[..., Any], bounds: RunOnceBounds, *args: Any, **kwargs: Any
) -> RunOnceResult[Any]:
    """``registry.run_once``: see the module docstring."""
    if not callable(function):
        raise InvalidArgumentError(f"run_once needs a callable, not {type(function).__name__}", key=key)
    check_backend(registry)
    return await _run(registry.obtain(key), bounds, function, args, kwargs)


def runs_once(registry: _Registry, template: str, bounds: RunOnceBounds) -> Callable[[F], F]:
    """``registry.runs_once``: the decorator, with ``synchronized``'s key templates."""
    check_backend(registry)

    async def run(key: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> RunOnceResult[Any]:
        return await _run(registry.obtain(key), bounds, wrapped, args, kwargs)

    return keyed(registry, template, "runs_once", run)


async def _run(
    lock: AsyncHybridLock,
    bounds: RunOnceBounds,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> RunOnceResult[Any]:
    context = lock._context
    if lock.hold_count:
        # Reentrant, the acquire would only count, and the run would end a hold that is not its own.
        raise InvalidArgumentError(
            "run_once called while this task holds this key's lock already", key=lock.key, server=context.server
        )
    start = monotonic()
    if not await lock.acquire(blocking=False):
        return RunOnceResult(False)
    hold_until = bounds.hold_until(start)
    if hold_until is not None:
        lock._hold_until = hold_until
        lease = context.config.lease
        left = hold_until - monotonic()
        if lease is not None and left < lease:
            # The grant's lease would outlast the bound: cut it back before fn starts (the renewer keeps to it).
            try:
                await lock.renew(max(left, MIN_LEASE))
            except BaseException:
                lock._hold_until = None  # (as in _end)
                with contextlib.suppress(HybridLockError):
                    await lock.release()
                raise
    try:
        result = await function(*args, **kwargs)
    finally:
        await _end(lock, bounds, start)
    return RunOnceResult(True, result)


#: How much later than computed a renewal that cuts a lease back to the bound may be sent (a loaded machine).
_SENT_LATE = 0.05


async def _end(lock: AsyncHybridLock, bounds: RunOnceBounds, start: float) -> None:
    """Release the run's hold, keeping the key until ``start + at_least_for``."""
    now = monotonic()
    keep_ms = bounds.keep_ms(start, now)
    try:
        if keep_ms:
            await lock._release_kept(kept_marker(lock._context.client_id), keep_ms)
        else:
            # Released as a lock is, perhaps passed with its lease to a task here queued for it: that holder's lease
            # is renewed as any, not ended at this run's bound.
            lock._hold_until = None
            await lock.release()
    except LockLostError as exc:
        most = bounds.at_most_for
        # At the bound, the lease is found lost when its valid_until passes: the drift margin before the bound itself
        # (the last renewal asked for at most ``most``), and a little more for the time that renewal took to be sent.
        # A job that ends at once when told (on_lost, the command line's --lost-signal) may end inside that margin,
        # and it still ran to the bound. (A loss of any other cause within it is named after the bound: it is one.)
        if most is None or now - start < most - lease_drift(most) - _SENT_LATE:
            raise
        raise LockLostError(
            f"the run took {now - start:.3f} s, past at_most_for ({most:g} s): its hold ended at the bound while it "
            "ran, so another owner may have run this occurrence meanwhile",
            key=lock.key,
            server=lock._context.server,
        ) from exc
