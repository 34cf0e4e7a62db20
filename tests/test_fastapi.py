"""hybridlock.contrib.fastapi against a real server the suite starts: concurrent requests through FastAPI's own
machinery.

Two apps, each with its own registry opened by ``registry_lifespan`` (two owners, as two worker processes are),
take requests at once through ``httpx.AsyncClient`` over ``ASGITransport`` (the app runs in the test's event loop;
its lifespan is entered by hand, since that transport does not run it). The streaming and disconnect cases call
the app as an ASGI server does, to see each message and to say when the client goes away. Each test ends by
looking in the server: the lock key or the permits are free.
"""

# (No `from __future__ import annotations`: FastAPI reads the endpoints' annotations, which name local variables.)
import asyncio
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

import httpx
import pytest
import redis

from tests._extras import skip_reason

pytest.importorskip("fastapi", reason=skip_reason("fastapi", "fastapi"))

from fastapi import Depends, FastAPI
from fastapi.responses import StreamingResponse

with warnings.catch_warnings():
    # Starlette 1.x asks for httpx2 behind its TestClient and warns when it finds httpx (still the test extra's).
    warnings.filterwarnings("ignore", message=".*httpx2", category=UserWarning)
    from starlette.testclient import TestClient

from hybridlock import AsyncHybridLock, AsyncLocalLockRegistry, HybridLockError, InvalidArgumentError
from hybridlock.contrib.fastapi import (
    LockUnavailable,
    RequestLock,
    RequestPermit,
    get_registry,
    registry_lifespan,
)
from hybridlock.errors import LocksHeldAtCloseWarning
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server

#: How long a test waits for something that happens at once (an event, a request getting in) before failing.
SOON = 10.0


class Probe:
    """What the endpoints report: how many requests are inside each key's endpoint now, the most ever at once, and
    an event per key that the blocking endpoints wait for."""

    def __init__(self) -> None:
        self.inside: dict[str, int] = {}
        self.most: dict[str, int] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.go: dict[str, asyncio.Event] = {}

    def enter(self, key: str) -> None:
        self.inside[key] = self.inside.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.inside[key])
        self.entered.setdefault(key, asyncio.Event()).set()

    def leave(self, key: str) -> None:
        self.inside[key] -= 1

    def gate(self, key: str) -> asyncio.Event:
        return self.go.setdefault(key, asyncio.Event())

    async def wait_inside(self, key: str, count: int = 1) -> None:
        async def reached() -> None:
            while self.inside.get(key, 0) < count:
                await asyncio.sleep(0.005)

        await asyncio.wait_for(reached(), SOON)


def make_app(url: str, probe: Probe) -> FastAPI:
    order_lock = RequestLock("orders:{order_id}", timeout=SOON)
    busy_lock = RequestLock("orders:{order_id}")  # timeout 0: refuse at once, 409
    slow_lock = RequestLock("orders:{order_id}", timeout=0.2, status_code=423, headers={"Retry-After": "1"})
    reports = RequestPermit("reports:{kind}", permits=3, timeout=SOON)
    reports_now = RequestPermit("reports:{kind}", permits=3)

    app = FastAPI(lifespan=registry_lifespan(url))

    @app.post("/orders/{order_id}", dependencies=[Depends(order_lock)])
    async def update(order_id: str) -> dict[str, str]:
        probe.enter(f"orders:{order_id}")
        await asyncio.sleep(0.01)  # long enough for the others to be let in, were the lock not held
        probe.leave(f"orders:{order_id}")
        return {"order": order_id}

    @app.post("/orders/{order_id}/hold", dependencies=[Depends(order_lock)])
    async def hold(order_id: str) -> dict[str, str]:
        key = f"orders:{order_id}"
        probe.enter(key)
        try:
            await probe.gate(key).wait()
        finally:
            probe.leave(key)
        return {"order": order_id}

    @app.post("/orders/{order_id}/now")
    async def now(order_id: str, lock: Annotated[AsyncHybridLock, Depends(busy_lock)]) -> dict[str, Any]:
        return {"order": order_id, "token": lock.fencing_token}

    @app.post("/orders/{order_id}/patient", dependencies=[Depends(slow_lock)])
    async def patient(order_id: str) -> dict[str, str]:
        return {"order": order_id}

    @app.post("/orders/{order_id}/fail", dependencies=[Depends(order_lock)])
    async def fail(order_id: str) -> None:
        raise RuntimeError(f"order {order_id} failed")

    @app.get("/reports", dependencies=[Depends(reports)])
    async def report(kind: str) -> dict[str, str]:
        key = f"reports:{kind}"
        probe.enter(key)
        try:
            await probe.gate(key).wait()
        finally:
            probe.leave(key)
        return {"kind": kind}

    @app.get("/reports/now", dependencies=[Depends(reports_now)])
    async def report_now(kind: str) -> dict[str, str]:
        return {"kind": kind}

    @app.get("/stream/{order_id}", dependencies=[Depends(busy_lock)])
    async def stream(order_id: str) -> StreamingResponse:
        return StreamingResponse(_chunks(probe, f"stream:{order_id}"))

    @app.get("/stream/{order_id}/function", dependencies=[Depends(busy_lock, scope="function")])
    async def stream_function(order_id: str) -> StreamingResponse:
        return StreamingResponse(_chunks(probe, f"stream:{order_id}"))

    return app


