"""Pub/sub wake-ups: prompt hand-off across processes, lease-end wake-ups, one connection, broken subscriptions."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time

import pytest
import redis

import hybridlock
from tests import _wake_workers

pytestmark = pytest.mark.server

CTX = multiprocessing.get_context("spawn")


def _script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(name, {}).get("calls", 0) for name in ("cmdstat_evalsha", "cmdstat_eval"))


def test_waiter_in_another_process_wakes_promptly_on_release(server, make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("handoff")
    delays = []
    for _ in range(5):
        ready, released_at = CTX.Event(), CTX.Value("d", 0.0)
        args = (server.url, "handoff", 1.0, ready, released_at)
        holder = CTX.Process(target=_wake_workers.hold_then_release, args=args)
        holder.start()
        try:
            assert ready.wait(20)
            redis_client.config_resetstat()
            assert lock.acquire(timeout=10)
            acquired_at = time.monotonic()  # CLOCK_MONOTONIC is one clock for every process on Linux
            lock.release()
        finally:
            holder.join(20)
        delays.append(acquired_at - released_at.value)
        # Waiting for ~1 s cost a handful of attempts, not a poll every few milliseconds.
        assert _script_calls(redis_client) <= 8
    assert statistics.median(delays) < 0.05  # about a round trip; polling would be tens of ms


def test_waiter_wakes_at_a_crashed_holders_lease_end(server, make_registry, redis_client):
    registry = make_registry()
    ready, token = CTX.Event(), CTX.Value("q", 0)
    crasher = CTX.Process(target=_wake_workers.hold_and_die, args=(server.url, "crash", 1.0, ready, token))
    crasher.start()
    assert ready.wait(20)
    crasher.join(20)
    pttl = redis_client.pttl("hybridlock:{crash}")
    assert pttl > 0  # the crashed holder's key is still there
    lease_end = time.monotonic() + pttl / 1000
    lock = registry.obtain("crash")
    assert lock.acquire(timeout=10)
    late = time.monotonic() - lease_end
    lock.release()
    assert -0.01 < late < 0.25  # within a few milliseconds of the lease end (generous for a loaded machine)
    assert lock.fencing_token is None


def test_forty_waiters_on_forty_keys_share_one_subscriber_connection(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    for i in range(40):
        holder.obtain(f"k{i}").acquire()
    results = []

    def wait_for(i: int) -> None:
        lock = waiting.obtain(f"k{i}")
        ok = lock.acquire(timeout=15)
        results.append(ok)
        if ok:
            lock.release()

    threads = [threading.Thread(target=wait_for, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(redis_client.pubsub_channels("hybridlock:*")) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(redis_client.pubsub_channels("hybridlock:*")) == 40
    subscribers = [c for c in redis_client.client_list() if int(c.get("sub", 0)) > 0]
    assert len(subscribers) == 1
    for i in range(40):
        holder.obtain(f"k{i}").release()
    for thread in threads:
        thread.join(20)
    assert results == [True] * 40


def test_waiters_still_get_the_lock_when_the_subscription_is_killed(make_registry, redis_client):
    holder, waiting = make_registry(expire_after=30), make_registry(expire_after=30)
    lock = holder.obtain("killed")
    lock.acquire()
    got = []

    def wait() -> None:
        other = waiting.obtain("killed")
        got.append(other.acquire(timeout=15))
        other.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 5
    while not redis_client.pubsub_channels("hybridlock:*") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert redis_client.client_kill_filter(_type="pubsub") >= 1
    time.sleep(0.2)
    lock.release()
    waiter.join(20)
    assert got == [True]
    assert waiting.backend._subscriber.failures >= 1


def test_waiters_fall_back_to_backoff_when_subscribe_is_refused(own_server):
    admin = redis.Redis.from_url(own_server.url)
    admin.execute_command("ACL", "SETUSER", "default", "-subscribe", "-ssubscribe")
    with hybridlock.LockRegistry(own_server.url) as holder, hybridlock.LockRegistry(own_server.url) as waiting:
        lock = holder.obtain("refused")
        lock.acquire()
        got = []

        def wait() -> None:
            other = waiting.obtain("refused")
            got.append(other.acquire(timeout=10))
            got.append(time.monotonic())
            other.release()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.5)
        released = time.monotonic()
        lock.release()
        waiter.join(15)
        assert got[0] is True
        assert got[1] - released < 1.0  # backoff is capped well below a second
    admin.close()


def test_spin_lock_type_waits_without_subscribing(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry(lock_type="spin")
    lock = holder.obtain("spin")
    lock.acquire()
    got = []

    def wait() -> None:
        other = waiting.obtain("spin")
        got.append(other.acquire(timeout=10))
        other.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert redis_client.pubsub_channels("hybridlock:*") == []
    lock.release()
    waiter.join(15)
    assert got == [True]
