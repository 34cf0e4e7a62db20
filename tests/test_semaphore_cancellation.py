"""An asyncio semaphore acquire cancelled while its attempt is in flight leaves no permit held by nobody.

asyncio only: a thread's acquire is cut off in flight only by ``KeyboardInterrupt``, which takes the same path
(``waiting.acquire_remote``'s ``undo``)."""

from __future__ import annotations

import asyncio

import pytest

import hybridlock
from tests._tasks import awaited

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


async def test_an_acquire_cancelled_in_flight_leaves_no_permit_behind(own_server) -> None:
    async with (
        hybridlock.AsyncLockRegistry(own_server.url) as registry,
        hybridlock.AsyncLockRegistry(own_server.url) as other,
    ):
        semaphore = registry.obtain_semaphore("cut", 1)
        rival = other.obtain_semaphore("cut", 1)
        for warm in (rival, semaphore):  # (connections made and scripts loaded before the server is frozen)
            assert await warm.acquire(blocking=False)
            await warm.release()
        own_server.pause()
        try:
            task = asyncio.ensure_future(awaited(semaphore.acquire))
            await asyncio.sleep(0.3)  # its attempt is sent; the frozen server has not run it
            task.cancel()
            await asyncio.sleep(0.3)  # the give-back is sent too (shielded), on another connection
        finally:
            own_server.resume()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert semaphore.held_here == 0
        # Whichever of the two the server ran first, nothing is left held: the permit is free at once, not after
        # the lease (30 s).
        assert await rival.acquire(blocking=False), "the permit granted to the cancelled acquire was left held"
        await rival.release()


def heard(semaphore) -> bool:
    """Whether every acquire of ``semaphore`` here waits on a subscription the server has confirmed (True before
    hand-overs, which keep no record of waiters)."""
    waiters = getattr(semaphore, "_waiters", None)
    return waiters is None or all(w.watch is not None and w.watch.epoch() is not None for w in waiters)


def sleeping(semaphore) -> bool:
    """Whether every acquire of ``semaphore`` here sleeps between attempts on a confirmed subscription, where a
    release can wake it (True before hand-overs)."""
    waiters = getattr(semaphore, "_waiters", None)
    return heard(semaphore) and (waiters is None or all(w.state == 0 for w in waiters))  # (0: _IDLE)


async def test_a_waiter_cancelled_while_a_release_attempts_for_it_leaves_no_permit_behind(own_server) -> None:
    # A release attempts for a waiting task of its process (tests/_async/test_semaphore_transfer.py), and the task is
    # cancelled before the answer comes (the request is held up until it has ended): the permit taken for it is
    # given back by the release, not left held by nobody until its lease ends.
    async with (
        hybridlock.AsyncLockRegistry(own_server.url) as registry,
        hybridlock.AsyncLockRegistry(own_server.url) as other,
    ):
        semaphore = registry.obtain_semaphore("handed", 1)
        assert await semaphore.acquire(blocking=False)
        backend = registry.backend
        transfer = getattr(backend, "transfer_permit", None)  # (None before hand-overs: the test then fails)
        offered = asyncio.Event()
        task = asyncio.ensure_future(awaited(semaphore.acquire))

        async def held_up(*args, **kwargs):
            offered.set()
            await asyncio.wait((task,))  # (the waiter has ended: cancelled meanwhile)
            return await transfer(*args, **kwargs)

        backend.transfer_permit = held_up
        # The waiter must sleep where the release finds it: after an attempt made on a confirmed subscription. Until
        # the server confirms it, the waiter polls, and the confirmation wakes it for one more attempt (see
        # waiting._wait_for_lock); after that attempt it sleeps until its place's refresh, a second later.
        attempt = backend.try_acquire_permit
        settled = asyncio.Event()

        async def watched_attempt(*args, **kwargs):
            confirmed = heard(semaphore)  # (read as the attempt starts, as the waiter reads its epoch)
            result = await attempt(*args, **kwargs)
            if confirmed:
                settled.set()
            return result

        backend.try_acquire_permit = watched_attempt
        await asyncio.wait_for(settled.wait(), 10)
        deadline = asyncio.get_running_loop().time() + 10
        while not (await backend.client.zcard(semaphore._names.queue) and sleeping(semaphore)):
            assert asyncio.get_running_loop().time() < deadline, "the waiter did not queue"
            await asyncio.sleep(0.005)

        async def cancel_when_offered() -> None:
            await offered.wait()
            task.cancel()

        canceller = asyncio.ensure_future(cancel_when_offered())
        await semaphore.release()  # (this task's permit: released here; bounded by the test's timeout)
        assert offered.is_set(), "the release did not attempt for the waiter"
        await canceller
        with pytest.raises(asyncio.CancelledError):
            await task
        assert semaphore.held_here == 0
        rival = other.obtain_semaphore("handed", 1)
        assert await rival.acquire(blocking=False), "the permit taken for the cancelled waiter was left held"
        await rival.release()
