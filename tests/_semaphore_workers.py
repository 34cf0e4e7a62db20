"""Process targets for tests/test_semaphore_processes.py (importable by a spawned child)."""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Connection

import redis

import hybridlock


def count_inside(url: str, key: str, permits: int, threads: int, rounds: int, conn: Connection) -> None:
    """``threads`` threads each take a permit ``rounds`` times and count themselves inside on the server (INCR on
    ``key:inside``); sends the most inside any of them saw, or the first error."""
    client = redis.Redis.from_url(url)
    most = 0
    errors: list[BaseException] = []
    guard = threading.Lock()
    with hybridlock.LockRegistry(url, expire_after=5.0) as registry:
        semaphore = registry.obtain_semaphore(key, permits)

        def work() -> None:
            nonlocal most
            try:
                for _ in range(rounds):
                    assert semaphore.acquire(timeout=60)
                    try:
                        inside = client.incr(f"{key}:inside")
                        with guard:
                            most = max(most, inside)
                        time.sleep(0.003)
                        client.decr(f"{key}:inside")
                    finally:
                        semaphore.release()
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    client.close()
    conn.send(("error", repr(errors[0])) if errors else ("most", most))


def hold_permit(url: str, key: str, expire_after: float, conn: Connection) -> None:
    """Take one permit of ``key`` (1 permit), report its fencing token, and hold it until killed."""
    registry = hybridlock.LockRegistry(url, expire_after=expire_after)
    semaphore = registry.obtain_semaphore(key, 1)
    assert semaphore.acquire(timeout=30)
    conn.send(("held", semaphore.fencing_token))
    while True:
        time.sleep(1)
