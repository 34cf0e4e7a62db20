"""A semaphore script that ran in the server but whose reply was lost (the connection dropped after the server ran it)
is run again by the client's retry (redis-py's ``Retry`` on the connection, on a new one): the retry must never
take a second permit held by nobody, and comes to the same outcome, but for a plain release, which reports a false
loss (as a lock's does). Written once: here tasks, in ``tests/_sync`` threads.

One server, reached through a proxy that cuts the connection of one request as its reply comes back
(``tests/_proxy.py``, ``cut_reply_to``): exactly one reply is lost.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._protocol import scripts
from hybridlock.errors import LockLostError
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from ._compat import JOIN, sleep, spawn
from .test_semaphore_transfer import _asleep

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def request_of(client: redis.Redis, script: str) -> bytes:
    """What marks a request running ``script``: its SHA-1, as EVALSHA sends it. The script is loaded here, so that
    the request cut off runs it (not a NOSCRIPT refusal, followed by an EVAL)."""
    sha = client.script_load(script)
    assert sha == hashlib.sha1(script.encode()).hexdigest()
    return sha.encode()


def watch_attempts(registry: Any, semaphore: Any) -> list[bool]:
    """A list that gets an item after each attempt of ``semaphore``'s waiters here made on a subscription the server
    had confirmed before and still has after: the waiter then sleeps until its place's refresh, a second later,
    where a release attempts for it. (A confirmation, or a change of subscription, during or before an attempt
    wakes the waiter for one more: see ``waiting._wait_for_lock``.)"""
    backend = registry.backend
    attempt = backend.try_acquire_permit
    attempted: list[bool] = []

    def epochs() -> list[int | None]:
        with semaphore._guard:
            return [None if w.watch is None else w.watch.epoch() for w in semaphore._waiters]

    async def watched(*args: Any, **kwargs: Any) -> Any:
        before = epochs()
        result = await attempt(*args, **kwargs)
        if before and None not in before and epochs() == before:
            attempted.append(True)
        return result

    backend.try_acquire_permit = watched
    return attempted


def slots_held(client: redis.Redis, semaphore: Any) -> list[int]:
    """The permit slots of ``semaphore`` held in the server by anyone."""
    return [i for i in range(4) if client.exists(semaphore._names.slot(i))]


async def test_a_retried_acquire_takes_one_permit(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    # The acquire's reply is lost and the acquire retried: it returns the permit its first run took (with a new
    # token), instead of taking a second one that nobody holds, renews or gives back until its lease ends, and that
    # counts against the limit meanwhile.
    proxy = FaultProxy(server.port)
    try:
        async with (
            hybridlock.AsyncLockRegistry(proxy.url) as registry,
            hybridlock.AsyncLockRegistry(server.url) as other,
        ):
            semaphore = registry.obtain_semaphore("retried", 2)
            rival = other.obtain_semaphore("retried", 2)
            assert await semaphore.acquire(blocking=False)  # (a connection made)
            first = semaphore.fencing_token
            await semaphore.release()
            proxy.cut_reply_to(request_of(redis_client, scripts.ACQUIRE_PERMIT))
            assert await semaphore.acquire(blocking=False)
            assert proxy.reply_cut, "no reply was cut off: the test did not test anything"
            assert first is not None
            assert (semaphore.fencing_token or 0) > first  # (minted after the lost reply's: tokens still increase)
            assert slots_held(redis_client, semaphore) == [0], "the retried acquire took a second permit"
            assert await rival.acquire(blocking=False), "the permit taken by the lost reply's run was left held"
            await rival.release()
            await semaphore.release()
            assert slots_held(redis_client, semaphore) == []
    finally:
        proxy.close()


@pytest.mark.parametrize("slot_taken", ["other-slot", "same-slot"])
async def test_a_retried_hand_over_hands_one_permit_and_reports_no_loss(
    server: EmbeddedServer, redis_client: redis.Redis, slot_taken: str
) -> None:
    # A release hands its permit to a task of its process that waits, in one request (scripts.TRANSFER_PERMIT), and
    # the reply is lost: the first run released our slot and took one for the waiter. The retry must see that and
    # return the same outcome: neither report the released permit lost nor leave the waiter's slot held by nobody
    # (another slot: slot 1 released and slot 0, the lowest free, taken; the old script found slot 1 gone and
    # raised LockLostError), nor release the waiter's permit as ours (the same slot, 0).
    proxy = FaultProxy(server.port)
    permits = 2 if slot_taken == "other-slot" else 1
    try:
        async with (
            hybridlock.AsyncLockRegistry(proxy.url) as registry,
            hybridlock.AsyncLockRegistry(server.url) as other,
        ):
            semaphore = registry.obtain_semaphore("handed", permits)
            names = semaphore._names
            queued = 1
            if slot_taken == "other-slot":
                rival = other.obtain_semaphore("handed", permits)
                assert await rival.acquire(blocking=False)  # slot 0
                assert await semaphore.acquire(blocking=False)  # slot 1
                # An earlier waiter of another owner, first in the queue (it never attempts: a place that does not
                # lapse during the test), so that our waiter is refused while slot 0 is free.
                redis_client.zadd(names.queue, {"ghost|1": 1})
                redis_client.zadd(names.queue_until, {"ghost|1": 2**50})
                await rival.release()  # (slot 0 free, but owed to the ghost's place: the waiter is refused)
                queued = 2
            else:
                assert await semaphore.acquire(blocking=False)  # slot 0
            attempted = watch_attempts(registry, semaphore)

            async def wait_then_release() -> list[int]:
                assert await semaphore.acquire(timeout=JOIN)
                held = slots_held(redis_client, semaphore)
                await semaphore.release()
                return held

            waiter = spawn(wait_then_release)
            deadline = time.monotonic() + JOIN
            while not (attempted and _asleep(semaphore)):  # (a thread's state reads asleep soon after its attempt)
                assert time.monotonic() < deadline, "the waiter did not wait"
                await sleep(0.002)
            assert redis_client.zcard(names.queue) == queued
            proxy.cut_reply_to(request_of(redis_client, scripts.TRANSFER_PERMIT))
            await semaphore.release()
            assert proxy.reply_cut, "no reply was cut off: the test did not test anything"
            assert await waiter.join() == [0], "a permit was left held by nobody"
            assert slots_held(redis_client, semaphore) == []
    finally:
        proxy.close()


async def test_a_retried_release_gives_the_permit_back_and_reports_it_lost(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    # What a retried plain release (scripts.RELEASE_PERMIT, no waiter here) does: the retry finds the permit gone and
    # reports it lost, as a retried lock release does: a false alarm on the safe side, with nothing left held.
    proxy = FaultProxy(server.port)
    try:
        async with hybridlock.AsyncLockRegistry(proxy.url) as registry:
            semaphore = registry.obtain_semaphore("released", 1)
            assert await semaphore.acquire(blocking=False)
            proxy.cut_reply_to(request_of(redis_client, scripts.RELEASE_PERMIT))
            with pytest.raises(LockLostError):
                await semaphore.release()
            assert proxy.reply_cut, "no reply was cut off: the test did not test anything"
            assert semaphore.held_here == 0
            assert slots_held(redis_client, semaphore) == []
    finally:
        proxy.close()
