"""Direct grants: a release hands a plain lock to the head of its server queue, and the waiter reads its grant from
its box in the lock's slot (``scripts.py``, "The queue of owners"; ``waiting.py``).

What these show on a real server: the woken owner needs no acquire after the wake-up; nothing but a write to the
lock's keys grants anything (a published message, a spoofed or replayed one, never does); a granted waiter that died
holds the lock for its provisional lease only, not a whole lease; a wait given up just as it was granted gives the
lock back; a grant's provisional lease is extended before it ends; tokens minted by grants keep increasing.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time

import pytest
import redis

import hybridlock
from hybridlock._async.backends.redis import AsyncRedisBackend
from hybridlock._core.config import QUEUE_PLACE_KEEP_MS
from hybridlock._core.names import lock_names
from hybridlock._sync.backends.redis import RedisBackend
from tests import _wake_workers
from tests._polling import until
from tests._stats import script_runs

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


def test_a_release_grants_the_lock_to_the_waiting_owner_without_another_acquire(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    first = holder.obtain("k")
    assert first.acquire()
    lock = waiting.obtain("k")
    waiter = _Waiter(lock)
    outcome = waiter.outcome
    until(lambda: _queued(redis_client), "the waiter's place in the queue")
    redis_client.config_resetstat()
    token = first.fencing_token
    first.release()
    assert waiter.got.wait(10)
    assert outcome[:1] == [True], outcome
    # The release was the only script: the waiter did not come back to acquire after it was told.
    assert script_runs(redis_client) == 1
    assert outcome[1] > token
    # The server holds the lock for the waiter, with a provisional lease no longer than its place's, and the
    # waiter's deadline is not later than the server's.
    assert redis_client.get(KEY_NAME) == waiting.client_id.encode()
    pttl = redis_client.pttl(KEY_NAME)
    server_end = time.monotonic() + pttl / 1000
    assert 0 < pttl <= QUEUE_PLACE_KEEP_MS
    valid_until = lock._valid_until  # (held by the waiter's thread: the tenancy's deadline is what counts)
    assert valid_until is not None
    assert valid_until <= server_end + 0.005
    assert not redis_client.exists(f"{KEY_NAME}:queue")
    assert not redis_client.exists(f"{KEY_NAME}:grant:{waiting.client_id}")
    waiter.finish()


def test_a_grants_provisional_lease_is_extended_before_it_ends(make_registry, redis_client):
    holder, waiting = make_registry(expire_after=30.0), make_registry(expire_after=30.0)
    first = holder.obtain("k")
    assert first.acquire()
    lock = waiting.obtain("k")
    got = threading.Event()
    release = threading.Event()
    lost: list[object] = []
    lock.on_lost(lost.append)

    def hold() -> None:
        with lock:
            got.set()
            release.wait(20)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    until(lambda: _queued(redis_client), "the waiter's place in the queue")
    first.release()
    assert got.wait(10)
    time.sleep(QUEUE_PLACE_KEEP_MS / 1000 + 1.0)  # past the provisional lease
    assert not lost
    assert redis_client.get(KEY_NAME) == waiting.client_id.encode()
    assert redis_client.pttl(KEY_NAME) > 20_000  # extended to the registry's lease
    assert not holder.obtain("k").acquire(blocking=False)
    release.set()
    thread.join(10)


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
        for owner in ("a", "b"):
            refused = backend.try_acquire(names, owner, 30_000, True, f"{owner}|w{owner}|30000")
            assert not refused.acquired
        assert backend.release(names, "holder", notify=True)
        assert redis_client.get(KEY_NAME) == b"a"  # granted to the head, unread
        backend.cancel_wait(names, "a", "a|wa|30000")  # "a" gives up before reading it
        assert redis_client.get(KEY_NAME) == b"b"  # given back: granted to the next in line
        assert not redis_client.exists(f"{KEY_NAME}:grant:a")
        granted = backend.await_grant(names, "b", "b|wb|30000", 1.0, 30_000)
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


async def test_an_asyncio_waiter_is_granted_the_lock_without_another_acquire(server, redis_client):
    async with (
        hybridlock.AsyncLockRegistry(server.url) as holder,
        hybridlock.AsyncLockRegistry(server.url) as waiting,
    ):
        first = holder.obtain("k")
        assert await first.acquire()
        lock = waiting.obtain("k")

        async def take() -> bool:
            got = await lock.acquire(timeout=20)
            owner = redis_client.get(KEY_NAME)
            await lock.release()
            return got and owner == waiting.client_id.encode()

        task = asyncio.ensure_future(take())
        for _ in range(400):
            if _queued(redis_client):
                break
            await asyncio.sleep(0.01)
        redis_client.config_resetstat()
        await first.release()
        assert await asyncio.wait_for(task, 10)
        assert script_runs(redis_client) == 2  # the release that granted it, and the waiter's own release


def test_the_asyncio_backend_reads_grants_too(server, redis_client):
    async def main() -> None:
        names = lock_names("hybridlock", "k")
        backend = AsyncRedisBackend(redis.asyncio.Redis.from_url(server.url), owns_client=True)
        try:
            assert (await backend.try_acquire(names, "holder", 30_000, False)).acquired
            assert not (await backend.try_acquire(names, "a", 30_000, True, "a|w|30000")).acquired
            assert await backend.release(names, "holder", notify=True)
            granted = await backend.await_grant(names, "a", "a|w|30000", 1.0, 30_000)
            assert granted is not None
            assert granted.acquired
            assert await backend.release(names, "a", notify=True)
        finally:
            await backend.aclose()

    asyncio.run(main())
