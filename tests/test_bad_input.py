"""Every bad input gets a clear error: ``InvalidArgumentError``, which is both a ``ValueError`` and a ``TypeError``.

Most of these run against the in-memory backend (the checks happen before anything is sent); the URL and
connection checks need no server either, since a client is only built, never used, when the input is rejected.
Errors also survive pickling with their ``key`` and ``server`` fields, so they cross process boundaries intact.
"""

from __future__ import annotations

import math
import pickle
import threading
import warnings

import pytest

import hybridlock
from hybridlock.backends import MemoryBackend


@pytest.fixture
def registry():
    with hybridlock.LockRegistry(MemoryBackend()) as reg:
        yield reg


def assert_invalid(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    err = excinfo.value
    assert isinstance(err, hybridlock.InvalidArgumentError)
    assert isinstance(err, hybridlock.HybridLockError)
    assert isinstance(err, ValueError)
    assert isinstance(err, TypeError)
    assert str(err), "the error must say what was wrong"


# -- lock keys ---------------------------------------------------------------------------------------------------------


# A key starting with "}" would give its server names an empty hash tag, scattering them over cluster slots.
@pytest.mark.parametrize("key", ["", None, 1, 1.5, b"orders:42", ["k"], ("k",), object(), "}", "}x", "}}"])
def test_obtain_rejects_a_bad_key(registry, key):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        registry.obtain(key)
    assert_invalid(excinfo)
    assert len(registry) == 0, "a rejected key must not leave a lock object behind"


@pytest.mark.parametrize("key", ["", None, 7])
def test_local_registry_rejects_a_bad_key(key):
    with hybridlock.LocalLockRegistry() as reg, pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        reg.obtain(key)
    assert_invalid(excinfo)


# -- registry construction ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("registry_key", ["", "a{b", "a}b", "{hybridlock}", "x{", "}", None, 3, b"hybridlock"])
def test_registry_rejects_a_bad_registry_key(registry_key):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), registry_key=registry_key)
    assert_invalid(excinfo)


@pytest.mark.parametrize("registry_key", ["", "a{b", "b}", 5])
def test_local_registry_rejects_a_bad_registry_key(registry_key):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LocalLockRegistry(registry_key)
    assert_invalid(excinfo)


@pytest.mark.parametrize(
    "expire_after",
    [0, 0.0, -1, -0.001, math.nan, math.inf, -math.inf, True, False, "30", None, [30]],
)
def test_registry_rejects_a_bad_expire_after(expire_after):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), expire_after=expire_after)
    assert_invalid(excinfo)


@pytest.mark.parametrize("lock_type", ["", "Spin", "fair", None, 1])
def test_registry_rejects_a_bad_lock_type(lock_type):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), lock_type=lock_type)
    assert_invalid(excinfo)


@pytest.mark.parametrize("max_hold", [0, -5, math.nan, "10", True])
def test_registry_rejects_a_bad_max_hold(max_hold):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), max_hold=max_hold)
    assert_invalid(excinfo)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("handoff_limit", -1),
        ("handoff_limit", 1.5),
        ("handoff_limit", True),
        ("handoff_limit", "64"),
        ("handoff_window", -0.1),
        ("handoff_window", math.nan),
        ("handoff_window", math.inf),
        ("handoff_window", False),
        ("handoff_contended_window", -0.001),
        ("handoff_contended_window", math.nan),
        ("handoff_contended_window", math.inf),
        ("handoff_contended_window", "0.02"),
        ("handoff_contended_window", None),
        ("handoff_barge_window", -0.001),
        ("handoff_barge_window", math.nan),
        ("handoff_barge_window", math.inf),
        ("handoff_barge_window", True),
        ("handoff_barge_window", "0.002"),
        ("handoff_barge_window", None),
    ],
)
def test_registry_rejects_a_bad_handoff_budget(option, value):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), **{option: value})
    assert_invalid(excinfo)
    assert option in str(excinfo.value)


@pytest.mark.parametrize("connection", [None, 6379, 1.0, b"redis://127.0.0.1:6379/0", object(), {"host": "x"}])
def test_registry_rejects_a_bad_connection_type(connection):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(connection)
    assert_invalid(excinfo)


@pytest.mark.parametrize("url", ["", "not a url", "http://127.0.0.1:6379/0", "127.0.0.1:6379", "ftp://x"])
def test_registry_rejects_a_bad_url(url):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(url)
    assert_invalid(excinfo)


# -- acquire arguments -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [-2, -0.5, -1.0001, -math.inf, math.nan, "1", None, True, [1]])
def test_acquire_rejects_a_bad_timeout(registry, timeout):
    lock = registry.obtain("k")
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        lock.acquire(timeout=timeout)
    assert_invalid(excinfo)
    assert not lock.is_held_by_current_thread()
    assert not lock.locked(), "a rejected acquire must not take the lock"


@pytest.mark.parametrize("timeout", [0, 0.0, 1, 5.5, -2])
def test_acquire_rejects_non_blocking_with_a_timeout(registry, timeout):
    lock = registry.obtain("k")
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        lock.acquire(blocking=False, timeout=timeout)
    assert_invalid(excinfo)
    assert not lock.locked()


