"""hybridlock.contrib.fastapi under a real ASGI server: ``tests/_fastapi_uvicorn_app.py`` served by uvicorn
processes against the suite's server, driven by real HTTP requests over loopback sockets.

Two uvicorn servers share the module: ``a`` with two worker processes (``--workers 2``: each runs the lifespan and
opens its own registry), ``b`` with one; requests go to both, so the locks are shown across three processes. The
endpoints count who is inside in the lock server itself (see the app's docstring). A client that goes away is a
socket closed by the test: the lease must be gone from the server well before it would expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
import redis.asyncio

from tests._extras import skip_reason

pytest.importorskip("fastapi", reason=skip_reason("fastapi", "fastapi"))
pytest.importorskip("uvicorn", reason=skip_reason("uvicorn", "test"))

from hybridlock.testing.server import EmbeddedServer, _free_port
from tests._examples import ROOT, checkout_env

from ._fastapi_uvicorn_app import BUSY_TIMEOUT, EXPIRE_AFTER, PERMITS

pytestmark = pytest.mark.server

#: How long the test waits for something that happens at once (a request getting in, a release) before failing;
#: a fraction of EXPIRE_AFTER, so that a release seen within it is the request's, not the lease's end.
SOON = 5.0
assert SOON < EXPIRE_AFTER / 4


@dataclass
class Uvicorn:
    """One uvicorn server process (and its workers) serving the test app on a free loopback port."""

    name: str
    workers: int
    log: Path
    port: int = field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, redis_url: str) -> None:
        command = [sys.executable, "-m", "uvicorn", "--factory", "tests._fastapi_uvicorn_app:create_app"]
        command += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
        command += ["--log-level", "warning", "--no-access-log", "--timeout-graceful-shutdown", "1"]
        with self.log.open("wb") as log:
            # A session of its own, so that a server that ignores SIGTERM is killed with its workers (its group).
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=checkout_env(warnings=None, REDIS_URL=redis_url),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def stop(self) -> int | None:
        """Stop it by its pid (SIGTERM: uvicorn's graceful shutdown, the lifespans' exit); killed with its workers
        if it has not ended within 15 s. Its exit status (None if it was never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        return self.process.returncode


@dataclass
class Servers:
    a: Uvicorn
    b: Uvicorn
    redis_url: str

    @property
    def all(self) -> tuple[Uvicorn, Uvicorn]:
        return (self.a, self.b)

    def stop(self) -> list[int | None]:
        return [server.stop() for server in self.all]


@pytest.fixture(scope="module")
def servers(server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    logs = tmp_path_factory.mktemp("uvicorn")
    started = Servers(Uvicorn("a", 2, logs / "a.log"), Uvicorn("b", 1, logs / "b.log"), server.url)
    with redis.Redis.from_url(server.url) as client:
        client.flushall()
        try:
            for uvicorn in started.all:
                uvicorn.start(server.url)
            # Every worker's lifespan has run (each pushes its pid), then each server answers.
            deadline = time.monotonic() + 60
            while client.llen("probe:started") < 3:
                assert time.monotonic() < deadline, _logs(started)
                assert all(u.process and u.process.poll() is None for u in started.all), _logs(started)
                time.sleep(0.05)
            for uvicorn in started.all:
                while True:
                    try:
                        if httpx.get(f"{uvicorn.url}/pid", timeout=SOON).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, _logs(started)
                    time.sleep(0.05)
            yield started
        finally:
            started.stop()


def _logs(servers: Servers) -> str:
    return "\n".join(f"--- uvicorn {u.name}:\n{u.log.read_text(errors='replace')[-3000:]}" for u in servers.all)


@asynccontextmanager
async def clients(servers: Servers) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, redis.asyncio.Redis]]:
    """An HTTP client for each server (a connection per concurrent request) and a client of the lock server."""
    async with (
        httpx.AsyncClient(base_url=servers.a.url, timeout=30) as a,
        httpx.AsyncClient(base_url=servers.b.url, timeout=30) as b,
    ):
        probe = redis.asyncio.Redis.from_url(servers.redis_url)
        try:
            yield a, b, probe
        finally:
            await probe.aclose()