async def _chunks(probe: Probe, key: str) -> AsyncIterator[bytes]:
    yield b"first "
    probe.enter(key)
    try:
        await probe.gate(key).wait()
    finally:
        probe.leave(key)
    yield b"last"


@pytest.fixture
def url(server: EmbeddedServer, redis_client: redis.Redis) -> str:
    return server.url  # (redis_client flushed the server)


class Apps:
    """Two apps on the same server, each with its own registry (two owners), with their lifespans running."""

    def __init__(self, url: str) -> None:
        self.probe = Probe()
        self.apps = [make_app(url, self.probe), make_app(url, self.probe)]
        self.clients: list[httpx.AsyncClient] = []
        self.tasks: list[asyncio.Future[Any]] = []
        self._stack = AsyncExitStack()

    def spawn(self, call: Any) -> asyncio.Future[Any]:
        """Run ``call`` (a request) concurrently; ended before the registries close, however the test ends."""
        task = asyncio.ensure_future(call)
        self.tasks.append(task)
        return task

    async def __aenter__(self) -> "Apps":
        for app in self.apps:
            await self._stack.enter_async_context(app.router.lifespan_context(app))
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            client = httpx.AsyncClient(transport=transport, base_url="http://test")
            self.clients.append(await self._stack.enter_async_context(client))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for gate in self.probe.go.values():
            gate.set()  # (a failed test must not leave a request waiting)
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self._stack.aclose()

    def held(self) -> list[Any]:
        return [lease for app in self.apps for lease in app.state.hybridlock_registry.held_locks()]


def lock_in_server(client: redis.Redis, key: str) -> bool:
    return bool(client.exists(f"hybridlock:{{{key}}}"))


def permits_in_server(client: redis.Redis, key: str) -> list[bytes]:
    """The permits of ``key``'s semaphore held in the server (a key per permit, ``...:permit:<slot>``)."""
    return [name for name in client.scan_iter(match=f"hybridlock:{{{key}}}:permit:*") if name.split(b":")[-1].isdigit()]


async def test_one_request_at_a_time_per_key_across_two_owners(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        calls = [apps.clients[i % 2].post(f"/orders/{key}") for i in range(8) for key in ("1", "2")]
        responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200] * 16
        assert apps.probe.most == {"orders:1": 1, "orders:2": 1}
        assert apps.held() == []
    assert not lock_in_server(redis_client, "orders:1")
    assert not lock_in_server(redis_client, "orders:2")


