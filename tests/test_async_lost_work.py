"""What only asyncio's ``until_lost()`` scope has: it cancels the work, and must tell its own cancellation from
anyone else's (the rules of ``asyncio.timeout``). The shared behaviour, on both sides, is in
``tests/_async/test_lost_work.py``.

* A cancellation from outside leaves the scope as ``CancelledError``, alone or at the same moment as a loss.
* Scopes nest: the one whose lease was lost raises ``LockLostError``, the one around it goes on; when both leases
  are lost, the outer one raises it.
* The task is left as it was: no cancellation request counted (``Task.cancelling()``), none pending, after a scope
  that ended normally, one that cancelled its work, one whose body swallowed the cancellation, and one whose own
  renewal by hand found the loss.

The losses here are made on a real server (the key deleted, as the renewer then finds it) where timing allows, and
marked at an exact moment (``_claim_loss``, what the renewer calls) where the test is about that moment.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

import hybridlock
from hybridlock.testing import EmbeddedServer

pytestmark = pytest.mark.server

LEASE = 0.9
JOIN = 10.0


def _lose(lock: hybridlock.AsyncHybridLock) -> None:
    """Mark the lease lost now, as the renewer does when it finds the key gone."""
    assert lock._claim_loss(lock._tenancy)


async def _released(lock: hybridlock.AsyncHybridLock) -> None:
    try:
        await lock.release()
    except hybridlock.LockLostError:
        pass


async def test_a_cancellation_from_outside_leaves_the_scope_as_cancelled_error(server: EmbeddedServer) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("outside")
        inside = asyncio.Event()

        async def work() -> None:
            async with lock, lock.until_lost():
                inside.set()
                await asyncio.sleep(JOIN)

        task = asyncio.ensure_future(work())
        await asyncio.wait_for(inside.wait(), JOIN)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, JOIN)
        assert not lock.lost
        assert not lock.is_held_by_current_task()
        assert await lock.acquire(timeout=JOIN)  # released by the `async with` on the way out
        await lock.release()


@pytest.mark.parametrize("first", ["loss", "outside"])
async def test_a_cancellation_from_outside_at_the_moment_of_a_loss_wins(server: EmbeddedServer, first: str) -> None:
    """Both requests reach the task before it runs again: the scope takes back only its own, and the one from
    outside goes on as ``CancelledError``."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("both")
        inside = asyncio.Event()

        async def work() -> None:
            await lock.acquire()
            try:
                async with lock.until_lost():
                    inside.set()
                    await asyncio.sleep(JOIN)
            finally:
                await _released(lock)

        task = asyncio.ensure_future(work())
        await asyncio.wait_for(inside.wait(), JOIN)
        if first == "loss":
            _lose(lock)
            task.cancel()
        else:
            task.cancel()
            _lose(lock)
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, JOIN)


