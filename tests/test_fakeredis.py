"""Quick checks of the Redis backend's scripts on fakeredis (with its Lua engine): no server needed.

They exercise the same code path as a real server (EVALSHA, the NOSCRIPT fallback, every script) in a fraction
of a second. Safety claims are shown on real servers elsewhere; fakeredis only catches script and parsing bugs
early.
"""

from __future__ import annotations

import threading
import time

import pytest

import hybridlock

fakeredis = pytest.importorskip("fakeredis")
pytest.importorskip("lupa")


@pytest.fixture
def client():
    fake = fakeredis.FakeRedis()
    yield fake
    fake.close()


@pytest.fixture
def registries(client):
    made = [hybridlock.LockRegistry(client, lock_type="spin") for _ in range(2)]
    yield made
    for registry in made:
        registry.close()


def test_plain_lock_scripts(registries, client):
    mine, other = registries
    lock = mine.obtain("k")
    assert lock.acquire(timeout=1)
    first_token = lock.fencing_token
    assert client.get("hybridlock:{k}") == mine.client_id.encode()
    assert not other.obtain("k").acquire(blocking=False)
    lock.renew(5.0)
    assert client.pttl("hybridlock:{k}") > 4000
    lock.release()
    assert not client.exists("hybridlock:{k}")
    with other.obtain("k") as taken:
        assert taken.fencing_token > first_token


def test_the_queue_serves_a_waiter_before_a_newcomer(registries, client):
    mine, other = registries
    lock = mine.obtain("q")
    lock.acquire()
    got = []

    def wait() -> None:
        theirs = other.obtain("q")
        got.append(theirs.acquire(timeout=5))
        if got[-1]:
            theirs.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while not client.zcard("hybridlock:{q}:queue") and time.monotonic() < deadline:
        time.sleep(0.005)
    lock.release()
    assert not lock.acquire(blocking=False)  # promised to the waiter at the head of the queue
    waiter.join(10)
    assert got == [True]


def test_read_write_and_multi_key_scripts(registries, client):
    mine, other = registries
    rw, rw_other = mine.obtain_read_write("doc"), other.obtain_read_write("doc")
    with rw.read_lock():
        assert rw_other.read_lock().acquire(blocking=False)
        rw_other.read_lock().release()
        assert not rw_other.write_lock().acquire(blocking=False)
    with rw.write_lock():
        assert rw.write_lock().fencing_token is not None
        assert not rw_other.read_lock().acquire(blocking=False)
    with mine.obtain_many(["a", "b", "c"]) as multi:
        assert multi._atomic is True
        assert not other.obtain("b").acquire(blocking=False)
    assert other.obtain_many(["a", "b"]).acquire(blocking=False)
    other.obtain_many(["a", "b"]).release()
