"""Targets for the replica processes that ``test_run_once_processes`` starts (importable by a spawned interpreter).

Each builds its own registry from the server URL, as an independent replica of a scheduled program would.
"""

from __future__ import annotations

import os
import time

import redis

import hybridlock


def fire_at(url: str, key: str, offset: float, at_least_for: float, expire_after: float, prefix: str) -> None:
    """Connect, report ready (``<prefix>:ready``), wait for the test to set the start time ``<prefix>:start``
    (``time.time()``), and fire the occurrence ``key`` ``offset`` seconds after it: ``run_once`` a job that counts
    its runs in ``<prefix>:runs`` and takes 0.2 s. Push ``ran``/``skipped``, the pid and how late after its time it
    fired to ``<prefix>:outcomes``, or the error to ``<prefix>:errors``."""
    client = redis.Redis.from_url(url)

    def job() -> int:
        client.incr(f"{prefix}:runs")
        time.sleep(0.2)
        return os.getpid()

    with hybridlock.LockRegistry(url, expire_after=expire_after) as registry:
        registry.obtain(key).locked()  # connect now: the replicas are to fire at their given times, not later
        client.rpush(f"{prefix}:ready", os.getpid())
        while (start := client.get(f"{prefix}:start")) is None:
            time.sleep(0.01)
        at = float(start) + offset
        time.sleep(max(0.0, at - time.time()))
        fired = time.time()
        try:
            result = registry.run_once(key, job, at_least_for=at_least_for)
        except Exception as exc:
            client.rpush(f"{prefix}:errors", f"{os.getpid()}: {type(exc).__name__}: {exc}")
            raise
        client.rpush(f"{prefix}:outcomes", f"{'ran' if result.ran else 'skipped'} {os.getpid()} {fired - at:.3f}")


def run_and_hang(url: str, key: str, expire_after: float, at_least_for: float, at_most_for: float, prefix: str) -> None:
    """``run_once`` a job that sets ``<prefix>:started`` and then runs for a minute (the test kills this process
    meanwhile)."""
    client = redis.Redis.from_url(url)

    def job() -> None:
        client.set(f"{prefix}:started", os.getpid())
        time.sleep(60)

    registry = hybridlock.LockRegistry(url, expire_after=expire_after)
    registry.run_once(key, job, at_least_for=at_least_for, at_most_for=at_most_for)
    os._exit(4)  # not meant to get here
