"""Wake-ups: prompt hand-off across processes, lease-end wake-ups, what waiting costs in connections, broken
subscriptions and connections, spoofed announcements.

A plain lock's waiter is granted the lock and reads its grant with a blocking pop (see ``test_grants.py``); the
waiters that are woken and take the lock themselves (the write half of a read-write lock here; several keys at once)
listen on pub/sub, sharing one subscriber connection per registry."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
import uuid

import pytest
import redis

import hybridlock
from hybridlock._core.names import read_write_names
from tests import _wake_workers
from tests._stats import script_runs

pytestmark = pytest.mark.server

CTX = multiprocessing.get_context("spawn")


@pytest.mark.slow(reason="5 spawned holders, each holding the lock for 1 s")
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
        assert script_runs(redis_client) <= 8
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


def test_forty_plain_waiters_on_forty_keys_each_block_one_connection_and_subscribe_to_nothing(
    make_registry, redis_client
):
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

    def blocked() -> int:
        return sum(1 for c in redis_client.client_list() if c.get("cmd") == "blpop" and "b" in c.get("flags", ""))

    deadline = time.monotonic() + 10
    while blocked() < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert blocked() == 40
    assert redis_client.pubsub_channels("hybridlock:*") == []
    for i in range(40):
        holder.obtain(f"k{i}").release()
    for thread in threads:
        thread.join(20)
    assert results == [True] * 40


def _write_waiter(registry: hybridlock.LockRegistry, key: str, results: list[object], timeout: float = 15) -> None:
    lock = registry.obtain_read_write(key).write_lock()
    ok = lock.acquire(timeout=timeout)
    results.append(ok)
    results.append(time.monotonic())
    if ok:
        lock.release()


def test_forty_woken_waiters_on_forty_keys_share_one_subscriber_connection(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    for i in range(40):
        holder.obtain_read_write(f"k{i}").write_lock().acquire()
    results: list[object] = []
    threads = [threading.Thread(target=_write_waiter, args=(waiting, f"k{i}", results)) for i in range(40)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(redis_client.pubsub_channels("hybridlock:*")) < 40 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(redis_client.pubsub_channels("hybridlock:*")) == 40
    subscribers = [c for c in redis_client.client_list() if int(c.get("sub", 0)) > 0]
    assert len(subscribers) == 1
    for i in range(40):
        holder.obtain_read_write(f"k{i}").write_lock().release()
    for thread in threads:
        thread.join(20)
    assert results[::2] == [True] * 40


def test_waiters_still_get_the_lock_when_the_subscription_is_killed(make_registry, redis_client):
    holder, waiting = make_registry(expire_after=30), make_registry(expire_after=30)
    lock = holder.obtain_read_write("killed").write_lock()
    lock.acquire()
    got: list[object] = []
    waiter = threading.Thread(target=_write_waiter, args=(waiting, "killed", got))
    waiter.start()
    deadline = time.monotonic() + 5
    while not redis_client.pubsub_channels("hybridlock:*") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert redis_client.client_kill_filter(_type="pubsub") >= 1
    time.sleep(0.2)
    lock.release()
    waiter.join(20)
    assert got[:1] == [True]
    assert waiting.backend._subscriber.failures >= 1


def test_a_plain_waiter_still_gets_the_lock_when_its_blocked_connection_is_killed(make_registry, redis_client):
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
    killed = 0
    deadline = time.monotonic() + 5
    while killed < 3 and time.monotonic() < deadline:  # several times: the client's own retry reconnects once
        for client in redis_client.client_list():
            if client.get("cmd") == "blpop":
                killed += redis_client.client_kill_filter(_id=client["id"])
        time.sleep(0.05)
    assert killed >= 1
    lock.release()
    waiter.join(20)
    assert got == [True]


def test_woken_waiters_fall_back_to_backoff_when_subscribe_is_refused(own_server):
    admin = redis.Redis.from_url(own_server.url)
    admin.execute_command("ACL", "SETUSER", "default", "-subscribe", "-ssubscribe")
    with hybridlock.LockRegistry(own_server.url) as holder, hybridlock.LockRegistry(own_server.url) as waiting:
        lock = holder.obtain_read_write("refused").write_lock()
        lock.acquire()
        got: list[object] = []
        waiter = threading.Thread(target=_write_waiter, args=(waiting, "refused", got, 10))
        waiter.start()
        time.sleep(0.5)
        released = time.monotonic()
        lock.release()
        waiter.join(15)
        assert got[0] is True
        assert got[1] - released < 1.0  # backoff is capped well below a second
    admin.close()


def test_plain_waiters_poll_when_blpop_is_refused(own_server, caplog):
    admin = redis.Redis.from_url(own_server.url)
    admin.execute_command("ACL", "SETUSER", "default", "-blpop")
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
        assert got[1] - released < 1.0  # the lock was granted to the waiter, and its next poll took it over
    assert any("refused BLPOP" in record.getMessage() for record in caplog.records)
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


# -- spoofed announcements ---------------------------------------------------------------------------------------------


class _Waiter:
    """A thread of ``registry`` waiting for the write half of ``key``'s read-write lock (held elsewhere: a waiter
    that is woken, not granted) until it gets it or ``timeout`` ends."""

    def __init__(self, registry: hybridlock.LockRegistry, key: str, timeout: float = 30.0) -> None:
        self.lock = registry.obtain_read_write(key).write_lock()
        self.got = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self.thread.start()

    def _run(self, timeout: float) -> None:
        if self.lock.acquire(timeout=timeout):
            self.got.set()
            self.lock.release()


def _flood(client: redis.Redis, channel: str, messages: list[str]) -> None:
    for start in range(0, len(messages), 5000):
        pipe = client.pipeline(transaction=False)
        for message in messages[start : start + 5000]:
            pipe.publish(channel, message)
        pipe.execute()


def _listener_caught_up(registry: hybridlock.LockRegistry, client: redis.Redis, channel: str) -> None:
    # Messages on one channel arrive in order: once a "wanted" sent now is counted, everything before it was seen.
    subscriber = registry.backend._subscriber
    before = subscriber._wanted[channel]
    client.publish(channel, "wanted")
    deadline = time.monotonic() + 60
    while subscriber._wanted[channel] == before:
        assert time.monotonic() < deadline, "the listener never caught up with the flood"
        time.sleep(0.05)


@pytest.mark.slow(reason="publishes 200,000 spoofed messages and waits for the waiter to read them all")
def test_spoofed_announcements_to_strangers_do_not_grow_a_waiters_memory(make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    channel = read_write_names(holder.registry_key, "spoofed").channel
    with holder.obtain_read_write("spoofed").write_lock():
        waiter = _Waiter(waiting, "spoofed", timeout=100)  # the flood can take long on a loaded machine
        deadline = time.monotonic() + 10
        while channel not in waiting.backend._subscriber._subscribed:
            assert time.monotonic() < deadline, "the waiter never subscribed"
            time.sleep(0.01)
        _flood(redis_client, channel, [f"released:{uuid.uuid4()}" for _ in range(200_000)])
        _listener_caught_up(waiting, redis_client, channel)
        subscriber = waiting.backend._subscriber
        # Only the owner waiting here is counted, however many names were addressed.
        assert set(subscriber._addressed[channel]) == {waiting.client_id}
        assert len(subscriber._owner_refs) == 1
    assert waiter.got.wait(10), "the waiter did not get the lock after the flood"
    waiter.thread.join(10)


def test_a_flood_of_spoofed_wakeups_costs_no_more_round_trips_than_polling(server, make_registry, redis_client):
    holder, waiting = make_registry(), make_registry()
    attempts: list[float] = []
    try_acquire = waiting.backend.try_acquire_write

    def counted(*args, **kwargs):
        attempts.append(time.monotonic())
        return try_acquire(*args, **kwargs)

    waiting.backend.try_acquire_write = counted  # type: ignore[method-assign]
    channel = read_write_names(holder.registry_key, "flooded").channel
    with holder.obtain_read_write("flooded").write_lock():
        waiter = _Waiter(waiting, "flooded")
        time.sleep(0.3)  # subscribed and sleeping on the notification
        sent = CTX.Value("q", 0)
        flooder = CTX.Process(
            target=_wake_workers.flood, args=(server.url, channel, f"released:{waiting.client_id}", 2.0, sent)
        )
        flooder.start()
        flooder.join(30)
        # Counted from the first spoofed message the waiter acted on to the end of the flood.
        end = time.monotonic()
        during = [t for t in attempts if t <= end][1:]
        elapsed = end - during[0] if during else 1.0
    # Polling (lock_type="spin") backs off from 2 ms to 100 ms: some 30 attempts in 2 s. Without a bound, every
    # spoofed message that finds the waiter sleeping is a round trip.
    assert sent.value > 10_000, "the flood was too slow to test anything"
    rate = len(during) / elapsed
    assert rate < 50, f"{len(during)} acquire attempts in {elapsed:.1f} s under a flood of fake wake-ups"
    assert waiter.got.wait(5), "the waiter did not get the lock once it was released"
    waiter.thread.join(10)
