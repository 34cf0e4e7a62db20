"""registry.obtain_many: all-or-nothing, deadlock-free multi-key locks."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

import hybridlock
from tests import _wake_workers

CTX = multiprocessing.get_context("spawn")


@pytest.fixture(params=["together", "in order"])
def path(request: pytest.FixtureRequest) -> str:
    """Run a test over both server paths: one atomic step, and key by key with rollback."""
    return str(request.param)


def _multi(registry: hybridlock.LockRegistry, keys: list[str], path: str) -> hybridlock.MultiLock:
    multi = registry.obtain_many(keys)
    multi._atomic = path == "together"
    return multi


def test_all_or_nothing_and_nothing_left_behind(any_registry_factory, path):
    mine, other = any_registry_factory(), any_registry_factory()
    blocker = other.obtain("b")
    assert blocker.acquire()
    multi = _multi(mine, ["a", "b", "c"], path)
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


def test_reversed_orders_never_deadlock_between_threads(any_registry_factory, path):
    first, second = any_registry_factory(), any_registry_factory()
    keys = ["x", "y", "z"]
    counters = dict.fromkeys(keys, 0)
    cycles = [0]
    failures: list[str] = []

    def loop(registry: hybridlock.LockRegistry, order: list[str]) -> None:
        multi = _multi(registry, order, path)
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


@pytest.mark.server
def test_keys_are_taken_together_in_one_round_trip(make_registry, redis_client):
    registry = make_registry()
    multi = registry.obtain_many(["p", "q", "r"])
    with multi:
        pass  # loads the script
    redis_client.config_resetstat()
    with multi:
        stats = redis_client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 1
        tokens = [lock.fencing_token for lock in multi.locks]
        assert all(token is not None for token in tokens)
    assert multi._atomic is True


@pytest.mark.server
def test_keys_in_different_cluster_slots_are_taken_in_order():
    from tests.test_contract import cluster_mode_server

    srv = cluster_mode_server()
    try:
        with hybridlock.LockRegistry(srv.url) as registry, hybridlock.LockRegistry(srv.url) as other:
            spread = registry.obtain_many(["a", "b"])  # different slots
            with spread:
                assert not other.obtain("a").acquire(blocking=False)
            assert spread._atomic is False
            # "R:{acct}1}" and "R:{acct}2}" both hash on "acct": one slot, so one atomic step.
            tagged = registry.obtain_many(["acct}1", "acct}2"])
            with tagged:
                assert not other.obtain("acct}2").acquire(blocking=False)
            assert tagged._atomic is True
    finally:
        srv.stop()
