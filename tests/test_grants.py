"""Direct grants: a release hands a plain lock to the head of its server queue, and the waiter reads its grant from
its box in the lock's slot (``scripts.py``, "The queue of owners"; ``waiting.py``). What needs processes, messages
from outside, a backend at work or one side only; ``tests/_async/test_grants.py`` has the rest, on both sides.

What these show on a real server: nothing but a write to the lock's keys grants anything (a published message, a
spoofed or replayed one, never does); a granted waiter that died holds the lock for its provisional lease only, not a
whole lease; a wait given up just as it was granted (or cancelled while its first look at its box is under way)
gives the lock back; tokens minted by grants keep increasing.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import replace

import pytest
import redis

import hybridlock
from hybridlock._async.backends.redis import AsyncRedisBackend
from hybridlock._core.config import QUEUE_PLACE_KEEP_MS
from hybridlock._core.names import lock_names
from hybridlock._sync.backends.redis import RedisBackend
from tests import _wake_workers
from tests._polling import until

pytestmark = pytest.mark.server

CTX = multiprocessing.get_context("spawn")
KEY_NAME = "hybridlock:{k}"


def _queued(client: redis.Redis, count: int = 1) -> bool:
    return client.zcard(f"{KEY_NAME}:queue") >= count


class _Waiter:
    """A thread that acquires ``lock`` (up to ``timeout``), records the outcome and the token in ``outcome``, and
    keeps the lock until ``finish()``."""

    def __init__(self, lock: hybridlock.HybridLock, timeout: float = 20.0) -> None:
        self.lock = lock
        self.outcome: list[object] = []
        self.got = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self._thread.start()

    def _run(self, timeout: float) -> None:
        try:
            got = self.lock.acquire(timeout=timeout)
            self.outcome.append(got)
            self.outcome.append(self.lock.fencing_token)
            self.got.set()
            if got:
                self._done.wait(30)
                self.lock.release()
        except BaseException as exc:  # the test reads it
            self.outcome.append(exc)
            self.got.set()

    def finish(self) -> None:
        """Let the thread release the lock (if it got it) and end."""
        self._done.set()
        self._thread.join(10)


def test_no_published_message_grants_the_lock(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    first = holder.obtain("k")
    assert first.acquire()
    lock = waiting.obtain("k")
    waiter = _Waiter(lock)
    outcome = waiter.outcome
    until(lambda: _queued(redis_client), "the waiter's place in the queue")
    (place,) = [member.decode() for member in redis_client.zrange(f"{KEY_NAME}:queue", 0, -1)]
    wait_id = place.partition("|")[2]
    # Anyone who can publish: every wake-up the protocol has ever used, on every channel, addressed to the waiter's
    # place, and the grant payload itself (which only ever travels in the box, a key).
    channels = [f"{KEY_NAME}:wake", f"{KEY_NAME}:wake:{waiting.client_id}", f"{KEY_NAME}:grant:{waiting.client_id}"]
    payloads = ["released", f"released:{waiting.client_id}", f"released:{place}", f"{wait_id}:999999999999999:0"]
    stop = time.monotonic() + 1.5
    while time.monotonic() < stop:
        for channel in channels:
            for payload in payloads:
                redis_client.publish(channel, payload)
        time.sleep(0.01)
    assert outcome == [], "a published message let the waiter in while the lock was held"
    first.release()
    assert waiter.got.wait(10)
    assert outcome[:1] == [True]
    waiter.finish()


def test_a_replayed_grant_of_an_earlier_wait_does_not_let_a_waiter_in(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    first = holder.obtain("k")
    assert first.acquire()
    lock = waiting.obtain("k")
    waiter = _Waiter(lock)
    outcome = waiter.outcome
    until(lambda: _queued(redis_client), "the waiter's place in the queue")
    box = f"{KEY_NAME}:grant:{waiting.client_id}"
    for _ in range(20):  # a grant to another wait of the same owner: read, recognised as not ours, set aside
        redis_client.lpush(box, f"{os.urandom(8).hex()}:123:0")
        time.sleep(0.05)
    assert outcome == [], "a grant to another wait let the waiter in while the lock was held"
    assert redis_client.get(KEY_NAME) == holder.client_id.encode()
    first.release()
    assert waiter.got.wait(10)
    assert outcome[:1] == [True]
    waiter.finish()


def test_giving_up_just_as_the_lock_is_granted_gives_it_back(server, redis_client):
    names = lock_names("hybridlock", "k")
    backend = RedisBackend(redis.Redis.from_url(server.url), owns_client=True)
    try:
        assert backend.try_acquire(names, "holder", 30_000, False).acquired
        arrivals = {}
        for owner in ("a", "b"):
            refused = backend.try_acquire(names, owner, 30_000, True, f"{owner}|w{owner}|30000")
            assert not refused.acquired
            arrivals[owner] = refused.queued_at
        assert backend.release(names, "holder", notify=True)
        # Granted to the head, unread: the key holds that tenancy, "<owner>|<token>".
        assert redis_client.get(KEY_NAME).startswith(b"a|")
        backend.cancel_wait(names, "a", "a|wa|30000")  # "a" gives up before reading it
        assert redis_client.get(KEY_NAME).startswith(b"b|")  # given back: granted to the next in line
        assert not redis_client.exists(f"{KEY_NAME}:grant:a")
        granted = backend.await_grant(names, "b", "b|wb|30000", 1.0, 30_000, arrivals["b"])
        assert granted is not None
        assert granted.acquired
        backend.cancel_wait(names, "b", "b|wb|30000")  # read, then given up (an interrupted acquire): given back too
        assert not redis_client.exists(KEY_NAME)
    finally:
        backend.close()


def test_a_granted_waiter_that_died_holds_the_lock_only_for_its_provisional_lease(server, make_registry, redis_client):
    holder = make_registry(expire_after=30.0)
    first = holder.obtain("k")
    assert first.acquire()
    ready = CTX.Event()
    doomed = CTX.Process(target=_wake_workers.wait_for_lock, args=(server.url, "k", ready))
    doomed.start()
    try:
        assert ready.wait(20)
        until(lambda: _queued(redis_client), "the doomed waiter's place")
        lock = make_registry(expire_after=30.0).obtain("k")
        waiter = _Waiter(lock, timeout=20.0)
        until(lambda: _queued(redis_client, 2), "the second waiter's place")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.join(10)
        released_at = time.monotonic()
        first.release()  # granted to the dead head: its place had not lapsed yet
        assert redis_client.pttl(KEY_NAME) <= QUEUE_PLACE_KEEP_MS
        assert waiter.got.wait(20)
        waited = time.monotonic() - released_at
        waiter.finish()
    finally:
        if doomed.is_alive():
            doomed.kill()
    assert waiter.outcome[:1] == [True], waiter.outcome
    # The dead head held the lock until its place would have lapsed (3 s at most), not for a 30 s lease.
    assert waited < QUEUE_PLACE_KEEP_MS / 1000 + 2.0, waited


def test_tokens_keep_increasing_across_grants(make_registry):
    registries = [make_registry() for _ in range(4)]
    seen: list[int] = []
    stop = time.monotonic() + 2.0
    errors: list[BaseException] = []

    def cycle(registry: hybridlock.LockRegistry) -> None:
        lock = registry.obtain("k")
        try:
            while time.monotonic() < stop:
                with lock:
                    token = lock.fencing_token
                    assert token is not None
                    seen.append(token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=cycle, args=(registry,)) for registry in registries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(seen) > 20
    assert seen == sorted(seen)
    assert len(set(seen)) == len(seen)


def test_the_asyncio_backend_reads_grants_too(server, redis_client):
    async def main() -> None:
        names = lock_names("hybridlock", "k")
        backend = AsyncRedisBackend(redis.asyncio.Redis.from_url(server.url), owns_client=True)
        try:
            assert (await backend.try_acquire(names, "holder", 30_000, False)).acquired
            refused = await backend.try_acquire(names, "a", 30_000, True, "a|w|30000")
            assert not refused.acquired
            assert await backend.release(names, "holder", notify=True)
            granted = await backend.await_grant(names, "a", "a|w|30000", 1.0, 30_000, refused.queued_at)
            assert granted is not None
            assert granted.acquired
            # Released as the granted tenancy it is ("<owner>|<token>"); the owner id alone is not it.
            assert not await backend.release(names, "a", notify=True)
            tenancy = replace(names, tenancy=f"a|{granted.fencing_token}")
            assert await backend.release(tenancy, "a", notify=True)
        finally:
            await backend.aclose()

    asyncio.run(main())


async def test_a_wait_cancelled_around_its_grant_leaves_nothing_held(server, redis_client):
    # The waiter expects a wait, so its first attempt and its first look at its box go in one pipelined round trip:
    # cancelled before, during or after the release that grants it the lock, it leaves the lock free (or taken by
    # its own release), never held by nobody.
    for release_after in (0.0, 0.005, 0.02):
        for cancel_after in (0.0, 0.002, 0.01, 0.03):
            redis_client.flushall()
            async with (
                hybridlock.AsyncLockRegistry(server.url) as first,
                hybridlock.AsyncLockRegistry(server.url) as second,
            ):
                holder, lock = first.obtain("k"), second.obtain("k")
                assert await holder.acquire()
                lock._wait_hint.expect_wait = True

                async def take(lock=lock) -> bool:
                    got = await lock.acquire(timeout=5)
                    if got:
                        await lock.release()
                    return got

                task = asyncio.ensure_future(take())
                await asyncio.sleep(release_after)
                await holder.release()
                await asyncio.sleep(cancel_after)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(0.05)
                assert redis_client.get(KEY_NAME) is None, (release_after, cancel_after)
