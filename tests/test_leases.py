"""Lease renewal, loss detection, manual renewal and max_hold, on a real server."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import hybridlock
from hybridlock._sync.wait_keeper import IDLE_LINGER

pytestmark = pytest.mark.server


def _wait_until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_renewal_keeps_a_live_holder_past_several_leases(make_registry, redis_client):
    holder, rival = make_registry(expire_after=0.6), make_registry(expire_after=0.6)
    lock = holder.obtain("job")
    with lock:
        end = time.monotonic() + 2.5  # four leases
        while time.monotonic() < end:
            assert not rival.obtain("job").acquire(blocking=False)
            assert redis_client.pttl("hybridlock:{job}") > 0
            time.sleep(0.1)
        assert not lock.lost
    # Released cleanly: no LockLostError above, and the key is gone.
    assert not redis_client.exists("hybridlock:{job}")


def test_key_deleted_behind_the_holder_is_noticed_within_one_period(make_registry, redis_client):
    registry = make_registry(expire_after=1.5)  # renewal period 0.5 s
    seen_by_lock, seen_by_registry = [], []
    registry.on_lost(seen_by_registry.append)
    lock = registry.obtain("job")
    lock.on_lost(seen_by_lock.append)
    lock.acquire()
    redis_client.delete("hybridlock:{job}")
    deleted_at = time.monotonic()
    assert _wait_until(lambda: lock.lost, timeout=3.0)
    assert time.monotonic() - deleted_at < 0.5 + 0.5  # one period plus generous slack
    time.sleep(0.7)  # further renewals must not call the callbacks again
    assert seen_by_lock == [lock]
    assert seen_by_registry == [lock]
    # Held still, so not None, but past: the check the docs advise says the lease is no longer certainly ours.
    assert lock.valid_until is not None
    assert not time.monotonic() < lock.valid_until
    with pytest.raises(hybridlock.LockLostError) as info:
        lock.release()
    assert info.value.key == "job"
    assert not lock.is_held_by_current_thread()
    # The next successful acquire clears the flag.
    with lock:
        assert not lock.lost


def test_loss_is_reported_when_another_owner_took_the_key(make_registry, redis_client):
    registry, rival = make_registry(expire_after=1.5), make_registry()
    lock = registry.obtain("job")
    lock.acquire()
    redis_client.set("hybridlock:{job}", rival.client_id, px=5000)
    assert _wait_until(lambda: lock.lost, timeout=3.0)
    with pytest.raises(hybridlock.LockLostError):
        lock.release()
    assert redis_client.get("hybridlock:{job}").decode() == rival.client_id  # the other's key is untouched


def test_max_hold_stops_renewal(make_registry):
    registry = make_registry(expire_after=0.6, max_hold=0.5)
    rival = make_registry()
    lock = registry.obtain("stuck")
    lock.acquire()
    started = time.monotonic()
    assert rival.obtain("stuck").acquire(timeout=5.0)
    # Not renewed after max_hold, so the key ended at most one lease later.
    assert time.monotonic() - started < 0.5 + 0.6 + 1.0
    assert _wait_until(lambda: lock.lost, timeout=2.0)
    with pytest.raises(hybridlock.LockLostError):
        lock.release()
    rival.obtain("stuck").release()


def test_renew_by_hand(make_registry, redis_client):
    registry = make_registry(expire_after=0.5, auto_renew=False)
    lock = registry.obtain("manual")
    with pytest.raises(hybridlock.LockNotOwnedError):
        lock.renew()
    lock.acquire()
    first_deadline = lock.valid_until
    lock.renew(3.0)
    assert lock.valid_until > first_deadline
    assert redis_client.pttl("hybridlock:{manual}") > 2000
    time.sleep(0.8)  # past the original lease
    registry.renew_lock("manual")
    assert redis_client.get("hybridlock:{manual}").decode() == registry.client_id
    redis_client.delete("hybridlock:{manual}")
    with pytest.raises(hybridlock.LockLostError):
        registry.renew_lock("manual")
    assert lock.lost
    with pytest.raises(hybridlock.LockLostError):
        lock.release()
    with pytest.raises(hybridlock.LockNotOwnedError):
        registry.renew_lock("manual")


def test_renewal_from_a_watchdog_thread(make_registry):
    registry = make_registry(expire_after=0.5, auto_renew=False)
    lock = registry.obtain("watched")
    errors = []
    with lock:

        def watchdog() -> None:
            try:
                lock.renew(5.0)
            except Exception as exc:
                errors.append(exc)

        thread = threading.Thread(target=watchdog)
        thread.start()
        thread.join(5)
        time.sleep(0.8)
    assert errors == []


def test_valid_until_is_a_conservative_monotonic_deadline(make_registry):
    registry = make_registry(expire_after=2.0)
    lock = registry.obtain("v")
    assert lock.valid_until is None
    before = time.monotonic()
    with lock:
        assert before < lock.valid_until < before + 2.0
    assert lock.valid_until is None


def test_many_held_locks_are_renewed_in_one_round_trip_per_period(make_registry, redis_client):
    registry = make_registry(expire_after=1.5)  # period 0.5 s
    locks = [registry.obtain(f"bulk:{i}") for i in range(2000)]
    for lock in locks:
        lock.acquire()
    runner = registry.backend._scripts
    round_trips = []  # one entry per call that reaches the server (a script, or one pipeline of scripts)
    single, pipelined = runner.run, runner.run_many

    def counted_run(*args, **kwargs):  # type: ignore[no-untyped-def]
        round_trips.append("run")
        return single(*args, **kwargs)

    def counted_run_many(source, calls):  # type: ignore[no-untyped-def]
        round_trips.append(f"pipeline of {len(calls)}")
        return pipelined(source, calls)

    runner.run, runner.run_many = counted_run, counted_run_many
    try:
        redis_client.config_resetstat()
        time.sleep(1.6)  # three periods
        assert 2 <= len(round_trips) <= 4, round_trips  # one round trip per period for all 2000 locks
        assert set(round_trips) == {"pipeline of 4"}  # in scripts of 500 keys, so no single script runs long
        assert all(redis_client.pttl(f"hybridlock:{{bulk:{i}}}") > 0 for i in (0, 999, 1999))
    finally:
        runner.run, runner.run_many = single, pipelined
        for lock in locks:
            lock.release()


def test_renewer_and_listener_are_one_thread_each_per_registry(make_registry):
    registry, rival = make_registry(expire_after=2.0), make_registry(expire_after=2.0)
    before = {t.name for t in threading.enumerate()}
    for i in range(20):
        registry.obtain(f"t:{i}").acquire()
    held_by_rival = rival.obtain("t:0")
    waiters = [threading.Thread(target=held_by_rival.acquire, kwargs={"timeout": 0.5}) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(5)
    names = [t.name for t in threading.enumerate() if t.name not in before]
    assert names.count("hybridlock-renewer-hybridlock") == 1
    assert names.count("hybridlock-pubsub-listener") <= 1
    for i in range(20):
        registry.obtain(f"t:{i}").release()
    registry.close()
    rival.close()
    time.sleep(0.1)
    left = [t for t in threading.enumerate() if t.name.startswith("hybridlock-")]
    assert left == []


def test_renewal_of_locks_in_different_slots_works_on_a_cluster():
    # On a server in cluster mode, RENEW is sent once per slot: one call across slots would be refused
    # (CROSSSLOT) and every held lock marked lost.
    from tests.test_contract import cluster_mode_server

    srv = cluster_mode_server()
    try:
        with hybridlock.LockRegistry(srv.url, expire_after=1.0) as registry:
            a, b = registry.obtain("a"), registry.obtain("b")  # slots 15495 and 3300
            assert a.acquire()
            assert b.acquire()
            time.sleep(2.0)  # two lease lengths: renewal must have kept both alive
            assert not a.lost
            assert not b.lost
            a.release()
            b.release()
    finally:
        srv.stop()


def test_a_renewal_reply_racing_a_release_is_not_a_loss(any_registry_factory):
    """The renewer may find the key gone because our own release just deleted it: that is no loss."""
    registry = any_registry_factory()
    lock = registry.obtain("race")
    called = []
    lock.on_lost(called.append)
    lock.acquire()
    snapshot = lock._tenancy  # what a renewal round in flight remembers
    backend = registry.backend
    release = backend.release

    def release_then_late_renewal_reply(*args, **kwargs):  # type: ignore[no-untyped-def]
        released = release(*args, **kwargs)
        lock._mark_lost(snapshot)  # the renewal reply for the key we just deleted arrives now
        return released

    backend.release = release_then_late_renewal_reply
    try:
        lock.release()  # must not raise LockLostError
    finally:
        del backend.release
    assert called == []
    assert not lock.lost


@pytest.mark.parametrize("kind", ["plain", "write", "read"])
def test_a_renewal_round_that_starts_during_the_release_is_not_a_loss(make_registry, kind):
    """A round that looks at the lease while its final release is under way (the tenancy already being given back,
    the lease not yet forgotten) and sends RENEW after RELEASE finds the key gone: no loss either."""
    registry = make_registry(expire_after=30)
    backend = registry.backend
    if kind == "plain":
        lock = registry.obtain("race")
        method = "release"
    else:
        rw = registry.obtain_read_write("race")
        lock = rw.write_lock() if kind == "write" else rw.read_lock()
        method = "release_write" if kind == "write" else "release_read"
    called = []
    lock.on_lost(called.append)
    registry.on_lost(called.append)
    real_release = getattr(backend, method)

    def release_then_renewal_round(*args, **kwargs):  # type: ignore[no-untyped-def]
        released = real_release(*args, **kwargs)
        registry._context.renewer.renew_once()  # a full round, snapshot and RENEW, landing after our RELEASE
        return released

    setattr(backend, method, release_then_renewal_round)
    lock.acquire()
    lock.release()  # must not raise LockLostError
    assert called == []
    assert not lock.lost


@pytest.mark.parametrize("kind", ["plain", "write", "read", "multi"])
def test_a_reentrant_acquire_of_a_lock_known_lost_raises(make_registry, redis_client, kind):
    """Counting locally would tell the caller it holds a lock another owner may hold by now."""
    registry = make_registry(expire_after=30)
    if kind in ("plain", "multi"):
        part = registry.obtain("gone")
        lock = registry.obtain_many(["gone", "other"]) if kind == "multi" else part
        server_key = "hybridlock:{gone}"
    else:
        rw = registry.obtain_read_write("gone")
        part = lock = rw.write_lock() if kind == "write" else rw.read_lock()
        server_key = "hybridlock:{gone}:" + ("writer" if kind == "write" else "readers")
    lock.acquire()
    redis_client.delete(server_key)  # an operator, an eviction or a FLUSHALL
    registry._context.renewer.renew_once()
    assert part.lost
    with pytest.raises(hybridlock.LockLostError) as raised:
        lock.acquire()
    assert raised.value.key == "gone"
    with pytest.raises(hybridlock.LockLostError):
        lock.acquire(blocking=False)
    with pytest.raises(hybridlock.LockLostError):
        lock.release()  # the one real hold ends, with the loss reported
    assert not lock.is_held_by_current_thread()
    assert lock.acquire(timeout=5)  # afresh
    lock.release()


def test_a_new_reader_thread_does_not_join_a_lost_read_hold(make_registry, redis_client):
    registry = make_registry(expire_after=30)
    read = registry.obtain_read_write("gone").read_lock()
    read.acquire()
    redis_client.delete("hybridlock:{gone}:readers")
    registry._context.renewer.renew_once()
    assert read.lost
    joined = []
    late = threading.Thread(target=lambda: joined.append(read.acquire(timeout=0.3)))
    late.start()
    late.join(5)
    assert joined == [False]  # it waited for the lost hold to drain instead of sharing it
    got = []

    def reader_after_drain() -> None:
        got.append(read.acquire(timeout=5))
        read.release()

    later = threading.Thread(target=reader_after_drain)
    later.start()
    with pytest.raises(hybridlock.LockLostError):
        read.release()
    later.join(10)
    assert got == [True]  # a fresh read hold once the lost one was given back


# -- the renewer never dies ---------------------------------------------------------------------------------------


class _FaultyRenewal:
    """Wraps a backend's ``renew``: while ``error`` is set, every call raises it (an error nobody translated)."""

    def __init__(self, registry: hybridlock.LockRegistry) -> None:
        self._renew = registry.backend.renew
        self.error: BaseException | None = None
        self.calls = 0
        registry.backend.renew = self  # type: ignore[method-assign]

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self._renew(*args, **kwargs)


