"""The server-side queue of waiting owners: first come, first served across owners; no herd; no stale places."""

from __future__ import annotations

import threading
import time

import pytest

import hybridlock
from tests._stats import script_runs


def _waiter(registry: hybridlock.LockRegistry, key: str, order: list[str], name: str, timeout: float = 15):
    def run() -> None:
        lock = registry.obtain(key)
        if lock.acquire(timeout=timeout):
            order.append(name)
            time.sleep(0.05)
            lock.release()
        else:
            order.append(f"{name} timed out")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _queue_length(registry: hybridlock.LockRegistry, key: str) -> int:
    backend = registry.backend
    names = registry._names(key)
    if isinstance(backend, hybridlock.backends.MemoryBackend):
        with backend._cond:
            return len(backend._queue(names, time.monotonic()))
    return int(backend.client.zcard(names.queue))


def test_owners_get_the_lock_in_arrival_order(any_registry_factory):
    holder = any_registry_factory()
    waiters = {name: any_registry_factory() for name in ("first", "second", "third")}
    lock = holder.obtain("fifo")
    lock.acquire()
    order: list[str] = []
    threads = []
    for count, (name, registry) in enumerate(waiters.items(), start=1):
        threads.append(_waiter(registry, "fifo", order, name))
        deadline = time.monotonic() + 5
        while _queue_length(holder, "fifo") < count and time.monotonic() < deadline:
            time.sleep(0.005)
    lock.release()
    # The holder comes back at once, but it is behind the queue now.
    assert lock.acquire(timeout=15)
    order.append("holder again")
    lock.release()
    for thread in threads:
        thread.join(20)
    assert order == ["first", "second", "third", "holder again"]


def test_a_free_lock_promised_to_the_queue_head_refuses_a_try_lock(any_registry_factory):
    holder, queued, newcomer = any_registry_factory(), any_registry_factory(), any_registry_factory()
    lock = holder.obtain("promised")
    lock.acquire()
    order: list[str] = []
    thread = _waiter(queued, "promised", order, "queued")
    deadline = time.monotonic() + 5
    while _queue_length(holder, "promised") < 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not newcomer.obtain("promised").acquire(blocking=False)  # does not jump the queue...
    assert _queue_length(holder, "promised") == 1  # ...and a non-blocking try does not join it
    lock.release()
    thread.join(20)
    assert order == ["queued"]


def test_a_waiter_that_gives_up_leaves_the_queue(any_registry_factory):
    holder, impatient, patient = any_registry_factory(), any_registry_factory(), any_registry_factory()
    lock = holder.obtain("patience")
    lock.acquire()
    order: list[str] = []
    first = _waiter(impatient, "patience", order, "impatient", timeout=0.3)
    time.sleep(0.1)
    second = _waiter(patient, "patience", order, "patient")
    first.join(10)
    assert order == ["impatient timed out"]
    time.sleep(0.1)
    released = time.monotonic()
    lock.release()
    second.join(10)
    assert order == ["impatient timed out", "patient"]
    assert time.monotonic() - released < 2.0  # not held up until the impatient one's place lapsed


@pytest.mark.server
def test_a_release_wakes_only_the_head_of_the_queue(make_registry, redis_client):
    holder = make_registry()
    waiters = [make_registry() for _ in range(4)]
    lock = holder.obtain("herd")
    lock.acquire()
    order: list[str] = []
    threads = []
    for i, registry in enumerate(waiters):
        threads.append(_waiter(registry, "herd", order, f"w{i}"))
        deadline = time.monotonic() + 5
        while _queue_length(holder, "herd") < i + 1 and time.monotonic() < deadline:
            time.sleep(0.005)
    time.sleep(0.2)
    redis_client.config_resetstat()
    lock.release()
    for thread in threads:
        thread.join(20)
    assert order == ["w0", "w1", "w2", "w3"]
    # Four releases (the holder's and three waiters') each wake one waiter: about one attempt per hand-over, where
    # waking everyone would cost 4 + 3 + 2 + 1 attempts.
    acquires_and_releases = script_runs(redis_client)
    assert acquires_and_releases <= 4 + 4 + 3, acquires_and_releases
