"""Semaphores across processes, on a real server: never more than N inside over processes x threads, and the
permit of a SIGKILLed holder comes back within its lease."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import hybridlock
from tests import _semaphore_workers
from tests.test_processes import stop_process

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

CTX = multiprocessing.get_context("spawn")


def test_never_more_than_n_inside_over_processes_and_threads(server, redis_client) -> None:
    permits, processes, threads, rounds = 3, 4, 3, 15
    ends = []
    children = []
    for _ in range(processes):
        parent_end, child_end = CTX.Pipe()
        child = CTX.Process(
            target=_semaphore_workers.count_inside,
            args=(server.url, "pool", permits, threads, rounds, child_end),
            daemon=True,
        )
        child.start()
        child_end.close()
        ends.append(parent_end)
        children.append(child)
    try:
        results = []
        for end in ends:
            assert end.poll(90), "a worker process did not finish"
            results.append(end.recv())
    finally:
        for child in children:
            stop_process(child)
    assert all(kind == "most" for kind, _ in results), results
    most = max(value for _, value in results)
    assert most <= permits, f"{most} holders inside a semaphore of {permits}"
    assert most >= 2, "the permits were never held together: the test did not test anything"
    assert int(redis_client.get("pool:inside")) == 0


def test_a_sigkilled_holders_permit_comes_back_within_its_lease(server) -> None:
    lease = 2.0
    parent_end, child_end = CTX.Pipe()
    holder = CTX.Process(
        target=_semaphore_workers.hold_permit, args=(server.url, "killed", lease, child_end), daemon=True
    )
    holder.start()
    child_end.close()
    try:
        assert parent_end.poll(30), "the holder process did not report"
        status, token = parent_end.recv()
        assert status == "held"
        with hybridlock.LockRegistry(server.url, expire_after=lease) as registry:
            semaphore = registry.obtain_semaphore("killed", 1)
            time.sleep(lease)  # renewed meanwhile: still held
            assert not semaphore.acquire(blocking=False)
            holder.kill()
            holder.join(10)
            killed = time.monotonic()
            assert semaphore.acquire(timeout=lease + 10), "a SIGKILLed holder's permit never came back"
            took = time.monotonic() - killed
            assert semaphore.fencing_token > token
            semaphore.release()
        # Within its lease (the last renewal came at most a third of it before the kill), plus room for a loaded
        # machine's wake-up.
        assert took <= lease + 1.0, took
    finally:
        stop_process(holder)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_holds_none_of_its_parents_permits(server) -> None:
    from tests.test_fork import Child

    with hybridlock.LockRegistry(server.url) as registry:
        semaphore = registry.obtain_semaphore("forked", 2)
        assert semaphore.acquire()

        def body(report, wait_for_parent) -> None:
            facts = {"held_before": semaphore.held_here, "client_id": registry.client_id}
            facts["took"] = semaphore.acquire(timeout=5)
            facts["second"] = semaphore.acquire(blocking=False)  # the parent's and ours: both permits are held
            semaphore.release()
            facts["held_after"] = semaphore.held_here
            report(facts)

        parent_id = registry.client_id
        child = Child(body)
        try:
            facts = child.next_report()
            assert child.wait() == 0
        finally:
            child.close()
        assert facts == {
            "held_before": 0,
            "client_id": facts["client_id"],
            "took": True,
            "second": False,
            "held_after": 0,
        }
        assert facts["client_id"] != parent_id
        assert semaphore.held_here == 1
        semaphore.release()
