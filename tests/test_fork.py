"""Fork safety: a child of ``os.fork()`` holds none of its parent's locks, has its own client_id, and works.

The child never asserts: it records what it saw, sends it to the parent as JSON lines over a pipe, and always
leaves through ``os._exit``. The parent checks, and bounds every wait.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable

import pytest

import hybridlock

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
]


class Child:
    """A forked child running ``body(report, wait_for_parent)``; the parent reads reports with ``next_report``."""

    def __init__(self, body: Callable[[Callable[[dict], None], Callable[[], None]], None]) -> None:
        up_read, up_write = os.pipe()  # child -> parent
        down_read, down_write = os.pipe()  # parent -> child
        with warnings.catch_warnings():
            # Python 3.12+ warns about forking a process with threads; forking one is the point here.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the child
            code = 0
            try:
                os.close(up_read)
                os.close(down_write)

                def report(facts: dict) -> None:
                    os.write(up_write, (json.dumps(facts) + "\n").encode())

                def wait_for_parent() -> None:
                    ready, _, _ = select.select([down_read], [], [], 30)
                    if not ready or not os.read(down_read, 1):
                        raise RuntimeError("the parent never said go")

                body(report, wait_for_parent)
            except BaseException:
                code = 1
                try:
                    os.write(up_write, (json.dumps({"child_error": traceback.format_exc()}) + "\n").encode())
                except BaseException:
                    pass
            finally:
                os._exit(code)
        os.close(up_write)
        os.close(down_read)
        self.pid = pid
        self._up = up_read
        self._down = down_write
        self._buffer = b""

    def next_report(self, timeout: float = 15.0) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._up], [], [], max(0.0, left))
            assert ready, f"the child sent nothing for {timeout}s"
            chunk = os.read(self._up, 65536)
            assert chunk, "the child exited without reporting"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        facts = json.loads(line)
        assert "child_error" not in facts, facts["child_error"]
        return facts

    def go(self) -> None:
        os.write(self._down, b"g")

    def wait(self, timeout: float = 15.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.pid = 0
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.02)
        raise AssertionError(f"the child did not exit within {timeout}s")

    def close(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.pid = 0
        for fd in (self._up, self._down):
            try:
                os.close(fd)
            except OSError:
                pass


def stored_owner(client, registry_key: str, key: str) -> str | None:
    """The owner id the server key of lock ``key`` holds (whatever the exact layout; a lock granted by a release
    holds "<owner>|<token>"), or None."""
    owners = [
        value.decode().partition("|")[0]
        for name in client.scan_iter(match=f"{registry_key}*{key}*")
        if client.type(name) == b"string" and (value := client.get(name)) is not None and not value.isdigit()
    ]
    assert len(owners) <= 1, owners
    return owners[0] if owners else None


def test_child_of_the_holding_thread_holds_nothing_and_works(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("parent-key")
    assert lock.acquire()
    assert lock.acquire()  # depth 2 in the forking thread
    parent_id = registry.client_id

    def child(report, wait_for_parent):
        facts: dict = {"client_id": registry.client_id}
        facts["hold_count"] = lock.hold_count
        facts["held_here"] = lock.is_held_by_current_thread()
        facts["held_locks"] = [held.key for held in registry.held_locks()]
        try:
            lock.release()
            facts["release"] = "no error"
        except Exception as exc:
            facts["release"] = type(exc).__name__
            facts["release_is_runtime_error"] = isinstance(exc, RuntimeError)
            facts["release_is_not_owned"] = isinstance(exc, hybridlock.LockNotOwnedError)
        facts["hold_count_after_release"] = lock.hold_count
        facts["locked"] = lock.locked()
        facts["nonblocking"] = lock.acquire(blocking=False)
        facts["timed"] = lock.acquire(timeout=0.3)
        other = registry.obtain("child-key")
        facts["other_acquired"] = other.acquire(timeout=5)
        facts["other_owner"] = stored_owner(redis_client, registry.registry_key, "child-key")
        other.release()
        facts["other_owner_after"] = stored_owner(redis_client, registry.registry_key, "child-key")
        report(facts)

        wait_for_parent()  # the parent has released its lock
        later: dict = {"acquired": lock.acquire(timeout=5)}
        later["owner"] = stored_owner(redis_client, registry.registry_key, "parent-key")
        later["hold_count"] = lock.hold_count
        lock.release()
        later["owner_after"] = stored_owner(redis_client, registry.registry_key, "parent-key")
        report(later)

    forked = Child(child)
    try:
        facts = forked.next_report()
        child_id = facts.pop("client_id")
        assert child_id != parent_id, "the child kept its parent's client_id"
        assert facts == {
            "hold_count": 0,
            "held_here": False,
            "held_locks": [],
            "release": "LockNotOwnedError",
            "release_is_runtime_error": True,
            "release_is_not_owned": True,
            "hold_count_after_release": 0,
            "locked": True,  # by the parent, as the server says
            "nonblocking": False,
            "timed": False,
            "other_acquired": True,
            "other_owner": child_id,
            "other_owner_after": None,
        }
        # The child's attempts changed nothing for the parent.
        assert lock.hold_count == 2
        assert lock.is_held_by_current_thread()
        assert stored_owner(redis_client, registry.registry_key, "parent-key") == parent_id
        lock.release()
        lock.release()  # clean: the key was still ours
        forked.go()
        later = forked.next_report()
        assert later == {"acquired": True, "owner": child_id, "hold_count": 1, "owner_after": None}
        assert forked.wait() == 0
    finally:
        forked.close()
    # The parent's registry still works after the child is gone.
    assert lock.acquire(timeout=5)
    assert stored_owner(redis_client, registry.registry_key, "parent-key") == parent_id
    lock.release()


def test_child_holds_nothing_that_another_parent_thread_held(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("k")
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(20)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(5)

    def child(report, wait_for_parent):
        facts = {"client_id": registry.client_id, "hold_count": lock.hold_count, "locked": lock.locked()}
        facts["nonblocking"] = lock.acquire(blocking=False)
        report(facts)
        wait_for_parent()
        facts = {"acquired": lock.acquire(timeout=5)}
        lock.release()
        report(facts)

    forked = Child(child)
    try:
        facts = forked.next_report()
        assert facts["client_id"] != registry.client_id
        assert facts["hold_count"] == 0
        assert facts["locked"] is True
        assert facts["nonblocking"] is False, "the child entered a lock a parent thread held at fork time"
        done.set()
        holder.join(10)
        assert not holder.is_alive()
        forked.go()
        assert forked.next_report() == {"acquired": True}
        assert forked.wait() == 0
    finally:
        done.set()
        forked.close()


def test_each_child_gets_its_own_client_id_and_excludes_the_others(make_registry, redis_client):
    registry = make_registry()
    registry.obtain("shared")  # the object exists before the fork, as in a pre-forking server

    def child(report, wait_for_parent):
        lock = registry.obtain("shared")
        got = lock.acquire(timeout=10)
        owner = stored_owner(redis_client, registry.registry_key, "shared")
        time.sleep(0.2)
        still = stored_owner(redis_client, registry.registry_key, "shared")
        lock.release()
        report({"client_id": registry.client_id, "got": got, "owner": owner, "still": still})

    children = [Child(child) for _ in range(3)]
    try:
        reports = [c.next_report(30) for c in children]
        assert [c.wait() for c in children] == [0, 0, 0]
    finally:
        for c in children:
            c.close()
    ids = {r["client_id"] for r in reports}
    assert len(ids) == 3
    assert registry.client_id not in ids
    for r in reports:
        assert r["got"] is True
        assert r["owner"] == r["client_id"] == r["still"], "another child took the lock from its holder"


def test_a_retained_lease_stays_the_parents_and_a_child_can_take_the_lock(make_registry, redis_client):
    registry = make_registry(retain_for=60.0)
    lock = registry.obtain("kept")
    with lock:
        pass
    assert lock.statistics().retained
    parent_id = registry.client_id

    def child(report, wait_for_parent):
        stats = lock.statistics()
        facts: dict = {"client_id": registry.client_id, "retained": stats.retained, "holds": stats.holds_server_lease}
        # The parent keeps the lease idle; the child's refused attempt makes the parent's reaper give it back.
        facts["acquired"] = lock.acquire(timeout=10)
        facts["owner"] = stored_owner(redis_client, registry.registry_key, "kept")
        lock.release()
        facts["retained_after"] = lock.statistics().retained  # the child's own retention, by its own reaper
        registry.close()  # gives the child's retained lease back
        facts["owner_after_close"] = stored_owner(redis_client, registry.registry_key, "kept")
        report(facts)

    forked = Child(child)
    try:
        facts = forked.next_report()
        child_id = facts.pop("client_id")
        assert child_id != parent_id
        assert facts == {
            "retained": False,
            "holds": False,
            "acquired": True,
            "owner": child_id,
            "retained_after": True,
            "owner_after_close": None,
        }
        assert forked.wait() == 0
    finally:
        forked.close()
    deadline = time.monotonic() + 5
    while lock.statistics().holds_server_lease and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not lock.statistics().holds_server_lease  # the parent gave its idle lease up for the child
    assert lock.acquire(timeout=5)
    assert stored_owner(redis_client, registry.registry_key, "kept") == parent_id
    lock.release()


def test_a_child_works_even_if_a_parent_thread_was_inside_the_memory_backend_at_fork():
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("in-memory")
    backend = registry.backend
    inside, leave = threading.Event(), threading.Event()

    def occupy() -> None:
        with backend._cond:  # type: ignore[attr-defined]
            inside.set()
            leave.wait(30)

    occupant = threading.Thread(target=occupy, daemon=True)
    occupant.start()
    assert inside.wait(5)

    def child(report, wait_for_parent):
        facts = {"acquired": lock.acquire(timeout=5)}
        if facts["acquired"]:
            lock.release()
        report(facts)

    forked = Child(child)
    try:
        leave.set()
        assert forked.next_report(timeout=15) == {"acquired": True}
        assert forked.wait() == 0
    finally:
        forked.close()
        occupant.join(5)
        registry.close()


def test_a_child_keeps_the_registrys_observer(make_registry, redis_client):
    events: list = []

    class Recorder:
        def on_acquire(self, event):
            events.append(("acquire", event.key, event.outcome))

        def on_release(self, event):
            events.append(("release", event.key, event.outcome, event.held_for is not None))

    observer = Recorder()
    registry = make_registry(observer=observer)
    lock = registry.obtain("parent-key")
    assert lock.acquire()

    def child(report, wait_for_parent):
        del events[:]  # the parent's, copied by the fork
        with registry.obtain("child-key"):
            pass
        try:
            lock.release()  # the parent's hold: not the child's to release (and not reported)
        except hybridlock.LockNotOwnedError:
            pass
        report({"same_observer": registry.observer is observer, "events": events})

    forked = Child(child)
    try:
        facts = forked.next_report()
        assert forked.wait() == 0
    finally:
        forked.close()
    assert facts["same_observer"] is True
    assert facts["events"] == [["acquire", "child-key", "acquired"], ["release", "child-key", "released", True]]
    lock.release()


def test_a_fork_while_another_thread_is_inside_the_clients_pool_leaves_the_child_working(make_registry):
    # A thread of the parent (here a stand-in for the registry's subscriber connecting) holds the pool's lock at the
    # moment of the fork. The child inherits the lock held by a thread it does not have: before the fix, its first
    # command hung for ever in redis-py's reset of the pool. The fork now waits for the pool to be free.
    registry = make_registry()
    lock = registry.obtain("pool-busy")
    with lock:
        pass
    pool_lock = registry.backend.client.connection_pool._lock
    inside, leave = threading.Event(), threading.Event()

    def busy() -> None:
        with pool_lock:
            inside.set()
            leave.wait(5)

    holder = threading.Thread(target=busy, daemon=True)
    holder.start()
    assert inside.wait(5)
    threading.Timer(0.3, leave.set).start()

    def child(report, wait_for_parent):
        facts = {"acquired": lock.acquire(timeout=5)}
        lock.release()
        report(facts)

    forked = Child(child)
    try:
        assert forked.next_report(timeout=10) == {"acquired": True}
        assert forked.wait() == 0
    finally:
        leave.set()
        forked.close()
    holder.join(5)
