"""Targets for the processes ``test_quorum_processes`` starts (importable by a spawned interpreter)."""

from __future__ import annotations

import os
import sys
import threading
import time

import redis

import hybridlock


def count_under_quorum_lock(urls: list[str], data_url: str, prefix: str, threads: int, iterations: int) -> None:
    """``threads`` threads each add 1 to ``<prefix>:counter`` (kept in the server at ``data_url``, read then
    written) ``iterations`` times under one quorum lock, claiming ``<prefix>:marker`` with SET NX on entry (an
    overlap is recorded in ``<prefix>:violations``) and appending each tenancy's fencing token to
    ``<prefix>:tokens`` in the order the critical sections ran. Exits 0 only if every thread finished cleanly."""
    data = redis.Redis.from_url(data_url)
    counter, marker, tokens = f"{prefix}:counter", f"{prefix}:marker", f"{prefix}:tokens"
    failed = threading.Event()
    with hybridlock.QuorumLockRegistry(urls, expire_after=5) as registry:
        lock = registry.obtain("counted")

        def work(thread_no: int) -> None:
            me = f"{os.getpid()}/{thread_no}"
            try:
                for _ in range(iterations):
                    with lock:
                        if not data.set(marker, me, nx=True):
                            data.rpush(f"{prefix}:violations", f"{me} entered while {data.get(marker)!r} was inside")
                        data.rpush(tokens, lock.fencing_token or 0)
                        value = int(data.get(counter) or 0)
                        time.sleep(0.0005)
                        data.set(counter, value + 1)
                        if data.get(marker) != me.encode():
                            data.rpush(f"{prefix}:violations", f"{me} found the marker changed")
                        data.delete(marker)
            except BaseException as exc:
                failed.set()
                data.rpush(f"{prefix}:errors", f"{me}: {type(exc).__name__}: {exc}")

        pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    data.close()
    sys.exit(1 if failed.is_set() else 0)
