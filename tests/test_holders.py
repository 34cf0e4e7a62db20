"""Holder metadata: what a lock's statistics() says of its holder, and the owner description the renewer writes to
the server (host, pid, start; per lease the thread or task, grant time, token) off the hot path."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time

import pytest

import hybridlock
from tests._polling import until

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def _owner_hash(redis_client, registry) -> dict[str, str]:
    raw = redis_client.hgetall(f"{registry.registry_key}:owner:{registry.client_id}")
    return {key.decode(): value.decode() for key, value in raw.items()}


def test_statistics_describe_the_holder(make_registry):
    registry = make_registry()
    lock = registry.obtain("described")
    free = lock.statistics()
    assert free.owner_name is None
    assert free.acquired_at is None
    before = time.time()
    done = threading.Event()

    def hold() -> None:
        with lock:
            stats = lock.statistics()
            assert stats.owner_name == "the-holder"
            assert before <= stats.acquired_at <= time.time()
            assert stats.client_id == registry.client_id
            assert stats.pid == os.getpid()
            assert stats.host == socket.gethostname()
            done.set()

    thread = threading.Thread(target=hold, name="the-holder")
    thread.start()
    thread.join(30)
    assert done.is_set()


def test_the_renewer_describes_the_owner_and_its_leases(make_registry, redis_client):
    registry = make_registry(expire_after=1.5)  # a round every 0.5 s
    lock = registry.obtain("k")
    with lock:
        token = lock.fencing_token
        described = until(lambda: (h := _owner_hash(redis_client, registry)).get("hybridlock:{k}") and h)
        assert described["host"] == socket.gethostname()
        assert described["pid"] == str(os.getpid())
        assert abs(float(described["started_at"]) - time.time()) < 60
        about = json.loads(described["hybridlock:{k}"])
        assert about["thread"] == threading.current_thread().name
        assert about["token"] == token
        assert abs(about["acquired_at"] - time.time()) < 30
        ttl = redis_client.pttl(f"hybridlock:owner:{registry.client_id}")
        assert 0 < ttl <= 60_000
    # Given back: its field goes at the next round (the registry's other leases keep the worker running).
    with registry.obtain("other"):
        until(lambda: "hybridlock:{k}" not in _owner_hash(redis_client, registry))


def test_close_removes_the_description(make_registry, redis_client):
    registry = make_registry(expire_after=1.5)
    with registry.obtain("k"):
        until(lambda: _owner_hash(redis_client, registry))
    registry.close()
    assert redis_client.exists(f"hybridlock:owner:{registry.client_id}") == 0


def test_a_quick_cycle_sends_no_description(make_registry, redis_client):
    registry = make_registry()  # the first round is 10 s away, the first description 1 s
    lock = registry.obtain("quick")
    redis_client.config_resetstat()
    for _ in range(50):
        with lock:
            pass
    stats = redis_client.info("commandstats")
    assert "cmdstat_hset" not in stats
    assert redis_client.exists(f"hybridlock:owner:{registry.client_id}") == 0


def test_a_lock_held_a_while_is_described_at_one_second(make_registry, redis_client):
    registry = make_registry()  # expire_after 30: no renewal round before 10 s
    start = time.monotonic()
    with registry.obtain("long"):
        until(lambda: "hybridlock:{long}" in _owner_hash(redis_client, registry))
        assert time.monotonic() - start < 8


def test_asyncio_statistics_name_the_task(server, redis_client):
    async def main() -> None:
        async with hybridlock.AsyncLockRegistry(server.url) as registry:
            lock = registry.obtain("task")

            async def hold() -> None:
                async with lock:
                    stats = lock.statistics()
                    assert stats.owner_name == "the-task"
                    assert stats.acquired_at is not None

            await asyncio.create_task(hold(), name="the-task")

    asyncio.run(main())
