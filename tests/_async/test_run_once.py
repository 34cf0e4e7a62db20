"""Run-once jobs (``registry.run_once``, ``@registry.runs_once``; ``hybridlock/_async/runonce.py``) over every
backend: one server, Sentinel, Cluster, a quorum of 3 servers, the in-memory store and ``LocalLockRegistry`` (whose
locks never expire, so ``at_most_for`` is not tried there).

Written once for asyncio (the other owner's run is another task); ``tests/_sync/test_run_once.py`` is generated
from it (another thread). Replicas as processes, and a replica killed mid-run: ``tests/test_run_once_processes.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock import InvalidArgumentError, LockLostError, RunOnceResult
from hybridlock._async._compat import AsyncEvent, monotonic
from hybridlock.testing import EmbeddedServer

from ._compat import JOIN, sleep, spawn
from .helpers import BACKENDS, Backend

RUNS = BACKENDS
LEASED = [param for param in RUNS if param.values[0] != "local"]  # those whose holds have a lease

LEASE = 1.0  # seconds (expire_after)
# How late a bound may be seen to end on a machine shared with other test runs (it ends at the bound, counted from
# when run_once asked for the lock, plus a round trip). Early, it may not be by more than EARLY.
SLACK = 1.0
EARLY = 0.05

pytestmark = pytest.mark.timeout(60)


async def noop() -> str:
    return "done"


async def first_run_after(registry: hybridlock.AsyncLockRegistry, key: str, start: float, within: float) -> float:
    """Try ``run_once(key)`` from ``registry`` every 20 ms until it runs; how long after ``start`` it did."""
    while True:
        if await registry.run_once(key, noop, at_least_for=0.1):
            return monotonic() - start
        assert monotonic() - start < within, f"{key!r} did not run within {within} s"
        await sleep(0.02)


@pytest.mark.parametrize("backend", RUNS, indirect=True)
async def test_runs_the_function_and_skips_at_once_while_another_owner_runs_it(backend: Backend) -> None:
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        other = backend.other_owner(mine)
        inside, go = AsyncEvent(), AsyncEvent()

        async def job(x: int) -> int:
            inside.set()
            assert await go.wait(JOIN)
            return x * 2

        running = spawn(lambda: mine.run_once("job", job, 21, at_least_for=0.2))
        assert await inside.wait(JOIN)
        asked = monotonic()
        skipped = await other.run_once("job", job, 1, at_least_for=0.2)
        assert monotonic() - asked < 1.0, "a skip must not wait"
        assert skipped == RunOnceResult(False)
        assert not skipped
        assert skipped.result is None
        go.set()
        ran = await running.join()
        assert ran == RunOnceResult(True, 42)
        assert ran


@pytest.mark.parametrize("backend", RUNS, indirect=True)
async def test_at_least_for_keeps_every_owner_out_after_a_quick_run_then_lets_the_next_in(backend: Backend) -> None:
    at_least = 1.5
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        other = backend.other_owner(mine)
        start = monotonic()
        assert await mine.run_once("quick", noop, at_least_for=at_least) == RunOnceResult(True, "done")
        # The key is kept, not deleted: another owner, this registry itself and a plain lock of the key are all out.
        assert not await other.run_once("quick", noop, at_least_for=at_least)
        assert not await mine.run_once("quick", noop, at_least_for=at_least)
        assert not await other.obtain("quick").acquire(blocking=False)
        ran_after = await first_run_after(other, "quick", start, at_least + SLACK)
        assert ran_after >= at_least - EARLY, f"ran again {ran_after:.3f} s after the start, before at_least_for"


@pytest.mark.parametrize("backend", RUNS, indirect=True)
async def test_a_run_that_outlasts_at_least_for_is_released_as_it_ends(backend: Backend) -> None:
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        other = backend.other_owner(mine)

        async def slow() -> None:
            await sleep(0.3)

        assert await mine.run_once("slow", slow, at_least_for=0.1)
        assert await other.run_once("slow", noop, at_least_for=0.1), "the key was kept after at_least_for"


@pytest.mark.parametrize("backend", RUNS, indirect=True)
async def test_a_function_that_raises_propagates_and_the_key_is_still_kept(backend: Backend) -> None:
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        other = backend.other_owner(mine)

        async def boom() -> None:
            raise ZeroDivisionError("the job failed")

        with pytest.raises(ZeroDivisionError, match="the job failed"):
            await mine.run_once("fails", boom, at_least_for=1.0)
        assert not await other.run_once("fails", noop, at_least_for=1.0), "an attempted occurrence ran again"


@pytest.mark.parametrize(("lease", "at_most"), [(1.0, 2.5), (3.0, 1.0)], ids=["renewed-then-bounded", "cut-at-start"])
@pytest.mark.parametrize("backend", LEASED, indirect=True)
async def test_at_most_for_ends_the_hold_while_the_function_overruns(
    backend: Backend, lease: float, at_most: float
) -> None:
    async with backend:
        mine = backend.registry(expire_after=lease)
        other = backend.other_owner(mine)
        inside, finish = AsyncEvent(), AsyncEvent()
        seen: dict[str, Any] = {}

        async def overrun() -> None:
            inside.set()
            assert await finish.wait(JOIN)
            lock = mine.obtain("stuck")  # the lock held for the run (the registry's identity map)
            seen["lost"], seen["valid"] = lock.lost, monotonic() < (lock.valid_until or 0.0)

        start = monotonic()
        running = spawn(lambda: mine.run_once("stuck", overrun, at_least_for=0.5, at_most_for=at_most))
        assert await inside.wait(JOIN)
        ran_after = await first_run_after(other, "stuck", start, at_most + SLACK)
        # Not before the bound (renewed past its lease when the lease is shorter), and not long after it.
        assert ran_after >= at_most - EARLY, f"the hold ended {ran_after:.3f} s after the start"
        finish.set()
        with pytest.raises(LockLostError, match="past at_most_for") as caught:
            await running.join()
        assert caught.value.key == "stuck"
        assert seen == {"lost": True, "valid": False}, "the running function was not told its hold had ended"


@pytest.mark.parametrize("backend", LEASED, indirect=True)
async def test_a_function_that_ends_as_soon_as_it_is_told_of_the_bound_is_told_it_ran_past_at_most_for(
    backend: Backend,
) -> None:
    # The lease is found lost at its valid_until, a drift margin before the bound: a job that stops the moment it is
    # told (as the command line's runner does, by --lost-signal) ends inside that margin, and ran to the bound all
    # the same. (CI once saw a plain "lease lost" here.)
    async with backend:
        mine = backend.registry(expire_after=10.0)

        async def told() -> None:
            lock = mine.obtain("told")
            while not lock.lost:
                await sleep(0.001)

        for _ in range(3):
            with pytest.raises(LockLostError, match="past at_most_for"):
                await mine.run_once("told", told, at_least_for=0.1, at_most_for=0.5)


@pytest.mark.parametrize("backend", LEASED, indirect=True)
async def test_a_task_here_handed_the_lock_as_a_run_ends_holds_it_past_the_runs_bound(backend: Backend) -> None:
    # A run that outlasts at_least_for is released as a lock is: to a task of this process queued for the key's
    # lock, with the lease (local hand-off). The run's at_most_for must not go with it.
    async with backend:
        mine = backend.registry(expire_after=LEASE, handoff_window=30.0)
        lock = mine.obtain("handed")
        waiter: dict[str, Any] = {}

        async def hold_past_the_bound() -> bool:
            assert await lock.acquire(timeout=JOIN)
            try:
                await sleep(2 * LEASE)  # past the run's at_most_for (LEASE from its start)
                return lock.lost
            finally:
                await lock.release()  # raises LockLostError if the lease ended meanwhile

        async def job() -> None:
            waiter["task"] = spawn(hold_past_the_bound)
            deadline = monotonic() + JOIN
            while lock.statistics().local_waiters < 1:
                assert monotonic() < deadline, "the other task never queued"
                await sleep(0.005)

        assert await mine.run_once("handed", job, at_least_for=0.001, at_most_for=LEASE)
        assert await waiter["task"].join() is False


@pytest.mark.parametrize("backend", [param for param in RUNS if param.values[0] == "redis"], indirect=True)
async def test_a_lease_lost_while_the_function_runs_raises_lock_lost_error_as_it_ends(backend: Backend) -> None:
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        assert isinstance(backend.url, str)
        client = redis.Redis.from_url(backend.url)
        seen: dict[str, Any] = {}

        async def job() -> None:
            lock = mine.obtain("deleted")
            client.delete(lock._names.lock)  # an operator, or a failover to a replica that never had it
            deadline = monotonic() + JOIN
            while not lock.lost and monotonic() < deadline:
                await sleep(0.02)  # the next renewal finds it gone
            seen["lost"] = lock.lost

        try:
            with pytest.raises(LockLostError, match="lease had ended before release") as caught:
                await mine.run_once("deleted", job, at_least_for=0.5, at_most_for=30)
        finally:
            client.close()
        assert caught.value.key == "deleted"
        assert seen == {"lost": True}


async def test_an_unreachable_server_raises_and_the_function_does_not_run() -> None:
    called: list[int] = []

    async def job() -> None:
        called.append(1)

    url = "redis://127.0.0.1:1/0?socket_timeout=0.5&socket_connect_timeout=0.5"
    registry = hybridlock.AsyncLockRegistry(url)
    try:
        with pytest.raises(hybridlock.BackendUnavailableError) as caught:
            await registry.run_once("job", job, at_least_for=1)
    finally:
        await registry.aclose()
    assert caught.value.key == "job"
    assert called == []


@pytest.mark.parametrize("backend", RUNS, indirect=True)
async def test_runs_once_fills_the_key_from_the_arguments(backend: Backend) -> None:
    async with backend:
        mine = backend.registry(expire_after=LEASE)
        calls: list[int] = []

        @mine.runs_once("report:{day}", at_least_for=1.0, at_most_for=5.0)
        async def report(day: int) -> int:
            calls.append(day)
            return day * 10

        assert await report(1) == RunOnceResult(True, 10)
        assert await report(day=1) == RunOnceResult(False)  # the same occurrence
        assert await report(2) == RunOnceResult(True, 20)  # another one
        assert calls == [1, 2]
        assert report.__name__ == "report"
        with pytest.raises(InvalidArgumentError, match="names when"):

            @mine.runs_once("report:{when}", at_least_for=1.0)
            async def bad(day: int) -> None: ...


async def test_bad_bounds_and_functions_are_refused_naming_the_setting() -> None:
    async with hybridlock.AsyncLockRegistry(hybridlock.backends.AsyncMemoryBackend()) as registry:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"at_least_for": 0}, "at_least_for"),
            ({"at_least_for": -1}, "at_least_for"),
            ({"at_least_for": math.nan}, "at_least_for"),
            ({"at_least_for": math.inf}, "at_least_for"),
            ({"at_least_for": "60"}, "at_least_for"),
            ({"at_least_for": True}, "at_least_for"),
            ({"at_least_for": 1, "at_most_for": 0}, "at_most_for"),
            ({"at_least_for": 0.01, "at_most_for": 0.05}, "at_most_for"),
            ({"at_least_for": 2, "at_most_for": 1}, "at_most_for .* at_least_for"),
        ]
        for bounds, named in cases:
            with pytest.raises(InvalidArgumentError, match=named):
                await registry.run_once("k", noop, **bounds)
            with pytest.raises(InvalidArgumentError, match=named):
                registry.runs_once("k", **bounds)
        with pytest.raises(InvalidArgumentError, match="callable"):
            await registry.run_once("k", "not a function", at_least_for=1)  # type: ignore[arg-type]
        lock = registry.obtain("held")
        async with lock:  # run_once inside this task's own hold of the key would end a hold not its own
            with pytest.raises(InvalidArgumentError, match="holds this key's lock already"):
                await registry.run_once("held", noop, at_least_for=1)
            assert lock.hold_count == 1


@pytest.mark.server
@pytest.mark.quorum
async def test_over_a_quorum_a_run_keeps_its_key_on_the_majority_left_when_a_minority_dies(
    quorum_servers: list[EmbeddedServer],
) -> None:
    at_least = 1.5
    urls = [server.url + "?socket_timeout=0.3&socket_connect_timeout=0.3" for server in quorum_servers]
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls, expire_after=LEASE) as mine,
        hybridlock.AsyncQuorumLockRegistry(urls, expire_after=LEASE) as other,
    ):

        async def job() -> None:
            for server in quorum_servers[: (len(quorum_servers) - 1) // 2]:  # a minority: one of 3, two of 5
                server.kill()

        start = monotonic()
        assert await mine.run_once("q", job, at_least_for=at_least)
        assert not await other.run_once("q", noop, at_least_for=0.1)
        ran_after = await first_run_after(other, "q", start, at_least + SLACK)
        assert ran_after >= at_least - EARLY, f"ran again {ran_after:.3f} s after the start, before at_least_for"