async def test_nested_scopes_the_one_whose_lease_was_lost_raises(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        outer, inner = registry.obtain("outer"), registry.obtain("inner")
        assert await outer.acquire(timeout=JOIN)
        assert await inner.acquire(timeout=JOIN)
        steps: list[str] = []
        async with outer.until_lost() as outer_scope:
            try:
                async with inner.until_lost():
                    redis_client.delete(inner._names.lock)
                    await asyncio.sleep(JOIN)
                    steps.append("inner work ran on")
            except hybridlock.LockLostError as exc:
                steps.append(f"{exc.key} lost")
            await asyncio.sleep(0.05)  # not cancelled: the outer lease is held
            steps.append("outer work goes on")
        assert steps == ["inner lost", "outer work goes on"]
        assert not outer_scope.lost
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0
        await outer.release()
        await _released(inner)


async def test_nested_scopes_both_lost_the_outer_one_raises(server: EmbeddedServer) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("twice")
        assert await lock.acquire(timeout=JOIN)
        steps: list[str] = []

        async def work() -> None:
            async with lock.until_lost():
                async with lock.until_lost():
                    asyncio.get_running_loop().call_later(0.05, _lose, lock)
                    await asyncio.sleep(JOIN)
                steps.append("between the scopes")  # never: both were lost

        with pytest.raises(hybridlock.LockLostError):
            await work()
        assert steps == []
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0
        await _released(lock)


async def test_a_body_that_swallows_the_cancellation_still_ends_with_lock_lost_error(server: EmbeddedServer) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("swallowed")
        assert await lock.acquire(timeout=JOIN)

        async def work() -> None:
            async with lock.until_lost():
                asyncio.get_running_loop().call_later(0.05, _lose, lock)
                try:
                    await asyncio.sleep(JOIN)
                except asyncio.CancelledError:
                    pass  # (bad manners, but the scope must still say the lease was lost)

        with pytest.raises(hybridlock.LockLostError):
            await work()
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0
        await asyncio.sleep(0.05)  # no cancellation left pending
        await _released(lock)


async def test_a_loss_the_task_finds_itself_leaves_no_cancellation_pending(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    """The task's own renewal by hand finds the key gone and raises ``LockLostError`` there, inside the scope: the
    scope's cancellation must not be left to hit the task's next ``await`` after it."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("found-here")
        assert await lock.acquire(timeout=JOIN)

        async def work() -> None:
            async with lock.until_lost():
                redis_client.delete(lock._names.lock)
                await lock.renew()

        with pytest.raises(hybridlock.LockLostError):
            await work()
        start = time.monotonic()
        await asyncio.sleep(0.05)  # a cancellation left pending would raise here
        assert time.monotonic() - start >= 0.04
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0
        await _released(lock)


async def test_a_scope_that_ends_normally_leaves_the_task_as_it_was(server: EmbeddedServer) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("normal")
        assert await lock.acquire(timeout=JOIN)
        async with lock.until_lost() as scope:
            await asyncio.sleep(0.05)
        _lose(lock)  # after the scope: it no longer watches
        await asyncio.sleep(0.05)
        assert not scope.lost
        current = asyncio.current_task()
        assert current is not None
        assert current.cancelling() == 0

        async def again() -> None:
            async with scope:
                pass

        with pytest.raises(hybridlock.LockNotOwnedError, match="entered once"):
            await again()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


async def test_ensure_held_from_a_thread_outside_the_loop_is_a_clear_error(server: EmbeddedServer) -> None:
    """A worker thread (a framework's ``def`` endpoint, ``asyncio.to_thread``) cannot be the holding task: it gets
    ``LockNotOwnedError`` naming the key and saying what to do, not a bare ``RuntimeError`` from asyncio."""
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        lock = registry.obtain("k")
        semaphore = registry.obtain_semaphore("s", permits=2)
        async with lock, semaphore:
            for holder, key in ((lock, "k"), (semaphore, "s")):
                with pytest.raises(hybridlock.LockNotOwnedError) as raised:
                    await asyncio.to_thread(holder.ensure_held)
                assert raised.value.key == key
                assert "outside its event loop" in str(raised.value)
                assert "lost" in str(raised.value)  # what a thread may read instead
            lock.ensure_held()  # the holding task itself still passes
            semaphore.ensure_held()


async def test_own_hold_queries_from_a_thread_answer_for_the_thread(server: EmbeddedServer) -> None:
    """A thread (``asyncio.to_thread``, a logging handler formatting a repr) asking whether *it* holds an asyncio lock
    or permit gets the true answer, no (it is not a task, so it holds nothing), not a bare ``RuntimeError`` from
    ``asyncio.current_task()``; a repr works from anywhere."""
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        lock = registry.obtain("k")
        semaphore = registry.obtain_semaphore("s", permits=2)
        halves = registry.obtain_read_write("rw")
        both = registry.obtain_many(["m1", "m2"])
        async with lock, semaphore, halves.read_lock(), both:

            def ask() -> list[object]:
                return [
                    lock.is_held_by_current_task(),
                    lock.hold_count,
                    lock._is_owned(),
                    semaphore.is_held_by_current_task(),
                    semaphore.hold_count,
                    semaphore.lost,
                    semaphore.valid_until,
                    semaphore.fencing_token,
                    halves.read_lock().is_held_by_current_task(),
                    halves.read_lock().hold_count,
                    both.is_held_by_current_task(),
                    both.hold_count,
                    "depth 0" in repr(halves.read_lock()),
                    "not held by this task" in repr(both),
                ]

            answers = [False, 0, False, False, 0, False, None, None, False, 0, False, 0, True, True]
            assert await asyncio.to_thread(ask) == answers
            still = [lock, semaphore, halves.read_lock(), both]  # the task still holds each
            assert [held.is_held_by_current_task() for held in still] == [True] * 4
