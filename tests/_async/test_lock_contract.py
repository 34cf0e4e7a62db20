"""The lock contract over every lock kind x every backend, written once: here for asyncio (owners are tasks), and
generated into ``tests/_sync`` for threads (owners are threads).

``tests/test_contract.py`` tests the thread API in more detail; this suite is what both APIs must share. Each
test bounds its own time (``_compat.JOIN``; the async hook's timeout).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest

import hybridlock

from ._compat import run_concurrently, sleep, spawn
from .helpers import EXCLUSIVE, SINGLE, Backend, Holder, Kind, in_other, kinds, take_and_give_back

# -- acquire and release -----------------------------------------------------------------------------------------------


@kinds()
async def test_acquire_and_release(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        assert not lock.is_held_by_current_task()
        assert await lock.acquire() is True
        assert lock.is_held_by_current_task()
        assert await in_other(lock.is_held_by_current_task) is False
        await lock.release()
        assert not lock.is_held_by_current_task()
        assert await lock.acquire(blocking=False) is True
        await lock.release()
        assert await lock.acquire(timeout=1) is True
        await lock.release()
        assert await in_other(lambda: take_and_give_back(lock)) is True, "the lock was left behind after release"


@kinds()
async def test_with_statement_returns_the_lock_and_releases_on_error(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        inside: list[bool] = []

        async def use() -> None:
            async with lock as entered:
                inside.append(entered is lock and lock.is_held_by_current_task())
                raise KeyError("boom")

        with pytest.raises(KeyError):
            await use()
        assert inside == [True]
        assert not lock.is_held_by_current_task()
        assert await in_other(lambda: take_and_give_back(lock)) is True


# -- reentrancy --------------------------------------------------------------------------------------------------------


@kinds()
async def test_reentrant_hold_lasts_until_the_last_release(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        rival = kind.rival(backend.other_owner(registry), "k")
        for _ in range(3):
            assert await lock.acquire(timeout=5)
        async with lock:
            assert lock.is_held_by_current_task()
        for _ in range(2):
            await lock.release()
            assert lock.is_held_by_current_task()
            assert await in_other(lambda: rival.acquire(blocking=False)) is False, "released one level too early"
        await lock.release()
        assert not lock.is_held_by_current_task()
        assert await in_other(lambda: take_and_give_back(rival)) is True


@kinds(*SINGLE)
async def test_hold_count_is_the_current_owners_depth(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        assert lock.hold_count == 0
        for depth in (1, 2, 3):
            assert await lock.acquire()
            assert lock.hold_count == depth
        assert await in_other(lambda: lock.hold_count) == 0
        async with lock:
            assert lock.hold_count == 4
        for depth in (2, 1, 0):
            await lock.release()
            assert lock.hold_count == depth


# -- held elsewhere: not blocking, timeouts ----------------------------------------------------------------------------


@kinds()
async def test_held_elsewhere_non_blocking_and_timed_acquires_fail(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        # Held by another task (thread) of this registry, then (where the backend has one) by another owner.
        for holder_registry in [registry, backend.registry()] if backend.shared else [registry]:
            async with Holder(kind.rival(holder_registry, "k")):
                start = time.monotonic()
                assert await lock.acquire(blocking=False) is False
                assert await lock.acquire(timeout=0) is False
                assert time.monotonic() - start < 1.0, "a non-blocking acquire waited"
                start = time.monotonic()
                assert await lock.acquire(timeout=0.2) is False
                elapsed = time.monotonic() - start
                assert 0.15 <= elapsed <= 2.0, f"acquire(timeout=0.2) took {elapsed:.3f}s"
                assert not lock.is_held_by_current_task()
            assert await lock.acquire(timeout=5) is True
            await lock.release()


@kinds()
async def test_with_lock_timeout_holds_the_lock_or_raises_lock_timeout_error(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        async with lock(timeout=5) as held:
            assert held is lock
            assert lock.is_held_by_current_task()
        assert not lock.is_held_by_current_task()
        async with lock(blocking=False), lock(timeout=0):  # free now; then reentrant
            assert lock.is_held_by_current_task()
        assert not lock.is_held_by_current_task()
        ran: list[bool] = []

        async def enter(**arguments: Any) -> None:
            async with lock(**arguments):
                ran.append(True)

        for holder_registry in [registry, backend.registry()] if backend.shared else [registry]:
            async with Holder(kind.rival(holder_registry, "k")):
                start = time.monotonic()
                with pytest.raises(hybridlock.LockTimeoutError) as caught:
                    await enter(timeout=0.2)
                elapsed = time.monotonic() - start
                assert ran == [], "the with-block ran without the lock"
                assert 0.15 <= elapsed <= 2.0, f"lock(timeout=0.2) took {elapsed:.3f}s"
                assert isinstance(caught.value, TimeoutError)
                keys = getattr(lock, "keys", None) or [lock.key]  # (a multi-key lock names all its keys)
                assert caught.value.key in keys
                assert caught.value.server == registry.server
                assert "within 0.2 s (waited 0." in str(caught.value)
                assert str(caught.value).startswith({"read": "read lock", "write": "write lock"}.get(kind.name, "lock"))
                assert all(repr(key) in str(caught.value) for key in keys)
                with pytest.raises(hybridlock.LockTimeoutError, match=r"blocking=False"):
                    await enter(blocking=False)
                assert ran == []
                assert not lock.is_held_by_current_task()
        async with lock(timeout=5):  # nothing was left behind by the refusals
            pass
        assert await in_other(lambda: take_and_give_back(lock)) is True


@kinds()
async def test_with_lock_timeout_releases_when_the_block_raises(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")

        async def use() -> None:
            async with lock(timeout=5):
                raise KeyError("boom")

        with pytest.raises(KeyError):
            await use()
        assert not lock.is_held_by_current_task()
        assert await in_other(lambda: take_and_give_back(lock)) is True


@kinds()
async def test_with_lock_timeout_refuses_bad_arguments_before_taking_anything(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        for bad in ({"timeout": -2}, {"timeout": float("nan")}, {"timeout": "5"}, {"timeout": 1, "blocking": False}):
            with pytest.raises(hybridlock.InvalidArgumentError):
                lock(**bad)
        assert not lock.is_held_by_current_task()
        assert await in_other(lambda: take_and_give_back(lock)) is True


@kinds()
async def test_a_waiting_acquire_gets_the_lock_when_it_is_released(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        async with Holder(kind.rival(backend.other_owner(registry), "k")) as holder:
            waiter = spawn(lambda: take_and_give_back(lock, 5))
            await sleep(0.1)
            assert not waiter.done(), "the waiter got in while the lock was held"
            holder.go.set()
            assert await waiter.join() is True


# -- release by a non-owner, and twice ---------------------------------------------------------------------------------


@kinds()
async def test_release_by_a_non_owner_raises_names_the_key_and_changes_nothing(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        with pytest.raises(hybridlock.LockNotOwnedError):
            await lock.release()  # nobody holds it
        async with Holder(lock) as holder:
            with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
                await lock.release()
            assert isinstance(excinfo.value, RuntimeError)
            assert isinstance(excinfo.value, hybridlock.HybridLockError)
            key = excinfo.value.key
            assert key is not None, "LockNotOwnedError.key is None"
            assert any(name in key for name in kind.keys("k")), key
            with pytest.raises(hybridlock.LockNotOwnedError):
                await lock.unlock()
            assert not holder.spawned.done()
            rival = kind.rival(backend.other_owner(registry), "k")
            assert await in_other(lambda: rival.acquire(blocking=False)) is False, "the failed release let go"
        assert await in_other(lambda: take_and_give_back(kind.rival(backend.other_owner(registry), "k"))) is True


@kinds()
async def test_release_twice_raises(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        await lock.acquire()
        await lock.release()
        with pytest.raises(hybridlock.LockNotOwnedError):
            await lock.release()
        assert await in_other(lambda: take_and_give_back(lock)) is True, "the failed second release broke the lock"


# -- exclusion ---------------------------------------------------------------------------------------------------------


@kinds(*EXCLUSIVE)
async def test_mutual_exclusion(backend: Backend, kind: Kind) -> None:
    # Tasks (threads) of two owners where the backend has them, else of one; a non-atomic counter is exact only if
    # no two were inside at once, and the marker sees any overlap directly.
    async with backend:
        locks = [kind.make(registry, "counter") for registry in backend.owners()]
        state = {"count": 0, "inside": 0, "max_inside": 0}
        per_lock, rounds = 6 // len(locks), 20

        async def work(lock: Any) -> None:
            for _ in range(rounds):
                async with lock:
                    state["inside"] += 1
                    state["max_inside"] = max(state["max_inside"], state["inside"])
                    value = state["count"]
                    await sleep(0.0002)  # invite a race
                    state["count"] = value + 1
                    state["inside"] -= 1

        await run_concurrently([functools.partial(work, lock) for lock in locks for _ in range(per_lock)], 30)
        assert state == {"count": 6 * rounds, "inside": 0, "max_inside": 1}


async def test_readers_hold_the_read_lock_together(backend: Backend) -> None:
    # Every reader waits inside the lock for all the others: this ends only if they are all admitted at once.
    async with backend:
        registries = backend.owners()
        readers = [registries[i % len(registries)].obtain_read_write("k").read_lock() for i in range(4)]
        inside = [0]

        async def read(lock: Any) -> None:
            async with lock:
                inside[0] += 1
                deadline = time.monotonic() + 5
                while inside[0] < len(readers):
                    assert time.monotonic() < deadline, f"only {inside[0]} readers were admitted together"
                    await sleep(0.001)

        await run_concurrently([functools.partial(read, lock) for lock in readers])


async def test_a_read_hold_keeps_writers_out(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        reader = registry.obtain_read_write("k").read_lock()
        writer = backend.other_owner(registry).obtain_read_write("k").write_lock()
        async with Holder(reader):
            assert await in_other(lambda: writer.acquire(blocking=False)) is False
            start = time.monotonic()
            assert await in_other(lambda: writer.acquire(timeout=0.2)) is False
            assert 0.15 <= time.monotonic() - start <= 2.0
        assert await in_other(lambda: take_and_give_back(writer)) is True


async def test_readers_and_writers_exclude_each_other(backend: Backend) -> None:
    # Writers and readers of two owners (where the backend has two) mix; the bookkeeping counts every overlap of a
    # writer with anyone. The guard only makes the bookkeeping itself exact between threads; nothing awaits under it.
    async with backend:
        rws = [registry.obtain_read_write("k") for registry in backend.owners()]
        guard = threading.Lock()
        state = {"readers": 0, "writers": 0, "count": 0, "violations": 0}
        rounds = 15

        def enter(role: str) -> None:
            with guard:
                state[role] += 1
                if state["writers"] > 1 or (state["writers"] and state["readers"]):
                    state["violations"] += 1

        def leave(role: str) -> None:
            with guard:
                state[role] -= 1

        async def write(rw: Any) -> None:
            for _ in range(rounds):
                async with rw.write_lock():
                    enter("writers")
                    value = state["count"]
                    await sleep(0.0002)  # invite a race
                    state["count"] = value + 1
                    leave("writers")

        async def read(rw: Any) -> None:
            for _ in range(rounds):
                async with rw.read_lock():
                    enter("readers")
                    await sleep(0.001)
                    leave("readers")

        writers = [functools.partial(write, rws[i % len(rws)]) for i in range(2)]
        readers = [functools.partial(read, rws[i % len(rws)]) for i in range(3)]
        await run_concurrently([*writers, *readers], 30)
        assert state == {"readers": 0, "writers": 0, "count": 2 * rounds, "violations": 0}


# -- Java-style aliases ------------------------------------------------------------------------------------------------


@kinds()
async def test_lock_unlock_and_try_lock_aliases(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        assert await lock.lock() is None
        assert lock.is_held_by_current_task()
        await lock.unlock()
        assert not lock.is_held_by_current_task()

        assert await lock.try_lock() is True
        assert await lock.tryLock() is True  # reentrant
        await lock.unlock()
        assert lock.is_held_by_current_task()
        await lock.unlock()
        assert not lock.is_held_by_current_task()

        async with Holder(kind.rival(backend.other_owner(registry), "k")):
            start = time.monotonic()
            assert await lock.try_lock() is False
            assert await lock.try_lock(None) is False
            assert await lock.tryLock(0) is False
            assert time.monotonic() - start < 1.0, "try_lock() without a timeout must not wait"
            start = time.monotonic()
            assert await lock.tryLock(0.2) is False
            assert 0.15 <= time.monotonic() - start <= 2.0
        assert await lock.try_lock(5) is True
        await lock.unlock()


# -- state: locked(), lost, fencing tokens, repr -----------------------------------------------------------------------


@kinds()
async def test_locked_reports_a_holder_here_or_elsewhere(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        assert await lock.locked() is False
        async with lock:
            assert await lock.locked() is True
        assert await lock.locked() is False
        async with Holder(lock):
            assert await lock.locked() is True, "locked() must see a holder in another task (thread)"
        if backend.shared:
            async with Holder(kind.make(backend.other_owner(registry), "k")):
                assert await lock.locked() is True, "locked() must see a holder in another registry"
        assert await lock.locked() is False


@kinds(*SINGLE)
async def test_lost_is_false_while_held_and_after_a_clean_release(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        assert lock.lost is False
        async with lock:
            assert lock.lost is False
        assert lock.lost is False


def fencing_tokens(lock: Any) -> list[int | None]:
    """The lock's fencing tokens: one for a plain or write lock, one per key for a multi-key lock."""
    if isinstance(lock, hybridlock.AsyncMultiLock):
        return [part.fencing_token for part in lock.locks]
    return [lock.fencing_token]


