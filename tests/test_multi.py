"""registry.obtain_many: all-or-nothing, deadlock-free multi-key locks."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

import hybridlock
from tests import _wake_workers

CTX = multiprocessing.get_context("spawn")


def test_all_or_nothing_and_nothing_left_behind(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    blocker = other.obtain("b")
    assert blocker.acquire()
    multi = mine.obtain_many(["a", "b", "c"])
    started = time.monotonic()
    assert not multi.acquire(timeout=0.3)
    assert 0.25 < time.monotonic() - started < 3  # the timeout covers the whole attempt
    assert not multi.try_lock()
    for key in ("a", "c"):
        assert not mine.obtain(key).is_held_by_current_thread()
        assert other.obtain(key).acquire(blocking=False), f"{key} was left behind"
        other.obtain(key).release()
    blocker.release()
    with multi:
        assert multi.is_held_by_current_thread()
        assert all(not other.obtain(k).acquire(blocking=False) for k in ("a", "b", "c"))
    assert not multi.is_held_by_current_thread()
    assert multi.keys == sorted(multi.keys)


def test_bad_input(any_registry_factory):
    registry = any_registry_factory()
    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.obtain_many("abc")
    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.obtain_many([])
    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.obtain_many(["a", ""])
    multi = registry.obtain_many(["a", "a", "b"])
    assert multi.keys == ["a", "b"]
    with pytest.raises(hybridlock.LockNotOwnedError):
        multi.release()


def test_reversed_orders_never_deadlock_between_threads(any_registry_factory):
    first, second = any_registry_factory(), any_registry_factory()
    keys = ["x", "y", "z"]
    counters = dict.fromkeys(keys, 0)
    cycles = [0]
    failures: list[str] = []

    def loop(registry: hybridlock.LockRegistry, order: list[str]) -> None:
        multi = registry.obtain_many(order)
        stop = time.monotonic() + 2.0
        while time.monotonic() < stop:
            if not multi.acquire(timeout=10):
                failures.append("timed out: deadlock?")
                return
            try:
                for key in keys:
                    value = counters[key]
                    time.sleep(0)
                    counters[key] = value + 1
                cycles[0] += 1
            finally:
                multi.release()

    threads = [
        threading.Thread(target=loop, args=(first, keys)),
        threading.Thread(target=loop, args=(second, list(reversed(keys)))),
        threading.Thread(target=loop, args=(first, ["z", "x", "y"])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert failures == []
    assert counters == dict.fromkeys(keys, cycles[0])
    assert cycles[0] > 10


@pytest.mark.server
def test_reversed_orders_never_deadlock_between_processes(server, redis_client):
    results = [CTX.Value("q", 0) for _ in range(2)]
    orders = [["acct-1", "acct-2", "acct-3"], ["acct-3", "acct-2", "acct-1"]]
    workers = [
        CTX.Process(target=_wake_workers.transfer_loop, args=(server.url, order, 3.0, result))
        for order, result in zip(orders, results, strict=True)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    done = [result.value for result in results]
    assert all(count > 0 for count in done), done  # -1 would mean an attempt timed out
    total = sum(done)
    for key in orders[0]:
        assert int(redis_client.get(f"acct:{key}")) == total
