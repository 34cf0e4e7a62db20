"""What each server-side failure does to a held lock, on real servers: the failure table of docs/guarantees.md.

Every test checks the same invariants: the holder is told (``lost``, its ``on_lost`` callback, an error from
``release()``), its ``valid_until`` never vouches for a moment in which another owner holds the lock, and fencing
tokens keep increasing across the failure.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

import hybridlock
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server


def _told(lock: hybridlock.HybridLock) -> threading.Event:
    event = threading.Event()
    lock.on_lost(lambda _lock: event.set())
    return event


def test_flushall_under_a_held_lock(own_server):
    with (
        hybridlock.LockRegistry(own_server.url, expire_after=1.5) as holder_registry,
        hybridlock.LockRegistry(own_server.url, expire_after=1.5) as rival_registry,
    ):
        lock = holder_registry.obtain("flushed")
        told = _told(lock)
        lock.acquire()
        old_token = lock.fencing_token
        assert old_token is not None
        redis.Redis.from_url(own_server.url).flushall()
        rival = rival_registry.obtain("flushed")
        assert rival.acquire(blocking=False)  # nothing in the server says the key is held any more
        # The holder cannot be told before its next renewal, but then it is (period: expire_after / 3).
        assert told.wait(3.0)
        assert lock.lost
        # The counter was flushed too: it is re-seeded from the server clock, above every earlier token.
        assert rival.fencing_token is not None
        assert rival.fencing_token > old_token
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
        rival.release()


def test_restart_without_persistence_under_a_held_lock(own_server):
    with (
        hybridlock.LockRegistry(own_server.url, expire_after=1.5) as holder_registry,
        hybridlock.LockRegistry(own_server.url, expire_after=1.5) as rival_registry,
    ):
        lock = holder_registry.obtain("restarted")
        told = _told(lock)
        lock.acquire()
        old_token = lock.fencing_token
        assert old_token is not None
        own_server.restart()
        rival = rival_registry.obtain("restarted")
        assert rival.acquire(timeout=10)
        assert told.wait(5.0), "the holder was never told the restart took its lease"
        assert lock.lost
        assert rival.fencing_token is not None
        assert rival.fencing_token > old_token
        with pytest.raises(hybridlock.LockLostError):  # known lost: the loss wins over the unreachable server
            lock.release()
        rival.release()


def test_a_pause_shorter_than_the_lease_costs_nothing(own_server):
    with (
        hybridlock.LockRegistry(own_server.url, expire_after=3.0) as holder_registry,
        hybridlock.LockRegistry(own_server.url, expire_after=3.0) as rival_registry,
    ):
        lock = holder_registry.obtain("paused")
        told = _told(lock)
        lock.acquire()
        redis.Redis.from_url(own_server.url).client_pause(1000)  # every client stalls for one second
        assert not rival_registry.obtain("paused").acquire(timeout=1.5)  # waits through the pause, still held
        time.sleep(1.0)  # a renewal period passes after the pause
        assert not lock.lost
        assert not told.is_set()
        lock.release()
        assert rival_registry.obtain("paused").acquire(timeout=5)
        rival_registry.obtain("paused").release()


def test_a_server_stall_longer_than_the_lease_is_reported_and_never_overlaps():
    # DEBUG SLEEP blocks the whole server; keys whose time ran out meanwhile are expired when it wakes.
    with (
        EmbeddedServer(extra_args=("--enable-debug-command", "yes")) as srv,
        hybridlock.LockRegistry(srv.url, expire_after=1.0) as holder_registry,
        hybridlock.LockRegistry(srv.url, expire_after=1.0) as rival_registry,
    ):
        lock = holder_registry.obtain("stalled")
        told = _told(lock)
        lock.acquire()
        stall = threading.Thread(target=lambda: redis.Redis.from_url(srv.url).execute_command("DEBUG", "SLEEP", 2.5))
        stall.start()
        rival = rival_registry.obtain("stalled")
        assert rival.acquire(timeout=15)
        rival_in_at = time.monotonic()
        stall.join(10)
        # The holder's deadline had passed when the rival got in, and the holder is told.
        assert (lock.valid_until or 0.0) <= rival_in_at
        assert told.wait(5.0)
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
        rival.release()


def test_an_embedded_server_never_takes_another_processs_server_for_its_own():
    # Two test workers may pick the same free port at once: the one that loses the bind exits, and must not take
    # the winner's answer for its own server's (it did, 10 times of 10, when any PONG on the port meant "ready").
    with EmbeddedServer() as taken:
        clash = EmbeddedServer()
        with pytest.raises(RuntimeError, match="could not start"):
            clash.start(timeout=2, port=taken.port)
        assert clash.process is not None
        assert clash.process.poll() is not None
        with redis.Redis.from_url(taken.url) as client:
            assert client.ping()