@kinds(*EXCLUSIVE)  # a read hold is shared by every reader here and orders nothing between owners: no token
async def test_fencing_tokens_grow_with_each_fresh_acquisition(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "k")
        assert fencing_tokens(lock) == [None] * len(kind.keys("k"))
        async with lock:
            first = fencing_tokens(lock)
            assert all(isinstance(token, int) for token in first), first
            async with lock:
                assert fencing_tokens(lock) == first, "a reentrant acquire is the same tenancy: the same token"
        assert fencing_tokens(lock) == [None] * len(first)
        async with lock:
            second = fencing_tokens(lock)
        assert all(b > a for a, b in zip(first, second, strict=True)), (first, second)  # type: ignore[operator]


@kinds()
async def test_repr_names_the_key_free_and_held(backend: Backend, kind: Kind) -> None:
    async with backend:
        lock = kind.make(backend.registry(), "orders:42")
        assert "orders:42" in repr(lock)
        async with lock, lock:
            assert "orders:42" in repr(lock)
            assert "orders:42" in await in_other(lambda: repr(lock))  # from an owner that does not hold it
        assert "orders:42" in repr(lock)


# -- a closed registry -------------------------------------------------------------------------------------------------


@kinds()
async def test_a_closed_registry_refuses_use(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        await registry.aclose()
        await registry.aclose()  # idempotent
        assert registry.closed
        with pytest.raises(hybridlock.RegistryClosedError) as excinfo:
            await lock.acquire()
        assert isinstance(excinfo.value, RuntimeError)
        assert isinstance(excinfo.value, hybridlock.HybridLockError)
        for use in (lambda: lock.acquire(blocking=False), lock.try_lock, lock.lock, enter_and_leave(lock)):
            with pytest.raises(hybridlock.RegistryClosedError):
                await use()
        with pytest.raises(hybridlock.RegistryClosedError):
            kind.make(registry, "k")
        assert not lock.is_held_by_current_task()


def enter_and_leave(lock: Any) -> Any:
    async def use() -> None:
        async with lock:
            pass

    return use


@kinds()
async def test_a_lock_held_at_close_can_still_be_released(backend: Backend, kind: Kind) -> None:
    async with backend:
        registry = backend.registry()
        lock = kind.make(registry, "k")
        assert await lock.acquire(timeout=5)
        with pytest.warns(hybridlock.LocksHeldAtCloseWarning, match="'k"):
            await registry.aclose()
        await lock.release()
        assert not lock.is_held_by_current_task()
        if backend.shared:
            theirs = kind.rival(backend.registry(), "k")
            assert await theirs.acquire(blocking=False), "the release after close left the server hold behind"
            await theirs.release()
