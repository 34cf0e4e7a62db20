"""``@registry.synchronized("order:{order_id}")``: run a function under the lock its arguments name.

The key is a ``str.format`` template filled from the call's bound arguments, so ``{order_id}``,
``{self.account}`` and ``{invoice.id}`` (attribute access) and ``{items[0]}`` (indexing) all work. Templates are
checked against the function's signature when decorating: a placeholder naming no parameter is an error then,
not at the first call. ``wrapt`` keeps the wrapped function's name, docstring, signature and introspection, and
binds methods, classmethods and staticmethods correctly.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import wrapt

from .._core.config import validate_timeout
from .._core.names import validate_key_template
from ..errors import InvalidArgumentError, LockTimeoutError
from ._compat import IS_ASYNC, OTHER_API_REGISTRY

if TYPE_CHECKING:
    from .lock import AsyncHybridLock


class _Registry(Protocol):
    """What the decorator needs of a registry."""

    @property
    def server(self) -> str: ...

    def obtain(self, key: str) -> AsyncHybridLock: ...


__all__ = ["execute_locked", "keyed", "synchronized"]

F = TypeVar("F", bound=Callable[..., Any])


_CONVERSIONS = (None, "r", "s", "a")  # what str.format knows: none, !r, !s, !a


def _fields(template: str, text: str) -> list[tuple[str, str, str | None]]:
    """Every replacement field of ``text`` (a template, or a format spec inside one) with those nested in its
    format spec (``"{n:{width}}"``), as (field, spec, conversion)."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise InvalidArgumentError(f"bad lock key template {template!r}: {exc}") from exc
    fields = []
    for _literal, field, spec, conversion in parsed:
        if field is not None:
            fields.append((field, spec or "", conversion))
            if spec and "{" in spec:
                fields += _fields(template, spec)
    return fields


def _placeholder_roots(template: str) -> list[str]:
    """The parameter names a template refers to: ``"{self.account}:{invoice.id}"`` -> ``["self", "invoice"]``.

    Everything about the template that can be checked without the call's values is checked here, so that a
    template that could never format fails when decorating: its syntax, positional fields and conversions
    (``!r``, ``!s`` and ``!a`` only). A format spec (``{n:d}``) can only be checked against a value: a spec that
    does not suit the argument fails at the call, as ``InvalidArgumentError``."""
    roots = []
    for field, _spec, conversion in _fields(template, template):
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise InvalidArgumentError(
                f"lock key template {template!r} must name parameters ({{order_id}}), not positions ({{0}})"
            )
        if conversion not in _CONVERSIONS:
            raise InvalidArgumentError(
                f"lock key template {template!r} converts {{{field}}} with !{conversion}, which str.format does not "
                "know: use !r, !s or !a, or none"
            )
        roots.append(root)
    try:
        # What parsing alone lets through (fields nested too deep, say) fails here, with stand-ins for the values.
        template.format_map(_AnyNames())
    except (ValueError, KeyError, AttributeError, IndexError, TypeError) as exc:
        raise InvalidArgumentError(f"bad lock key template {template!r}: {exc}") from exc
    return roots


class _StandIn:
    """Any value: every attribute, index and format spec works and gives an empty string."""

    def __getattr__(self, name: str) -> _StandIn:
        return self

    def __getitem__(self, index: object) -> _StandIn:
        return self

    def __format__(self, spec: str) -> str:
        return ""


class _AnyNames(dict[str, Any]):
    def __missing__(self, name: str) -> _StandIn:
        return _StandIn()


def _fill(template: str, names: dict[str, Any], function: Any, server: str) -> str:
    """The lock key for one call; ``InvalidArgumentError`` naming the template, the function and the argument when
    the arguments cannot fill it (a spec that does not suit the value, a missing attribute, a failing ``__format__``,
    ...)."""
    try:
        return template.format_map(names)
    except Exception as exc:
        culprit = _failing_field(template, names)
        where = "" if culprit is None else f" at {{{culprit[0]}}} ({culprit[1]})"
        raise InvalidArgumentError(
            f"cannot fill lock key template {template!r} for {function.__qualname__}(){where}: "
            f"{type(exc).__name__}: {exc}",
            server=server,
        ) from exc


def _failing_field(template: str, names: dict[str, Any]) -> tuple[str, str] | None:
    """The first field of ``template`` that ``names`` cannot fill, with what its argument is: for messages only
    (the call has already failed; this formats field by field to say where)."""
    formatter = string.Formatter()
    for field, spec, conversion in _fields(template, template):
        root = field.split(".", 1)[0].split("[", 1)[0]
        if root not in names:
            return field, "no such argument"
        about = f"argument {root} is a {type(names[root]).__name__}"
        try:
            value, _ = formatter.get_field(field, (), names)
            value = formatter.convert_field(value, conversion)
            formatter.format_field(value, formatter.vformat(spec, (), names))
        except Exception:
            return field, about
    return None


