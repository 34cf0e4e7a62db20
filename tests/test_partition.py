"""One client cut off from the server (a TCP proxy between them), the others not: the holder is told, in time.

The safety claim under test: by the time another owner can get a lock whose holder was partitioned away, that
holder's ``valid_until`` has passed, its ``lost`` flag is up (or comes up at its renewal), its ``on_lost``
callbacks ran, and its release raises a documented error. Nobody is inside the critical section twice while
their ``valid_until`` both say so.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import hybridlock

from ._proxy import FaultProxy

pytestmark = pytest.mark.server


def _client(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=0.3,
        socket_connect_timeout=0.3,
        retry=Retry(NoBackoff(), 1),
    )


@pytest.fixture
def proxy(server):  # type: ignore[no-untyped-def]
    with FaultProxy(server.port) as p:
        yield p


def test_a_partitioned_holder_is_told_before_another_owner_gets_in(proxy, make_registry, redis_client):
    cut_off = hybridlock.LockRegistry(_client(proxy.port), expire_after=1.5)
    rival = make_registry(expire_after=1.5)
    try:
        lock = cut_off.obtain("partitioned")
        told = threading.Event()
        lock.on_lost(lambda _lock: told.set())
        assert lock.acquire(timeout=5)
        proxy.partition()
        last_valid_until = lock.valid_until
        assert last_valid_until is not None
        started = time.monotonic()
        got = rival.obtain("partitioned").acquire(timeout=10)
        rival_in_at = time.monotonic()
        assert got, "the rival never got the lock after the holder's lease ended"
        # The holder's own deadline had passed before the rival got in: a holder that checks valid_until before
        # each side effect never acts alongside the rival.
        assert (lock.valid_until or 0.0) <= rival_in_at
        assert last_valid_until <= rival_in_at
        assert rival_in_at - started < 6.0
        # And it is told: the renewer marks the lease lost once valid_until has passed without a renewal.
        assert told.wait(5.0), "the partitioned holder was never told it lost the lock"
        assert lock.lost
        with pytest.raises(hybridlock.LockLostError):  # known lost: the loss wins over the unreachable server
            lock.release()
        assert not lock.is_held_by_current_thread()
        rival.obtain("partitioned").release()
    finally:
        proxy.heal()
        cut_off.close()


def test_a_partitioned_waiter_gets_a_clear_error_within_its_timeout(proxy, make_registry):
    holder = make_registry(expire_after=30)
    cut_off = hybridlock.LockRegistry(_client(proxy.port), expire_after=30)
    try:
        held = holder.obtain("busy")
        held.acquire()
        waiter = cut_off.obtain("busy")
        proxy.partition()
        started = time.monotonic()
        with pytest.raises(hybridlock.BackendUnavailableError) as raised:
            waiter.acquire(timeout=2)
        assert time.monotonic() - started < 2 + 3 * 0.3 + 1.0  # timeout + the client's socket timeouts + slack
        assert raised.value.key == "busy"
        assert str(proxy.port) in (raised.value.server or "")
        assert not waiter.is_held_by_current_thread()
        held.release()
    finally:
        proxy.heal()
        cut_off.close()


def test_after_the_partition_heals_the_cut_off_owner_takes_the_lock_again(proxy, make_registry):
    cut_off = hybridlock.LockRegistry(_client(proxy.port), expire_after=1.5)
    try:
        lock = cut_off.obtain("heals")
        lock.acquire()
        proxy.partition()
        deadline = time.monotonic() + 6
        while not lock.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.lost
        with pytest.raises(hybridlock.LockLostError):  # known lost: the loss wins over the unreachable server
            lock.release()
        proxy.heal()
        assert lock.acquire(timeout=5)
        assert not lock.lost
        lock.release()
    finally:
        proxy.heal()
        cut_off.close()
