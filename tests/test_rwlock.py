"""Read-write locks: shared readers, exclusive writers, writer preference, per-reader expiry, downgrade."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

import hybridlock
from tests import _wake_workers
from tests._stats import script_runs

CTX = multiprocessing.get_context("spawn")


# -- contract, on the memory backend and a real server -------------------------------------------------------------


def test_readers_share_and_writers_exclude(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    rw, rw_other = mine.obtain_read_write("cat"), other.obtain_read_write("cat")
    assert mine.obtain_read_write("cat") is rw
    with rw.read_lock():
        assert rw_other.read_lock().acquire(timeout=1)  # two owners read at once
        rw_other.read_lock().release()
        assert not rw_other.write_lock().acquire(timeout=0.2)
    with rw.write_lock():
        assert rw.write_lock().fencing_token is not None
        assert not rw_other.read_lock().acquire(timeout=0.2)
        assert not rw_other.write_lock().acquire(blocking=False)
    with rw_other.write_lock():
        pass


def test_both_halves_are_reentrant_per_thread(any_registry_factory):
    rw = any_registry_factory().obtain_read_write("r")
    read, write = rw.read_lock(), rw.write_lock()
    with read, read:
        assert read.hold_count == 2
        assert read.is_held_by_current_thread()
    assert read.hold_count == 0
    with write, write:
        assert write.hold_count == 2
    with pytest.raises(hybridlock.LockNotOwnedError):
        read.release()
    with pytest.raises(hybridlock.LockNotOwnedError):
        write.release()


def test_downgrade_works_and_upgrade_is_refused_at_once(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    rw = mine.obtain_read_write("d")
    write, read = rw.write_lock(), rw.read_lock()
    write.acquire()
    read.acquire()  # downgrade: take read while writing...
    write.release()  # ...then let go of write
    assert read.hold_count == 1
    assert other.obtain_read_write("d").read_lock().acquire(timeout=1)  # readers elsewhere may come in now
    other.obtain_read_write("d").read_lock().release()
    started = time.monotonic()
    with pytest.raises(hybridlock.LockUpgradeError) as info:
        write.acquire(timeout=10)
    assert time.monotonic() - started < 1  # at once, not after the timeout
    assert isinstance(info.value, RuntimeError)
    read.release()


def test_local_readers_overlap_and_a_local_writer_excludes_them(any_registry_factory):
    rw = any_registry_factory().obtain_read_write("local")
    inside, peak, violations = [0], [0], []
    guard = threading.Lock()

    def reader() -> None:
        for _ in range(20):
            with rw.read_lock():
                with guard:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(0.002)
                with guard:
                    inside[0] -= 1

    def writer() -> None:
        for _ in range(10):
            with rw.write_lock():
                with guard:
                    if inside[0]:
                        violations.append(inside[0])
                time.sleep(0.002)

    threads = [threading.Thread(target=reader) for _ in range(4)] + [threading.Thread(target=writer)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert violations == []
    assert peak[0] >= 2


def test_writer_is_not_starved_by_a_never_ending_reader_stream(any_registry_factory):
    readers_registry, writer_registry = any_registry_factory(), any_registry_factory()
    rw_readers = readers_registry.obtain_read_write("stream")
    rw_writer = writer_registry.obtain_read_write("stream")
    stop = threading.Event()

    def reader(offset: float) -> None:
        time.sleep(offset)
        while not stop.is_set():  # overlapping holds: at every moment some reader is inside
            with rw_readers.read_lock():
                time.sleep(0.03)

    readers = [threading.Thread(target=reader, args=(i * 0.01,)) for i in range(4)]
    local_writer_result = []
    try:
        for thread in readers:
            thread.start()
        time.sleep(0.2)
        started = time.monotonic()
        assert rw_writer.write_lock().acquire(timeout=10), "a writer of another owner starved"
        rw_writer.write_lock().release()
        assert time.monotonic() - started < 5

        # And a writer thread of the readers' own process:
        def local_writer() -> None:
            got = rw_readers.write_lock().acquire(timeout=10)
            local_writer_result.append(got)
            if got:
                rw_readers.write_lock().release()

        local = threading.Thread(target=local_writer)
        local.start()
        local.join(15)
    finally:
        stop.set()
        for thread in readers:
            thread.join(10)
    assert local_writer_result == [True]


# -- real servers ------------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_many_reader_threads_share_one_remote_hold(make_registry, redis_client):
    registry = make_registry()
    rw = registry.obtain_read_write("popular")
    all_in, leave = threading.Barrier(51), threading.Event()

    def reader() -> None:
        with rw.read_lock():
            all_in.wait(10)
            leave.wait(10)

    redis_client.config_resetstat()
    threads = [threading.Thread(target=reader) for _ in range(50)]
    for thread in threads:
        thread.start()
    all_in.wait(10)
    assert redis_client.zcard("hybridlock:{popular}:readers") == 1
    assert script_runs(redis_client) <= 2
    leave.set()
    for thread in threads:
        thread.join(10)
    assert redis_client.zcard("hybridlock:{popular}:readers") == 0


@pytest.mark.server
def test_readers_overlap_and_writers_exclude_across_processes(server, redis_client):
    results = [CTX.Value("q", 0) for _ in range(3)]
    workers = [
        CTX.Process(target=_wake_workers.rw_worker, args=(server.url, "mixed", 3.0, 8, result)) for result in results
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    cycles = [result.value for result in results]
    assert all(count > 0 for count in cycles), cycles  # -1: a reader saw a writer or a writer saw a reader
    assert int(redis_client.get("rw:max-readers")) >= 2  # readers of different processes were inside together
    writes = sum(count // 8 for count in cycles)
    assert int(redis_client.get("rw:data") or 0) >= writes - 3  # every write counted (the last ones may be cut)


@pytest.mark.server
def test_a_crashed_readers_hold_ends_with_its_own_lease(server, make_registry, redis_client):
    ready = CTX.Event()
    crasher = CTX.Process(target=_wake_workers.read_and_die, args=(server.url, "crash", ready))
    crasher.start()
    assert ready.wait(20)
    crasher.join(20)
    # A live reader keeps renewing its own hold for 2.5 s; the crashed one's must not ride along.
    live = make_registry(expire_after=1.0).obtain_read_write("crash")
    writer = make_registry().obtain_read_write("crash")
    release_at = []

    def hold_read() -> None:
        with live.read_lock():
            time.sleep(2.5)
            release_at.append(time.monotonic())

    holder = threading.Thread(target=hold_read)
    holder.start()
    time.sleep(0.1)
    assert writer.write_lock().acquire(timeout=10)
    got_at = time.monotonic()
    writer.write_lock().release()
    holder.join(10)
    assert got_at - release_at[0] < 0.5  # right after the live reader left, not a lease later


@pytest.mark.server
def test_every_read_write_script_stays_in_one_cluster_slot():
    from tests.test_contract import cluster_mode_server

    srv = cluster_mode_server()
    try:
        with hybridlock.LockRegistry(srv.url, expire_after=1.0) as mine, hybridlock.LockRegistry(srv.url) as other:
            rw, rw_other = mine.obtain_read_write("catalog"), other.obtain_read_write("catalog")
            with rw.read_lock():
                assert not rw_other.write_lock().acquire(timeout=0.2)  # queues as a waiting writer, then gives up
                time.sleep(0.5)  # a renewal of the read hold
            with rw.write_lock():
                rw.read_lock().acquire()  # downgrade
                time.sleep(0.5)  # a renewal of both holds
            rw.read_lock().release()
            assert not rw.read_lock().lost
            assert not rw.write_lock().lost
    finally:
        srv.stop()
