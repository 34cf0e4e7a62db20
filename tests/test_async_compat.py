"""The asyncio shims: AsyncFifoMutex excludes, serves in arrival order, times out and survives cancellation;
shielded() finishes cleanup; AsyncWorker runs until stopped. Plain asyncio.run, each test bounded in time."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from hybridlock._async import _compat as async_compat
from hybridlock._async._compat import AsyncFifoMutex, AsyncWorker, current_owner, shielded
from hybridlock._sync import _compat as sync_compat

T = TypeVar("T")

LIMIT = 10.0  # seconds any one test may take


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, LIMIT)

    return asyncio.run(bounded())


async def until(predicate: Any, what: str) -> None:
    """Yield to the loop until ``predicate()`` holds (it needs other tasks to run)."""
    deadline = time.monotonic() + LIMIT / 2
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0)


async def queue_tasks(mutex: AsyncFifoMutex, count: int, order: list[int]) -> list[asyncio.Task[None]]:
    """Start ``count`` tasks that each take the mutex, note their number and release; queue them one by one."""

    async def enter(i: int) -> None:
        assert await mutex.acquire()
        order.append(i)
        mutex.release()

    tasks = []
    for i in range(count):
        before = mutex.waiting
        tasks.append(asyncio.create_task(enter(i)))
        await until(lambda before=before: mutex.waiting == before + 1, f"task {i} to queue")
    return tasks


def test_the_shims_pair_up() -> None:
    # The names generated code reaches for exist on both sides (after the AsyncX -> X renames).
    for name in async_compat.__all__:
        assert name.removeprefix("Async") in sync_compat.__all__
    from hybridlock._sync._compat import FifoMutex

    assert sync_compat.FifoMutex is FifoMutex
    owner = sync_compat.current_owner()
    assert owner is sync_compat.current_owner()  # one per thread (tests/test_dead_owners.py has the rest)
    assert sync_compat.owner_ident(owner) == threading.get_ident()
    assert sync_compat.shielded(lambda: 42) == 42


def test_exclusion_among_200_tasks() -> None:
    async def main() -> int:
        mutex = AsyncFifoMutex()
        inside = 0
        overlaps = 0
        entries = 0

        async def worker() -> None:
            nonlocal inside, overlaps, entries
            for _ in range(5):
                assert await mutex.acquire()
                inside += 1
                overlaps += inside != 1
                entries += 1
                await asyncio.sleep(0)  # let everyone else try to get in
                inside -= 1
                mutex.release()
                await asyncio.sleep(0)

        await asyncio.gather(*(worker() for _ in range(200)))
        assert not mutex.locked()
        assert mutex.waiting == 0
        assert entries == 1000
        return overlaps

    assert run(main()) == 0


def test_waiters_get_the_mutex_in_arrival_order() -> None:
    async def main() -> list[int]:
        mutex = AsyncFifoMutex()
        assert await mutex.acquire()
        order: list[int] = []
        tasks = await queue_tasks(mutex, 10, order)
        mutex.release()
        await asyncio.gather(*tasks)
        assert not mutex.locked()
        return order

    assert run(main()) == list(range(10))


def test_timeout_returns_false_and_leaves_the_queue() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex()
        assert await mutex.acquire()
        assert not await mutex.acquire(blocking=False)
        assert not await mutex.acquire(timeout=0)
        started = time.monotonic()
        assert not await mutex.acquire(timeout=0.2)
        assert 0.15 < time.monotonic() - started < 2.0
        assert mutex.waiting == 0
        # A later waiter still gets it on release.
        later = asyncio.create_task(mutex.acquire(timeout=5))
        await until(lambda: mutex.waiting == 1, "the later waiter to queue")
        mutex.release()
        assert await later
        assert mutex.locked()
        mutex.release()
        with pytest.raises(RuntimeError):
            mutex.release()

    run(main())


def test_cancel_while_waiting_leaves_no_stuck_lock() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex()
        assert await mutex.acquire()
        order: list[int] = []
        first, second, third = await queue_tasks(mutex, 3, order)
        second.cancel()
        with pytest.raises(asyncio.CancelledError):
            await second
        assert mutex.waiting == 2
        mutex.release()
        await asyncio.gather(first, third)
        assert order == [0, 2]
        assert not mutex.locked()
        assert mutex.waiting == 0
        # Cancelled while the only waiter: the release unlocks, and the mutex is free for the next comer.
        assert await mutex.acquire()
        lone = asyncio.create_task(mutex.acquire())
        await until(lambda: mutex.waiting == 1, "the lone waiter to queue")
        lone.cancel()
        # Released before the cancelled task has run: its wake-up is cancelled, so the release passes it over
        # rather than handing the mutex to a task that is leaving.
        mutex.release()
        assert not mutex.locked()
        with pytest.raises(asyncio.CancelledError):
            await lone
        assert not mutex.locked()
        assert await mutex.acquire(blocking=False)

    run(main())


def test_cancel_after_the_grant_passes_ownership_on() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex()
        assert await mutex.acquire()
        order: list[int] = []
        granted, next_in_line = await queue_tasks(mutex, 2, order)
        # release() hands the mutex to the first waiter; it is cancelled before it runs to see the grant.
        mutex.release()
        assert mutex.locked()
        granted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await granted
        await next_in_line
        assert order == [1]
        assert not mutex.locked()
        assert mutex.waiting == 0

    run(main())


def test_cancel_after_the_grant_with_nobody_behind_unlocks() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex()
        assert await mutex.acquire()
        waiter = asyncio.create_task(mutex.acquire())
        await until(lambda: mutex.waiting == 1, "the waiter to queue")
        mutex.release()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not mutex.locked()

    run(main())


def test_pass_on_with_a_barge_window() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex(barge_window=5.0)
        assert await mutex.acquire()
        assert not mutex.pass_on()  # nobody waits: still ours
        assert mutex.locked()
        order: list[int] = []
        (waiter,) = await queue_tasks(mutex, 1, order)
        # Within the window the mutex is left free with the waiter woken; a running task may take it first.
        assert mutex.pass_on()
        assert not mutex.locked()
        assert await mutex.acquire(blocking=False)
        await asyncio.sleep(0)  # the woken waiter looks, finds it taken, queues again at the head
        assert mutex.waiting == 1
        assert order == []
        mutex.release()  # a plain release hands it over directly
        await waiter
        assert order == [0]
        assert not mutex.locked()

    run(main())


def test_cancel_after_a_barge_wake_wakes_the_next() -> None:
    async def main() -> None:
        mutex = AsyncFifoMutex(barge_window=5.0)
        assert await mutex.acquire()
        order: list[int] = []
        woken, behind = await queue_tasks(mutex, 2, order)
        assert mutex.pass_on()  # frees it and wakes `woken` to take it
        woken.cancel()
        with pytest.raises(asyncio.CancelledError):
            await woken
        await behind
        assert order == [1]
        assert not mutex.locked()
        assert mutex.waiting == 0

    run(main())


def test_shielded_cleanup_finishes_then_the_cancel_is_seen() -> None:
    async def main() -> None:
        steps: list[str] = []

        async def cleanup() -> str:
            steps.append("cleanup started")
            await asyncio.sleep(0.05)
            steps.append("cleanup finished")
            return "done"

        async def release() -> None:
            try:
                await shielded(cleanup)
            finally:
                steps.append("caller resumed")

        task = asyncio.create_task(release())
        await until(lambda: steps, "the cleanup to start")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert steps == ["cleanup started", "cleanup finished", "caller resumed"]
        assert await shielded(cleanup) == "done"

    run(main())


def test_current_owner_is_the_task() -> None:
    async def main() -> None:
        me = current_owner()
        assert me is asyncio.current_task()
        assert current_owner() == me

        async def whoami() -> object:
            return current_owner()

        assert await asyncio.create_task(whoami()) != me

    run(main())
    with pytest.raises(RuntimeError):
        current_owner()


def test_async_worker_steps_until_stopped() -> None:
    async def main() -> None:
        calls = 0

        async def step() -> float:
            nonlocal calls
            calls += 1
            return 60.0  # a long sleep: only wake() and stop() cut it short

        worker = AsyncWorker(step, name="test-worker")
        worker.start()
        await until(lambda: calls == 1, "the first step")
        worker.wake()
        await until(lambda: calls == 2, "the step after wake()")
        assert worker.running
        assert await worker.stop(timeout=5)
        assert not worker.running
        assert calls == 2
        assert worker.error is None

        async def failing() -> float:
            raise ValueError("boom")

        broken = AsyncWorker(failing, name="broken")
        broken.start()
        await until(lambda: not broken.running, "the failing worker to end")
        assert isinstance(broken.error, ValueError)
        assert await broken.stop()

    run(main())


def test_thread_worker_steps_until_stopped() -> None:
    calls: list[int] = []

    def step() -> float:
        calls.append(1)
        return 60.0

    worker = sync_compat.Worker(step, name="test-thread-worker")
    worker.start()
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    worker.wake()
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert worker.stop(timeout=5)
    assert len(calls) == 2
    assert worker.error is None


def test_async_event_waits_like_a_thread_event():
    from hybridlock._async._compat import AsyncEvent

    async def main() -> None:
        event = AsyncEvent()
        start = time.monotonic()
        assert await event.wait(0.05) is False
        assert time.monotonic() - start >= 0.04
        asyncio.get_running_loop().call_later(0.02, event.set)
        assert await event.wait(5) is True
        assert event.is_set()
        event.clear()
        assert await event.wait(0) is False

    asyncio.run(asyncio.wait_for(main(), 10))


def test_async_condition_wakes_waiters_whose_predicate_holds():
    from hybridlock._async._compat import AsyncCondition

    async def main() -> None:
        cond = AsyncCondition()
        state = {"ready": False}

        async def waiter() -> bool:
            with cond:
                return await cond.wait_for(lambda: state["ready"], 5)

        tasks = [asyncio.create_task(waiter()) for _ in range(10)]
        await asyncio.sleep(0.01)
        cond.notify_all()  # predicate still false: nobody may return
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)
        state["ready"] = True
        cond.notify_all()
        assert await asyncio.gather(*tasks) == [True] * 10
        with cond:
            assert await cond.wait_for(lambda: False, 0.02) is False
        # A cancelled waiter leaves no trace behind.
        lone = asyncio.create_task(cond.wait_for(lambda: False))
        await asyncio.sleep(0.01)
        lone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await lone
        assert cond._waiters == []

    asyncio.run(asyncio.wait_for(main(), 10))
