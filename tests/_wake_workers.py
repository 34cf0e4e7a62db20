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


def rw_worker(url: str, key: str, seconds: float, write_every: int, result) -> None:  # type: ignore[no-untyped-def]
    """Mix reads and writes on a read-write lock; record overlaps and violations in Redis.

    Readers INCR ``rw:readers`` on entry and DECR on exit and remember the highest count they saw; a writer
    SET NX ``rw:writer`` on entry and checks that no reader is inside. ``result`` gets the cycle count, or -1 on a
    violation."""
    import redis

    client = redis.Redis.from_url(url)
    with hybridlock.LockRegistry(url) as registry:
        rw = registry.obtain_read_write(key)
        cycles = 0
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            if cycles % write_every == write_every - 1:
                with rw.write_lock():
                    if not client.set("rw:writer", "1", nx=True) or int(client.get("rw:readers") or 0) != 0:
                        result.value = -1
                        return
                    value = int(client.get("rw:data") or 0)
                    time.sleep(0.002)
                    client.set("rw:data", value + 1)
                    client.delete("rw:writer")
            else:
                with rw.read_lock():
                    inside = client.incr("rw:readers")
                    if client.exists("rw:writer"):
                        result.value = -1
                        return
                    client.eval(
                        "if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then "
                        "redis.call('SET', KEYS[1], ARGV[1]) end",
                        1,
                        "rw:max-readers",
                        inside,
                    )
                    time.sleep(0.01)
                    client.decr("rw:readers")
            cycles += 1
    client.close()
    result.value = cycles


def read_and_die(url: str, key: str, ready) -> None:  # type: ignore[no-untyped-def]
    """Take the read lock with a 1 s lease, then crash without releasing."""
    registry = hybridlock.LockRegistry(url, expire_after=1.0)
    registry.obtain_read_write(key).read_lock().acquire()
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def flood(url: str, channel: str, message: str, seconds: float, sent) -> None:  # type: ignore[no-untyped-def]
    """Publish ``message`` on ``channel`` as fast as pipelines allow for ``seconds``; count them in ``sent``."""
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + seconds
    count = 0
    while time.monotonic() < deadline:
        pipe = client.pipeline(transaction=False)
        for _ in range(500):
            pipe.publish(channel, message)
        pipe.execute()
        count += 500
    sent.value = count
    client.close()


def wait_for_lock(url: str, key: str, ready) -> None:  # type: ignore[no-untyped-def]
    """Wait for ``key`` (held by the test), saying so just before; the test kills us while we wait."""
    registry = hybridlock.LockRegistry(url, expire_after=30.0)
    lock = registry.obtain(key)
    ready.set()
    lock.acquire(timeout=60)
    time.sleep(60)
