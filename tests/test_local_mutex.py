"""The per-key local mutex hands over in arrival order and never strands a hand-off."""

from __future__ import annotations

import os
import threading
import time

import pytest

from hybridlock._sync._compat import FifoMutex


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


# -- pass_on() and the barge window ------------------------------------------------------------------------------------


def _queue_waiter(mutex: FifoMutex, entered: list[str], name: str, timeout: float = 10) -> threading.Thread:
    """Start a thread that waits for ``mutex``, records ``name`` once inside and releases with pass_on (so it never
    comes back); return once it is queued."""
    before = mutex.waiting

    def take() -> None:
        if mutex.acquire(timeout=timeout):
            entered.append(name)
            if not mutex.pass_on():
                mutex.release()

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while mutex.waiting <= before and time.monotonic() < deadline:
        time.sleep(0.001)
    assert mutex.waiting == before + 1
    return thread


def test_pass_on_with_nobody_waiting_keeps_the_mutex():
    for window in (0.0, 10.0):
        mutex = FifoMutex(window)
        mutex.acquire()
        assert not mutex.pass_on()
        assert mutex.locked()
        mutex.release()
        assert not mutex.locked()


def test_without_a_window_pass_on_hands_over_directly():
    mutex = FifoMutex(0.0)
    mutex.acquire()
    entered: list[str] = []
    for attempt in range(20):
        waiter = _queue_waiter(mutex, entered, f"w{attempt}")
        assert mutex.pass_on()
        # The mutex belongs to the waiter from this instant: the releasing thread cannot take it back.
        assert not mutex.acquire(False)
        waiter.join(5)
        assert mutex.acquire(timeout=5)
    assert entered == [f"w{attempt}" for attempt in range(20)]


def test_within_the_window_a_running_thread_may_go_first_and_the_waiter_still_gets_in():
    mutex = FifoMutex(10.0)
    mutex.acquire()
    entered: list[str] = []
    barged = 0
    for attempt in range(20):
        waiter = _queue_waiter(mutex, entered, f"w{attempt}")
        assert mutex.pass_on()
        if mutex.acquire(False):
            # We went ahead of the woken waiter; it must still be waiting, first in line, and get in after us.
            barged += 1
            assert f"w{attempt}" not in entered
            mutex.release()
        waiter.join(5)
        assert not waiter.is_alive()
        assert mutex.acquire(timeout=5)
    assert entered == [f"w{attempt}" for attempt in range(20)]
    # The waiter needs the GIL to run, and we hold it from pass_on() to acquire(): barging is the rule here.
    assert barged >= 1


def test_the_window_bounds_how_long_a_waiter_is_passed_over():
    mutex = FifoMutex(0.2)
    mutex.acquire()
    entered: list[str] = []
    waiter = _queue_waiter(mutex, entered, "waiter")
    started = time.monotonic()
    # Release and retake at once, then hold for a while. We keep the GIL from pass_on() to acquire(), so the woken
    # waiter only runs while we hold the mutex: without the bound it would never get in.
    while not entered and time.monotonic() - started < 5:
        if mutex.pass_on():
            assert mutex.acquire(timeout=5)
        time.sleep(0.002)
    assert entered == ["waiter"], "the waiter was passed over past the window"
    assert time.monotonic() - started < 5
    waiter.join(5)
    mutex.release()


def test_waiters_keep_arrival_order_under_barging():
    mutex = FifoMutex(10.0)
    mutex.acquire()
    entered: list[str] = []
    waiters = [_queue_waiter(mutex, entered, f"w{i}") for i in range(5)]
    # Barge a few times, holding a while each time so that the woken waiter runs, finds the mutex taken and queues
    # again (first in line); then leave for good: each waiter passes on to the next, and nobody comes back.
    for _ in range(7):
        assert mutex.pass_on()
        assert mutex.acquire(False)
        time.sleep(0.002)
    assert mutex.pass_on()
    for waiter in waiters:
        waiter.join(5)
    assert entered == [f"w{i}" for i in range(5)]
    assert not mutex.locked()
    assert mutex.waiting == 0


def test_a_waiter_passed_over_still_times_out_on_time():
    mutex = FifoMutex(30.0)
    mutex.acquire()
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(mutex.acquire(timeout=0.3)), daemon=True)
    waiter.start()
    deadline = time.monotonic() + 5
    while mutex.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    started = time.monotonic()
    while waiter.is_alive() and time.monotonic() - started < 5:
        if mutex.pass_on():
            assert mutex.acquire(timeout=5)
        time.sleep(0)  # let the waiter look now and then
    waiter.join(5)
    # Either it got in during a gap (True) or it gave up at its timeout; never a hang.
    assert len(results) == 1
    assert time.monotonic() - started < 3
    if not results[0]:
        assert mutex.waiting == 0
        assert mutex.locked()
        mutex.release()
    assert not mutex.locked()


@pytest.mark.parametrize(
    ("window", "pass_on"),
    [(0.0, False), (0.0, True), (0.001, True), (1.0, True)],
    ids=["release", "pass_on-strict", "pass_on-1ms", "pass_on-1s"],
)
def test_exclusion_under_contention(window, pass_on):
    mutex = FifoMutex(window)
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
            time.sleep(0)
            inside[0] -= 1
            if not (pass_on and mutex.pass_on()):
                mutex.release()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert count[0] == 4000
    assert overlaps[0] == 0
    assert not mutex.locked()
    assert mutex.waiting == 0


def test_an_interrupt_inside_acquire_never_leaves_the_mutex_locked():
    """KeyboardInterrupt can land at any bytecode boundary of the main thread, the guard's exit included."""
    import _thread
    import signal

    armed = [False]

    def interrupt(signum, frame):  # type: ignore[no-untyped-def]
        if armed[0]:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    stop = threading.Event()

    def pester() -> None:
        while not stop.is_set():
            _thread.interrupt_main()
            time.sleep(0.00001)

    mutex = FifoMutex()
    pesterer = threading.Thread(target=pester, daemon=True)
    interrupted = leaked = 0
    try:
        pesterer.start()
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                armed[0] = True
                mutex.acquire()
                armed[0] = False
            except KeyboardInterrupt as exc:
                armed[0] = False
                tb = exc.__traceback__
                inside = False
                while tb is not None:
                    inside = inside or tb.tb_frame.f_code.co_filename.endswith(os.path.join("_sync", "_compat.py"))
                    tb = tb.tb_next
                if inside:
                    interrupted += 1
                    if mutex.locked():
                        leaked += 1
                        mutex.release()
                elif mutex.locked():
                    mutex.release()  # interrupted after acquire() returned: ours to give back
                continue
            mutex.release()
    finally:
        armed[0] = False
        stop.set()
        pesterer.join(5)
        signal.signal(signal.SIGINT, previous)
    assert interrupted > 0, "no interruption landed inside acquire(); the test proved nothing"
    assert leaked == 0