@pytest.mark.parametrize("error", [TypeError("not a bytes-like object"), RuntimeError("a bug"), OverflowError()])
def test_a_renewal_that_raises_anything_reports_the_loss_and_the_renewer_carries_on(
    make_registry, redis_client, caplog, error
):
    registry = make_registry(expire_after=0.6)  # renewal period 0.2 s
    fault = _FaultyRenewal(registry)
    lock, other = registry.obtain("victim"), registry.obtain("other")
    lost: list[object] = []
    lock.on_lost(lost.append)
    assert lock.acquire(timeout=5)
    renewer = registry._context.renewer
    assert renewer is not None
    worker = renewer._worker
    assert worker is not None

    with caplog.at_level("WARNING", logger="hybridlock"):
        fault.error = error
        # (The callbacks run just after the flag goes up, in whichever thread found the loss: wait for them.)
        assert _wait_until(lambda: lost, 3.0), "a renewer that raised left the lease to lapse unreported"
        assert lock.lost
        assert lost == [lock]
        assert fault.calls >= 2, "a failed round must be retried before the lease ends"
        failures = [r for r in caplog.records if "renewing the leases" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in failures]

        fault.error = None
        assert other.acquire(timeout=5)  # keeps the renewer busy: the same thread must serve it
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
        assert not lock.is_held_by_current_thread()
        rounds = renewer.rounds
        time.sleep(1.5)  # two and a half leases: only renewal keeps "other"
        assert renewer._worker is worker  # (a worker is started once: a restart would be a new one)
        assert worker.running
        assert renewer.rounds >= rounds + 3
        assert not other.lost
        assert redis_client.get("hybridlock:{other}") == registry.client_id.encode()
        assert any("works again" in r.getMessage() for r in caplog.records)
    other.release()