def test_acquire_with_timeout_minus_one_is_accepted(registry):
    lock = registry.obtain("k")
    assert lock.acquire(timeout=-1)
    lock.release()
    assert lock.acquire(blocking=False, timeout=-1)
    lock.release()


def test_bad_timeout_is_rejected_even_on_a_reentrant_acquire(registry):
    # The reentrant fast path must not skip argument checks: RLock checks them on every call.
    lock = registry.obtain("k")
    with lock:
        with pytest.raises(hybridlock.InvalidArgumentError):
            lock.acquire(timeout=-3)
        with pytest.raises(hybridlock.InvalidArgumentError):
            lock.acquire(blocking=False, timeout=1)
        assert lock.hold_count == 1, "a rejected reentrant acquire must not count"
    assert not lock.locked()


@pytest.mark.parametrize("timeout", ["1", math.nan, -math.nan, True, [1], b"1"])
def test_try_lock_rejects_a_bad_timeout(registry, timeout):
    lock = registry.obtain("k")
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        lock.try_lock(timeout)
    assert_invalid(excinfo)
    with pytest.raises(hybridlock.InvalidArgumentError):
        lock.tryLock(timeout)
    assert not lock.locked()


def test_bad_timeout_is_rejected_while_another_thread_holds(registry):
    # Validation comes before any waiting: a bad timeout must not block on a busy lock.
    lock = registry.obtain("k")
    held, done = threading.Event(), threading.Event()

    def hold():
        with lock:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(5)
        with pytest.raises(hybridlock.InvalidArgumentError):
            lock.acquire(timeout=-5)
    finally:
        done.set()
        thread.join(10)
    assert not thread.is_alive()


# -- other calls -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("age", [-1, -0.1, "10", None, True])
def test_expire_unused_rejects_a_bad_age(registry, age):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        registry.expire_unused_older_than(age)
    assert_invalid(excinfo)


def test_release_of_an_unheld_lock_is_a_runtime_error(registry):
    lock = registry.obtain("k")
    with pytest.raises(hybridlock.LockNotOwnedError) as excinfo:
        lock.release()
    assert isinstance(excinfo.value, RuntimeError)
    assert isinstance(excinfo.value, hybridlock.HybridLockError)
    assert excinfo.value.key == "k"
    with pytest.raises(RuntimeError):
        lock.unlock()


# -- errors survive pickling -------------------------------------------------------------------------------------------


# Every error class the library defines, so that one added later is covered without editing these tests.
ALL_ERRORS = [
    cls
    for cls in (getattr(hybridlock.errors, name) for name in hybridlock.errors.__all__)
    if not issubclass(cls, Warning)
]


@pytest.mark.parametrize("cls", ALL_ERRORS)
def test_errors_pickle_round_trip(cls):
    err = cls("something went wrong", key="orders:42", server="redis://127.0.0.1:1234/0")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(err, protocol=protocol))
        assert type(copy) is cls
        assert copy.key == "orders:42"
        assert copy.server == "redis://127.0.0.1:1234/0"
        assert str(copy) == str(err)
        assert "orders:42" in str(copy)
        assert "127.0.0.1:1234" in str(copy)


def test_errors_without_fields_pickle_round_trip():
    err = hybridlock.LockLostError("lease ended")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is hybridlock.LockLostError
    assert copy.key is None
    assert copy.server is None
    assert str(copy) == "lease ended"


def test_raised_error_pickles_with_its_key(registry):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        registry.obtain("k").acquire(timeout=-7)
    copy = pickle.loads(pickle.dumps(excinfo.value))
    assert type(copy) is type(excinfo.value)
    assert str(copy) == str(excinfo.value)
    with pytest.raises(hybridlock.LockNotOwnedError) as excinfo2:
        registry.obtain("orders:7").release()
    copy2 = pickle.loads(pickle.dumps(excinfo2.value))
    assert copy2.key == "orders:7"
    assert copy2.server == excinfo2.value.server


def test_error_classes_derive_from_the_stdlib_types_callers_catch():
    assert issubclass(hybridlock.LockLostError, RuntimeError)
    assert issubclass(hybridlock.LockNotOwnedError, RuntimeError)
    assert issubclass(hybridlock.RegistryClosedError, RuntimeError)
    assert issubclass(hybridlock.BackendUnavailableError, ConnectionError)
    assert issubclass(hybridlock.LockTimeoutError, TimeoutError)
    assert issubclass(hybridlock.LockUpgradeError, RuntimeError)
    for cls in ALL_ERRORS:
        assert issubclass(cls, hybridlock.HybridLockError)


# -- bounds on durations and keys --------------------------------------------------------------------------------------

TOO_LONG = [threading.TIMEOUT_MAX * 2, 2**70, 1e300]


@pytest.mark.parametrize("value", [*TOO_LONG, 1e-4, 0.05, 0.0999])
def test_expire_after_is_bounded(value):
    # Too long: the server or a thread's wait would refuse it at every acquire or renewal. Too short: the lease is
    # lost before a renewal can reach the server.
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), expire_after=value)
    assert_invalid(excinfo)
    assert "expire_after" in str(excinfo.value)


