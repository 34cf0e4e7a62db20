"""Who holds a lock here, where only one side can say it: thread identity (an ident the system hands to the next
thread must not hand it an ended thread's locks), ``with lock.acquire(timeout=...)`` (threads only),
``threading.Condition`` waits, fork, and ``hybridlock inspect`` run as a command. The rest of what happens to a hold
whose holder is gone is in ``tests/_async/test_dead_owners.py`` (and its generated thread twin).
"""

from __future__ import annotations

import _thread
import asyncio
import gc
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import hybridlock
from hybridlock.errors import LockNotOwnedError, LockTimeoutError
from tests._polling import until
from tests._sync.helpers import KINDS, Kind
from tests.test_fork import Child

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]

LEASE = 1.0
WITHIN = LEASE + LEASE / 3 + 2.5  # (see tests/_async/test_dead_owners.py)
ALL_KINDS = [pytest.param(KINDS[name], id=name) for name in KINDS]


def in_thread(target: Any, name: str | None = None) -> Any:
    """``target()``'s result, computed in a thread of its own that has ended when this returns."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the thread hung"
    if errors:
        raise errors[0]
    return out[0]


# -- a thread is one owner, from its first lock to its end ---------------------------------------------------------


def test_each_thread_is_one_owner_that_ends_with_it() -> None:
    from hybridlock._sync._compat import current_owner, owner_alive, owner_ident, owner_name

    me = current_owner()
    assert current_owner() is me
    assert owner_ident(me) == threading.get_ident()
    assert owner_alive(me)
    assert owner_name(me) == threading.current_thread().name
    theirs = in_thread(current_owner, name="short-lived")
    assert theirs is not me
    assert owner_name(theirs) == "short-lived"
    assert not owner_alive(theirs)  # ended (its threading.local was cleared)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_new_thread_with_an_ended_threads_ident_does_not_own_its_lock(make_registry: Any, kind: Kind) -> None:
    # The system hands an ended thread's ident to the next thread (glibc: usually the very next one). Keyed on the
    # ident, that thread would re-enter and release a hold it never took (threading.RLock does); the hold belongs to
    # the ended thread, whose lease then ends (tests/_async/test_dead_owners.py).
    registry = make_registry()  # 30 s lease: nothing ends during the test
    lock = kind.make(registry, "reused")
    ended_ident = in_thread(lambda: lock.acquire(timeout=10) and threading.get_ident())
    for _ in range(200):
        seen = in_thread(
            lambda: {
                "ident": threading.get_ident(),
                "held": lock.is_held_by_current_thread(),
                "depth": lock.hold_count,
                "took": kind.name != "read" and lock.acquire(blocking=False),
                "release": _release_error(lock),
            }
        )
        if seen["ident"] == ended_ident:
            break
    else:
        pytest.skip("no thread got an ended thread's ident in 200 tries on this platform")
    assert seen == {"ident": ended_ident, "held": False, "depth": 0, "took": False, "release": "LockNotOwnedError"}


def _release_error(lock: Any) -> str:
    try:
        lock.release()
    except LockNotOwnedError:
        return "LockNotOwnedError"
    return "released"


def test_a_thread_not_started_by_threading_is_an_owner_too(caplog: pytest.LogCaptureFixture) -> None:
    # acquire() called straight from C (no Python frame above it), in a thread threading knows nothing of: it takes
    # the lock, and once that thread has ended its hold is found and ended like any other.
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    registry = hybridlock.LocalLockRegistry()
    try:
        lock = registry.obtain("foreign")
        _thread.start_new_thread(lock.acquire, ())
        until(lambda: lock.statistics().owner_thread is not None, what="the foreign thread to take the lock")
        assert lock.statistics().acquired_from is None  # (no frame to tell)
        assert in_thread(lambda: _take_and_give_back(lock, timeout=WITHIN)), "its hold was never ended"
        (warning,) = [record.getMessage() for record in caplog.records if "still holding" in record.getMessage()]
        assert "'foreign'" in warning
    finally:
        registry.close()


# -- `with lock.acquire(timeout=...):` -------------------------------------------------------------------------------


@pytest.fixture(params=["local", "redis"])
def registries(request: pytest.FixtureRequest) -> Any:
    """Two owners of the same keys (one, for LocalLockRegistry: its other owner is another thread)."""
    if request.param == "local":
        registry = hybridlock.LocalLockRegistry()
        yield registry, registry
        registry.close()
    else:
        make = request.getfixturevalue("make_registry")
        yield make(), make()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_with_acquire_works_as_in_filelock(registries: Any, kind: Kind) -> None:
    mine, other = registries
    lock = kind.make(mine, "k")
    with lock.acquire(timeout=5) as entered:
        assert entered is lock
        assert lock.is_held_by_current_thread()
    assert not lock.is_held_by_current_thread()
    with lock.try_lock(5) as entered, lock.acquire(timeout=5):  # reentrant inside
        assert entered is lock
        assert lock.hold_count == 2
    assert lock.hold_count == 0
    with lock.lock():
        assert lock.hold_count == 1
    assert lock.hold_count == 0
    # Everywhere else acquire() returns exactly True or False, as threading.RLock's does.
    assert lock.acquire(timeout=5) is True
    lock.release()
    assert in_thread(lambda: _take_and_give_back(kind.rival(other, "k"))) is True, "left held"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_with_acquire_of_a_busy_lock_runs_nothing_and_holds_nothing(registries: Any, kind: Kind) -> None:
    mine, other = registries
    lock = kind.make(mine, "k")
    rival = kind.rival(other, "k")
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with rival:
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        ran = []
        with pytest.raises(LockTimeoutError) as caught, lock.acquire(timeout=0.2):
            ran.append(True)
        assert ran == []
        assert caught.value.key == (getattr(lock, "key", None) or lock.keys[0])
        with pytest.raises(LockTimeoutError), lock.acquire(blocking=False):
            ran.append(True)
        assert ran == []
        assert lock.acquire(blocking=False) is False
        assert not lock.is_held_by_current_thread()
    finally:
        done.set()
        holder.join(30)


def _take_and_give_back(lock: Any, timeout: float = 10) -> bool:
    if not lock.acquire(timeout=timeout):
        return False
    lock.release()
    return True


def test_async_with_acquire_takes_nothing(server: Any) -> None:
    # `async with lock.acquire(...)` fails on the coroutine, which never runs: nothing is taken, Python warns.
    async def main() -> None:
        async with hybridlock.AsyncLockRegistry(server.url) as registry:
            lock = registry.obtain("k")
            with pytest.raises((TypeError, AttributeError)):
                async with lock.acquire(timeout=1):  # type: ignore[attr-defined]
                    pass
            assert not lock.is_held_by_current_task()
            assert not await registry.obtain("k").locked()

    def run_and_collect() -> None:
        asyncio.run(main())
        gc.collect()

    with pytest.warns(RuntimeWarning, match="never awaited"):
        run_and_collect()


# -- holders that are still there ------------------------------------------------------------------------------------


def test_a_condition_wait_is_not_a_gone_holder(make_registry: Any, caplog: pytest.LogCaptureFixture) -> None:
    # wait() releases the lock (no holder meanwhile) and takes it back in threading.py: where the caller took it
    # stays what statistics() says.
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    registry = make_registry(expire_after=LEASE)
    lock = registry.obtain("cond")
    condition = threading.Condition(lock)

    def wait() -> tuple[str | None, str | None, bool, bool]:
        with condition:
            before = lock.statistics().acquired_from
            condition.wait(timeout=3 * LEASE)
            time.sleep(2 * LEASE)  # held again, across renewals
            stats = lock.statistics()
            return before, stats.acquired_from, stats.abandoned, lock.lost

    before, after, abandoned, lost = in_thread(wait)
    assert before is not None
    assert before.endswith(f"test_owners.py:{wait.__code__.co_firstlineno + 1}")
    assert after == before
    assert not abandoned
    assert not lost
    assert not [record for record in caplog.records if "still holding" in record.getMessage()]


# -- fork -------------------------------------------------------------------------------------------------------------


def test_a_forked_child_tells_its_own_gone_holders_from_its_live_ones(make_registry: Any, server: Any) -> None:
    registry = make_registry(expire_after=LEASE)
    parent_lock = registry.obtain("parent")
    assert parent_lock.acquire()  # held by the forking thread: the child holds none of it

    def child(report: Any, wait_for_parent: Any) -> None:
        kept = registry.obtain("child-kept")
        assert kept.acquire(timeout=10)  # by the thread that forked, which lives on in the child
        taker = threading.Thread(target=lambda: registry.obtain("child-gone").acquire(timeout=10))
        taker.start()
        taker.join(10)
        other = hybridlock.LockRegistry(server.url, expire_after=LEASE)
        start = time.monotonic()
        got = other.obtain("child-gone").acquire(timeout=WITHIN)
        took = time.monotonic() - start
        time.sleep(LEASE)
        stats = kept.statistics()
        report({"got": got, "took": took, "kept_abandoned": stats.abandoned, "kept_lost": kept.lost})

    process = Child(child)
    try:
        facts = process.next_report(timeout=30)
        assert process.wait() == 0
    finally:
        process.close()
    assert facts["got"] is True
    assert facts["took"] < WITHIN
    assert facts["kept_abandoned"] is False
    assert facts["kept_lost"] is False
    assert parent_lock.statistics().abandoned is False
    parent_lock.release()


# -- hybridlock inspect -----------------------------------------------------------------------------------------------


def test_inspect_shows_a_gone_holder(make_registry: Any, server: Any) -> None:
    registry = make_registry(expire_after=9.0)  # looked at every 3 s, ends 9 s after the grant
    lock = registry.obtain("gone")

    def take() -> int:
        line = sys._getframe().f_lineno + 1
        assert lock.acquire(timeout=10)
        return line

    line = in_thread(take, name="forgetful")
    site = f"test_owners.py:{line}"
    env = {key: value for key, value in os.environ.items() if key != "HYBRIDLOCK_REGISTRY_KEY"}
    env["HYBRIDLOCK_SERVER_URL"] = server.url

    def inspect(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "hybridlock", "inspect", *args, "gone"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    def abandoned() -> dict[str, Any] | None:
        (state,) = json.loads(inspect("--json"))["locks"]
        holder: dict[str, Any] | None = state["holder"]
        return holder if holder is not None and holder["abandoned"] else None

    holder = until(abandoned, what="inspect to show the hold abandoned", timeout=8)
    assert holder["thread"] == "forgetful"
    assert holder["site"].endswith(site)
    text = inspect()
    assert "ABANDONED" in text
    assert site in text