def test_a_huge_lease_does_not_overflow_the_renewers_wait(make_registry):
    # The longest lease accepted (larger ones are refused as arguments): the renewer's waits must not overflow.
    with pytest.warns(hybridlock.LongLeaseWarning):  # (that long on purpose)
        registry = make_registry(expire_after=threading.TIMEOUT_MAX)
    lock = registry.obtain("forever")
    with lock:
        time.sleep(0.1)
        renewer = registry._context.renewer
        assert renewer is not None
        assert renewer._worker is not None
        assert renewer._worker.running


def _hybridlock_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("hybridlock-")]


def test_background_threads_end_when_idle_and_come_back_on_demand(make_registry):
    registry, rival = make_registry(expire_after=2.0), make_registry(expire_after=2.0)
    for _ in range(2):  # the second round: threads that ended start again
        lock, theirs = registry.obtain("idle"), rival.obtain("idle")
        assert lock.acquire(timeout=5)
        waiter = threading.Thread(target=lambda t=theirs: t.acquire(timeout=5) and t.release())
        waiter.start()
        # The rival's wait keeper keeps its place in the server queue (it waits for a grant, not on pub/sub).
        assert _wait_until(lambda: "hybridlock-wait-keeper" in _hybridlock_threads(), 5)
        assert "hybridlock-renewer-hybridlock" in _hybridlock_threads()
        lock.release()
        waiter.join(5)
        # Each ends within its linger (the wait keeper's is the longest) once nothing is held or awaited.
        assert _wait_until(lambda: _hybridlock_threads() == [], IDLE_LINGER + 1.0), _hybridlock_threads()
    # Renewal still works after a restart.
    lock = registry.obtain("idle")
    with lock:
        time.sleep(2.5)
        assert not lock.lost


