"""Lock key templates, for decorators of one's own over a registry (the framework integrations in
``hybridlock.contrib`` are built on this): the template checks and the filling that ``@registry.synchronized`` and
``@registry.runs_once`` use, and the check of ``run_once``'s bounds, for a decorator applied before the registry it
will use exists (one built lazily in each worker process, say).

``keyed(registry, template, name, run)`` returns a decorator that runs each call of the decorated (blocking)
function as ``run(key, wrapped, args, kwargs)``, ``key`` filled from ``template`` by the call's bound arguments
(``"{order_id}"``, ``"{self.account}"``, ``"{items[0]}"``). ``InvalidArgumentError`` when decorating for a bad
template, a placeholder naming no parameter, a generator or an async function; at a call, for arguments that cannot
fill the template (naming ``registry.server``, read only then; ``name`` names the decorator in messages).
"""

from __future__ import annotations

from ._core.runonce import RunOnceBounds
from ._sync.decorator import keyed

__all__ = ["keyed", "run_once_bounds"]


def run_once_bounds(at_least_for: float, at_most_for: float | None = None) -> tuple[float, float | None]:
    """``(at_least_for, at_most_for)`` in seconds as ``registry.run_once`` takes them, checked as it checks them:
    ``InvalidArgumentError`` naming the setting otherwise."""
    bounds = RunOnceBounds.checked(at_least_for, at_most_for)
    return bounds.at_least_for, bounds.at_most_for
