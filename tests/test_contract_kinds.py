"""The lock contract, run over every lock kind and every backend.

Kinds: ``HybridLock`` (``registry.obtain``), ``WriteLock`` and ``ReadLock`` (``registry.obtain_read_write(k)``'s
``write_lock()`` and ``read_lock()``), and ``MultiLock`` (``registry.obtain_many``). Backends: a ``LockRegistry``
over a ``MemoryBackend``, a ``LocalLockRegistry``, and a real Redis/Valkey server (the session's own).

As in trio's ``generic_lock_test`` and CPython's ``Lib/test/lock_tests.py``, each behaviour is written once and
parametrized over the implementations. What a kind means shapes a few tests: a read lock is shared, so the
exclusion tests run over the exclusive kinds, and the read lock has tests of its own (shared admission, and
exclusion against the write lock). Where a kind does not yet meet the contract, that single case is a strict xfail:
it starts failing, on purpose, once the library is fixed, so the mark must then go.

Each test bounds its own run time: threads are joined with short timeouts and checked with asserts.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

import hybridlock
from hybridlock.backends import MemoryBackend

JOIN = 10.0  # seconds any helper thread may take; far above what a passing run needs


class Lock(Protocol):
    """What every lock kind offers."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
    def release(self) -> None: ...
    def is_held_by_current_thread(self) -> bool: ...
    def try_lock(self, timeout: float | None = None) -> bool: ...
    def lock(self) -> object: ...  # None, as Java's lock() returns nothing
    def unlock(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(self, *exc_info: object) -> None: ...


# -- backends ----------------------------------------------------------------------------------------------------------


@dataclass
class Backend:
    """Makes registries over one store. ``shared``: two registries it makes are two owners of the same keys (as
    two processes are); a ``LocalLockRegistry`` shares nothing, so there the other owner is another thread."""

    name: str
    make: Callable[[], hybridlock.LockRegistry]
    shared: bool

    def __post_init__(self) -> None:
        self.made: list[hybridlock.LockRegistry] = []

    def registry(self) -> hybridlock.LockRegistry:
        registry = self.make()
        self.made.append(registry)
        return registry

    def other_owner(self, registry: hybridlock.LockRegistry) -> hybridlock.LockRegistry:
        """Another owner of ``registry``'s keys where the backend has one; else ``registry`` itself (whose locks
        another thread then holds)."""
        return self.registry() if self.shared else registry


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("local", id="local"),
        pytest.param("redis", id="redis", marks=pytest.mark.server),
    ]
)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "memory":
        store = MemoryBackend()
        made = Backend("memory", lambda: hybridlock.LockRegistry(store), shared=True)
    elif request.param == "local":
        made = Backend("local", hybridlock.LocalLockRegistry, shared=False)
    else:
        request.getfixturevalue("redis_client")  # flushes the session's server
        url = request.getfixturevalue("server").url
        made = Backend("redis", lambda: hybridlock.LockRegistry(url), shared=True)
    yield made
    for registry in made.made:
        registry.close()


# -- lock kinds --------------------------------------------------------------------------------------------------------


def _multi_keys(key: str) -> list[str]:
    return [key, f"{key}:second"]


@dataclass(frozen=True)
class Kind:
    """One lock kind. ``rival`` is a lock that cannot be held while this one is held by another thread or owner:
    the same kind for the exclusive ones, the write lock for the read lock, and a plain lock on one of its keys for
    the multi-key lock (all or nothing: one busy key keeps it out)."""

    name: str
    make: Callable[[hybridlock.LockRegistry, str], Lock]
    rival: Callable[[hybridlock.LockRegistry, str], Lock]
    keys: Callable[[str], list[str]]
    exclusive: bool = True


KINDS = {
    "plain": Kind("plain", lambda r, k: r.obtain(k), lambda r, k: r.obtain(k), lambda k: [k]),
    "write": Kind(
        "write",
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda k: [k],
    ),
    "read": Kind(
        "read",
        lambda r, k: r.obtain_read_write(k).read_lock(),
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda k: [k],
        exclusive=False,
    ),
    "multi": Kind(
        "multi",
        lambda r, k: r.obtain_many(_multi_keys(k)),
        lambda r, k: r.obtain(_multi_keys(k)[-1]),
        _multi_keys,
    ),
}