def test_a_lock_taken_now_and_then_keeps_one_renewer_thread(make_registry):
    # A prefork worker's turns in a busy lock's queue: a short hold every 0.1 s. The renewer lingers a whole linger
    # after the last lease given back; before, it ended at the end of a linger counted from its first look at an
    # empty table, and a new thread started at nearly every other acquire.
    registry = make_registry()
    lock = registry.obtain("now-and-then")
    renewer = registry._context.renewer
    workers = set()
    for _ in range(15):
        with lock:
            workers.add(id(renewer._worker))
        time.sleep(0.1)
    assert len(workers) == 1, f"{len(workers)} renewer threads for 15 holds 0.1 s apart"
    assert _wait_until(lambda: "hybridlock-renewer-hybridlock" not in _hybridlock_threads(), 5)


# -- a lease counts from the attempt that got it, a hold from the grant -------------------------------------------
# Not from the start of acquire(): a wait longer than the lease would leave a lock just granted looking expired.


def _hold_in_thread(acquire, release, seconds: float) -> threading.Thread:  # type: ignore[no-untyped-def]
    """Take a lock in a thread of its own and hold it ``seconds``; returns once it is held."""
    held = threading.Event()

    def hold() -> None:
        assert acquire(timeout=5)
        held.set()
        time.sleep(seconds)
        release()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5)
    return thread