async def entered(probe: redis.asyncio.Redis, key: str, count: int = 1) -> list[int]:
    """The pids of the next ``count`` requests that get inside ``key``'s endpoint, as they do."""
    pids = []
    for _ in range(count):
        popped = await probe.blpop([f"probe:entered:{key}"], SOON)
        assert popped is not None, f"no request got inside {key} within {SOON} s"
        pids.append(int(popped[1]))
    return pids


async def lease_of(probe: redis.asyncio.Redis, key: str) -> float:
    """The time left of ``key``'s lock lease in the server (s); 0 when it is not held."""
    return max(0, await probe.pttl(f"hybridlock:{{{key}}}")) / 1000


async def permits_of(probe: redis.asyncio.Redis, key: str) -> list[bytes]:
    """The permits of ``key``'s semaphore held in the server (a key per permit, ``...:permit:<slot>``)."""
    return [
        name async for name in probe.scan_iter(match=f"hybridlock:{{{key}}}:permit:*") if name.split(b":")[-1].isdigit()
    ]


async def released_within(probe: redis.asyncio.Redis, key: str, *, permit: bool = False) -> float:
    """How long (s) until ``key``'s lock (or its last permit) is gone from the server; fails past SOON."""
    started = time.monotonic()
    while await permits_of(probe, key) if permit else await lease_of(probe, key):
        assert time.monotonic() - started < SOON, f"{key} still held {SOON} s after its request ended"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_one_request_at_a_time_per_key_across_processes(servers: Servers) -> None:
    async with clients(servers) as (a, b, probe):
        key = "orders:1"
        calls = [(a, b)[i % 2].post("/orders/1") for i in range(10)]
        responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200] * 10
        assert int(await probe.get(f"probe:most:{key}")) == 1
        # a's and b's requests ran in different processes (a's two workers, b).
        assert {r.json()["pid"] for r in responses[1::2]}.isdisjoint({r.json()["pid"] for r in responses[0::2]})
        # A fencing token is one process's tenancy of the lease: requests of one worker that follow each other
        # within its local hand-off window share one (docs/tuning.md); never two processes.
        pids_of_token: dict[int, set[int]] = {}
        for response in responses:
            pids_of_token.setdefault(response.json()["token"], set()).add(response.json()["pid"])
        assert all(len(pids) == 1 for pids in pids_of_token.values()), pids_of_token
        # The hold ends after the response is sent (the dependency's exit runs then), so wait for it.
        await released_within(probe, key)


async def test_a_busy_key_is_answered_with_the_chosen_status_within_the_timeout(servers: Servers) -> None:
    async with clients(servers) as (a, b, probe):
        key = "orders:2"
        holder = asyncio.ensure_future(a.post("/orders/2/hold"))
        try:
            await entered(probe, key)
            # From the other server (waits in the lock server) and from the holder's own (in the process first).
            for client in (b, a):
                started = time.monotonic()
                refused = await client.post("/orders/2/busy")
                waited = time.monotonic() - started
                assert refused.status_code == 423, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json() == {
                    "detail": f"lock 'orders:2' is held by another request: not acquired within {BUSY_TIMEOUT:g} s;"
                    " try again later"
                }
                assert BUSY_TIMEOUT <= waited < BUSY_TIMEOUT + 2.0, waited
        finally:
            await probe.rpush(f"probe:go:{key}", "go")
            assert (await holder).status_code == 200
        assert (await b.post("/orders/2/busy")).status_code == 200
        assert int(await probe.get(f"probe:most:{key}")) == 1
        await released_within(probe, key)  # after the response is sent