def kinds(*names: str, xfail: dict[str, tuple[str, type[BaseException]]] | None = None) -> pytest.MarkDecorator:
    """Parametrize ``kind`` over ``names`` (all kinds when none), with a strict xfail on the cases in ``xfail``
    (name -> (reason, the exception the gap raises today))."""
    gaps = xfail or {}
    params = []
    for name in names or tuple(KINDS):
        marks = []
        if name in gaps:
            reason, raises = gaps[name]
            marks.append(pytest.mark.xfail(strict=True, reason=reason, raises=raises))
        params.append(pytest.param(KINDS[name], id=name, marks=marks))
    return pytest.mark.parametrize("kind", params)


EXCLUSIVE = ("plain", "write", "multi")

MULTI_HAS_NO_HOLD_COUNT = ("MultiLock has no hold_count", AttributeError)
MULTI_HAS_NO_LOST = ("MultiLock has no lost", AttributeError)
NO_LOCKED = "has no locked()"


# -- helpers -----------------------------------------------------------------------------------------------------------


def run_threads(targets: list[Callable[[], object]], timeout: float = JOIN) -> None:
    """Run each target in a thread of its own; fail on the first error, or if any is still running at ``timeout``."""
    errors: list[BaseException] = []

    def wrap(target: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(target), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    assert not any(thread.is_alive() for thread in threads), f"threads still running after {timeout}s: a hang"
    if errors:
        raise errors[0]


def in_thread(function: Callable[[], object]) -> object:
    """``function()``'s result, computed in another thread."""
    result: list[object] = []
    run_threads([lambda: result.append(function())])
    return result[0]


class Holder:
    """Holds ``lock`` (``depth`` levels) in a thread of its own for the body of ``with Holder(lock): ...``."""

    def __init__(self, lock: Lock, depth: int = 1) -> None:
        self.lock = lock
        self.depth = depth
        self.held = threading.Event()
        self.go = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for _ in range(self.depth):
                assert self.lock.acquire(timeout=JOIN)
            self.held.set()
            self.go.wait(JOIN)
            for _ in range(self.depth):
                self.lock.release()
        except BaseException as exc:
            self.error = exc
            self.held.set()

    def __enter__(self) -> Holder:
        self.thread.start()
        assert self.held.wait(JOIN), "the holder thread never got the lock"
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.go.set()
        self.thread.join(JOIN)
        assert not self.thread.is_alive(), "the holder thread hung while releasing"
        if self.error is not None:
            raise self.error


def take_and_give_back(lock: Lock, timeout: float = JOIN) -> bool:
    got = lock.acquire(timeout=timeout)
    if got:
        lock.release()
    return got


# -- acquire and release -----------------------------------------------------------------------------------------------


@kinds()
def test_acquire_and_release(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "k")
    assert not lock.is_held_by_current_thread()
    assert lock.acquire() is True
    assert lock.is_held_by_current_thread()
    assert in_thread(lock.is_held_by_current_thread) is False
    lock.release()
    assert not lock.is_held_by_current_thread()
    assert lock.acquire(blocking=False) is True
    lock.release()
    assert lock.acquire(timeout=1) is True
    lock.release()
    assert in_thread(lambda: take_and_give_back(lock)) is True, "the lock was left behind after release"


@kinds()
def test_with_statement_returns_the_lock_and_releases_on_error(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "k")
    inside: list[bool] = []

    def use() -> None:
        with lock as entered:
            inside.append(entered is lock and lock.is_held_by_current_thread())
            raise KeyError("boom")

    with pytest.raises(KeyError):
        use()
    assert inside == [True]
    assert not lock.is_held_by_current_thread()
    assert in_thread(lambda: take_and_give_back(lock)) is True


@kinds()
def test_reentrant_hold_lasts_until_the_last_release(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    rival = kind.rival(backend.other_owner(registry), "k")
    for _ in range(3):
        assert lock.acquire(timeout=5)
    with lock:
        assert lock.is_held_by_current_thread()
    for _ in range(2):
        lock.release()
        assert lock.is_held_by_current_thread()
        assert in_thread(lambda: rival.acquire(blocking=False)) is False, "released one level too early"
    lock.release()
    assert not lock.is_held_by_current_thread()
    assert in_thread(lambda: take_and_give_back(rival)) is True


@kinds(xfail={"multi": MULTI_HAS_NO_HOLD_COUNT})
def test_hold_count_is_the_current_threads_depth(backend: Backend, kind: Kind) -> None:
    lock: Any = kind.make(backend.registry(), "k")
    assert lock.hold_count == 0
    for depth in (1, 2, 3):
        assert lock.acquire()
        assert lock.hold_count == depth
    assert in_thread(lambda: lock.hold_count) == 0
    with lock:
        assert lock.hold_count == 4
    for depth in (2, 1, 0):
        lock.release()
        assert lock.hold_count == depth


# -- held elsewhere: not blocking, timeouts ----------------------------------------------------------------------------


@kinds()
def test_held_elsewhere_non_blocking_and_timed_acquires_fail(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    # Held by another thread of this registry, then (where the backend has one) by another owner.
    holders = [registry, backend.registry()] if backend.shared else [registry]
    for holder_registry in holders:
        with Holder(kind.rival(holder_registry, "k")):
            start = time.monotonic()
            assert lock.acquire(blocking=False) is False
            assert lock.acquire(timeout=0) is False
            assert time.monotonic() - start < 1.0, "a non-blocking acquire waited"
            start = time.monotonic()
            assert lock.acquire(timeout=0.2) is False
            elapsed = time.monotonic() - start
            assert 0.15 <= elapsed <= 2.0, f"acquire(timeout=0.2) took {elapsed:.3f}s"
            assert not lock.is_held_by_current_thread()
        assert lock.acquire(timeout=5) is True
        lock.release()


@kinds()
def test_a_waiting_acquire_gets_the_lock_when_it_is_released(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    with Holder(kind.rival(backend.other_owner(registry), "k")) as holder:
        waited: list[bool] = []
        waiter = threading.Thread(target=lambda: waited.append(take_and_give_back(lock, 5)), daemon=True)
        waiter.start()
        time.sleep(0.1)
        assert not waited, "the waiter got in while the lock was held"
        holder.go.set()
        waiter.join(JOIN)
        assert not waiter.is_alive()
    assert waited == [True]


# -- release by a non-owner, and twice ---------------------------------------------------------------------------------


@kinds()
def test_release_by_a_thread_that_does_not_hold_raises(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    with pytest.raises(hybridlock.LockNotOwnedError):
        lock.release()  # nobody holds it
    with Holder(lock) as holder:
        with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
            lock.release()
        assert isinstance(excinfo.value, RuntimeError)
        assert isinstance(excinfo.value, hybridlock.HybridLockError)
        with pytest.raises(hybridlock.LockNotOwnedError):
            lock.unlock()
        # The failed release changed nothing: the holder still holds.
        assert holder.thread.is_alive()
        rival = kind.rival(backend.other_owner(registry), "k")
        assert in_thread(lambda: rival.acquire(blocking=False)) is False
    assert in_thread(lambda: take_and_give_back(kind.rival(backend.other_owner(registry), "k"))) is True


@kinds()
def test_release_by_a_non_owner_names_the_key(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "k")
    with Holder(lock), pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
        lock.release()
    key = excinfo.value.key
    assert key is not None, "LockNotOwnedError.key is None"
    assert any(name in key for name in kind.keys("k")), key


@kinds()
def test_release_twice_raises(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "k")
    lock.acquire()
    lock.release()
    with pytest.raises(hybridlock.LockNotOwnedError):
        lock.release()
    assert in_thread(lambda: take_and_give_back(lock)) is True, "the failed second release broke the lock"


# -- exclusion with real threads ---------------------------------------------------------------------------------------


@kinds(*EXCLUSIVE)
def test_mutual_exclusion_with_real_threads(backend: Backend, kind: Kind) -> None:
    # Threads of two registries (two owners) where the backend has them, else of one; a non-atomic counter is exact
    # only if no two threads were inside at once, and the marker sees any overlap directly.
    registries = [backend.registry(), backend.registry()] if backend.shared else [backend.registry()]
    locks = [kind.make(registry, "counter") for registry in registries]
    state = {"count": 0, "inside": 0, "max_inside": 0}
    threads_per_lock, rounds = 6 // len(locks), 20

    def work(lock: Lock) -> None:
        for _ in range(rounds):
            with lock:
                state["inside"] += 1
                state["max_inside"] = max(state["max_inside"], state["inside"])
                value = state["count"]
                time.sleep(0.0002)  # invite a race
                state["count"] = value + 1
                state["inside"] -= 1

    run_threads([functools.partial(work, lock) for lock in locks for _ in range(threads_per_lock)], timeout=30)
    assert state == {"count": 6 * rounds, "inside": 0, "max_inside": 1}


# -- read locks: shared among readers, excluded by the writer ----------------------------------------------------------


def test_readers_hold_the_read_lock_together(backend: Backend) -> None:
    # Every reader waits inside the lock for all the others: this ends only if they are all admitted at once.
    registries = [backend.registry(), backend.registry()] if backend.shared else [backend.registry()]
    readers = [registries[i % len(registries)].obtain_read_write("k").read_lock() for i in range(4)]
    all_inside = threading.Barrier(len(readers))

    def read(lock: hybridlock.ReadLock) -> None:
        with lock:
            all_inside.wait(5)

    run_threads([functools.partial(read, lock) for lock in readers])


def test_a_read_hold_keeps_writers_out(backend: Backend) -> None:
    registry = backend.registry()
    reader = registry.obtain_read_write("k").read_lock()
    writer = backend.other_owner(registry).obtain_read_write("k").write_lock()
    with Holder(reader):
        assert in_thread(lambda: writer.acquire(blocking=False)) is False
        start = time.monotonic()
        assert in_thread(lambda: writer.acquire(timeout=0.2)) is False
        assert 0.15 <= time.monotonic() - start <= 2.0
    assert in_thread(lambda: take_and_give_back(writer)) is True


def test_readers_and_writers_exclude_each_other(backend: Backend) -> None:
    registries = [backend.registry(), backend.registry()] if backend.shared else [backend.registry()]
    rws = [registry.obtain_read_write("k") for registry in registries]
    guard = threading.Lock()  # makes the bookkeeping atomic, so the checks see exact numbers
    state = {"readers": 0, "writers": 0, "max_readers": 0, "count": 0, "violations": 0}
    rounds = 15

    def enter(role: str) -> None:
        with guard:
            state[role] += 1
            state["max_readers"] = max(state["max_readers"], state["readers"])
            if state["writers"] > 1 or (state["writers"] and state["readers"]):
                state["violations"] += 1

    def leave(role: str) -> None:
        with guard:
            state[role] -= 1

    def write(rw: hybridlock.ReadWriteLock) -> None:
        for _ in range(rounds):
            with rw.write_lock():
                enter("writers")
                value = state["count"]
                time.sleep(0.0002)
                state["count"] = value + 1
                leave("writers")

    def read(rw: hybridlock.ReadWriteLock) -> None:
        for _ in range(rounds):
            with rw.read_lock():
                enter("readers")
                time.sleep(0.001)
                leave("readers")

    writers = [functools.partial(write, rws[i % len(rws)]) for i in range(2)]
    readers = [functools.partial(read, rws[i % len(rws)]) for i in range(3)]
    run_threads([*writers, *readers], timeout=30)
    assert state["violations"] == 0, "a writer was inside with another writer or a reader"
    assert state["count"] == 2 * rounds
    assert state["readers"] == state["writers"] == 0


# -- Java-style aliases ------------------------------------------------------------------------------------------------


@kinds()
def test_lock_unlock_and_try_lock_aliases(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    assert lock.lock() is None
    assert lock.is_held_by_current_thread()
    lock.unlock()
    assert not lock.is_held_by_current_thread()

    assert lock.try_lock() is True
    assert lock.tryLock() is True  # type: ignore[attr-defined]  # reentrant
    lock.unlock()
    assert lock.is_held_by_current_thread()
    lock.unlock()
    assert not lock.is_held_by_current_thread()

    with Holder(kind.rival(backend.other_owner(registry), "k")):
        start = time.monotonic()
        assert lock.try_lock() is False
        assert lock.try_lock(None) is False
        assert lock.tryLock(0) is False  # type: ignore[attr-defined]
        assert time.monotonic() - start < 1.0, "try_lock() without a timeout must not wait"
        start = time.monotonic()
        assert lock.tryLock(0.2) is False  # type: ignore[attr-defined]
        assert 0.15 <= time.monotonic() - start <= 2.0
    assert lock.try_lock(5) is True
    lock.unlock()


# -- state: locked(), lost, fencing tokens, repr -----------------------------------------------------------------------


@kinds(
    xfail={
        "write": (f"WriteLock {NO_LOCKED}", AttributeError),
        "read": (f"ReadLock {NO_LOCKED}", AttributeError),
        "multi": (f"MultiLock {NO_LOCKED}", AttributeError),
    }
)
def test_locked_reports_a_holder_here_or_elsewhere(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock: Any = kind.make(registry, "k")
    assert lock.locked() is False
    with lock:
        assert lock.locked() is True
    assert lock.locked() is False
    with Holder(lock):
        assert lock.locked() is True, "locked() must see a holder in another thread"
    if backend.shared:
        with Holder(kind.make(backend.registry(), "k")):
            assert lock.locked() is True, "locked() must see a holder in another registry"
    assert lock.locked() is False


@kinds(xfail={"multi": MULTI_HAS_NO_LOST})
def test_lost_is_false_while_held_and_after_a_clean_release(backend: Backend, kind: Kind) -> None:
    lock: Any = kind.make(backend.registry(), "k")
    assert lock.lost is False
    with lock:
        assert lock.lost is False
    assert lock.lost is False


def fencing_tokens(lock: Any) -> list[int | None]:
    """The lock's fencing tokens: one for a plain or write lock, one per key for a multi-key lock."""
    if isinstance(lock, hybridlock.MultiLock):
        return [part.fencing_token for part in lock.locks]
    return [lock.fencing_token]


# A read hold is shared by every reader of a process and says nothing about order between owners: no token.
@kinds(*EXCLUSIVE)
def test_fencing_tokens_grow_with_each_fresh_acquisition(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "k")
    assert fencing_tokens(lock) == [None] * len(kind.keys("k"))
    with lock:
        first = fencing_tokens(lock)
        assert all(isinstance(token, int) for token in first), first
        with lock:
            assert fencing_tokens(lock) == first, "a reentrant acquire is the same tenancy: the same token"
    assert fencing_tokens(lock) == [None] * len(first)
    with lock:
        second = fencing_tokens(lock)
    assert all(b > a for a, b in zip(first, second, strict=True)), (first, second)  # type: ignore[operator]


@kinds()
def test_repr_names_the_key_free_and_held(backend: Backend, kind: Kind) -> None:
    lock = kind.make(backend.registry(), "orders:42")
    free = repr(lock)
    assert "orders:42" in free
    with lock, lock:
        held = repr(lock)
        assert "orders:42" in held
    assert "orders:42" in repr(lock)
    assert in_thread(lambda: repr(lock))  # from a thread that does not hold it


# -- a closed registry -------------------------------------------------------------------------------------------------


@kinds()
def test_a_closed_registry_refuses_use(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    registry.close()
    registry.close()  # idempotent
    assert registry.closed
    with pytest.raises(hybridlock.RegistryClosedError) as excinfo:
        lock.acquire()
    assert isinstance(excinfo.value, RuntimeError)
    assert isinstance(excinfo.value, hybridlock.HybridLockError)
    for use in (lambda: lock.acquire(blocking=False), lock.try_lock, lock.lock, lambda: kind.make(registry, "k")):
        with pytest.raises(hybridlock.RegistryClosedError):
            use()
    with pytest.raises(hybridlock.RegistryClosedError), lock:
        pass
    assert not lock.is_held_by_current_thread()


@kinds()
def test_a_lock_held_at_close_can_still_be_released(backend: Backend, kind: Kind) -> None:
    registry = backend.registry()
    lock = kind.make(registry, "k")
    assert lock.acquire(timeout=5)
    registry.close()
    lock.release()
    assert not lock.is_held_by_current_thread()
    if backend.shared:
        theirs = kind.rival(backend.registry(), "k")
        assert theirs.acquire(blocking=False), "the release after close() left the server hold behind"
        theirs.release()