def _blocked_lock(
    kind: str, waiter: hybridlock.LockRegistry, holder: hybridlock.LockRegistry, hold: float
) -> tuple[Any, list[Any], threading.Thread]:
    """A lock of ``waiter``'s of the given kind (with the parts whose leases to look at), which ``holder`` (another
    owner, or a thread of the same one for "local") keeps busy for ``hold`` seconds from now."""
    if kind in ("lock", "local"):
        lock = waiter.obtain("late")
        blocker = holder.obtain("late")
        thread = _hold_in_thread(blocker.acquire, blocker.release, hold)
        return lock, [lock], thread
    if kind == "multi":
        lock = waiter.obtain_many(["late", "late-too"])
        blocker = holder.obtain("late-too")
        thread = _hold_in_thread(blocker.acquire, blocker.release, hold)
        return lock, lock.locks, thread
    rw = waiter.obtain_read_write("late")
    blocking_writer = holder.obtain_read_write("late").write_lock()
    thread = _hold_in_thread(blocking_writer.acquire, blocking_writer.release, hold)
    half = rw.read_lock() if kind == "read" else rw.write_lock()
    return half, [half], thread


@pytest.mark.parametrize("kind", ["lock", "local", "multi", "read", "write"])
def test_a_lock_granted_after_a_wait_longer_than_its_lease_has_a_whole_lease(make_registry, kind):
    # Hand-off off, so that the "local" waiter (a thread of the holder's own process) takes a fresh lease too.
    waiter = make_registry(expire_after=1.0, handoff_limit=0)
    holder = waiter if kind == "local" else make_registry(expire_after=1.0)
    fault = _FaultyRenewal(waiter)
    lock, parts, thread = _blocked_lock(kind, waiter, holder, hold=1.8)
    if kind != "local":
        fault.error = ConnectionError("renewal cut off (test)")  # the waiter's registry renews nothing yet
    started = time.monotonic()
    assert lock.acquire(timeout=10)
    granted = time.monotonic()
    deadlines = [part.valid_until for part in parts]
    fault.error = ConnectionError("renewal cut off (test)")
    try:
        assert granted - started > 1.2, "the wait must outlast the lease for this test to mean anything"
        # One renewal round fails: a lease granted just now is still valid, so this is no loss.
        assert _wait_until(lambda: fault.calls >= 1, 3.0)
        fault.error = None
        time.sleep(0.1)  # (a failed round marks ended leases lost just after its call raised)
        assert not lock.lost, "a failed renewal reported a lock granted a moment before as lost"
        for deadline in deadlines:
            assert deadline is not None
            assert granted + 0.5 < deadline <= granted + 1.0, (deadline - granted, "valid_until counts the wait")
        time.sleep(1.2)  # past the lease as first granted: renewal keeps it
        assert not lock.lost
    finally:
        fault.error = None
        thread.join(5)
    lock.release()  # no LockLostError


def test_max_hold_counts_the_hold_not_the_wait_for_the_lock(make_registry, redis_client):
    holder = make_registry(expire_after=1.0)
    waiter = make_registry(expire_after=1.0, max_hold=1.5)
    lock, _, thread = _blocked_lock("lock", waiter, holder, hold=1.8)
    started = time.monotonic()
    assert lock.acquire(timeout=10)
    granted = time.monotonic()
    thread.join(5)
    assert granted - started > 1.2  # waited longer than max_hold minus the lease: the hold has not begun
    time.sleep(1.0)  # within max_hold of the grant, past the lease as granted: only renewal kept it
    assert not lock.lost, "max_hold counted the wait for the lock"
    # (Its own id, or "<id>|<token>" for a lock granted by the holder's release.)
    assert redis_client.get("hybridlock:{late}").decode().partition("|")[0] == waiter.client_id
    # max_hold still ends the hold: not renewed after 1.5 s, so reported lost once its last lease ran out.
    assert _wait_until(lambda: lock.lost, 3.0)
    assert time.monotonic() - granted > 1.5
    with pytest.raises(hybridlock.LockLostError):
        lock.release()