async def test_a_permit_limit_holds_across_processes(servers: Servers) -> None:
    async with clients(servers) as (a, b, probe):
        key = "reports:daily"
        calls = [asyncio.ensure_future((a, b)[i % 2].get("/reports/daily")) for i in range(6)]
        try:
            await entered(probe, key, PERMITS)
            assert len(await permits_of(probe, key)) == PERMITS
            for client in (a, b):
                refused = await client.get("/reports/daily/now")
                assert refused.status_code == 429
                assert refused.json() == {
                    "detail": f"all {PERMITS} permits of 'reports:daily' are taken by other requests; try again later"
                }
            assert (await b.get("/reports/weekly/now")).status_code == 200  # another key, its own permits
            await asyncio.sleep(0.2)  # (time for a waiting request to get in, were the limit not held)
            assert int(await probe.get(f"probe:inside:{key}")) == PERMITS
        finally:
            await probe.rpush(f"probe:go:{key}", *["go"] * 6)
            responses = await asyncio.gather(*calls)
        assert [r.status_code for r in responses] == [200] * 6
        assert int(await probe.get(f"probe:most:{key}")) == PERMITS
        await released_within(probe, key, permit=True)  # after the responses are sent


async def _open(server: Uvicorn, request: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request)
    await writer.drain()
    return reader, writer


async def _read_until(reader: asyncio.StreamReader, expected: bytes) -> bytes:
    received = b""
    while expected not in received:
        chunk = await asyncio.wait_for(reader.read(4096), SOON)
        assert chunk, f"the server closed the connection before sending {expected!r}: {received!r}"
        received += chunk
    return received


