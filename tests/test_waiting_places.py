"""Places in the server queue: a live waiter keeps its place as long as it waits, a dead one loses it in seconds.

A refused waiter's place lapses ``QUEUE_PLACE_KEEP_MS`` (3 s) after it was last refreshed; the registry's wait
keeper refreshes the places of its live waits about every second (``hybridlock._wait_keeper``).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest

import hybridlock
from hybridlock._sync.wait_keeper import IDLE_LINGER, REFRESH_INTERVAL
from hybridlock.backends.base import QUEUE_PLACE_KEEP_MS
from tests import _workers

CTX = multiprocessing.get_context("spawn")


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _first_success(try_once, limit: float) -> float:
    """Seconds until ``try_once()`` first returns True, polling; fails past ``limit``."""
    start = time.monotonic()
    while not try_once():
        assert time.monotonic() - start < limit, f"still refused after {limit} s"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.server
@pytest.mark.parametrize("write", [False, True], ids=["plain", "writer"])
def test_a_waiter_killed_while_queued_does_not_keep_a_free_lock_from_others(server, make_registry, redis_client, write):
    holder, other = make_registry(expire_after=20), make_registry(expire_after=20)
    if write:
        held = holder.obtain_read_write("crashq").read_lock()  # a reader keeps the writer waiting
        place_key = "hybridlock:{crashq}:writers"
    else:
        held = holder.obtain("crashq")
        place_key = "hybridlock:{crashq}:queue"
    held.acquire()
    waiter = CTX.Process(target=_workers.wait_for_lock, args=(server.url, "crashq", 20.0, write))
    waiter.start()
    try:
        _wait_until(lambda: redis_client.zcard(place_key) == 1, 20, "the child to queue")
        time.sleep(1.5)  # long enough for its keeper to have refreshed its place at least once
    finally:
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.join(10)
    held.release()
    # With a writer: new readers are held back by a waiting writer only while its record lives.
    lock = other.obtain_read_write("crashq").read_lock() if write else other.obtain("crashq")

    def try_once() -> bool:
        if lock.acquire(blocking=False):
            lock.release()
            return True
        return False

    # Before: the dead waiter's place was kept for the holder's whole lease plus 2 s (about 21 s here).
    waited = _first_success(try_once, limit=8.0)
    assert waited < QUEUE_PLACE_KEEP_MS / 1000 + 1.5, waited


def _waiter(
    registry: hybridlock.LockRegistry, key: str, order: list[str], name: str, many: bool = False
) -> threading.Thread:
    def run() -> None:
        # A multi-key lock queues for whichever of its keys blocks it: here the contended one.
        lock = registry.obtain_many([key, f"{key}-spare"]) if many else registry.obtain(key)
        if lock.acquire(timeout=30):
            order.append(name)
            time.sleep(0.05)
            lock.release()
        else:
            order.append(f"{name} timed out")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _queued(registry: hybridlock.LockRegistry, key: str) -> int:
    backend = registry.backend
    names = registry._names(key)
    if isinstance(backend, hybridlock.backends.MemoryBackend):
        with backend._cond:
            return len(backend._queue(names, time.monotonic()))
    return int(backend.client.zcard(names.queue))


@pytest.mark.slow(reason="waits past twice the queue places' keep time")
@pytest.mark.parametrize("many", [False, True], ids=["plain", "multi"])
def test_a_live_waiter_keeps_its_place_past_the_keep_time(any_registry_factory, many):
    """Arrival order holds across owners even when the holder keeps everyone waiting twice the keep time."""
    holder = any_registry_factory(expire_after=20)
    first, second, late = any_registry_factory(), any_registry_factory(), any_registry_factory()
    lock = holder.obtain("patient")
    lock.acquire()
    order: list[str] = []
    threads = [_waiter(first, "patient", order, "first", many)]
    _wait_until(lambda: _queued(holder, "patient") == 1, 5, "first to queue")
    threads.append(_waiter(second, "patient", order, "second"))
    _wait_until(lambda: _queued(holder, "patient") == 2, 5, "second to queue")
    # Past the keep time: without the keeper both places have lapsed now, and the late one would go first.
    time.sleep(QUEUE_PLACE_KEEP_MS / 1000 + 1.0)
    threads.append(_waiter(late, "patient", order, "late"))
    _wait_until(lambda: _queued(holder, "patient") == 3, 5, "late to queue")
    time.sleep(2.0)
    lock.release()
    for thread in threads:
        thread.join(30)
    assert order == ["first", "second", "late"]
    # The keeper threads stop once their registry waits for nothing: at their next look (a refresh interval at
    # most), after their linger.
    _wait_until(
        lambda: not any(r._context.wait_keeper.running for r in (first, second, late)),
        REFRESH_INTERVAL + IDLE_LINGER + 0.5,
        "the keepers to stop",
    )


def test_a_live_waiting_writer_holds_back_new_readers_past_the_keep_time(any_registry_factory):
    reader, writer, newcomer = any_registry_factory(expire_after=20), any_registry_factory(), any_registry_factory()
    held = reader.obtain_read_write("shelf").read_lock()
    held.acquire()
    outcome: list[bool] = []

    def write() -> None:
        half = writer.obtain_read_write("shelf").write_lock()
        outcome.append(half.acquire(timeout=30))
        if outcome[-1]:
            half.release()

    thread = threading.Thread(target=write)
    thread.start()
    _wait_until(lambda: writer._context.wait_keeper.running, 5, "the writer to wait")
    time.sleep(QUEUE_PLACE_KEEP_MS / 1000 + 1.0)
    try:
        # Without the keeper the writer's record would have lapsed by now, and a new reader would get in first.
        assert not newcomer.obtain_read_write("shelf").read_lock().acquire(blocking=False)
    finally:
        held.release()
        thread.join(30)
    assert outcome == [True]


def test_the_keeper_runs_only_while_a_wait_is_in_progress(any_registry_factory):
    holder, waiter = any_registry_factory(), any_registry_factory()
    lock = holder.obtain("keeper")
    with lock:
        pass
    assert not holder._context.wait_keeper.running  # an uncontended acquire waits for nothing
    lock.acquire()
    outcome: list[bool] = []
    thread = threading.Thread(target=lambda: outcome.append(waiter.obtain("keeper").acquire(timeout=0.5)))
    thread.start()
    _wait_until(lambda: waiter._context.wait_keeper.running, 5, "the keeper to start")
    thread.join(10)
    assert outcome == [False]
    _wait_until(
        lambda: not waiter._context.wait_keeper.running,
        REFRESH_INTERVAL + IDLE_LINGER + 0.5,
        "the keeper to stop after the wait timed out",
    )
    lock.release()


def test_keep_waiting_keeps_only_places_still_held(any_registry_factory):
    holder, waiter = any_registry_factory(), any_registry_factory()
    backend, names = holder.backend, holder._names("places")
    rw_names = holder.obtain_read_write("places")._names
    holder.obtain("places").acquire()
    holder.obtain_read_write("places").read_lock().acquire()
    owner = waiter.client_id
    assert backend.keep_waiting([], owner) == []
    assert backend.keep_waiting([names, rw_names.write], owner) == [False, False]  # not queued
    assert not backend.try_acquire(names, owner, 1000, queue=True).acquired
    assert not backend.try_acquire_write(rw_names, owner, 1000, wait=True).acquired
    assert backend.keep_waiting([names, rw_names.write], owner) == [True, True]
    assert backend.keep_waiting([names], "somebody else") == [False]
    backend.cancel_wait(names, owner)
    backend.cancel_write_wait(rw_names, owner)
    assert backend.keep_waiting([names, rw_names.write], owner) == [False, False]  # not brought back
    holder.obtain("places").release()
    holder.obtain_read_write("places").read_lock().release()
