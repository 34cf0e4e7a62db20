"""The app that ``tests/test_fastapi_uvicorn.py`` serves with real uvicorn processes
(``uvicorn --factory tests._fastapi_uvicorn_app:create_app``), against the server at ``REDIS_URL``.

Its endpoints report to the test through that same server, in ``probe:*`` keys apart from hybridlock's: how many
requests are inside a key's endpoint now (``probe:inside:<key>``) and the most ever at once (``probe:most:<key>``),
a list each request pushes its pid to once inside (``probe:entered:<key>``), a list a holding request pops its go
from (``probe:go:<key>``), and the pids of the workers whose lifespan started and stopped (``probe:started``,
``probe:stopping``). Counters in the server, not in the process: the requests run in several processes.
"""

# (No `from __future__ import annotations`: FastAPI reads the endpoints' annotations.)
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import redis.asyncio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from hybridlock import AsyncHybridLock
from hybridlock.contrib.fastapi import RequestLock, RequestPermit, registry_lifespan

#: The lease of every hold (s): the tests show that a release comes well before it would end.
EXPIRE_AFTER = 30.0
#: The longest a request waits for the lock, a go or a disconnect (the test's own bounds are shorter).
WAIT = 20.0
#: The wait of the endpoint whose refusal the test times (s).
BUSY_TIMEOUT = 0.3
PERMITS = 2

# Adds one to KEYS[1] (inside now) and raises KEYS[2] (the most at once) to it; returns the new count.
ENTER = """
local inside = redis.call('INCR', KEYS[1])
if inside > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], inside) end
return inside
"""


@asynccontextmanager
async def probe_lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Around registry_lifespan's (one per worker process), so that the registry closes as soon as the server
    # shuts down, as it does in an app that has no lifespan of its own.
    probe = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
    app.state.probe = probe
    try:
        async with registry_lifespan(os.environ["REDIS_URL"], expire_after=EXPIRE_AFTER)(app):
            await probe.rpush("probe:started", os.getpid())
            yield
        await probe.rpush("probe:stopping", os.getpid())
    finally:
        await probe.aclose()


order_lock = RequestLock("orders:{order_id}", timeout=WAIT)
busy_lock = RequestLock("orders:{order_id}", timeout=BUSY_TIMEOUT, status_code=423, headers={"Retry-After": "1"})
stream_lock = RequestLock("orders:{order_id}")
report_permit = RequestPermit("reports:{kind}", permits=PERMITS, timeout=WAIT)
report_now = RequestPermit("reports:{kind}", permits=PERMITS)


def probe_of(request: Request) -> Any:
    return request.app.state.probe


async def enter(probe: Any, key: str) -> None:
    await probe.eval(ENTER, 2, f"probe:inside:{key}", f"probe:most:{key}")
    await probe.rpush(f"probe:entered:{key}", os.getpid())


async def leave(probe: Any, key: str) -> None:
    await probe.decr(f"probe:inside:{key}")


def create_app() -> FastAPI:
    """The app (``uvicorn --factory tests._fastapi_uvicorn_app:create_app``), on the server at ``REDIS_URL``."""
    app = FastAPI(lifespan=probe_lifespan)

    @app.get("/pid")
    async def pid() -> dict[str, int]:
        return {"pid": os.getpid()}

    @app.post("/orders/{order_id}")
    async def pay(
        order_id: str, request: Request, lock: Annotated[AsyncHybridLock, Depends(order_lock)]
    ) -> dict[str, Any]:
        key = f"orders:{order_id}"
        await enter(probe_of(request), key)
        await asyncio.sleep(0.02)  # long enough for another request to come in, were the lock not held
        await leave(probe_of(request), key)
        return {"pid": os.getpid(), "token": lock.fencing_token}

    @app.post("/orders/{order_id}/hold", dependencies=[Depends(order_lock)])
    async def hold(order_id: str, request: Request, until_disconnect: bool = False) -> dict[str, Any]:
        """Holds the lock until the test pushes a go; with ``until_disconnect``, first until the client has gone (it
        then pushes its pid to ``probe:disconnected:<key>``: the endpoint runs on, and holds the lock, after that)."""
        key = f"orders:{order_id}"
        probe = probe_of(request)
        await enter(probe, key)
        if until_disconnect:
            await asyncio.wait_for(gone(request), WAIT)
            await probe.rpush(f"probe:disconnected:{key}", os.getpid())
        await probe.blpop([f"probe:go:{key}"], WAIT)
        await leave(probe, key)
        return {"pid": os.getpid()}

    @app.post("/orders/{order_id}/busy", dependencies=[Depends(busy_lock)])
    async def busy(order_id: str) -> dict[str, Any]:
        return {"pid": os.getpid()}

    @app.get("/reports/{kind}", dependencies=[Depends(report_permit)])
    async def report(kind: str, request: Request) -> dict[str, Any]:
        key = f"reports:{kind}"
        probe = probe_of(request)
        await enter(probe, key)
        await probe.blpop([f"probe:go:{key}"], WAIT)
        await leave(probe, key)
        return {"pid": os.getpid()}

    @app.get("/reports/{kind}/now", dependencies=[Depends(report_now)])
    async def report_at_once(kind: str) -> dict[str, Any]:
        return {"pid": os.getpid()}

    @app.get("/orders/{order_id}/stream", dependencies=[Depends(stream_lock)])
    async def stream(order_id: str, request: Request) -> StreamingResponse:
        return StreamingResponse(held_body(probe_of(request), f"orders:{order_id}"))

    @app.get("/reports/{kind}/stream", dependencies=[Depends(report_now)])
    async def report_stream(kind: str, request: Request) -> StreamingResponse:
        return StreamingResponse(held_body(probe_of(request), f"reports:{kind}"))

    return app


async def gone(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.01)


async def held_body(probe: Any, key: str) -> AsyncIterator[bytes]:
    """A body sent in two chunks, the second after a go: the hold covers the time between them."""
    yield b"first "
    await probe.blpop([f"probe:go:{key}"], WAIT)
    yield b"last"
