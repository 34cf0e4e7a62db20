"""Lock key templates, for decorators of one's own over a registry (the framework integrations in
``hybridlock.contrib`` are built on this): the template checks and the filling that ``@registry.synchronized`` and
``@registry.runs_once`` use, and the check of ``run_once``'s bounds, for a decorator applied before the registry it
will use exists (one built lazily in each worker process, say).

``semaphore_permits``, ``acquire_timeout`` and ``key_template`` check, when a decorator or dependency is declared,
the values a lock or semaphore would refuse at every call, so that an integration refuses them where they are
declared, with the same ``InvalidArgumentError``.

``keyed(registry, template, name, run)`` returns a decorator that runs each call of the decorated (blocking)
function as ``run(key, wrapped, args, kwargs)``, ``key`` filled from ``template`` by the call's bound arguments
(``"{order_id}"``, ``"{self.account}"``, ``"{items[0]}"``). ``InvalidArgumentError`` when decorating for a bad
template, a placeholder naming no parameter, a generator or an async function; at a call, for arguments that cannot
fill the template (naming ``registry.server``, read only then; ``name`` names the decorator in messages).
"""

from __future__ import annotations

from ._core.config import validate_timeout
from ._core.names import validate_key_template
from ._core.runonce import RunOnceBounds
from ._sync.decorator import keyed
from ._sync.semaphore import validate_permits

__all__ = ["acquire_timeout", "key_template", "keyed", "run_once_bounds", "semaphore_permits"]


def run_once_bounds(at_least_for: float, at_most_for: float | None = None) -> tuple[float, float | None]:
    """``(at_least_for, at_most_for)`` in seconds as ``registry.run_once`` takes them, checked as it checks them:
    ``InvalidArgumentError`` naming the setting otherwise."""
    bounds = RunOnceBounds.checked(at_least_for, at_most_for)
    return bounds.at_least_for, bounds.at_most_for


def semaphore_permits(permits: int) -> int:
    """``permits`` as ``registry.obtain_semaphore`` takes it, checked as it checks it: a whole number from 1 to 1024
    (``InvalidArgumentError`` otherwise)."""
    return validate_permits(permits)


def acquire_timeout(timeout: float | None) -> float | None:
    """``timeout`` as a blocking ``acquire(timeout=...)`` takes it, checked as it checks it: seconds from 0 to
    ``threading.TIMEOUT_MAX``, or None, -1 or ``inf`` to wait as long as it takes (returned as None);
    ``InvalidArgumentError`` otherwise (a ``TimeoutOverflowError`` above the maximum)."""
    if timeout is None:
        return None
    return validate_timeout(True, timeout)


def key_template(template: str) -> str:
    """``template`` (a ``str.format`` lock key template), refused with ``InvalidArgumentError`` when its own text
    makes every key it gives one that ``registry.obtain`` refuses: with no placeholder, a key that starts with
    ``}`` or cannot be encoded as UTF-8; with placeholders, text around them that does the same whatever fills
    them. What a call's values make of the key is checked at that call."""
    validate_key_template(template)
    return template
