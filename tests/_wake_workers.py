"""Subprocess bodies for the wake-up and fencing tests (module-level so multiprocessing can import them)."""

from __future__ import annotations

import os
import signal
import time

import hybridlock


def hold_then_release(url: str, key: str, hold: float, ready, released_at) -> None:  # type: ignore[no-untyped-def]
    """Take ``key``, say so, hold it ``hold`` seconds, note the release time (system-wide monotonic clock)."""
    with hybridlock.LockRegistry(url, expire_after=10.0) as registry:
        lock = registry.obtain(key)
        lock.acquire()
        ready.set()
        time.sleep(hold)
        released_at.value = time.monotonic()
        lock.release()


def hold_and_die(url: str, key: str, expire_after: float, ready, token) -> None:  # type: ignore[no-untyped-def]
    """Take ``key`` with a short lease, report the token, then crash without releasing (SIGKILL to ourselves)."""
    registry = hybridlock.LockRegistry(url, expire_after=expire_after)
    lock = registry.obtain(key)
    lock.acquire()
    token.value = lock.fencing_token
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def transfer_loop(url: str, keys: list[str], seconds: float, result) -> None:  # type: ignore[no-untyped-def]
    """Move one unit between accounts ``keys`` under a multi-key lock, non-atomically, for ``seconds``."""
    import redis

    client = redis.Redis.from_url(url)
    done = 0
    with hybridlock.LockRegistry(url) as registry:
        multi = registry.obtain_many(keys)
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            if not multi.acquire(timeout=10):
                result.value = -1  # a deadlock would show up here
                return
            try:
                for key in keys:  # read-modify-write each account: only exclusion keeps the sums exact
                    value = int(client.get(f"acct:{key}") or 0)
                    client.set(f"acct:{key}", value + 1)
                done += 1
            finally:
                multi.release()
    client.close()
    result.value = done
