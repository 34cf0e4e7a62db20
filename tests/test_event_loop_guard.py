"""A thread lock called from a running asyncio event loop refuses at once, pointing to the asyncio API.

Inside a loop, every task runs on the loop's thread, so a thread-owned reentrant lock would admit them all as its
one owner, and a blocking wait would stall the loop."""

from __future__ import annotations

import asyncio

import pytest

import hybridlock


def _in_loop(call):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        return call()

    return asyncio.run(asyncio.wait_for(main(), 10))


@pytest.mark.parametrize("kind", ["plain", "write", "read", "multi"])
def test_every_lock_kind_refuses_inside_a_running_loop(kind: str) -> None:
    registry = hybridlock.LocalLockRegistry()
    rw = registry.obtain_read_write("doc")
    lock = {
        "plain": registry.obtain("k"),
        "write": rw.write_lock(),
        "read": rw.read_lock(),
        "multi": registry.obtain_many(["a", "b"]),
    }[kind]
    for attempt in (lambda: lock.acquire(), lambda: lock.acquire(blocking=False), lambda: lock.try_lock(1)):
        with pytest.raises(hybridlock.EventLoopBlockedError, match="AsyncLockRegistry") as excinfo:
            _in_loop(attempt)
        assert isinstance(excinfo.value, RuntimeError)
        assert excinfo.value.server == "memory"

    def with_statement() -> None:
        with lock:
            pass

    with pytest.raises(hybridlock.EventLoopBlockedError):
        _in_loop(with_statement)
    # Nothing was taken: outside the loop the lock is free.
    assert lock.acquire(blocking=False)
    lock.release()


def test_five_tasks_cannot_share_one_thread_lock() -> None:
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("shared")
    inside: list[int] = []

    async def task(n: int) -> None:
        try:
            with lock:
                inside.append(n)
                await asyncio.sleep(0.01)
        except hybridlock.EventLoopBlockedError:
            pass

    async def main() -> None:
        await asyncio.gather(*(task(n) for n in range(5)))

    asyncio.run(asyncio.wait_for(main(), 10))
    assert inside == []


def test_a_worker_thread_of_the_loop_may_use_thread_locks() -> None:
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("k")

    def hold() -> bool:
        with lock:
            return lock.is_held_by_current_thread()

    async def main() -> bool:
        return await asyncio.to_thread(hold)

    assert asyncio.run(asyncio.wait_for(main(), 10)) is True
