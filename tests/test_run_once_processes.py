"""Run-once jobs across replica processes on a real server: N replicas firing the same occurrence at skewed times
run it once, and a replica killed mid-run lets the next occurrence run once its lease ends. (The bounds themselves,
over every backend and both sides: ``tests/_async/test_run_once.py``.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

import hybridlock
from tests import _run_once_workers

pytestmark = [pytest.mark.server, pytest.mark.timeout(90)]

CTX = multiprocessing.get_context("spawn")


def stop(process) -> None:
    if process.pid is not None and process.is_alive():
        process.kill()
    process.join(10)


@pytest.mark.parametrize("skew", [0.3, 0.0], ids=["skewed", "all-at-once"])
def test_replicas_firing_one_occurrence_at_skewed_times_run_it_once(server, redis_client, skew):
    # Replica i fires at start + i * skew: the last 0.9 s after the first, long after its 0.2 s run has ended, but
    # within at_least_for.
    replicas, at_least_for, prefix = 4, 2.0, f"skew{skew}"
    workers = [
        CTX.Process(
            target=_run_once_workers.fire_at,
            args=(server.url, "nightly:2026-11-26", i * skew, at_least_for, 5.0, prefix),
            daemon=True,
        )
        for i in range(replicas)
    ]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 30
        while redis_client.llen(f"{prefix}:ready") < replicas:
            assert time.monotonic() < deadline, "the replicas did not all start"
            time.sleep(0.02)
        redis_client.set(f"{prefix}:start", repr(time.time() + 0.2))
        for worker in workers:
            worker.join(30)
        assert not any(worker.is_alive() for worker in workers), "a replica hung"
    finally:
        for worker in workers:
            stop(worker)
    assert redis_client.lrange(f"{prefix}:errors", 0, -1) == []
    outcomes = sorted(outcome.decode() for outcome in redis_client.lrange(f"{prefix}:outcomes", 0, -1))
    assert int(redis_client.get(f"{prefix}:runs")) == 1, outcomes
    assert [outcome.split()[0] for outcome in outcomes] == ["ran"] + ["skipped"] * (replicas - 1), outcomes
    assert [worker.exitcode for worker in workers] == [0] * replicas
    # Each fired at its time (else the skew was not what the test says).
    assert max(float(outcome.split()[2]) for outcome in outcomes) < 0.1, outcomes


def test_a_replica_killed_mid_run_lets_the_next_occurrence_run_when_its_lease_ends(server, make_registry, redis_client):
    lease, prefix = 1.5, "killed"
    runner = CTX.Process(
        target=_run_once_workers.run_and_hang,
        args=(server.url, "hourly", lease, 0.5, 30.0, prefix),
        daemon=True,
    )
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while redis_client.get(f"{prefix}:started") is None:
            assert time.monotonic() < deadline, "the replica never started its run"
            time.sleep(0.02)
        registry: hybridlock.LockRegistry = make_registry(expire_after=lease)
        ran: list[str] = []
        # Running (renewed past its lease, which ends long before at_most_for): the others skip.
        time.sleep(lease)
        assert not registry.run_once("hourly", ran.append, "early", at_least_for=0.5)
        os.kill(runner.pid, signal.SIGKILL)
        runner.join(10)
        killed_at = time.monotonic()
        while not registry.run_once("hourly", ran.append, "next", at_least_for=0.5):
            assert time.monotonic() - killed_at < lease + 1.5, "the killed replica's lease did not end on time"
            time.sleep(0.02)
        waited = time.monotonic() - killed_at
        # Its renewer had set at least about two thirds of the lease before it died.
        assert waited >= 0.5, f"ran again {waited:.2f} s after the kill, before the dead replica's lease could end"
        assert ran == ["next"]
    finally:
        stop(runner)
