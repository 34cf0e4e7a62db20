"""A quorum acquire cut off while its calls are on the wire, on real servers: a task cancelled (asyncio) or a thread
interrupted by ``KeyboardInterrupt``. The servers still run the ACQUIREs they received; whatever they grant must be
given back, so that no key of the lock stays behind (held by nobody for the whole lease) and another owner gets the
lock as soon as the servers have answered.

``CLIENT PAUSE ... WRITE`` holds the scripts in the servers for ``PAUSE`` seconds (all of them, or all but the
first, whose grant then comes in time and the others' late); the cancel or interrupt comes ``CUT_AT`` seconds into
the acquire, while the others are still held. The cancellation sweep over a quorum (every await point, no pause)
is in ``tests/test_async_cancellation.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

import pytest
import redis

import hybridlock
from hybridlock.testing import EmbeddedServer
from tests._interrupts import interrupt_after
from tests._tasks import awaited

pytestmark = [pytest.mark.server, pytest.mark.quorum, pytest.mark.timeout(60)]

PAUSE = 0.6  # seconds the paused servers hold the ACQUIREs
CUT_AT = 0.2  # seconds into the acquire the cancel or interrupt comes
SETTLE = 2.0  # seconds after the pause by which every server must be clean
LEASE = 30  # seconds: a lease left behind would outlast the test by far

PAUSED = pytest.mark.parametrize("paused", ["all", "all but one"])


def lock_keys(client: redis.Redis) -> list[bytes]:
    """The keys of lock ``k`` (its lease; not its fencing counter, which outlives every tenancy by design)."""
    return [key for key in client.keys("*{k}*") if not key.endswith(b":fence")]


@contextmanager
def admins(servers: list[EmbeddedServer]) -> Iterator[list[redis.Redis]]:
    clients = [redis.Redis.from_url(server.url) for server in servers]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def pause(clients: list[redis.Redis], paused: str) -> float:
    """Hold every write (our scripts) in the servers named by ``paused`` for ``PAUSE`` seconds; returns when the
    pause ends (``time.monotonic()``)."""
    held = clients if paused == "all" else clients[1:]
    for client in held:
        client.execute_command("CLIENT", "PAUSE", int(PAUSE * 1000), "WRITE")
    return time.monotonic() + PAUSE


def wait_until_clean(clients: list[redis.Redis], pause_ends: float) -> None:
    """Once the pause is over (before, the held ACQUIREs have not run yet), until every server is clean of the
    lock, for ``SETTLE`` seconds at most."""
    time.sleep(max(0.0, pause_ends - time.monotonic()) + 0.05)
    until = pause_ends + SETTLE
    while True:
        left = {i: lock_keys(client) for i, client in enumerate(clients)}
        if not any(left.values()):
            return
        if time.monotonic() > until:
            ttls = {i: [clients[i].pttl(key) for key in keys] for i, keys in left.items() if keys}
            raise AssertionError(f"left behind, held by nobody: {left} (PTTL ms {ttls})")
        time.sleep(0.01)


@PAUSED
def test_a_thread_interrupted_while_its_acquire_is_on_the_wire_leaves_no_lease(
    quorum_servers: list[EmbeddedServer], paused: str
) -> None:
    urls = [server.url for server in quorum_servers]
    with (
        admins(quorum_servers) as clients,
        hybridlock.QuorumLockRegistry(urls, expire_after=LEASE) as mine,
        hybridlock.QuorumLockRegistry(urls, expire_after=LEASE) as theirs,
    ):
        lock, rival = mine.obtain("k"), theirs.obtain("k")
        for warm in (lock, rival):  # connections made and scripts loaded before the pause
            assert warm.acquire(timeout=5)
            warm.release()
        pause_ends = pause(clients, paused)
        with interrupt_after(CUT_AT), pytest.raises(KeyboardInterrupt):
            lock.acquire(timeout=5)
        assert not lock.is_held_by_current_thread()
        assert not lock._mutex.locked(), "the local mutex stayed held"
        wait_until_clean(clients, pause_ends)
        assert rival.acquire(blocking=False), "another owner could not take the lock"
        rival.release()
        assert lock.acquire(timeout=5), "the interrupted owner could not take the lock again"
        lock.release()


@PAUSED
async def test_a_task_cancelled_while_its_acquire_is_on_the_wire_leaves_no_lease(
    quorum_servers: list[EmbeddedServer], paused: str
) -> None:
    urls = [server.url for server in quorum_servers]
    with admins(quorum_servers) as clients:
        async with (
            hybridlock.AsyncQuorumLockRegistry(urls, expire_after=LEASE) as mine,
            hybridlock.AsyncQuorumLockRegistry(urls, expire_after=LEASE) as theirs,
        ):
            lock, rival = mine.obtain("k"), theirs.obtain("k")
            for warm in (lock, rival):
                assert await warm.acquire(timeout=5)
                await warm.release()
            pause_ends = pause(clients, paused)
            task = asyncio.create_task(awaited(partial(lock.acquire, timeout=5)))
            await asyncio.sleep(CUT_AT)
            assert task.cancel(), "the acquire ended before the cancel"
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not lock._mutex.locked(), "the local mutex stayed held"
            # The stragglers need this loop for their replies: let it run until the servers are clean (or SETTLE
            # has passed), before the check that blocks it.
            await asyncio.sleep(max(0.0, pause_ends - time.monotonic()) + 0.05)
            while any(lock_keys(client) for client in clients) and time.monotonic() < pause_ends + SETTLE:
                await asyncio.sleep(0.01)
            wait_until_clean(clients, pause_ends)
            assert await rival.acquire(blocking=False), "another owner could not take the lock"
            await rival.release()
            assert await lock.acquire(timeout=5), "the cancelled owner could not take the lock again"
            await lock.release()