@pytest.mark.parametrize("option", ["max_hold", "handoff_window", "handoff_barge_window", "retain_for"])
@pytest.mark.parametrize("value", TOO_LONG)
def test_durations_are_bounded(option, value):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), **{option: value})
    assert_invalid(excinfo)
    assert option in str(excinfo.value)


@pytest.mark.parametrize("value", TOO_LONG)
def test_timeouts_are_bounded(registry, value):
    lock = registry.obtain("k")
    rw = registry.obtain_read_write("k")
    for kind in (lock, rw.read_lock(), rw.write_lock(), registry.obtain_many(["a", "b"])):
        with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
            kind.acquire(timeout=value)
        assert_invalid(excinfo)
        with pytest.raises(hybridlock.InvalidArgumentError):
            kind.try_lock(value)
        assert not kind.is_held_by_current_thread()


def test_renew_by_hand_is_bounded(registry):
    with registry.obtain("k") as lock:
        for value in (*TOO_LONG, 1e-4):
            with pytest.raises(hybridlock.InvalidArgumentError):
                lock.renew(value)
            with pytest.raises(hybridlock.InvalidArgumentError):
                registry.renew_lock("k", value)


def test_the_bounds_themselves_are_accepted(registry):
    with hybridlock.LockRegistry(
        MemoryBackend(), expire_after=0.1, max_hold=threading.TIMEOUT_MAX, retain_for=threading.TIMEOUT_MAX
    ) as reg:
        assert reg.expire_after == 0.1
    lock = registry.obtain("k")
    assert lock.acquire(timeout=threading.TIMEOUT_MAX)
    assert lock.acquire(timeout=math.inf)  # forever, as threading.RLock reads it
    lock.release()
    lock.release()


@pytest.mark.server
def test_the_longest_lease_works_on_a_real_server(server):
    # The longest lease must survive the whole round: SET PX, renewal (PEXPIRE), the queue's expiry arithmetic.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=hybridlock.LongLeaseWarning)  # (that long on purpose)
        reg = hybridlock.LockRegistry(server.url, expire_after=threading.TIMEOUT_MAX)
        other = hybridlock.LockRegistry(server.url, expire_after=threading.TIMEOUT_MAX)
    with reg:
        try:
            pairs = [
                (reg.obtain("long"), other.obtain("long")),
                (reg.obtain_read_write("long").write_lock(), other.obtain_read_write("long").read_lock()),
                (reg.obtain_read_write("long").read_lock(), other.obtain_read_write("long").write_lock()),
            ]
            for lock, theirs in pairs:
                assert lock.acquire(timeout=5)
                assert reg.backend.renew([lock._names], reg.client_id, reg._context.config.lease_ms) == [True]
                assert not theirs.acquire(timeout=0.2)  # queued as a waiter with that lease, then gave up
                lock.release()
                assert theirs.acquire(timeout=5)
                theirs.release()
        finally:
            other.close()


@pytest.mark.parametrize("key", ["\ud800", "a\udfffb", "orders:\ud83d"])
def test_a_key_that_is_not_utf8_encodable_is_refused_at_obtain(registry, key):
    for obtain in (registry.obtain, registry.obtain_read_write, lambda k: registry.obtain_many([k, "x"])):
        with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
            obtain(key)
        assert_invalid(excinfo)
        assert "UTF-8" in str(excinfo.value)
    assert len(registry) == 0


@pytest.mark.parametrize("registry_key", ["\ud800", "locks\udcff"])
def test_a_registry_key_that_is_not_utf8_encodable_is_refused(registry_key):
    with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
        hybridlock.LockRegistry(MemoryBackend(), registry_key=registry_key)
    assert_invalid(excinfo)


@pytest.mark.parametrize("timeout", [*TOO_LONG, math.nan])
def test_synchronized_refuses_a_bad_timeout_when_decorating(registry, timeout):
    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.synchronized("k", timeout=timeout)


def test_the_templates_checks_refuse_what_a_use_would_refuse_and_return_what_it_takes():
    from hybridlock.templates import acquire_timeout, key_template, semaphore_permits

    assert semaphore_permits(1024) == 1024
    assert acquire_timeout(None) is None
    assert acquire_timeout(-1) is None
    assert acquire_timeout(float("inf")) is None
    assert acquire_timeout(2) == 2.0
    assert key_template("orders:{order_id}") == "orders:{order_id}"
    assert key_template("{x}}}") == "{x}}}"  # ("}" after a value: that value decides)
    for bad in (lambda: semaphore_permits(1025), lambda: semaphore_permits(0), lambda: semaphore_permits(2.0)):
        with pytest.raises(hybridlock.InvalidArgumentError, match="permits"):
            bad()
    with pytest.raises(hybridlock.TimeoutOverflowError):
        acquire_timeout(1e300)
    with pytest.raises(hybridlock.InvalidArgumentError):
        acquire_timeout(-2)
    for template in ("}}static", "}}{x}", "k:\ud800{x}", ""):
        with pytest.raises(hybridlock.InvalidArgumentError):
            key_template(template)
