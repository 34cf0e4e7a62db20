"""The lock contract, run over every backend: in memory, and a real Redis/Valkey server.

Registries made by one ``any_registry_factory`` share one store, so two of them are two owners of the same keys,
as two processes are. Every concurrency test uses real threads, checks an invariant, and bounds its run time.
``tests/_async/test_lock_contract.py`` (and its generated ``tests/_sync`` twin) runs the behaviours every lock kind
shares over every kind and every backend, for both APIs.
"""

from __future__ import annotations

import gc
import math
import threading
import time
import weakref
from collections.abc import Callable

import pytest
import redis

import hybridlock
from hybridlock.testing.server import EmbeddedServer
from tests._stats import script_runs

# The fixture's params, with the server mark on the Redis case so ``-m "not server"`` still runs the memory case.
over_backends = pytest.mark.parametrize(
    "any_registry_factory",
    [pytest.param("memory", id="memory"), pytest.param("redis", id="redis", marks=pytest.mark.server)],
    indirect=True,
)

JOIN_TIMEOUT = 15.0


def run_threads(targets: list[Callable[[], object]], timeout: float = JOIN_TIMEOUT) -> None:
    """Run each target in its own thread; fail if any raises or is still running after ``timeout`` seconds."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported to the test below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"threads still running after {timeout}s: a hang"
    if errors:
        raise errors[0]


class Holder:
    """Holds a lock in a thread of its own until told to release it (``with Holder(lock): ...``)."""

    def __init__(self, lock: hybridlock.HybridLock, depth: int = 1) -> None:
        self.lock = lock
        self.depth = depth
        self.held = threading.Event()
        self.go = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for _ in range(self.depth):
                assert self.lock.acquire(timeout=10)
            self.held.set()
            self.go.wait(JOIN_TIMEOUT)
            for _ in range(self.depth):
                self.lock.release()
        except BaseException as exc:
            self.error = exc
            self.held.set()

    def __enter__(self) -> Holder:
        self.thread.start()
        assert self.held.wait(10), "the holder thread never got the lock"
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.go.set()
        self.thread.join(JOIN_TIMEOUT)
        assert not self.thread.is_alive(), "the holder thread hung while releasing"
        if self.error is not None:
            raise self.error


# -- identity ----------------------------------------------------------------------------------------------------------


@over_backends
def test_obtain_returns_the_same_object_per_key(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("orders:42")
    assert registry.obtain("orders:42") is lock
    assert registry.obtain("orders:43") is not lock
    assert lock.key == "orders:42"
    # Another registry is another owner: its own object.
    assert any_registry_factory().obtain("orders:42") is not lock


@over_backends
def test_obtain_from_many_threads_at_once_returns_one_object(any_registry_factory):
    registry = any_registry_factory()
    barrier = threading.Barrier(8)
    seen: list[hybridlock.HybridLock] = []

    def grab() -> None:
        barrier.wait(5)
        for i in range(50):
            seen.append(registry.obtain(f"race:{i}"))

    run_threads([grab] * 8)
    by_key: dict[str, set[int]] = {}
    for lock in seen:
        by_key.setdefault(lock.key, set()).add(id(lock))
    assert len(by_key) == 50
    assert all(len(ids) == 1 for ids in by_key.values()), "two lock objects for one key"


@over_backends
def test_weak_references_work(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    ref = weakref.ref(lock)
    assert ref() is lock
    proxy = weakref.proxy(lock)
    assert proxy.acquire(timeout=5)
    assert lock.is_held_by_current_thread()
    proxy.release()
    assert not lock.is_held_by_current_thread()
    holder: weakref.WeakValueDictionary[str, hybridlock.HybridLock] = weakref.WeakValueDictionary()
    holder["k"] = lock
    assert holder["k"] is lock


@over_backends
def test_repr_shows_the_state(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("orders:42")
    free = repr(lock)
    assert "orders:42" in free
    assert "unlocked" in free
    with lock, lock:
        held = repr(lock)
        assert "orders:42" in held
        assert "unlocked" not in held
        assert "locked" in held
        assert "2" in held, "the repr should show the reentrancy depth"
    assert "unlocked" in repr(lock)


# -- reentrancy --------------------------------------------------------------------------------------------------------


@over_backends
def test_reentrancy_counts_per_thread(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    assert lock.hold_count == 0
    assert not lock.is_held_by_current_thread()
    seen_elsewhere: list[tuple[int, bool, bool]] = []

    def look() -> None:
        seen_elsewhere.append((lock.hold_count, lock.is_held_by_current_thread(), lock.acquire(blocking=False)))

    for depth in range(1, 6):
        assert lock.acquire()
        assert lock.hold_count == depth
        assert lock.is_held_by_current_thread()
    run_threads([look])
    assert seen_elsewhere == [(0, False, False)]
    with lock:
        assert lock.hold_count == 6
    for depth in range(4, -1, -1):
        lock.release()
        assert lock.hold_count == depth
        assert lock.is_held_by_current_thread() == (depth > 0)
        assert lock.locked() == (depth > 0)
    with pytest.raises(hybridlock.LockNotOwnedError):
        lock.release()


@over_backends
def test_reentrant_hold_keeps_other_owners_out_until_the_last_release(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    lock, theirs = mine.obtain("k"), other.obtain("k")
    lock.acquire()
    lock.acquire()
    lock.acquire()
    lock.release()
    lock.release()
    assert not theirs.acquire(blocking=False), "released one level too early"
    lock.release()
    assert theirs.acquire(timeout=5)
    theirs.release()


def command_calls(client) -> dict[str, int]:
    """Calls per command the server has run so far, minus the INFO calls that read them."""
    stats = client.info("commandstats")
    return {name: value["calls"] for name, value in stats.items() if name != "cmdstat_info"}


@pytest.mark.server
def test_reentrant_acquire_and_release_send_nothing_to_redis(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("k")
    before_first = command_calls(redis_client)
    assert lock.acquire()
    after_first = command_calls(redis_client)
    assert after_first != before_first, "the first acquire must reach the server (is the counting working?)"
    for _ in range(10):
        assert lock.acquire()
        assert lock.acquire(timeout=1)
        assert lock.acquire(blocking=False)
        assert lock.try_lock(0.5)
        with lock:
            assert lock.hold_count == 6
            assert lock.locked()
            assert lock.is_held_by_current_thread()
        for _ in range(4):
            lock.release()
    assert lock.hold_count == 1
    assert command_calls(redis_client) == after_first, "a reentrant acquire or release talked to the server"
    lock.release()
    assert command_calls(redis_client) != after_first, "the final release must reach the server"


# What the acquire and release scripts may run inside the server (counted by INFO commandstats too).
SCRIPT_INTERNAL = {
    "get", "set", "exists", "time", "incr", "pexpire", "pttl", "del", "publish", "spublish", "sadd", "srem", "scard",
    "zadd", "zrem", "zrange", "zrangebyscore", "zcard", "zscore", "type",
}  # fmt: skip


@pytest.mark.server
def test_uncontended_acquire_and_release_take_one_round_trip_each(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("k")
    with lock:  # the first use may load the scripts (NOSCRIPT, then EVAL)
        pass
    before = command_calls(redis_client)
    for _ in range(20):
        assert lock.acquire()
        lock.release()
    after = command_calls(redis_client)
    changed = {name for name in after if after[name] != before.get(name, 0)}
    script_runs = sum(after.get(n, 0) - before.get(n, 0) for n in ("cmdstat_evalsha", "cmdstat_eval"))
    assert script_runs == 40, f"{script_runs} script calls for 20 acquire/release pairs"
    others = {name.removeprefix("cmdstat_") for name in changed} - {"evalsha", "eval"} - SCRIPT_INTERNAL
    assert not others, f"commands besides the scripts: {others}"
    # With nobody queued, the scripts skip the queue's work: the acquire runs TIME, EXISTS, SET NX and one
    # SET ... GET for the token; the release GET, DEL and EXISTS, and announces nothing (9 with the two script calls).
    inner = sum(after[n] - before.get(n, 0) for n in changed) - script_runs
    assert inner <= 20 * 7, f"{inner / 20:.1f} server commands inside the scripts per uncontended cycle"
    assert "cmdstat_publish" not in changed, "a release with nobody queued announced it"


@pytest.mark.server
def test_threads_waiting_on_the_local_lock_send_nothing_to_redis(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("k")
    results: list[bool] = []
    started = threading.Barrier(5)

    def wait_for_it() -> None:
        started.wait(5)
        got = lock.acquire(timeout=10)
        results.append(got)
        if got:
            lock.release()

    with Holder(lock):
        quiet_from = command_calls(redis_client)
        threads = [threading.Thread(target=wait_for_it, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        started.wait(5)
        time.sleep(0.5)  # the four threads wait all this time
        assert command_calls(redis_client) == quiet_from, "threads waiting locally talked to the server"
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    assert results == [True] * 4


# -- release by a non-owner --------------------------------------------------------------------------------------------


@over_backends
def test_release_by_a_thread_that_does_not_hold_raises(any_registry_factory):
    registry, other = any_registry_factory(), any_registry_factory()
    lock = registry.obtain("k")
    with Holder(lock) as holder:
        with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
            lock.release()
        err = excinfo.value
        assert isinstance(err, RuntimeError)
        assert isinstance(err, hybridlock.HybridLockError)
        assert err.key == "k"
        with pytest.raises(RuntimeError):
            lock.unlock()
        # The failed release changed nothing: the holder still holds, everywhere.
        assert lock.locked()
        assert not other.obtain("k").acquire(blocking=False)
        assert holder.thread.is_alive()
    assert other.obtain("k").acquire(timeout=5)
    other.obtain("k").release()


@over_backends
def test_release_of_another_registrys_lock_raises(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    lock = mine.obtain("k")
    with lock:
        with pytest.raises(hybridlock.LockNotOwnedError):
            other.obtain("k").release()
        assert lock.is_held_by_current_thread()
        assert not other.obtain("k").acquire(blocking=False)


# -- Java-style API ----------------------------------------------------------------------------------------------------


@over_backends
def test_lock_unlock_and_try_lock_aliases(any_registry_factory):
    registry, other = any_registry_factory(), any_registry_factory()
    lock = registry.obtain("k")
    assert lock.lock() is None
    assert lock.is_held_by_current_thread()
    lock.unlock()
    assert not lock.locked()

    assert lock.try_lock() is True
    assert lock.tryLock() is True  # reentrant
    assert lock.hold_count == 2
    lock.unlock()
    lock.unlock()

    theirs = other.obtain("k")
    with Holder(theirs):
        start = time.monotonic()
        assert lock.try_lock() is False
        assert lock.try_lock(None) is False
        assert lock.tryLock(0) is False
        assert time.monotonic() - start < 1.0, "try_lock() without a timeout must not wait"
        start = time.monotonic()
        assert lock.tryLock(0.3) is False
        assert 0.25 <= time.monotonic() - start <= 2.0
    assert lock.tryLock(5) is True
    lock.unlock()


@over_backends
def test_with_statement_returns_the_lock_and_releases_on_error(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    inside: list[bool] = []

    def use() -> None:
        with lock as entered:
            inside.append(entered is lock and lock.is_held_by_current_thread())
            raise KeyError("boom")

    with pytest.raises(KeyError):
        use()
    assert inside == [True]
    assert not lock.locked()


# -- exclusion between owners ------------------------------------------------------------------------------------------


@over_backends
def test_locked_reports_holders_in_this_process_and_elsewhere(any_registry_factory):
    mine, other = any_registry_factory(), any_registry_factory()
    lock, theirs = mine.obtain("k"), other.obtain("k")
    assert not lock.locked()
    with theirs:
        assert lock.locked(), "locked() must see a holder in another registry"
        assert not lock.is_held_by_current_thread()
        assert lock.hold_count == 0
    assert not lock.locked()
    with Holder(lock):
        assert lock.locked(), "locked() must see a holder in another thread"
        assert theirs.locked()
    assert not lock.locked()
    assert not theirs.locked()


@over_backends
def test_two_registries_in_one_process_exclude_each_other(any_registry_factory):
    first, second = any_registry_factory(), any_registry_factory()
    assert first.client_id != second.client_id
    assert first.registry_key == second.registry_key
    a, b = first.obtain("k"), second.obtain("k")
    got_it = threading.Event()
    outcome: list[bool] = []

    def wait_in_second() -> None:
        ok = b.acquire(timeout=10)
        outcome.append(ok)
        got_it.set()
        if ok:
            time.sleep(0.05)
            b.release()

    assert a.acquire()
    assert not b.acquire(blocking=False)
    waiter = threading.Thread(target=wait_in_second, daemon=True)
    waiter.start()
    assert not got_it.wait(0.5), "the second registry got the lock while the first held it"
    released_at = time.monotonic()
    a.release()
    assert got_it.wait(10), "the second registry never got the lock after the first released it"
    assert time.monotonic() - released_at < 5.0
    waiter.join(JOIN_TIMEOUT)
    assert outcome == [True]


@over_backends
def test_mutual_exclusion_across_threads_and_registries(any_registry_factory):
    registries = [any_registry_factory(), any_registry_factory()]
    locks = [r.obtain("counter") for r in registries]
    state = {"count": 0, "inside": 0, "max_inside": 0}
    per_thread = 40

    def work(lock: hybridlock.HybridLock) -> None:
        for _ in range(per_thread):
            with lock:
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["count"]
                time.sleep(0.0002)  # invite a race
                state["count"] = value + 1
                state["inside"] -= 1

    targets = [lambda lock=lock: work(lock) for lock in locks for _ in range(4)]
    run_threads(targets, timeout=60)
    assert state["max_inside"] == 1
    assert state["count"] == 8 * per_thread


@over_backends
def test_registry_keys_never_collide(any_registry_factory):
    # Pairs of (registry_key, key) that would share a server key under a naive "R:key" layout.
    pairs = [
        (("a", "b:c"), ("a:b", "c")),
        (("app", "x:fence"), ("app", "x")),
        (("app", "x:wake"), ("app", "x")),
        (("app", "x}"), ("app", "x")),
        (("app", "}"), ("app", "")),
    ]
    for (reg1, key1), (reg2, key2) in pairs:
        if not key2:
            continue
        first = any_registry_factory(registry_key=reg1)
        second = any_registry_factory(registry_key=reg2)
        a, b = first.obtain(key1), second.obtain(key2)
        assert a.acquire(blocking=False)
        assert b.acquire(blocking=False), f"{(reg1, key1)} and {(reg2, key2)} collide"
        b.release()
        a.release()
    # The same key under two registry keys: two different locks.
    one, two = any_registry_factory(registry_key="one"), any_registry_factory(registry_key="two")
    with one.obtain("k"):
        assert two.obtain("k").acquire(blocking=False)
        two.obtain("k").release()


# -- timeouts ----------------------------------------------------------------------------------------------------------


@over_backends
@pytest.mark.parametrize("held_by", ["another registry", "another thread"])
def test_timeout_bounds_the_whole_acquire(any_registry_factory, held_by):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    holder_lock = any_registry_factory().obtain("k") if held_by == "another registry" else lock
    with Holder(holder_lock):
        for timeout in (0.3, 0.6):
            start = time.monotonic()
            assert lock.acquire(timeout=timeout) is False
            elapsed = time.monotonic() - start
            assert timeout - 0.05 <= elapsed <= 2.0, f"acquire(timeout={timeout}) took {elapsed:.3f}s"
        start = time.monotonic()
        assert lock.acquire(blocking=False) is False
        assert lock.acquire(timeout=0) is False
        assert time.monotonic() - start < 1.0
        assert not lock.is_held_by_current_thread()


@over_backends
def test_timeout_with_local_and_remote_waits_together(any_registry_factory):
    # Thread A of this registry waits for the remote holder; thread B waits locally behind A. B's timeout covers
    # both waits, so it gives up on time even though A is still waiting on the server.
    registry = any_registry_factory()
    lock = registry.obtain("k")
    durations: list[tuple[bool, float]] = []

    def try_for(timeout: float) -> None:
        start = time.monotonic()
        got = lock.acquire(timeout=timeout)
        durations.append((got, time.monotonic() - start))
        if got:
            lock.release()

    with Holder(any_registry_factory().obtain("k")):
        run_threads([lambda: try_for(1.5), lambda: try_for(0.4)])
    assert sorted(durations, key=lambda d: d[1]) == [
        (False, pytest.approx(0.4, abs=0.35)),
        (False, pytest.approx(1.5, abs=0.6)),
    ]


# -- threading.Condition -----------------------------------------------------------------------------------------------


@over_backends
def test_condition_wait_and_notify_between_threads(any_registry_factory):
    registry = any_registry_factory()
    cond = threading.Condition(registry.obtain("k"))
    items: list[int] = []
    consumed: list[int] = []

    def consume() -> None:
        for _ in range(5):
            with cond:
                assert cond.wait_for(lambda: items, timeout=10), "never notified"
                consumed.append(items.pop(0))

    def produce() -> None:
        for i in range(5):
            with cond:
                items.append(i)
                cond.notify()
            time.sleep(0.02)

    run_threads([consume, produce])
    assert consumed == [0, 1, 2, 3, 4]


@over_backends
def test_condition_wait_releases_every_level_and_restores_the_depth(any_registry_factory):
    registry, other = any_registry_factory(), any_registry_factory()
    lock = registry.obtain("k")
    cond = threading.Condition(lock)
    ready = threading.Event()
    observed: dict[str, object] = {}

    def waiter() -> None:
        with cond, lock:
            assert lock.hold_count == 2
            ready.set()
            observed["notified"] = cond.wait(timeout=10)
            observed["depth_after"] = lock.hold_count
            observed["mine_after"] = lock.is_held_by_current_thread()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert ready.wait(5)
    # While it waits, the lock is free: for other threads here and for other owners.
    theirs = other.obtain("k")
    assert theirs.acquire(timeout=5), "Condition.wait() did not release the server lock"
    theirs.release()
    with cond:
        assert lock.hold_count == 1
        cond.notify()
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive()
    assert observed == {"notified": True, "depth_after": 2, "mine_after": True}
    assert not lock.locked()


@over_backends
def test_condition_wait_times_out_and_keeps_the_lock(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    cond = threading.Condition(lock)
    with cond:
        start = time.monotonic()
        assert cond.wait(timeout=0.3) is False
        assert 0.25 <= time.monotonic() - start <= 2.0
        assert lock.is_held_by_current_thread()
        assert lock.hold_count == 1
    assert not lock.locked()


@over_backends
def test_condition_needs_the_lock_held(any_registry_factory):
    registry = any_registry_factory()
    cond = threading.Condition(registry.obtain("k"))
    with pytest.raises(RuntimeError):
        cond.notify()
    with pytest.raises(RuntimeError):
        cond.wait(timeout=0.01)
    with Holder(registry.obtain("k")), pytest.raises(RuntimeError):
        cond.notify_all()  # held, but by another thread


# -- the registry's memory ---------------------------------------------------------------------------------------------


@over_backends
def test_unreferenced_unheld_locks_are_reclaimed_at_once_and_held_ones_never(any_registry_factory):
    # As with threading.RLock, a lock nobody references is garbage; the registry keeps no cache of recent ones.
    registry = any_registry_factory()
    kept = registry.obtain("kept")  # referenced, unheld
    held = registry.obtain("held")
    held.acquire()
    held_ref = weakref.ref(held)
    dropped_ref = weakref.ref(registry.obtain("dropped"))
    del held  # held, but no longer referenced by the program
    gc.collect()
    assert dropped_ref() is None, "an unheld, unreferenced lock was not reclaimed"
    assert held_ref() is not None, "a held lock was reclaimed"
    assert registry.expire_unused_older_than(0) == 0  # nothing left to forget: a no-op kept for compatibility
    assert registry.obtain("kept") is kept, "a second object for a still-referenced key"
    again = registry.obtain("held")
    assert again is held_ref()
    assert again.is_held_by_current_thread()
    assert again.hold_count == 1
    assert len(registry) == 2
    again.release()

    del again
    gc.collect()
    assert held_ref() is None, "a released, unreferenced lock was not reclaimed"
    assert registry.obtain("kept") is kept


@over_backends
def test_expire_unused_never_drops_a_referenced_lock(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    with lock:
        pass
    assert registry.expire_unused_older_than(0) == 0
    gc.collect()
    assert registry.obtain("k") is lock


@over_backends
def test_a_held_lock_nobody_references_stays_the_lock_for_its_key(any_registry_factory):
    # If the registry forgot a held lock, a second object would have a free local mutex and the same client_id,
    # and a second thread could walk into the critical section.
    registry = any_registry_factory()
    held = threading.Event()
    go = threading.Event()
    errors: list[BaseException] = []

    def hold_without_a_reference() -> None:
        try:
            assert registry.obtain("k").acquire(timeout=5)
            held.set()
            go.wait(JOIN_TIMEOUT)
            registry.obtain("k").release()
        except BaseException as exc:
            errors.append(exc)
            held.set()

    thread = threading.Thread(target=hold_without_a_reference, daemon=True)
    thread.start()
    try:
        assert held.wait(5)
        for _ in range(3):
            registry.expire_unused_older_than(0)
            gc.collect()
        lock = registry.obtain("k")
        assert lock.locked()
        assert lock.acquire(blocking=False) is False, "a second thread entered a held lock"
        assert lock.acquire(timeout=0.2) is False
    finally:
        go.set()
        thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive()
    assert not errors, errors
    assert lock.acquire(timeout=5)
    lock.release()


@over_backends
def test_the_registry_does_not_grow_without_bound(any_registry_factory):
    registry = any_registry_factory()
    for i in range(5000):
        registry.obtain(f"key:{i}")
    gc.collect()
    assert len(registry) == 0, f"{len(registry)} lock objects kept for 5000 unreferenced, unheld keys"


# -- closing -----------------------------------------------------------------------------------------------------------


@over_backends
def test_a_closed_registry_refuses_use(any_registry_factory):
    registry = any_registry_factory()
    lock = registry.obtain("k")
    registry.close()
    registry.close()  # idempotent
    assert registry.closed
    with pytest.raises(hybridlock.RegistryClosedError) as excinfo:
        registry.obtain("k")
    assert isinstance(excinfo.value, RuntimeError)
    assert isinstance(excinfo.value, hybridlock.HybridLockError)
    assert excinfo.value.key == "k"
    with pytest.raises(hybridlock.RegistryClosedError):
        registry.obtain("other")
    with pytest.raises(hybridlock.RegistryClosedError):
        lock.acquire()
    with pytest.raises(hybridlock.RegistryClosedError):
        lock.acquire(blocking=False)
    with pytest.raises(hybridlock.RegistryClosedError):
        lock.try_lock()
    with pytest.raises(hybridlock.RegistryClosedError):
        lock.lock()
    with pytest.raises(hybridlock.RegistryClosedError), lock:
        pass
    assert not lock.is_held_by_current_thread()


@over_backends
def test_registry_as_a_context_manager_closes(any_registry_factory):
    with any_registry_factory() as registry:
        with registry.obtain("k"):
            pass
        assert not registry.closed
    assert registry.closed
    with pytest.raises(hybridlock.RegistryClosedError):
        registry.obtain("k")


@over_backends
def test_closing_stops_a_waiting_acquire(any_registry_factory):
    registry, other = any_registry_factory(), any_registry_factory()
    lock = registry.obtain("k")
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(lock.acquire(timeout=30))
        except hybridlock.RegistryClosedError as exc:
            outcome.append(exc)

    with Holder(other.obtain("k")):
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        time.sleep(0.3)
        closed_at = time.monotonic()
        registry.close()
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive()
        assert time.monotonic() - closed_at < 10.0
    assert len(outcome) == 1
    assert isinstance(outcome[0], hybridlock.RegistryClosedError), outcome


@over_backends
def test_a_lock_held_at_close_can_still_be_released(any_registry_factory):
    registry, other = any_registry_factory(), any_registry_factory()
    lock = registry.obtain("k")
    lock.acquire()
    with pytest.warns(hybridlock.LocksHeldAtCloseWarning, match="'k'"):
        registry.close()
    lock.release()
    assert not lock.is_held_by_current_thread()
    theirs = other.obtain("k")
    assert theirs.acquire(blocking=False), "the release after close() left the server key behind"
    theirs.release()


# -- LocalLockRegistry -------------------------------------------------------------------------------------------------


def test_local_lock_registry_works():
    with hybridlock.LocalLockRegistry() as registry:
        assert isinstance(registry.client_id, str)
        lock = registry.obtain("k")
        assert registry.obtain("k") is lock
        with lock, lock:
            assert lock.hold_count == 2
            assert lock.locked()
        assert not lock.locked()
        state = {"count": 0, "inside": 0, "max_inside": 0}

        def work() -> None:
            for _ in range(200):
                with lock:
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    value = state["count"]
                    time.sleep(0)
                    state["count"] = value + 1
                    state["inside"] -= 1

        run_threads([work] * 6)
        assert state == {"count": 1200, "inside": 0, "max_inside": 1}
        cond = threading.Condition(registry.obtain("c"))
        with cond:
            assert cond.wait(0.05) is False
        with Holder(lock):
            start = time.monotonic()
            assert lock.acquire(timeout=0.3) is False
            assert 0.25 <= time.monotonic() - start <= 2.0
    with pytest.raises(hybridlock.RegistryClosedError):
        registry.obtain("k")


def test_local_lock_registry_leases_never_expire():
    with hybridlock.LocalLockRegistry() as registry:
        lock = registry.obtain("k")
        with lock:
            assert lock.valid_until in (None, float("inf"))
            time.sleep(0.2)
        # Releasing after a while is clean: no lease ran out.


def test_renewing_on_a_local_lock_registry_keeps_the_lease_without_expiry():
    # renew() used to give the lock a lease of the registry's default expire_after (or the one passed), after which
    # release() raised LockLostError while valid_until still said inf.
    with hybridlock.LocalLockRegistry() as registry:
        lock = registry.obtain("k")
        with lock:
            lock.renew()
            registry.renew_lock("k", 0.1)
            lock.renew(0.1)
            time.sleep(0.3)
            assert lock.valid_until == float("inf")
            assert not lock.lost
        # Released without LockLostError: the lease had not ended.
        assert not lock.locked()


def test_read_write_locks_on_a_local_lock_registry():
    # They used to fail with a TypeError: the in-memory backend was given no lease for a read or write hold.
    with hybridlock.LocalLockRegistry() as registry:
        rw = registry.obtain_read_write("k")
        with rw.read_lock():
            assert rw.read_lock().valid_until == float("inf")
            assert run_in_thread(lambda: rw.write_lock().acquire(timeout=0.1)) is False
        with rw.write_lock():
            assert run_in_thread(lambda: rw.read_lock().acquire(timeout=0.1)) is False
            time.sleep(0.2)
        assert run_in_thread(lambda: _take_and_give_back(rw.read_lock())) is True


def _take_and_give_back(lock: object) -> bool:
    got = lock.acquire(timeout=5)  # type: ignore[attr-defined]
    if got:
        lock.release()  # type: ignore[attr-defined]
    return bool(got)


def run_in_thread(function: Callable[[], object]) -> object:
    result: list[object] = []
    run_threads([lambda: result.append(function())])
    return result[0]


def test_local_lock_registries_are_separate():
    with hybridlock.LocalLockRegistry() as one, hybridlock.LocalLockRegistry() as two, one.obtain("k"):
        assert two.obtain("k").acquire(blocking=False)
        two.obtain("k").release()


# -- what it costs the server, and where its keys live -----------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("lock_type", ["pubsub", "spin"])
def test_waiting_for_another_owner_does_not_poll_every_few_milliseconds(make_registry, redis_client, lock_type):
    holder, waiter = make_registry(), make_registry(lock_type=lock_type)
    theirs, lock = holder.obtain("k"), waiter.obtain("k")
    held, release_now = threading.Event(), threading.Event()

    def hold() -> None:
        with theirs:
            held.set()
            release_now.wait(10)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5)
    before = script_runs(redis_client)
    timer = threading.Timer(1.0, release_now.set)
    timer.start()
    start = time.monotonic()
    try:
        assert lock.acquire(timeout=10)
        waited = time.monotonic() - start
        calls = script_runs(redis_client) - before
        lock.release()
    finally:
        release_now.set()
        timer.cancel()
        thread.join(JOIN_TIMEOUT)
    assert 0.9 <= waited <= 2.0, f"got the lock {waited:.2f}s after starting to wait (released after 1 s)"
    # Polling every few milliseconds would be hundreds of attempts; backoff capped near 0.1 s is a few dozen.
    assert calls <= 60, f"{calls} script calls while waiting 1 s"


def cluster_mode_server() -> EmbeddedServer:
    """A single-node Redis Cluster owning every slot: the server then refuses scripts that cross slots."""
    srv = EmbeddedServer(extra_args=("--cluster-enabled", "yes")).start()
    try:
        client = redis.Redis.from_url(srv.url)
        try:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        except redis.ResponseError:
            client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
        deadline = time.monotonic() + 10
        while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
            assert time.monotonic() < deadline, "the cluster-mode server never became ready"
            time.sleep(0.05)
        client.close()
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.mark.server
def test_every_script_touches_one_cluster_slot():
    keys = ["k", "orders:42", "a}b", "{x}", "x{y}z", "{}", "ü-ключ", "with space", "a:b:c"]
    srv = cluster_mode_server()
    try:
        client = redis.Redis.from_url(srv.url)
        with hybridlock.LockRegistry(srv.url) as mine, hybridlock.LockRegistry(srv.url) as other:
            for key in keys:
                lock = mine.obtain(key)
                assert lock.acquire(timeout=5), key  # ACQUIRE: lock key and fencing counter together
                lock.renew()  # RENEW of one lock
                assert other.obtain(key).acquire(blocking=False) is False, key
                lock.release()  # RELEASE
                assert other.obtain(key).acquire(timeout=5), key
                other.obtain(key).release()
            # A wait subscribes to the lock's release channel: that works in cluster mode too.
            with Holder(mine.obtain("k")):
                assert other.obtain("k").acquire(timeout=0.2) is False
            assert other.obtain("k").acquire(timeout=5)
            other.obtain("k").release()
            names = [name.decode() for name in client.scan_iter()]
            assert names, "nothing was stored?"
            assert all(name.startswith("hybridlock:") for name in names), names
        client.close()
    finally:
        srv.stop()


# -- try_lock(timeout <= 0) --------------------------------------------------------------------------------------------


def _lock_kinds(registry: hybridlock.LockRegistry) -> dict[str, hybridlock.HybridLock]:
    # One of each lock kind over the same key; anything in "k" held by another owner keeps each of them out.
    rw = registry.obtain_read_write("k")
    return {
        "plain": registry.obtain("k"),
        "read": rw.read_lock(),  # type: ignore[dict-item]
        "write": rw.write_lock(),  # type: ignore[dict-item]
        "multi": registry.obtain_many(["k", "other"]),  # type: ignore[dict-item]
    }


@over_backends
@pytest.mark.parametrize("kind", ["plain", "read", "write", "multi"])
@pytest.mark.parametrize("timeout", [-1, -0.5, -1e9, -math.inf, -0.0])
def test_try_lock_with_a_timeout_at_or_below_zero_does_not_wait(any_registry_factory, kind, timeout):
    # As Java's tryLock(time, unit): a wait <= 0 is "take it only if it is free now".
    registry, other = any_registry_factory(), any_registry_factory()
    lock = _lock_kinds(registry)[kind]
    theirs = _lock_kinds(other)["write" if kind == "read" else kind]
    with Holder(theirs):  # type: ignore[arg-type]
        start = time.monotonic()
        assert lock.try_lock(timeout) is False
        assert time.monotonic() - start < 1.0, "try_lock(timeout <= 0) must not wait"
        assert not lock.is_held_by_current_thread()
    assert lock.try_lock(timeout) is True
    lock.release()
