"""Many tasks on one key, on a real server: 1,000 tasks in one process, and 4 processes x 100 tasks.

A non-atomic counter (read, yield to the loop, write) is exact only if no two tasks were inside at once; an overlap
marker sees any overlap directly. Each process runs its own event loop and registry (multiprocessing, spawn).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest
import redis
import redis.asyncio

import hybridlock
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server


async def test_1000_tasks_in_one_process_on_one_key(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    state = {"count": 0, "inside": 0, "max_inside": 0}
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        lock = registry.obtain("counter")

        async def work() -> None:
            async with lock:
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["count"]
                await asyncio.sleep(0)  # invite a race
                state["count"] = value + 1
                state["inside"] -= 1

        start = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(1000))), 30)
        elapsed = time.monotonic() - start
    assert state == {"count": 1000, "inside": 0, "max_inside": 1}
    assert redis_client.exists("hybridlock:{counter}") == 0, "the lease outlived the last release"
    assert elapsed < 20, f"1,000 tasks took {elapsed:.1f}s"


COUNTER, INSIDE, OVERLAPS = "test:counter", "test:inside", "test:overlaps"


async def _process_main(url: str, tasks: int) -> None:
    client = redis.asyncio.Redis.from_url(url)
    async with hybridlock.AsyncLockRegistry(url) as registry:
        lock = registry.obtain("shared")

        async def work() -> None:
            async with lock:
                if await client.incr(INSIDE) != 1:
                    await client.incr(OVERLAPS)
                value = int(await client.get(COUNTER) or 0)  # read-modify-write: exact only under exclusion
                await client.set(COUNTER, value + 1)
                await client.decr(INSIDE)

        await asyncio.gather(*(work() for _ in range(tasks)))
    await client.aclose()


def _process(url: str, tasks: int) -> None:
    asyncio.run(asyncio.wait_for(_process_main(url, tasks), 60))


def test_4_processes_x_100_tasks_on_one_key(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_process, args=(server.url, 100), daemon=True) for _ in range(4)]
    for process in processes:
        process.start()
    deadline = time.monotonic() + 90
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
    assert [p.exitcode for p in processes] == [0] * 4, "a process failed or hung"
    assert int(redis_client.get(COUNTER) or 0) == 400
    assert int(redis_client.get(OVERLAPS) or 0) == 0, "two tasks were inside at once"
    assert int(redis_client.get(INSIDE) or 0) == 0
    assert redis_client.exists("hybridlock:{shared}") == 0
