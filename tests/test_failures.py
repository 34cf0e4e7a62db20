"""The server dies or freezes: clear ``BackendUnavailableError``s naming the key and server, no hang, no false True.

Each test runs its own server (``own_server``) so it can kill or pause it.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import hybridlock

pytestmark = pytest.mark.server

JOIN_TIMEOUT = 20.0


def assert_unavailable(err: BaseException, key: str, server) -> None:
    assert isinstance(err, hybridlock.BackendUnavailableError), repr(err)
    assert isinstance(err, ConnectionError)
    assert isinstance(err, hybridlock.HybridLockError)
    assert err.key == key
    assert err.server is not None
    assert str(server.port) in err.server
    assert key in str(err)
    assert str(server.port) in str(err)


def outcome_in_thread(call, timeout: float = JOIN_TIMEOUT):
    """Run ``call`` in a new thread; return ("ok", value) or ("raised", exception), failing if it hangs."""
    result: list[tuple[str, object]] = []

    def run() -> None:
        try:
            result.append(("ok", call()))
        except BaseException as exc:
            result.append(("raised", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"hung for more than {timeout}s"
    return result[0]


def test_server_killed_while_a_thread_holds(own_server):
    with hybridlock.LockRegistry(own_server.url) as registry:
        lock = registry.obtain("orders:42")
        assert lock.acquire()
        assert lock.acquire()  # depth 2: the reentrant release needs no server
        own_server.kill()
        lock.release()
        assert lock.hold_count == 1
        start = time.monotonic()
        with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
            lock.release()
        assert time.monotonic() - start < 10.0
        assert_unavailable(excinfo.value, "orders:42", own_server)
        # The local lock is released all the same.
        assert lock.hold_count == 0
        assert not lock.is_held_by_current_thread()
        with pytest.raises(hybridlock.LockNotOwnedError):
            lock.release()
        # Another thread of this process is not stuck behind a leaked local lock: it reaches the (dead) server.
        start = time.monotonic()
        kind, value = outcome_in_thread(lambda: lock.acquire(timeout=5))
        assert kind == "raised", f"acquire against a dead server returned {value!r}"
        assert_unavailable(value, "orders:42", own_server)
        assert time.monotonic() - start < 5.0 + 5.0


def test_server_killed_while_a_thread_waits(own_server):
    with hybridlock.LockRegistry(own_server.url) as holder, hybridlock.LockRegistry(own_server.url) as waiter:
        theirs = holder.obtain("k")
        assert theirs.acquire()
        lock = waiter.obtain("k")
        outcome: list[tuple[str, object, float]] = []
        waiting = threading.Event()

        def wait() -> None:
            waiting.set()
            try:
                outcome.append(("ok", lock.acquire(timeout=10), time.monotonic()))
            except BaseException as exc:
                outcome.append(("raised", exc, time.monotonic()))

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        assert waiting.wait(5)
        time.sleep(0.5)  # it is waiting for the holder now
        assert not outcome, f"the waiter finished early: {outcome}"
        own_server.kill()
        killed_at = time.monotonic()
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive(), "the waiter hung after the server died"
        kind, value, finished_at = outcome[0]
        assert kind == "raised", f"a waiter got {value!r} from a dead server"
        assert_unavailable(value, "k", own_server)
        # Well within its own timeout plus the client's socket timeout (5 s for a URL-made client).
        assert finished_at - killed_at < 8.0, f"took {finished_at - killed_at:.1f}s to notice the server died"
        assert not lock.is_held_by_current_thread()
        # Its local lock is free: a second waiter also reaches the server and fails, instead of timing out.
        kind, value = outcome_in_thread(lambda: lock.acquire(timeout=3))
        assert kind == "raised", value
        assert_unavailable(value, "k", own_server)
        with pytest.raises(hybridlock.BackendUnavailableError):
            theirs.release()
        assert theirs.hold_count == 0


@pytest.mark.parametrize("blocking", [True, False])
def test_acquire_against_a_dead_server_raises_and_leaves_the_local_lock_free(own_server, blocking):
    with hybridlock.LockRegistry(own_server.url) as registry:
        lock = registry.obtain("k")
        with lock:
            pass  # connected once, so the pool holds a connection that is about to break
        own_server.kill()
        kwargs = {"timeout": 5} if blocking else {"blocking": False}
        for _ in range(2):
            start = time.monotonic()
            with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
                lock.acquire(**kwargs)
            assert time.monotonic() - start < 10.0
            assert_unavailable(excinfo.value, "k", own_server)
            assert lock.hold_count == 0
            assert not lock.is_held_by_current_thread()
        # From another thread too: a leaked local lock would make this return False after the timeout instead.
        kind, value = outcome_in_thread(lambda: lock.acquire(timeout=3))
        assert kind == "raised", value
        assert_unavailable(value, "k", own_server)
        with pytest.raises(hybridlock.BackendUnavailableError):
            lock.locked()


def test_acquire_against_a_server_that_was_never_there(own_server):
    url = own_server.url
    own_server.kill()
    with hybridlock.LockRegistry(url) as registry:
        lock = registry.obtain("k")
        with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
            lock.acquire(timeout=5)
        assert_unavailable(excinfo.value, "k", own_server)
        assert lock.hold_count == 0
        with pytest.raises(hybridlock.BackendUnavailableError), lock:
            pytest.fail("entered a lock without a server")


def test_paused_server_makes_acquire_fail_within_a_few_seconds(own_server):
    # A client that does not retry: then one socket timeout is all the delay there is.
    client = redis.Redis(host="127.0.0.1", port=own_server.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        with hybridlock.LockRegistry(client) as registry:
            lock = registry.obtain("k")
            with lock:
                pass
            own_server.pause()
            try:
                for call in (lambda: lock.acquire(timeout=1), lambda: lock.acquire(blocking=False), lock.acquire):
                    start = time.monotonic()
                    kind, value = outcome_in_thread(call)
                    elapsed = time.monotonic() - start
                    assert kind == "raised", f"acquire against a frozen server returned {value!r}"
                    assert_unavailable(value, "k", own_server)
                    assert elapsed < 4.0, f"took {elapsed:.1f}s with a 0.5 s socket timeout"
                    assert not lock.is_held_by_current_thread()
            finally:
                own_server.resume()
            # Once the server answers again, the lock works: nothing was left half-taken.
            assert lock.acquire(timeout=5)
            lock.release()
    finally:
        client.close()


def test_paused_server_never_yields_a_lock_without_the_server(own_server):
    # A holder elsewhere, then the server freezes: a waiter here must not come back with True.
    client = redis.Redis(host="127.0.0.1", port=own_server.port, socket_timeout=0.5, retry=Retry(NoBackoff(), 0))
    try:
        with hybridlock.LockRegistry(own_server.url) as holder, hybridlock.LockRegistry(client) as waiter:
            theirs = holder.obtain("k")
            assert theirs.acquire()
            lock = waiter.obtain("k")
            assert not lock.acquire(blocking=False)
            own_server.pause()
            try:
                kind, value = outcome_in_thread(lambda: lock.acquire(timeout=2))
                assert (kind, value) == ("ok", False) or (
                    kind == "raised" and isinstance(value, hybridlock.BackendUnavailableError)
                ), (kind, value)
                assert not lock.is_held_by_current_thread()
            finally:
                own_server.resume()
            theirs.release()
            assert lock.acquire(timeout=5)
            lock.release()
    finally:
        client.close()


def test_paused_server_with_a_url_made_client_costs_one_socket_timeout(own_server):
    # The registry's own client (5 s socket timeout) must not retry a timeout: acquire(timeout=0.5) against a
    # frozen server fails within the caller's timeout plus one socket timeout.
    with hybridlock.LockRegistry(own_server.url) as registry:
        lock = registry.obtain("k")
        with lock:
            pass
        own_server.pause()
        try:
            start = time.monotonic()
            kind, value = outcome_in_thread(lambda: lock.acquire(timeout=0.5))
            elapsed = time.monotonic() - start
        finally:
            own_server.resume()
        assert kind == "raised", f"acquire against a frozen server returned {value!r}"
        assert_unavailable(value, "k", own_server)
        assert elapsed < 0.5 + 5.0 + 1.5, f"took {elapsed:.1f}s (caller timeout 0.5 s, socket timeout 5 s)"
        assert not lock.is_held_by_current_thread()
        assert lock.acquire(timeout=5)
        lock.release()


def test_a_frozen_servers_error_says_it_hit_the_socket_timeout_not_the_callers(own_server):
    """Issue 34: acquire(timeout=2) on a frozen server raised after 5 s, within the documented bound (the caller's
    timeout plus the socket timeout) but with nothing saying which bound ended it, or why."""
    with hybridlock.LockRegistry(f"{own_server.url}?socket_timeout=1") as registry:
        lock = registry.obtain("k")
        with lock:
            pass
        own_server.pause()
        try:
            start = time.monotonic()
            kind, value = outcome_in_thread(lambda: lock.acquire(timeout=0.2))
            elapsed = time.monotonic() - start
        finally:
            own_server.resume()
    assert kind == "raised", f"acquire against a frozen server returned {value!r}"
    assert_unavailable(value, "k", own_server)
    assert elapsed < 0.2 + 1.0 + 1.5, f"took {elapsed:.1f}s (caller timeout 0.2 s, socket timeout 1 s)"
    message = str(value)
    assert "no answer within the client's socket timeout (socket_timeout=1 s)" in message
    assert "a call's own timeout bounds its wait for the lock, not a request in flight" in message
    assert "TLS" not in message


def test_server_killed_during_condition_wait_raises_a_connection_error(own_server):
    # `with cond: cond.wait()` when the server dies mid-wait: the re-acquire fails, and the caller must see that
    # BackendUnavailableError, not a LockNotOwnedError from the `with` exit hiding it.
    with hybridlock.LockRegistry(own_server.url) as registry:
        lock = registry.obtain("k")
        cond = threading.Condition(lock)
        waiting = threading.Event()

        thread_result: list[tuple[str, object]] = []

        def wait() -> None:
            try:
                with cond:
                    waiting.set()
                    cond.wait(timeout=1)
                thread_result.append(("ok", None))
            except BaseException as exc:
                thread_result.append(("raised", exc))

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        assert waiting.wait(5)
        time.sleep(0.3)  # it is inside cond.wait() now, the lock released
        own_server.kill()
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive(), "the condition waiter hung after the server died"
        kind, value = thread_result[0]
        assert kind == "raised", "cond.wait() came back holding a lock it could not re-acquire"
        assert_unavailable(value, "k", own_server)
        assert not lock.is_held_by_current_thread()
        # The lock object is still consistent: releasing it here is refused as usual.
        with pytest.raises(hybridlock.LockNotOwnedError):
            lock.release()


def test_server_killed_before_condition_wait_raises_a_connection_error(own_server):
    # The server dies while the thread holds the lock, before it calls cond.wait(): Condition's _release_save
    # fails with BackendUnavailableError (the lock is released locally), and the `with` exit must let that
    # error (a ConnectionError) through rather than raise LockNotOwnedError over it.
    with hybridlock.LockRegistry(own_server.url) as registry:
        cond = threading.Condition(registry.obtain("k"))

        def wait_after_the_server_died() -> None:
            with cond:
                own_server.kill()
                cond.wait(timeout=1)

        with pytest.raises(hybridlock.BackendUnavailableError):
            wait_after_the_server_died()
