"""Targets for the processes that ``test_processes`` starts (importable by a spawned interpreter).

Every worker builds its own registry from the server URL, as an independent program would.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from multiprocessing.connection import Connection

import redis

import hybridlock


def count_under_lock(
    url: str, key: str, prefix: str, threads: int, iterations: int, expire_after: float, **registry_options: object
) -> None:
    """``threads`` threads each add 1 to ``<prefix>:counter`` ``iterations`` times, non-atomically, under the lock.

    On entry a thread claims ``<prefix>:marker`` with SET NX; if someone else is inside, that fails and the
    violation is recorded in the list ``<prefix>:violations``. Errors go to ``<prefix>:errors``. The process exits
    with status 0 only if every thread finished cleanly.
    """
    client = redis.Redis.from_url(url)
    counter, marker = f"{prefix}:counter", f"{prefix}:marker"
    violations, errors = f"{prefix}:violations", f"{prefix}:errors"
    failed = threading.Event()

    with hybridlock.LockRegistry(url, expire_after=expire_after, **registry_options) as registry:  # type: ignore[arg-type]
        lock = registry.obtain(key)

        def work(thread_no: int) -> None:
            me = f"{os.getpid()}/{thread_no}"
            try:
                for _ in range(iterations):
                    with lock:
                        if not client.set(marker, me, nx=True):
                            client.rpush(violations, f"{me} entered while {client.get(marker)!r} was inside")
                            raise AssertionError("two holders inside the critical section at once")
                        value = int(client.get(counter) or 0)
                        time.sleep(0.0005)  # widen the window between the read and the write
                        client.set(counter, value + 1)
                        still = client.get(marker)
                        if still != me.encode():
                            client.rpush(violations, f"{me} found the marker changed to {still!r} while inside")
                            raise AssertionError("someone touched the marker while we were inside")
                        client.delete(marker)
                    client.incr(f"{prefix}:done")
            except BaseException as exc:
                failed.set()
                client.rpush(errors, f"{me}: {type(exc).__name__}: {exc}")

        pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
    client.close()
    sys.exit(1 if failed.is_set() else 0)


def hold_until_told(url: str, key: str, expire_after: float, auto_renew: bool, conn: Connection) -> None:
    """Take the lock, report ``("held", client_id)``, then wait for any message and release.

    After releasing, reports ``("released", None)`` or the error as ``(class name, message, key, hold_count,
    is_held_by_current_thread)``."""
    registry = hybridlock.LockRegistry(url, expire_after=expire_after, auto_renew=auto_renew)
    lock = registry.obtain(key)
    if not lock.acquire(timeout=10):
        conn.send(("not acquired", None))
        return
    conn.send(("held", registry.client_id))
    if not conn.poll(60):  # the test is gone: let the lease end
        os._exit(3)
    conn.recv()
    try:
        lock.release()
    except hybridlock.HybridLockError as exc:
        conn.send((type(exc).__name__, str(exc), exc.key, lock.hold_count, lock.is_held_by_current_thread()))
    else:
        conn.send(("released", None))
    registry.close()


def wait_for_lock(url: str, key: str, expire_after: float, write: bool) -> None:
    """Wait (as long as it takes) for ``key``'s plain lock, or for its read-write lock's write half; the test kills
    this process while it waits."""
    registry = hybridlock.LockRegistry(url, expire_after=expire_after)
    lock = registry.obtain_read_write(key).write_lock() if write else registry.obtain(key)
    lock.acquire(timeout=120)
    os._exit(4)  # not meant to get here
