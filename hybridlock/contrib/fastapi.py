"""FastAPI integration: a registry opened by the app's lifespan (which serves a plain Starlette app as well), and
dependencies that hold a lock or a semaphore permit for the length of a request.

    app = FastAPI(lifespan=registry_lifespan("redis://localhost:6379/0"))

    @app.post("/orders/{order_id}/pay", dependencies=[Depends(RequestLock("orders:{order_id}", timeout=2))])
    async def pay(order_id: int): ...

Needs the ``fastapi`` extra (``pip install 'hybridlock[fastapi]'``); ``import hybridlock`` itself never imports
FastAPI. Built on the public asyncio API only (``AsyncLockRegistry``, ``obtain``, ``obtain_semaphore``).

When a dependency's hold ends: FastAPI runs the code after a dependency's ``yield`` after the response is sent
(FastAPI 0.118 and later, the default ``Depends(..., scope="request")``), so the lock or permit covers the whole
response, a streamed body included; with ``Depends(..., scope="function")`` (FastAPI 0.121 and later) it ends when
the path operation function returns, before the response is sent. FastAPI 0.106 to 0.117 always ended it before
the response was sent. Either way the release runs however the request ends: a response, an exception in the
endpoint, a client that went away (Starlette stops streaming the body and the request's exit code runs), a
cancelled request task; FastAPI shields that exit code from cancellation, and the release's own server round trip
is shielded by hybridlock as well. At shutdown ``registry_lifespan`` closes the registry only once the requests
holding (or taking, or giving back) a lock or permit of it are done, waiting at most ``shutdown_timeout``: an ASGI
server may cancel the requests still running and run the lifespan's exit at once (uvicorn does, past its
``--timeout-graceful-shutdown``), before their releases have gone to the server.

Failure modes: a hold is a lease, renewed by the registry while the request runs. If the lease is lost (the server
unreachable for longer than ``expire_after``), another request may be let in while this one still runs; the
endpoint that must not act without the lock checks ``lock.ensure_held()`` (or the fencing token) before it commits,
and the release at the request's end raises ``LockLostError``. A lock server that cannot be reached when the
request starts raises ``BackendUnavailableError`` out of the dependency (an exception handler of the app may turn
it into a 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import string
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

try:
    from fastapi import HTTPException, Request
    from fastapi.exceptions import RequestValidationError
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(f"hybridlock.contrib.fastapi needs FastAPI: pip install 'hybridlock[fastapi]' ({exc})") from exc

from .. import AsyncHybridLock, AsyncLockRegistry, AsyncSemaphore
from ..errors import HybridLockError, InvalidArgumentError
from ..templates import acquire_timeout, key_template, semaphore_permits

__all__ = [
    "STATE_ATTRIBUTE",
    "LockUnavailable",
    "RequestLock",
    "RequestPermit",
    "get_registry",
    "registry_lifespan",
]

#: The attribute of ``app.state`` that ``registry_lifespan`` stores the open registry in.
STATE_ATTRIBUTE = "hybridlock_registry"

Lifespan = Callable[[Any], Any]  # app -> an async context manager (what FastAPI's lifespan= takes)
KeyFunction = Callable[[Request], str]


def registry_lifespan(
    connection: Any = None,
    *,
    registry: Callable[[], AsyncLockRegistry] | None = None,
    lifespan: Lifespan | None = None,
    shutdown_timeout: float | None = 5.0,
    **registry_options: Any,
) -> Callable[[Any], Any]:
    """A lifespan for ``FastAPI(lifespan=...)`` (or Starlette's) that opens an ``AsyncLockRegistry`` on startup,
    puts it on ``app.state.hybridlock_registry`` (see ``get_registry``), and closes it on shutdown.

    ``connection`` and ``registry_options`` are ``AsyncLockRegistry``'s (a ``redis://`` URL, a client, ...); or
    ``registry``, a callable with no arguments that returns a registry (an ``AsyncQuorumLockRegistry``, an
    ``AsyncLocalLockRegistry`` in tests), called on startup. The registry is made inside the app's event loop, the
    loop it belongs to from then on.

    ``lifespan`` is the app's own lifespan, run inside this one: the registry is open during its startup and its
    shutdown, and what it yields (a state dict, or None) is what this lifespan yields.

    ``shutdown_timeout``: on shutdown, how long (seconds; None: as long as it takes) to wait, after the app's own
    lifespan has ended, for the requests still holding, taking or giving back a lock or permit of ``RequestLock`` or
    ``RequestPermit`` before closing the registry (a request the server cancelled at its shutdown gives its hold
    back then). A hold left after it stays held until its request releases it or its lease ends, and closing the
    registry warns (``LocksHeldAtCloseWarning``) naming it."""
    if (connection is None) == (registry is None):
        raise InvalidArgumentError("registry_lifespan needs one of a connection (a URL, a client) and registry=")
    if registry is not None and registry_options:
        raise InvalidArgumentError(
            f"registry options ({', '.join(sorted(registry_options))}) go to the registry that registry= makes"
        )
    _check_seconds("shutdown_timeout", shutdown_timeout)

    @asynccontextmanager
    async def hybridlock_lifespan(app: Any) -> AsyncIterator[Any]:
        opened = registry() if registry is not None else AsyncLockRegistry(connection, **registry_options)
        if not isinstance(opened, AsyncLockRegistry):
            raise InvalidArgumentError(
                f"registry= must return an AsyncLockRegistry (the asyncio API), not {type(opened).__name__}"
            )
        async with opened:
            # (A request still running after shutdown meets a closed registry: RegistryClosedError.)
            holds = _holds[opened] = _Holds()
            setattr(app.state, STATE_ATTRIBUTE, opened)
            try:
                if lifespan is None:
                    yield None
                else:
                    async with lifespan(app) as state:
                        yield state
            finally:
                # The server may have cancelled the requests still running and come here at once (uvicorn does):
                # closing under their releases would warn of holds that are being given back as left held.
                await holds.wait_none(shutdown_timeout)

    return hybridlock_lifespan


def get_registry(request: Request) -> AsyncLockRegistry:
    """The registry ``registry_lifespan`` opened for the request's app; a dependency (``Depends(get_registry)``)
    as well as a function. Raises ``HybridLockError`` when the app has none (no ``registry_lifespan``, or a
    ``TestClient`` used outside ``with TestClient(app) as client:``, which alone runs the lifespan)."""
    found = getattr(request.app.state, STATE_ATTRIBUTE, None)
    if not isinstance(found, AsyncLockRegistry):
        raise HybridLockError(
            "this app has no lock registry: give it lifespan=hybridlock.contrib.fastapi.registry_lifespan(...) (the "
            "lifespan runs under a server, and in tests inside `with TestClient(app) as client:`)"
        )
    return found


class _Holds:
    """How many requests are holding, taking or giving back a lock or permit of one registry that
    ``registry_lifespan`` opened: its exit waits for none before it closes the registry."""

    def __init__(self) -> None:
        self._count = 0
        self._none = asyncio.Event()
        self._none.set()

    def enter(self) -> None:
        self._count += 1
        self._none.clear()

    def exit(self) -> None:
        self._count -= 1
        if not self._count:
            self._none.set()

    async def wait_none(self, timeout: float | None) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._none.wait(), timeout)


#: The holds of each open registry that registry_lifespan opened (one set by hand on app.state has none: untracked).
_holds: weakref.WeakKeyDictionary[AsyncLockRegistry, _Holds] = weakref.WeakKeyDictionary()


def _holds_of(registry: AsyncLockRegistry) -> _Holds:
    return _holds.get(registry) or _Holds()


class LockUnavailable(HTTPException):
    """The answer of ``RequestLock`` / ``RequestPermit`` when the lock or a permit was not had in time: an
    ``HTTPException`` (so FastAPI answers ``{"detail": ...}`` with its status code), with the ``key``, the ``kind``
    (``"lock"`` or ``"semaphore"``) and the ``timeout`` that passed, for an exception handler of the app that
    wants to answer otherwise (``@app.exception_handler(LockUnavailable)``)."""

    def __init__(
        self,
        status_code: int,
        detail: str,
        *,
        key: str,
        kind: str,
        timeout: float | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=dict(headers) if headers else None)
        self.key = key
        self.kind = kind
        self.timeout = timeout


class _RequestHold:
    """What ``RequestLock`` and ``RequestPermit`` share: the key from the request, the wait, the refusal."""

    _kind: str

    def __init__(
        self,
        key: str | KeyFunction,
        *,
        timeout: float | None,
        status_code: int,
        detail: str | None,
        headers: Mapping[str, str] | None,
    ) -> None:
        if isinstance(key, str):
            self._fields = _template_fields(key)
            key_template(key)  # a key every request would be refused for (a 422 blaming the client): refused now
        elif callable(key):
            self._fields = ()
        else:
            raise InvalidArgumentError(f"key must be a template (str) or a callable(request), not {type(key).__name__}")
        _check_seconds("timeout", timeout)
        acquire_timeout(timeout)  # (above threading.TIMEOUT_MAX: every acquire would refuse it)
        if isinstance(status_code, bool) or not isinstance(status_code, int) or not 400 <= status_code <= 599:
            raise InvalidArgumentError(f"status_code must be an HTTP error status (4xx or 5xx), not {status_code!r}")
        self.key = key
        self.timeout = timeout
        self.status_code = status_code
        self.detail = detail
        self.headers = headers

    def key_for(self, request: Request) -> str:
        """The lock key for ``request``: the template filled from its path parameters (as Starlette converted them:
        ``{order_id:int}`` in the route's path gives ``42`` for ``/orders/042``) and, for the names that are none,
        its query parameters (as sent; the last one of a repeated name). A name the request lacks answers 422,
        as FastAPI answers a missing parameter."""
        if callable(self.key):
            return self.key(request)
        values: dict[str, Any] = {}
        for name in self._fields:
            if name in request.path_params:
                values[name] = request.path_params[name]
            elif name in request.query_params:
                values[name] = request.query_params[name]
            else:
                raise RequestValidationError(
                    [{"type": "missing", "loc": ("query", name), "msg": "Field required", "input": None}]
                )
        return self.key.format_map(values)

    def _refusal(self, key: str) -> LockUnavailable:
        if self.detail is not None:
            detail = self.detail
        elif self.timeout is None or self.timeout == 0:
            detail = f"{self._busy(key)}; try again later"
        else:
            detail = f"{self._busy(key)}: not acquired within {self.timeout:g} s; try again later"
        return LockUnavailable(
            self.status_code, detail, key=key, kind=self._kind, timeout=self.timeout, headers=self.headers
        )

    def _busy(self, key: str) -> str:
        raise NotImplementedError

    def _acquire_arguments(self) -> dict[str, Any]:
        # None waits as long as it takes, 0 takes it only if free now, else at most that long.
        if self.timeout is None:
            return {"blocking": True}
        if self.timeout == 0:
            return {"blocking": False}
        return {"timeout": self.timeout}

    def _obtain(self, request: Request, obtain: Callable[[str], Any]) -> tuple[str, Any]:
        key = self.key_for(request)
        try:
            return key, obtain(key)
        except InvalidArgumentError as exc:
            if callable(self.key) or exc.key is not None:
                # The application's key function is at fault, or the app's own settings for a valid key (two
                # RequestPermits of one key with different permits): a server error, not the request's.
                raise
            # A template filled from the request's own values (an empty query parameter for the whole key, ...).
            raise RequestValidationError(
                [{"type": "value_error", "loc": ("query",), "msg": str(exc), "input": key}]
            ) from None

    def __repr__(self) -> str:
        return (
            f"<hybridlock.contrib.fastapi.{type(self).__name__} key={self.key!r} timeout={self.timeout!r} "
            f"status_code={self.status_code}>"
        )


class RequestLock(_RequestHold):
    """A dependency that holds the lock for a key built from the request, for the whole request:
    ``Depends(RequestLock("orders:{order_id}", timeout=2))``; the path operation may take the held
    ``AsyncHybridLock`` as its value (``lock: Annotated[AsyncHybridLock, Depends(order_lock)]``), for its fencing
    token or ``ensure_held()``.

    ``key``: a template whose ``{name}`` fields are path parameters or, failing that, query parameters of the
    request (see ``key_for``); or a callable taking the ``Request`` and returning the key (a header, the user).
    ``timeout``: how long a request waits for the lock (seconds; 0, the default: only if free now; None: as long
    as it takes). When it is not had in time the request is answered ``status_code`` (409 Conflict by default: the
    request conflicts with another one in progress on the same resource; 423 Locked is WebDAV's and some clients
    and proxies do not know it) with a JSON body ``{"detail": "lock 'orders:42' is held by another request; try
    again later"}`` (or ``detail``), and ``headers`` (``Retry-After``, say), by raising ``LockUnavailable``.

    The lock is the registry's (``get_registry``): requests of every worker process and every replica sharing the
    server exclude each other, and requests of one process queue in arrival order. It is released when the
    request ends, however it ends (see the module's docstring for when that is relative to the response)."""

    _kind = "lock"

    def __init__(
        self,
        key: str | KeyFunction,
        *,
        timeout: float | None = 0,
        status_code: int = 409,
        detail: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(key, timeout=timeout, status_code=status_code, detail=detail, headers=headers)

    def _busy(self, key: str) -> str:
        return f"lock {key!r} is held by another request"

    async def __call__(self, request: Request) -> AsyncIterator[AsyncHybridLock]:
        registry = get_registry(request)
        key, lock = self._obtain(request, registry.obtain)
        holds = _holds_of(registry)
        holds.enter()
        try:
            if not await lock.acquire(**self._acquire_arguments()):
                raise self._refusal(key)
            try:
                yield lock
            finally:
                await lock.release()
        finally:
            holds.exit()


class RequestPermit(_RequestHold):
    """A dependency that holds one of ``permits`` permits of a semaphore for the whole request: at most
    ``permits`` requests at once inside the endpoint across every process sharing the server
    (``Depends(RequestPermit("reports", permits=4))``). The path operation may take the ``AsyncSemaphore``.

    ``key``, ``timeout``, ``detail`` and ``headers`` as ``RequestLock`` takes them; ``status_code`` defaults to 429
    Too Many Requests (a concurrency limit, which clients and gateways know to back off from).

    The limit is the semaphore's, stored in the server by its first user and kept while it is used (see
    docs/semaphore.md): a ``permits`` that differs from the stored limit does not change it; ``set_permits`` on
    the semaphore does."""

    _kind = "semaphore"

    def __init__(
        self,
        key: str | KeyFunction,
        *,
        permits: int,
        timeout: float | None = 0,
        status_code: int = 429,
        detail: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(key, timeout=timeout, status_code=status_code, detail=detail, headers=headers)
        # Checked as obtain_semaphore checks it (1 to 1024): refused now, not at every request.
        self.permits = semaphore_permits(permits)

    def _busy(self, key: str) -> str:
        return f"all {self.permits} permits of {key!r} are taken by other requests"

    async def __call__(self, request: Request) -> AsyncIterator[AsyncSemaphore]:
        registry = get_registry(request)
        key, semaphore = self._obtain(request, lambda key: registry.obtain_semaphore(key, permits=self.permits))
        holds = _holds_of(registry)
        holds.enter()
        try:
            if not await semaphore.acquire(**self._acquire_arguments()):
                raise self._refusal(key)
            try:
                yield semaphore
            finally:
                await semaphore.release()
        finally:
            holds.exit()


def _check_seconds(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
        raise InvalidArgumentError(f"{name} must be None or a number of seconds >= 0, not {value!r}")


def _template_fields(template: str) -> tuple[str, ...]:
    """The parameter names a key template uses, checked: named fields only, no conversions or format specs."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidArgumentError(f"not a valid key template: {template!r} ({exc})") from None
    for _text, field, spec, conversion in parsed:
        if field is None:
            continue
        if not field.isidentifier():
            raise InvalidArgumentError(
                f"key template {template!r}: each field must name a path or query parameter ({{order_id}}), not "
                f"{{{field}}}"
            )
        if spec or conversion:
            raise InvalidArgumentError(f"key template {template!r}: fields take no conversion or format spec")
        if field not in names:
            names.append(field)
    if not template:
        raise InvalidArgumentError("key template must not be empty")
    return tuple(names)
