"""The per-key local mutex hands over in arrival order and never strands a hand-off."""

from __future__ import annotations

import threading
import time

import pytest

from hybridlock._local import FifoMutex


def test_waiters_get_the_mutex_in_arrival_order():
    mutex = FifoMutex()
    mutex.acquire()
    order: list[int] = []
    threads = []
    for i in range(8):
        thread = threading.Thread(target=lambda i=i: (mutex.acquire(), order.append(i), mutex.release()))
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while mutex.waiting < i + 1 and time.monotonic() < deadline:  # queue them one by one
            time.sleep(0.001)
    mutex.release()
    for thread in threads:
        thread.join(5)
    assert order == list(range(8))
    assert not mutex.locked()


def test_timeout_leaves_the_queue_and_later_waiters_still_get_it():
    mutex = FifoMutex()
    mutex.acquire()
    started = time.monotonic()
    assert not mutex.acquire(timeout=0.2)
    assert 0.15 < time.monotonic() - started < 2.0
    assert mutex.waiting == 0
    got = []
    thread = threading.Thread(target=lambda: got.append(mutex.acquire(timeout=5)))
    thread.start()
    time.sleep(0.05)
    mutex.release()
    thread.join(5)
    assert got == [True]


def test_non_blocking_and_release_of_unlocked():
    mutex = FifoMutex()
    assert mutex.acquire(False)
    assert not mutex.acquire(False)
    mutex.release()
    with pytest.raises(RuntimeError):
        mutex.release()


def test_exclusion_under_contention():
    mutex = FifoMutex()
    inside = [0]
    overlaps = [0]
    count = [0]

    def work() -> None:
        for _ in range(500):
            assert mutex.acquire(timeout=10)
            inside[0] += 1
            if inside[0] != 1:
                overlaps[0] += 1
            count[0] += 1
            inside[0] -= 1
            mutex.release()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert count[0] == 4000
    assert overlaps[0] == 0
