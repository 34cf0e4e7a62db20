"""Targets for the processes that ``test_cluster`` starts (importable by a spawned interpreter).

Every worker builds its own registry from the cluster URL, as an independent program would; the counters and the
overlap markers live in a separate plain server (``counter_url``), so checking them never goes through the cluster
under test.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import redis

import hybridlock


def count_under_cluster_locks(
    cluster_url: str, counter_url: str, keys: list[str], threads: int, iterations: int, seed: int
) -> None:
    """``threads`` threads each do ``iterations`` rounds; a round takes one key's lock (or, one round in four, two
    keys of different slots at once, key by key with rollback) and adds 1, non-atomically, to each key's counter.

    On entry a thread claims each key's marker with SET NX; if someone else is inside, the violation is recorded in
    the list ``violations``. Errors go to ``errors``. Exits with status 0 only if every thread finished cleanly."""
    client = redis.Redis.from_url(counter_url)
    failed = threading.Event()

    with hybridlock.LockRegistry(cluster_url, expire_after=10.0) as registry:

        def enter(key: str, me: str) -> None:
            if not client.set(f"marker:{key}", me, nx=True):
                client.rpush("violations", f"{me} entered {key} while {client.get(f'marker:{key}')!r} was inside")
                raise AssertionError("two holders inside the critical section at once")

        def leave(key: str, me: str) -> None:
            value = int(client.get(f"counter:{key}") or 0)
            time.sleep(0.0005)  # widen the window between the read and the write
            client.set(f"counter:{key}", value + 1)
            if client.get(f"marker:{key}") != me.encode():
                client.rpush("violations", f"{me} found the marker of {key} changed while inside")
                raise AssertionError("someone touched the marker while we were inside")
            client.delete(f"marker:{key}")

        def work(thread_no: int) -> None:
            me = f"{os.getpid()}/{thread_no}"
            rng = random.Random(seed * 1000 + thread_no)
            try:
                for round_no in range(iterations):
                    if round_no % 4 == 3:
                        chosen = rng.sample(keys, 2)
                        lock = registry.obtain_many(chosen)
                    else:
                        chosen = [rng.choice(keys)]
                        lock = registry.obtain(chosen[0])
                    if not lock.acquire(timeout=30):
                        raise AssertionError(f"{me} could not take {chosen} within 30 s")
                    try:
                        for key in chosen:
                            enter(key, me)
                        for key in chosen:
                            leave(key, me)
                    finally:
                        lock.release()
                    client.incrby("rounds", 1)
            except BaseException as exc:
                failed.set()
                client.rpush("errors", f"{me}: {type(exc).__name__}: {exc}")

        pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    client.close()
    sys.exit(1 if failed.is_set() else 0)