async def _hang_up(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


@pytest.mark.parametrize("permit", [False, True], ids=["lock", "permit"])
async def test_a_client_that_hangs_up_mid_stream_frees_the_hold_at_once(servers: Servers, permit: bool) -> None:
    async with clients(servers) as (_a, b, probe):
        key, path = ("reports:hangup", "/reports/hangup/stream") if permit else ("orders:3", "/orders/3/stream")
        reader, writer = await _open(servers.a, f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
        try:
            assert b"first " in await _read_until(reader, b"first ")
            if permit:
                assert len(await permits_of(probe, key)) == 1
            else:
                assert await lease_of(probe, key) > EXPIRE_AFTER - SOON
        finally:
            await _hang_up(writer)
        # No go is ever pushed: only the client's going away ends the body, and the request with it.
        assert await released_within(probe, key, permit=permit) < SOON
        if permit:
            assert (await b.get("/reports/hangup/now")).status_code == 200
        else:
            assert (await b.post("/orders/3/busy")).status_code == 200


async def test_a_client_that_hangs_up_while_the_endpoint_runs_frees_the_lock_when_it_returns(
    servers: Servers,
) -> None:
    # uvicorn does not cancel an endpoint whose client went away: it runs on, and must hold the lock until it
    # returns (releasing it then would let another request in beside work still being done); then it is freed at
    # once, not when the lease ends.
    async with clients(servers) as (_a, b, probe):
        key = "orders:4"
        request = b"POST /orders/4/hold?until_disconnect=true HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"
        _reader, writer = await _open(servers.b, request)
        try:
            await entered(probe, key)
        finally:
            await _hang_up(writer)
        assert await probe.blpop([f"probe:disconnected:{key}"], SOON) is not None  # the endpoint saw it go
        assert await lease_of(probe, key) > EXPIRE_AFTER - SOON  # and runs on, holding the lock
        assert (await b.post("/orders/4/busy")).status_code == 423
        await probe.rpush(f"probe:go:{key}", "go")
        assert await released_within(probe, key) < SOON
        assert (await b.post("/orders/4/busy")).status_code == 200


async def test_a_client_that_hangs_up_while_its_request_waits_for_the_lock_still_has_it_run(servers: Servers) -> None:
    # The dependency does not watch for the client going away while it waits, and uvicorn does not cancel the
    # request: it waits on, takes the lock when it is free, runs the endpoint and releases it (docs/fastapi.md).
    async with clients(servers) as (a, b, probe):
        key = "orders:7"
        b_pid = (await b.get("/pid")).json()["pid"]
        holder = asyncio.ensure_future(a.post("/orders/7/hold"))
        try:
            await entered(probe, key)
            _reader, writer = await _open(
                servers.b, b"POST /orders/7 HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n"
            )
            try:
                started = time.monotonic()
                while not await probe.zcard(f"hybridlock:{{{key}}}:queue"):  # b's request is queued in the server
                    assert time.monotonic() - started < SOON
                    await asyncio.sleep(0.01)
            finally:
                await _hang_up(writer)
        finally:
            await probe.rpush(f"probe:go:{key}", "go")
            assert (await holder).status_code == 200
        assert await entered(probe, key) == [b_pid]  # the request whose client left
        assert await released_within(probe, key) < SOON
        assert int(await probe.get(f"probe:most:{key}")) == 1


def test_each_worker_opens_and_closes_its_registry_and_a_stop_frees_what_requests_hold(servers: Servers) -> None:
    # (Last in the module: it stops the module's servers.) Requests still holding a lock and a permit when the
    # servers are stopped: uvicorn waits for them for its graceful shutdown timeout (1 s here), then cancels them
    # and runs the lifespans' exit at once (which closes each registry).
    with redis.Redis.from_url(servers.redis_url) as client, contextlib.ExitStack() as sockets:
        started = {int(pid) for pid in client.lrange("probe:started", 0, -1)}
        assert len(started) == 3  # a's two workers and b
        holder = sockets.enter_context(socket.create_connection(("127.0.0.1", servers.b.port), timeout=SOON))
        holder.sendall(b"POST /orders/5/hold HTTP/1.1\r\nHost: test\r\nContent-Length: 0\r\n\r\n")
        assert client.blpop(["probe:entered:orders:5"], SOON) is not None
        streamer = sockets.enter_context(socket.create_connection(("127.0.0.1", servers.a.port), timeout=SOON))
        streamer.sendall(b"GET /reports/stopping/stream HTTP/1.1\r\nHost: test\r\n\r\n")
        received = b""
        while b"first " not in received:
            chunk = streamer.recv(4096)
            assert chunk, received
            received += chunk
        assert client.pttl("hybridlock:{orders:5}") > (EXPIRE_AFTER - SOON) * 1000
        assert _permits(client, "reports:stopping")
        # (uvicorn ends by the signal it was stopped by, once it has shut down; its supervisor of workers exits 0.)
        assert set(servers.stop()) <= {0, -signal.SIGTERM}, _logs(servers)
        assert {int(pid) for pid in client.lrange("probe:stopping", 0, -1)} == started
        # Nothing left held in the server: no lease, no permit (the fencing counters and the semaphores' stored
        # limits stay, as they do after every release).
        assert client.pttl("hybridlock:{orders:5}") == -2
        assert _permits(client, "reports:stopping") == []
        left = [name for name in client.scan_iter(match="hybridlock:*") if not name.endswith((b":fence", b":permits"))]
        assert left == []
    # Nothing in the servers' logs but uvicorn's report of the request it cancelled (a traceback ending in
    # CancelledError), in each process that ran one: no error and no warning of hybridlock's.
    expected = ("ERROR:    Cancel 1 running task", "ERROR:    Exception in ASGI application", "Traceback (most recent")
    for uvicorn in servers.all:
        log = uvicorn.log.read_text(errors="replace")
        reports = [line for line in log.splitlines() if line and not line[0].isspace()]
        assert all(
            line.startswith(expected) or line.startswith("asyncio.exceptions.CancelledError") for line in reports
        ), log
        assert log.count("Traceback") == 1, log


def _permits(client: redis.Redis, key: str) -> list[bytes]:
    return [name for name in client.scan_iter(match=f"hybridlock:{{{key}}}:permit:*") if name.split(b":")[-1].isdigit()]