async def _acquire_or_raise(registry: _Registry, key: str, timeout: float | None) -> Any:
    lock = registry.obtain(key)
    if not await lock.acquire(timeout=-1 if timeout is None else timeout):
        raise LockTimeoutError(f"lock not acquired within {timeout} s", key=key, server=registry.server)
    return lock


def synchronized(registry: _Registry, template: str, *, timeout: float | None = None) -> Callable[[F], F]:
    """Decorator factory behind ``LockRegistry.synchronized``."""
    if not isinstance(template, str) or not template:
        raise InvalidArgumentError("the lock key template must be a non-empty str")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise InvalidArgumentError(f"timeout must be None or a non-negative number of seconds, not {timeout!r}")
    if timeout is not None:
        validate_timeout(True, timeout)  # NaN, and the upper bound: at decoration, not at the first call

    async def run_locked(key: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        lock = await _acquire_or_raise(registry, key, timeout)
        try:
            return await wrapped(*args, **kwargs)
        finally:
            await lock.release()

    return keyed(registry, template, "synchronized", run_locked)


def keyed(registry: _Registry, template: str, name: str, run: Callable[..., Any]) -> Callable[[F], F]:
    """A decorator that runs each call as ``run(key, wrapped, args, kwargs)``, ``key`` filled from ``template`` by
    the call's arguments: what ``synchronized`` and ``runs_once`` share (``name``: the registry method, for
    messages). The template and each decorated function are checked when decorating."""
    if not isinstance(template, str) or not template:
        raise InvalidArgumentError("the lock key template must be a non-empty str")
    roots = _placeholder_roots(template)
    validate_key_template(template)  # (a key obtain() would refuse at every call: refused now)

    def decorate(function: F) -> F:
        raw = function.__func__ if isinstance(function, (classmethod, staticmethod)) else function
        if not callable(raw):
            raise InvalidArgumentError(f"@{name} needs a function, not {type(function).__name__}")
        if inspect.isasyncgenfunction(raw) or inspect.isgeneratorfunction(raw):
            raise InvalidArgumentError(f"@{name} cannot hold a lock across a generator's yields ({raw.__qualname__})")
        if inspect.iscoroutinefunction(raw) != IS_ASYNC:
            # Worded for both sides (this runs on each): the other API is named through the shim.
            what = "an async function" if inspect.iscoroutinefunction(raw) else "not an async function"
            raise InvalidArgumentError(
                f"{raw.__qualname__} is {what}, which {type(registry).__name__}.{name} cannot run: decorate it "
                f"with {OTHER_API_REGISTRY}.{name}"
            )
        signature = inspect.signature(raw)
        accepts_any_keyword = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
        unknown = [r for r in roots if r not in signature.parameters]
        if unknown and not accepts_any_keyword:
            raise InvalidArgumentError(
                f"lock key template {template!r} names {', '.join(unknown)}, which "
                f"{raw.__qualname__}{signature} has no parameter for"
            )
        # The first parameter of a method or classmethod is bound by the time wrapt calls us: remember its name.
        first = next(iter(signature.parameters), None)

        @wrapt.decorator
        async def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if instance is not None and not isinstance(function, staticmethod) and first is not None:
                bound = signature.bind(instance, *args, **kwargs)
            else:
                bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            names = dict(bound.arguments)
            for parameter in signature.parameters.values():
                if parameter.kind is parameter.VAR_KEYWORD:
                    names.update(names.pop(parameter.name, {}))
            key = _fill(template, names, raw, registry.server)
            return await run(key, wrapped, args, kwargs)

        return wrapper(function)  # type: ignore[return-value]  # a FunctionWrapper stands in for F

    return decorate


async def execute_locked(
    registry: _Registry,
    key: str,
    function: Callable[..., Any],
    *args: Any,
    timeout: float | None = None,
    **kwargs: Any,
) -> Any:
    """Run ``function(*args, **kwargs)`` holding ``key``'s lock; ``LockTimeoutError`` if not acquired in time."""
    if not callable(function):
        raise InvalidArgumentError(f"execute_locked needs a callable, not {type(function).__name__}", key=key)
    lock = await _acquire_or_raise(registry, key, timeout)
    try:
        return await function(*args, **kwargs)
    finally:
        await lock.release()