async def test_a_busy_key_is_refused_with_the_status_and_a_clear_body(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        holder = apps.spawn(apps.clients[0].post("/orders/7/hold"))
        await apps.probe.wait_inside("orders:7")
        assert lock_in_server(redis_client, "orders:7")
        # Another owner, and another request of the holder's own app: both refused at once, 409.
        for client in apps.clients:
            refused = await client.post("/orders/7/now")
            assert refused.status_code == 409
            assert refused.json() == {"detail": "lock 'orders:7' is held by another request; try again later"}
        # The status the route chose (423) after the wait it chose, with its headers.
        started = asyncio.get_running_loop().time()
        refused = await apps.clients[1].post("/orders/7/patient")
        assert asyncio.get_running_loop().time() - started >= 0.2
        assert refused.status_code == 423
        assert refused.headers["retry-after"] == "1"
        assert refused.json() == {
            "detail": "lock 'orders:7' is held by another request: not acquired within 0.2 s; try again later"
        }
        # Another key is not blocked by it.
        other = await apps.clients[1].post("/orders/8/now")
        assert other.status_code == 200
        assert other.json()["token"] is not None
        apps.probe.gate("orders:7").set()
        assert (await holder).status_code == 200
        after = await apps.clients[1].post("/orders/7/now")
        assert after.status_code == 200
        assert apps.held() == []
    assert not lock_in_server(redis_client, "orders:7")


async def test_a_permit_limit_holds_across_two_owners(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        key = "reports:daily"
        first = [apps.spawn(apps.clients[i % 2].get("/reports?kind=daily")) for i in range(3)]
        await apps.probe.wait_inside(key, 3)
        waiting = [apps.spawn(apps.clients[i % 2].get("/reports?kind=daily")) for i in range(3)]
        for client in apps.clients:
            refused = await client.get("/reports/now?kind=daily")
            assert refused.status_code == 429
            assert refused.json() == {
                "detail": "all 3 permits of 'reports:daily' are taken by other requests; try again later"
            }
        other = await apps.clients[0].get("/reports/now?kind=weekly")  # another key, its own permits
        assert other.status_code == 200
        await asyncio.sleep(0.1)  # (the waiting ones had time to get in, were the limit not held)
        assert apps.probe.inside[key] == 3
        apps.probe.gate(key).set()
        responses = await asyncio.gather(*first, *waiting)
        assert [r.status_code for r in responses] == [200] * 6
        assert apps.probe.most[key] == 3
        assert (await apps.clients[1].get("/reports/now?kind=daily")).status_code == 200
        assert apps.held() == []
        for app in apps.apps:
            assert app.state.hybridlock_registry.obtain_semaphore(key, permits=3).held_here == 0
    assert permits_in_server(redis_client, key) == []


async def test_the_lock_is_released_after_an_exception_in_the_endpoint(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        failed = await apps.clients[0].post("/orders/3/fail")
        assert failed.status_code == 500
        assert not lock_in_server(redis_client, "orders:3")
        assert (await apps.clients[1].post("/orders/3/now")).status_code == 200
        assert apps.held() == []


async def test_the_lock_is_released_when_the_request_is_cancelled(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        # The holder's request cancelled inside the endpoint (the client gave up: ASGITransport runs the app in the
        # client's task), and a request waiting for the lock cancelled while it waits.
        holder = apps.spawn(apps.clients[0].post("/orders/5/hold"))
        await apps.probe.wait_inside("orders:5")
        waiter = apps.spawn(apps.clients[1].post("/orders/5/hold"))
        await asyncio.sleep(0.05)  # (the waiter is queued in the server)
        waiter.cancel()
        holder.cancel()
        for task in (holder, waiter):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert apps.probe.inside["orders:5"] == 0
        assert not lock_in_server(redis_client, "orders:5")
        assert apps.held() == []
        now = await apps.clients[1].post("/orders/5/now")
        assert now.status_code == 200
        # A permit's request cancelled inside the endpoint.
        inside = apps.spawn(apps.clients[0].get("/reports?kind=cancelled"))
        await apps.probe.wait_inside("reports:cancelled")
        assert len(permits_in_server(redis_client, "reports:cancelled")) == 1
        inside.cancel()
        with pytest.raises(asyncio.CancelledError):
            await inside
        assert permits_in_server(redis_client, "reports:cancelled") == []
        assert apps.held() == []


async def test_the_lifespan_lets_cancelled_requests_give_back_their_holds_before_it_closes_the_registry(
    url: str, redis_client: redis.Redis
) -> None:
    # As uvicorn shuts down: the requests still running when its graceful shutdown times out are cancelled, and the
    # lifespan's exit runs at once, before they have run their release. The registry must close after those
    # releases, not under them (LocksHeldAtCloseWarning, an error here, names a hold that was being given back).
    probe = Probe()
    app = make_app(url, probe)
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    registry = get_registry_of(app)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            calls = [
                asyncio.ensure_future(client.post("/orders/6/hold")),
                asyncio.ensure_future(client.get("/reports?kind=closing")),
            ]
            await probe.wait_inside("orders:6")
            await probe.wait_inside("reports:closing")
            for call in calls:
                call.cancel()
            await lifespan.__aexit__(None, None, None)
            for call in calls:
                with pytest.raises(asyncio.CancelledError):
                    await call
    finally:
        for gate in probe.go.values():
            gate.set()
        await lifespan.__aexit__(None, None, None)  # (closes it if the test failed before; else does nothing)
    assert registry.closed
    assert registry.held_locks() == []
    assert not lock_in_server(redis_client, "orders:6")
    assert permits_in_server(redis_client, "reports:closing") == []


async def test_the_lifespan_waits_for_a_running_request_at_most_its_shutdown_timeout(
    url: str, redis_client: redis.Redis
) -> None:
    app = FastAPI(lifespan=registry_lifespan(url, shutdown_timeout=0.2))
    inside, go_on = asyncio.Event(), asyncio.Event()

    @app.get("/o/{order_id}", dependencies=[Depends(RequestLock("orders:{order_id}"))])
    async def get(order_id: str) -> None:
        inside.set()
        await go_on.wait()

    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        call = asyncio.ensure_future(client.get("/o/1"))
        await asyncio.wait_for(inside.wait(), SOON)
        started = asyncio.get_running_loop().time()
        with pytest.warns(LocksHeldAtCloseWarning, match="'orders:1'"):
            await lifespan.__aexit__(None, None, None)
        assert 0.2 <= asyncio.get_running_loop().time() - started < 0.2 + SOON
        go_on.set()
        assert (await call).status_code == 200  # its release still goes to the server
    assert not lock_in_server(redis_client, "orders:1")


async def _asgi_get(app: FastAPI, path: str, disconnect: asyncio.Event, body: list[bytes]) -> None:
    """GET ``path`` from ``app`` as an ASGI server would, collecting the body; the client goes away (an
    ``http.disconnect`` message) once ``disconnect`` is set."""

    async def receive() -> dict[str, Any]:
        if not hasattr(receive, "sent"):
            receive.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"", "more_body": False}
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
        "state": {},
    }
    await app(scope, receive, send)


async def test_the_lock_covers_a_streamed_body_by_default_and_not_with_function_scope(
    url: str, redis_client: redis.Redis
) -> None:
    async with Apps(url) as apps:
        app = apps.apps[0]
        for path, covered in (("/stream/9", True), ("/stream/9/function", False)):
            body: list[bytes] = []
            call = apps.spawn(_asgi_get(app, path, asyncio.Event(), body))
            await apps.probe.wait_inside("stream:9")  # the first chunk is sent, the body not finished
            assert b"first " in body
            assert lock_in_server(redis_client, "orders:9") is covered, path
            apps.probe.gate("stream:9").set()
            await asyncio.wait_for(call, SOON)
            assert b"".join(body) == b"first last"
            assert not lock_in_server(redis_client, "orders:9")
            apps.probe.go.pop("stream:9")
        assert apps.held() == []


async def test_the_lock_is_released_when_the_client_disconnects_mid_stream(url: str, redis_client: redis.Redis) -> None:
    async with Apps(url) as apps:
        disconnect = asyncio.Event()
        body: list[bytes] = []
        call = apps.spawn(_asgi_get(apps.apps[0], "/stream/4", disconnect, body))
        await apps.probe.wait_inside("stream:4")
        assert lock_in_server(redis_client, "orders:4")
        disconnect.set()  # the gate stays shut: only the disconnect ends the stream
        await asyncio.wait_for(call, SOON)
        assert b"".join(body) == b"first "
        assert apps.probe.inside["stream:4"] == 0
        assert not lock_in_server(redis_client, "orders:4")
        assert apps.held() == []
        assert (await apps.clients[1].post("/orders/4/now")).status_code == 200


async def test_key_templates_take_path_then_query_parameters(url: str, redis_client: redis.Redis) -> None:
    seen: list[str] = []
    by_tenant = RequestLock(lambda request: f"tenant:{request.headers['x-tenant']}")
    both = RequestLock("{tenant}:{order_id}")
    app = FastAPI(lifespan=registry_lifespan(url))

    @app.get("/t/{order_id}")
    async def show(
        lock: Annotated[AsyncHybridLock, Depends(both)], other: Annotated[AsyncHybridLock, Depends(by_tenant)]
    ) -> None:
        seen.extend([lock.key, other.key])

    @app.get("/whole", dependencies=[Depends(RequestLock("{tenant}"))])
    async def whole() -> None:
        pass

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            ok = await client.get("/t/12?tenant=acme&order_id=99", headers={"x-tenant": "acme"})
            assert ok.status_code == 200, ok.text
            assert seen == ["acme:12", "tenant:acme"]
            missing = await client.get("/t/12", headers={"x-tenant": "acme"})
            assert missing.status_code == 422
            assert missing.json()["detail"][0]["loc"] == ["query", "tenant"]
            # A key the request's own values make invalid (empty) is the request's fault: 422, not 500.
            empty = await client.get("/whole?tenant=")
            assert empty.status_code == 422
            assert "lock key must not be empty" in empty.json()["detail"][0]["msg"]
            assert (await client.get("/whole?tenant=acme")).status_code == 200


async def test_two_permit_settings_for_one_key_are_the_apps_error_not_the_requests(url: str) -> None:
    # Two endpoints limit one key with different permits: the app's own mistake, a server error (500) whose detail
    # (naming the lock server) does not reach the client; never a 422 blaming the request.
    app = FastAPI(lifespan=registry_lifespan(url))
    held, go_on = asyncio.Event(), asyncio.Event()

    @app.get("/a", dependencies=[Depends(RequestPermit("reports", permits=4))])
    async def a() -> None:
        held.set()
        await go_on.wait()

    @app.get("/b", dependencies=[Depends(RequestPermit("reports", permits=2))])
    async def b() -> None:
        pass

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = asyncio.ensure_future(client.get("/a"))
            await asyncio.wait_for(held.wait(), 10)
            second = await client.get("/b")
            go_on.set()
            assert (await first).status_code == 200
    assert second.status_code == 500, second.text
    assert "redis://" not in second.text


def test_the_test_client_runs_the_lifespan_and_the_app_lifespan_inside_it(url: str) -> None:
    events: list[str] = []

    @asynccontextmanager
    async def own(app: FastAPI) -> AsyncIterator[None]:
        events.append(f"start, registry open: {not get_registry_of(app).closed}")
        yield
        events.append(f"stop, registry open: {not get_registry_of(app).closed}")

    app = FastAPI(lifespan=registry_lifespan(url, lifespan=own, expire_after=5))

    @app.get("/o/{order_id}", dependencies=[Depends(RequestLock("orders:{order_id}"))])
    async def get(order_id: str, registry: Annotated[Any, Depends(get_registry)]) -> dict[str, float]:
        return {"expire_after": registry.expire_after}

    with pytest.raises(HybridLockError, match="no lock registry"):
        TestClient(app).get("/o/1")  # outside `with`, the lifespan does not run
    with TestClient(app) as client:
        assert client.get("/o/1").json() == {"expire_after": 5.0}
        registry = app.state.hybridlock_registry
    assert registry.closed
    assert events == ["start, registry open: True", "stop, registry open: True"]


def test_any_registry_through_a_factory() -> None:
    app = FastAPI(lifespan=registry_lifespan(registry=lambda: AsyncLocalLockRegistry("local")))
    busy = RequestLock("orders:{order_id}")

    @app.get("/o/{order_id}")
    async def get(lock: Annotated[AsyncHybridLock, Depends(busy)]) -> dict[str, str]:
        return {"registry": lock.registry.registry_key}

    with TestClient(app) as client:
        assert client.get("/o/1").json() == {"registry": "local"}


def get_registry_of(app: FastAPI) -> Any:
    return app.state.hybridlock_registry


@pytest.mark.parametrize(
    "make",
    [
        lambda: RequestLock("orders:{}"),
        lambda: RequestLock("orders:{0}"),
        lambda: RequestLock("orders:{id!r}"),
        lambda: RequestLock("orders:{id"),
        lambda: RequestLock(""),
        lambda: RequestLock("orders", timeout=-1),
        lambda: RequestLock("orders", status_code=200),
        lambda: RequestPermit("reports", permits=0),
        # Issue 34: values every request would be refused for (a 422 blaming the client), refused when declared.
        lambda: RequestPermit("big", permits=2000),
        lambda: RequestPermit("big", permits=1025),
        lambda: RequestPermit("reports", permits=2, timeout=1e300),
        lambda: RequestLock("orders", timeout=1e300),
        lambda: RequestLock("}}orders"),
        lambda: RequestLock("orders:\ud800"),
        lambda: registry_lifespan(),
        lambda: registry_lifespan("redis://x", registry=lambda: None),
        lambda: registry_lifespan("redis://x", shutdown_timeout=-1),
    ],
)
def test_bad_arguments_are_refused_when_the_app_is_built(make: Callable[[], object]) -> None:
    with pytest.raises(InvalidArgumentError):
        make()


def test_the_largest_values_a_request_can_use_are_accepted_when_the_app_is_built() -> None:
    assert RequestPermit("reports", permits=1024, timeout=9e9).permits == 1024
    assert RequestLock("{order_id}", timeout=float("inf")).timeout == float("inf")


def test_a_refusal_is_an_http_exception_naming_the_key() -> None:
    refusal = RequestLock("orders:{order_id}", timeout=1)._refusal("orders:1")
    assert isinstance(refusal, LockUnavailable)
    assert (refusal.status_code, refusal.key, refusal.kind, refusal.timeout) == (409, "orders:1", "lock", 1)


def test_importing_hybridlock_imports_no_framework() -> None:
    program = "import sys, hybridlock; print(sorted({'fastapi', 'starlette'} & set(sys.modules)))"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stderr


def test_without_fastapi_the_import_says_which_extra_to_install() -> None:
    program = "import sys; sys.modules['fastapi'] = None; import hybridlock.contrib.fastapi"
    run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "hybridlock.contrib.fastapi needs FastAPI: pip install 'hybridlock[fastapi]'" in run.stderr
