"""Safety across processes, on a real server: mutual exclusion, crashed and frozen holders, leases that run out."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

import hybridlock
from tests import _workers

pytestmark = pytest.mark.server

CTX = multiprocessing.get_context("spawn")


def stored_owners(client, key: str) -> list[str]:
    """The owners the server's lock keys for ``key`` name: every string key naming it whose value is no counter (a
    lock granted by a release holds "<owner>|<token>": its owner part)."""
    owners = []
    for name in client.scan_iter(match=f"*{key}*"):
        if client.type(name) != b"string":
            continue
        value = client.get(name)
        if value is not None and not value.isdigit():
            owners.append(value.decode().partition("|")[0])
    return owners


def stop_process(process) -> None:
    """Make sure a child is gone, whatever state the test left it in."""
    if process.pid is not None and process.is_alive():
        try:
            os.kill(process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        process.kill()
    process.join(10)


def start_holder(url: str, key: str, expire_after: float, auto_renew: bool = True):
    parent_end, child_end = CTX.Pipe()
    process = CTX.Process(
        target=_workers.hold_until_told, args=(url, key, expire_after, auto_renew, child_end), daemon=True
    )
    process.start()
    child_end.close()
    assert parent_end.poll(30), "the holder process did not report"
    status, client_id = parent_end.recv()
    assert status == "held", status
    return process, parent_end, client_id


@pytest.mark.slow(reason="4 processes x 4 threads cycle one lock")
@pytest.mark.parametrize(
    "registry_options",
    [{}, {"retain_for": 0.05}, {"handoff_limit": 0}],
    ids=["defaults", "lease-retention", "hand-off-off"],
)
def test_mutual_exclusion_across_4_processes_x_4_threads(server, redis_client, registry_options):
    processes, threads, iterations = 4, 4, 20
    prefix = "excl"
    workers = [
        CTX.Process(
            target=_workers.count_under_lock,
            args=(server.url, "shared", prefix, threads, iterations, 10.0),
            kwargs=registry_options,
            daemon=True,
        )
        for _ in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 90
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        assert not any(w.is_alive() for w in workers), "a worker process hung"
    finally:
        for worker in workers:
            stop_process(worker)
    violations = redis_client.lrange(f"{prefix}:violations", 0, -1)
    errors = redis_client.lrange(f"{prefix}:errors", 0, -1)
    assert violations == [], violations[:5]
    assert errors == [], errors[:5]
    assert [w.exitcode for w in workers] == [0] * processes
    total = processes * threads * iterations
    assert int(redis_client.get(f"{prefix}:done")) == total
    assert int(redis_client.get(f"{prefix}:counter")) == total, "a lost update: two holders at once"
    assert redis_client.get(f"{prefix}:marker") is None
    assert stored_owners(redis_client, "shared") == [], "a lock key was left behind"


def test_holder_killed_with_sigkill_frees_the_lock_within_its_lease(server, make_registry, redis_client):
    lease = 1.5
    process, conn, holder_id = start_holder(server.url, "crash", lease)
    try:
        assert stored_owners(redis_client, "crash") == [holder_id]
        lock = make_registry().obtain("crash")
        assert not lock.acquire(blocking=False)
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        killed_at = time.monotonic()
        assert lock.acquire(timeout=10), "the lock of a crashed holder was never freed"
        waited = time.monotonic() - killed_at
        try:
            assert waited <= lease + 1.5, f"took {waited:.2f}s, longer than the lease"
            # The lease was respected: the crashed holder's renewer had set at least ~2/3 of it.
            assert waited >= 0.5, f"acquired after {waited:.2f}s, before the crashed holder's lease could end"
            assert stored_owners(redis_client, "crash") == [lock.registry.client_id]
        finally:
            lock.release()
    finally:
        stop_process(process)
        conn.close()


@pytest.mark.parametrize("auto_renew", [False, True], ids=["no-renewal", "renewer-frozen-too"])
def test_holder_frozen_past_its_lease_loses_the_lock(server, make_registry, redis_client, auto_renew):
    lease = 1.0
    process, conn, holder_id = start_holder(server.url, "frozen", lease, auto_renew=auto_renew)
    other = make_registry()
    lock = other.obtain("frozen")
    try:
        os.kill(process.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert lock.acquire(timeout=10), "the frozen holder's lease never ended"
        assert time.monotonic() - stopped_at <= lease + 1.5
        assert stored_owners(redis_client, "frozen") == [other.client_id]

        os.kill(process.pid, signal.SIGCONT)
        time.sleep(0.3)  # let its renewer (if any) run first: it must not take the key back
        conn.send("release")
        assert conn.poll(15), "the resumed holder did not answer"
        name, message, key, hold_count, still_mine = conn.recv()
        assert name == "LockLostError", (name, message)
        assert key == "frozen"
        assert "frozen" in message
        assert hold_count == 0
        assert not still_mine, "the local lock must be released even when the lease was lost"
        # The new holder's key is untouched, and we still hold the lock.
        assert stored_owners(redis_client, "frozen") == [other.client_id]
        assert lock.is_held_by_current_thread()
        assert lock.locked()
        lock.release()  # clean: the key was still ours
        assert stored_owners(redis_client, "frozen") == []
        process.join(10)
        assert process.exitcode == 0
        assert holder_id != other.client_id
    finally:
        stop_process(process)
        conn.close()


def test_lease_that_runs_out_raises_lock_lost_at_release(make_registry, redis_client):
    slow = make_registry(expire_after=0.5, auto_renew=False)
    fast = make_registry()
    mine, theirs = slow.obtain("orders:42"), fast.obtain("orders:42")
    assert mine.acquire()
    assert not theirs.acquire(blocking=False)
    time.sleep(0.8)  # past the lease
    assert theirs.acquire(timeout=5), "the expired lease did not let another owner in"
    with pytest.raises(hybridlock.LockLostError) as excinfo:
        mine.release()
    err = excinfo.value
    assert isinstance(err, RuntimeError)
    assert isinstance(err, hybridlock.HybridLockError)
    assert err.key == "orders:42"
    assert "orders:42" in str(err)
    assert "changed" in str(err), "the message should warn that guarded data may have been changed"
    assert err.server == slow.server
    # The local lock is released all the same ...
    assert mine.hold_count == 0
    assert not mine.is_held_by_current_thread()
    with pytest.raises(hybridlock.LockNotOwnedError):
        mine.release()
    # ... and the new holder's key survives.
    assert stored_owners(redis_client, "orders:42") == [fast.client_id]
    assert theirs.locked()
    assert not mine.acquire(blocking=False), "the old holder got back in while the new one holds"
    theirs.release()
    assert mine.acquire(timeout=5), "the old holder's registry cannot lock again"
    mine.release()


def test_lease_that_runs_out_with_nobody_else_still_raises(make_registry, redis_client):
    registry = make_registry(expire_after=0.3, auto_renew=False)
    lock = registry.obtain("k")
    assert lock.acquire()
    assert lock.acquire()
    time.sleep(0.6)  # past the lease
    lock.release()  # a reentrant level: nothing is sent, nothing is noticed yet
    assert lock.hold_count == 1
    with pytest.raises(hybridlock.LockLostError):
        lock.release()
    assert lock.hold_count == 0
    assert stored_owners(redis_client, "k") == []
    # The lock works again afterwards, and a release in time is clean.
    assert lock.acquire(blocking=False)
    lock.release()
