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
