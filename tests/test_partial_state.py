"""Server state lost in part (eviction, an operator's DEL, a key of the wrong type): every script copes.

Any subset of a lock's keys may vanish at any moment (``maxmemory`` eviction picks keys one by one; an operator
deletes what looks stale). Whatever is left, other owners must go on taking the lock normally: no script error,
no owner stuck behind a place that cannot lapse, exclusion kept among those who still hold valid leases.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis

import hybridlock

pytestmark = pytest.mark.server

PLAIN_KEYS = ("lock", "fence", "queue", "queue_until")
RW_KEYS = ("writer", "readers", "writers_waiting", "fence")


def _subsets(names: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [c for r in range(1, len(names) + 1) for c in itertools.combinations(names, r)]


def _wait_queued(client: redis.Redis, queue: str, count: int) -> None:
    deadline = time.monotonic() + 5
    while client.zcard(queue) < count:
        assert time.monotonic() < deadline, "the waiter never queued"
        time.sleep(0.005)


def _check_exclusion(registries: list[hybridlock.LockRegistry], key: str, rounds: int = 5) -> None:
    """Every registry takes ``key`` ``rounds`` times from its own thread; nobody overlaps; all finish in time."""
    inside, overlaps, errors, done = [0], [0], [], []
    guard = threading.Lock()

    def run(registry: hybridlock.LockRegistry) -> None:
        lock = registry.obtain(key)
        try:
            for _ in range(rounds):
                assert lock.acquire(timeout=10), "not obtained within 10 s"
                with guard:
                    inside[0] += 1
                    overlaps[0] += inside[0] > 1
                time.sleep(0.002)
                with guard:
                    inside[0] -= 1
                lock.release()
            done.append(registry)
        except BaseException as exc:  # reported below, with the registry's thread gone
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(registry,)) for registry in registries]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert len(done) == len(registries)
    assert overlaps[0] == 0


@pytest.mark.parametrize("deleted", _subsets(PLAIN_KEYS), ids="+".join)
def test_other_owners_acquire_after_any_keys_of_a_held_and_awaited_lock_vanish(make_registry, redis_client, deleted):
    # A short lease: the crashed waiter's place below is kept for a short time after it.
    holder, waiter, newcomer = make_registry(expire_after=1), make_registry(), make_registry()
    names = holder._names("partial")
    lock = holder.obtain("partial")
    with lock:
        first_token = lock.fencing_token
    lock.acquire()
    # One waiter that crashed while queued (its place was taken, nobody renews it), and one that goes on waiting.
    assert not holder.backend.try_acquire(names, "crashed-waiter", 1000, queue=True).acquired
    order: list[str] = []

    def wait() -> None:
        taken = waiter.obtain("partial")
        if taken.acquire(timeout=15):
            order.append("waiter")
            taken.release()
        else:
            order.append("timeout")

    waiting = threading.Thread(target=wait)
    waiting.start()
    _wait_queued(redis_client, names.queue, 2)
    redis_client.delete(*(getattr(names, name) for name in deleted))
    started = time.monotonic()
    if "lock" in deleted:
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
    else:
        lock.release()
    waiting.join(15)
    assert order == ["waiter"]
    assert time.monotonic() - started < 5
    _check_exclusion([holder, waiter, newcomer], "partial")
    with newcomer.obtain("partial") as taken:
        assert taken.fencing_token > first_token


@pytest.mark.parametrize("broken", PLAIN_KEYS)
def test_a_key_of_the_wrong_type_is_treated_as_missing(make_registry, redis_client, broken):
    first, second = make_registry(), make_registry()
    names = first._names("typed")
    with first.obtain("typed"):
        pass
    name = getattr(names, broken)
    redis_client.delete(name)
    if broken in ("queue", "queue_until"):
        redis_client.set(name, "not a sorted set")
    else:
        redis_client.rpush(name, "not a string")
    _check_exclusion([first, second], "typed")


@pytest.mark.parametrize("deleted", _subsets(RW_KEYS), ids="+".join)
def test_read_write_locks_survive_any_keys_vanishing(make_registry, redis_client, deleted):
    # A short lease: a reader that waits for a writer whose key vanished (no release to wake it) waits that long.
    writer, reader, other = make_registry(expire_after=1), make_registry(), make_registry()
    names = writer.obtain_read_write("rw")._names
    write = writer.obtain_read_write("rw").write_lock()
    write.acquire()
    # A writer that crashed while waiting, and a reader that waits now.
    assert not writer.backend.try_acquire_write(names, "crashed-writer", 1000, wait=True).acquired
    got: list[str] = []

    def read() -> None:
        half = reader.obtain_read_write("rw").read_lock()
        if half.acquire(timeout=15):
            got.append("read")
            half.release()
        else:
            got.append("timeout")

    reading = threading.Thread(target=read)
    reading.start()
    time.sleep(0.1)
    redis_client.delete(*(getattr(names, name) for name in deleted))
    if "writer" in deleted:
        with pytest.raises(hybridlock.LockLostError):
            write.release()
    else:
        write.release()
    reading.join(15)
    assert got == ["read"]
    # Writers and readers of all three owners go on normally.
    for registry in (writer, reader, other):
        rw = registry.obtain_read_write("rw")
        assert rw.write_lock().acquire(timeout=5)
        rw.write_lock().release()
        assert rw.read_lock().acquire(timeout=5)
        rw.read_lock().release()


@pytest.mark.parametrize("broken", RW_KEYS)
def test_read_write_keys_of_the_wrong_type_are_treated_as_missing(make_registry, redis_client, broken):
    first, second = make_registry(), make_registry()
    names = first.obtain_read_write("rwtyped")._names
    name = getattr(names, broken)
    if broken in ("readers", "writers_waiting"):
        redis_client.set(name, "not a sorted set")
    else:
        redis_client.rpush(name, "not a string")
    for registry in (first, second, first):
        rw = registry.obtain_read_write("rwtyped")
        with rw.write_lock():
            pass
        with rw.read_lock():
            pass


def test_renewal_reports_a_lock_whose_key_changed_type_as_lost(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("renewed")
    lock.acquire()
    redis_client.delete("hybridlock:{renewed}")
    redis_client.rpush("hybridlock:{renewed}", "not a string")
    with pytest.raises(hybridlock.LockLostError):
        lock.renew()
    assert lock.lost
    with pytest.raises(hybridlock.LockLostError):
        lock.release()


def test_a_server_error_names_the_operation_the_key_and_the_server(make_registry, redis_client, server):
    registry = make_registry()
    lock = registry.obtain("refused")
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)  # every write is refused with OOM
    try:
        with pytest.raises(hybridlock.HybridLockError) as raised:
            lock.acquire(timeout=1)
    finally:
        redis_client.config_set("maxmemory", 0)
    error = raised.value
    assert not isinstance(error, redis.exceptions.RedisError)
    assert type(error) is hybridlock.HybridLockError
    assert error.key == "refused"
    assert error.server == registry.server
    assert "during acquire" in str(error)
    assert "key='refused'" in str(error)
    assert f"127.0.0.1:{server.port}" in str(error)
    assert not lock.is_held_by_current_thread()


@pytest.mark.parametrize("policy", ["allkeys-random", "allkeys-lru"])
def test_owners_go_on_while_the_server_evicts_keys_under_maxmemory(own_server, policy):
    """Eviction picks keys one at a time, a lock's included: whatever it leaves, nobody gets a script error and
    every owner keeps getting the lock (a holder whose lease key was evicted is told so by LockLostError)."""
    client = redis.Redis.from_url(own_server.url)
    registries = [hybridlock.LockRegistry(own_server.url, expire_after=2) for _ in range(3)]
    errors: list[BaseException] = []
    taken = [0, 0, 0]
    stop = threading.Event()
    try:
        client.config_set("maxmemory-policy", policy)
        client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 2_000_000)

        def fill() -> None:
            filler = redis.Redis.from_url(own_server.url)
            n = 0
            while not stop.is_set():
                filler.set(f"filler:{n}", b"x" * 20_000)  # each write makes the server evict something
                n += 1
            filler.close()

        def contend(index: int) -> None:
            lock = registries[index].obtain("evicted")
            try:
                while not stop.is_set():
                    assert lock.acquire(timeout=10), "not obtained within 10 s"
                    taken[index] += 1
                    time.sleep(0.001)
                    try:
                        lock.release()
                    except hybridlock.LockLostError:
                        pass  # its lease key was evicted: reported, as it must be
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=fill)] + [threading.Thread(target=contend, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(3)
        stop.set()
        for thread in threads:
            thread.join(30)
        assert client.info("stats")["evicted_keys"] > 0
        assert not errors, errors
        assert all(taken), taken
    finally:
        stop.set()
        for registry in registries:
            registry.close()
        client.close()
