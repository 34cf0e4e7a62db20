"""The asyncio API's edges: the event-loop guard and the clients each side refuses; closing a registry and ending
its loop leave no task pending and no connection open; anyio's asyncio backend.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import warnings
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio

import hybridlock
from hybridlock.testing.server import EmbeddedServer

# -- what each side refuses --------------------------------------------------------------------------------------------


async def test_a_thread_lock_inside_the_loop_raises_event_loop_blocked() -> None:
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("k")
    with pytest.raises(hybridlock.EventLoopBlockedError, match="AsyncLockRegistry"):
        lock.acquire(blocking=False)
    registry.close()


def test_clients_of_the_other_side_are_refused(server: EmbeddedServer) -> None:
    blocking_client = redis.Redis.from_url(server.url)
    with pytest.raises(hybridlock.InvalidArgumentError, match="asyncio"):
        hybridlock.AsyncLockRegistry(blocking_client)
    blocking_client.close()
    asyncio_client = redis.asyncio.Redis.from_url(server.url)  # never connected: nothing to close
    with pytest.raises(hybridlock.InvalidArgumentError, match="AsyncLockRegistry"):
        hybridlock.LockRegistry(asyncio_client)


async def test_an_acquire_run_as_a_task_of_its_own_is_refused_before_taking_anything(server: EmbeddedServer) -> None:
    """``asyncio.wait_for(lock.acquire(), t)`` (before Python 3.12 it runs the acquire in a new task),
    ``create_task(lock.acquire())`` or ``gather(lock.acquire())``: the hold would belong to that task, which ends as
    ``acquire()`` returns, so the caller got True for a lock it did not hold and could not release. Each kind
    refuses with ``LockNotOwnedError`` naming the key; another owner then takes every key at once (nothing was left
    held here or in the server), and in the task that will hold it the same calls work."""
    async with (
        hybridlock.AsyncLockRegistry(server.url) as registry,
        hybridlock.AsyncLockRegistry(server.url) as other,
    ):

        def kinds(registry: hybridlock.AsyncLockRegistry) -> dict[str, Any]:
            return {
                "k": registry.obtain("k"),
                "s": registry.obtain_semaphore("s", permits=1),
                "rw": registry.obtain_read_write("rw").write_lock(),
                "rr": registry.obtain_read_write("rr").read_lock(),
                "m1": registry.obtain_many(["m1", "m2"]),
            }

        for (key, kind), rival in zip(kinds(registry).items(), kinds(other).values(), strict=True):
            try_call = kind.try_lock if hasattr(kind, "try_lock") else kind.try_acquire
            runs = [
                partial(asyncio.ensure_future, kind.acquire()),
                partial(asyncio.create_task, kind.acquire(timeout=5)),
                partial(asyncio.gather, try_call()),
            ]
            if hasattr(kind, "lock"):
                runs.append(partial(asyncio.create_task, kind.lock()))
            if sys.version_info < (3, 12):
                runs.append(partial(asyncio.wait_for, kind.acquire(), 5))
            for run in runs:
                with pytest.raises(hybridlock.LockNotOwnedError, match="task of its own") as raised:
                    await run()
                assert raised.value.key == key
                assert "asyncio.timeout" in str(raised.value)
            assert await rival.acquire(blocking=False), f"{key}: left held by a task that ended"
            await rival.release()
            if sys.version_info >= (3, 12):  # (wait_for runs it in the calling task: it holds)
                assert await asyncio.wait_for(kind.acquire(), 5)
                await kind.release()
            async with asyncio.timeout(5):  # the way that works everywhere: awaited in the task that will hold it
                assert await kind.acquire()
            assert kind.is_held_by_current_task()
            await kind.release()


# -- closing and loop shutdown -----------------------------------------------------------------------------------------


def run_and_watch(main: Callable[[], Awaitable[None]], caplog: pytest.LogCaptureFixture) -> list[str]:
    """Run ``main()`` in a loop of its own, end the loop, collect garbage; return every warning and every asyncio
    log record seen (a destroyed pending task, a never-retrieved exception, an unclosed transport)."""
    with caplog.at_level(logging.WARNING, logger="asyncio"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(asyncio.wait_for(main(), 20))
        gc.collect()
    return [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records if r.name == "asyncio"]


@pytest.mark.server
def test_aclose_stops_every_background_task(server: EmbeddedServer, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        before = asyncio.all_tasks()
        registry = hybridlock.AsyncLockRegistry(server.url, expire_after=0.6, retain_for=0.05)
        other = hybridlock.AsyncLockRegistry(server.url)
        lock = registry.obtain("k")
        theirs = other.obtain("k")

        async def wait_for_it() -> None:  # a pub/sub wait, with its place kept by the wait keeper
            async with theirs:
                pass

        async with lock:  # the renewer runs
            waiter = asyncio.create_task(wait_for_it())
            await asyncio.sleep(0.4)  # a renewal round
        await waiter
        async with lock:  # retained after this release: the reaper runs
            pass
        assert asyncio.all_tasks() - before - {asyncio.current_task()}, "no background task ran: a weak test"
        await registry.aclose()
        await other.aclose()
        for _ in range(3):
            await asyncio.sleep(0)
        left = asyncio.all_tasks() - before
        assert not left, f"tasks still running after aclose(): {left}"

    assert run_and_watch(main, caplog) == []


@pytest.mark.server
def test_ending_the_loop_with_a_registry_open_destroys_no_pending_task(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A program that forgets aclose(): asyncio.run cancels the registry's tasks as the loop ends; none may be
    # destroyed pending or leave an error nobody retrieved.
    async def main() -> None:
        registry = hybridlock.AsyncLockRegistry(server.url, expire_after=0.6)
        lock = registry.obtain("k")
        await lock.acquire()
        await asyncio.sleep(0.3)

    messages = run_and_watch(main, caplog)
    # (Its connection is reported unclosed, as any redis.asyncio client's would be: closing is the program's job.)
    assert not [m for m in messages if "destroyed but it is pending" in m or "never retrieved" in m], messages


# -- one registry per event loop ---------------------------------------------------------------------------------------


@pytest.mark.server
def test_a_registry_used_from_a_second_asyncio_run_says_to_make_one_per_loop(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    made = [hybridlock.AsyncLockRegistry(server.url)]  # at import time, say: outside any loop

    async def use() -> None:
        async with made[0].obtain("orders:42"):
            pass

    run_and_watch(use, caplog)  # its first loop: it works (and keeps its connection there)
    raised: list[BaseException] = []

    async def again() -> None:
        with pytest.raises(hybridlock.EventLoopMismatchError) as caught:
            await use()
        raised.append(caught.value)

    run_and_watch(again, caplog)
    (error,) = raised
    facts = (isinstance(error, RuntimeError), str(error), error.key, error.server or "")
    # (Its connection belonged to the closed loop: dropping the registry, which the error's traceback holds too,
    # reports it unclosed, as any client would.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        del error
        raised.clear()
        made.clear()
        gc.collect()
    is_runtime_error, message, key, where = facts
    assert is_runtime_error
    assert "AsyncLockRegistry 'hybridlock' belongs to the event loop it was first used in (closed now)" in message
    assert "Make one registry per event loop" in message
    assert "asyncio.run()" in message
    assert key == "orders:42"
    assert str(server.port) in where


@pytest.mark.parametrize("kind", ["local", "redis", "quorum"])
def test_every_call_from_another_loop_is_refused_and_the_registry_goes_on_in_its_own(
    kind: str, request: pytest.FixtureRequest
) -> None:
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        registry: hybridlock.AsyncLockRegistry
        if kind == "local":
            registry = hybridlock.AsyncLocalLockRegistry()
        elif kind == "redis":
            registry = hybridlock.AsyncLockRegistry(request.getfixturevalue("server").url)
        else:
            registry = hybridlock.AsyncQuorumLockRegistry(request.getfixturevalue("quorum_urls"))
        held = registry.obtain("held")
        holding, done = asyncio.Event(), asyncio.Event()

        async def hold() -> None:  # a task of the first loop holding a lock while the second loop runs
            async with held:
                holding.set()
                await done.wait()

        async def start() -> None:
            first.create_task(hold())
            await holding.wait()

        first.run_until_complete(start())

        async def noop() -> None: ...

        calls = {
            "acquire": lambda: registry.obtain("k").acquire(),
            "acquire a held lock": lambda: held.acquire(blocking=False),
            "multi-key acquire": lambda: registry.obtain_many(["a", "b"]).acquire(),
            "locked": lambda: registry.obtain("k").locked(),
            "renew": lambda: held.renew(),
            "renew_lock": lambda: registry.renew_lock("held"),
            "execute_locked": lambda: registry.execute_locked("k", noop),
            "aclose": registry.aclose,
        }
        if kind != "quorum":  # (read-write locks are refused over a quorum)
            calls["read acquire"] = lambda: registry.obtain_read_write("rw").read_lock().acquire()
            calls["write acquire"] = lambda: registry.obtain_read_write("rw").write_lock().acquire()
        for name, call in calls.items():
            with pytest.raises(hybridlock.EventLoopMismatchError, match=r"\(still open\)") as caught:
                second.run_until_complete(call())
            assert type(registry).__name__ in str(caught.value), name
        assert not registry.closed
        # Its own loop goes on as if nothing happened.
        done.set()
        first.run_until_complete(asyncio.sleep(0.05))
        assert held.statistics().owner_thread is None  # released by its holder, in its loop

        async def use() -> None:
            async with registry.obtain("k"), registry.obtain_many(["a", "b"]):
                assert not await held.locked()
            await registry.aclose()

        first.run_until_complete(use())
        assert registry.closed
    finally:
        for loop in (first, second):
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


# -- anyio -------------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_anyio_task_groups_share_a_lock_on_the_asyncio_backend(server: EmbeddedServer) -> None:
    # Tasks of two task groups take turns on one key; a lock held by the outer task is kept while a nested task
    # group runs, and its tasks (not the holder) wait for it.
    async def main() -> list[str]:
        order: list[str] = []
        async with hybridlock.AsyncLockRegistry(server.url) as registry:
            lock = registry.obtain("k")

            async def worker(name: str) -> None:
                async with lock:
                    order.append(f"{name} in")
                    await anyio.sleep(0.01)
                    order.append(f"{name} out")

            with anyio.fail_after(20):
                async with lock, anyio.create_task_group() as outer:
                    for i in range(3):
                        outer.start_soon(worker, f"a{i}")
                    async with anyio.create_task_group() as inner:
                        for i in range(3):
                            inner.start_soon(worker, f"b{i}")
                        await anyio.sleep(0.05)
                        assert order == [], "a task got in while the outer task held the lock"
                        assert lock.is_held_by_current_task()
                        await lock.release()  # let the others in; the `async with` exit needs one level
                        await lock.acquire()  # back of the queue
                    order.append("holder back")
                    assert lock.hold_count == 1
        return order

    order = anyio.run(main, backend="asyncio")
    assert len(order) == 13
    assert order.count("holder back") == 1
    entries = [entry for entry in order if entry != "holder back"]
    assert all(entries[i].endswith(" in") and entries[i + 1] == entries[i][:-3] + " out" for i in range(0, 12, 2))
