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
