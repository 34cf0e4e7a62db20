"""The instrumentation hook (``observer=``) on a real server, written once: here for asyncio (other owners are
tasks and registries), generated into ``tests/_sync`` for threads.

Each test checks what the observer was told against what happened: an uncontended cycle, a wait for another owner
(a remote hand-off) and for a task of the same registry (a local hand-off), timeouts, a loss (the key deleted
under the holder), a renewal round that fails (the server killed), and an observer that raises. Times are
asserted with generous bounds only; every wait is bounded (``JOIN``, the async hook's timeout).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.metrics import AcquireEvent, LockObserver, LossEvent, ReleaseEvent, RenewalEvent
from hybridlock.testing.server import EmbeddedServer

from ._compat import JOIN, sleep, spawn
from .helpers import Holder, take_and_give_back

pytestmark = pytest.mark.server


class Recorder(LockObserver):
    """Keeps every event (``list.append`` is atomic: the renewer reports from its own thread or task)."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_acquire(self, event: AcquireEvent) -> None:
        self.events.append(event)

    def on_release(self, event: ReleaseEvent) -> None:
        self.events.append(event)

    def on_renewal(self, event: RenewalEvent) -> None:
        self.events.append(event)

    def on_loss(self, event: LossEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [event for event in self.events if isinstance(event, kind)]


async def until(predicate: Any, what: str, within: float = JOIN) -> None:
    for _ in range(int(within / 0.01)):
        if predicate():
            return
        await sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_an_uncontended_cycle_is_one_acquire_from_the_server_and_one_release(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    async with hybridlock.AsyncLockRegistry(server.url, observer=recorder) as registry:
        assert registry.observer is recorder
        lock = registry.obtain("orders:1")
        async with lock, lock:  # the second, reentrant, only counts: not reported
            await sleep(0.05)
    acquire, release = recorder.events
    assert isinstance(acquire, AcquireEvent)
    assert (acquire.registry_key, acquire.key, acquire.kind) == ("hybridlock", "orders:1", "lock")
    assert (acquire.outcome, acquire.via, acquire.server_attempts, acquire.handoff) == ("acquired", "server", 1, None)
    assert acquire.error is None
    assert 0 < acquire.duration < 5
    assert acquire.local_wait + acquire.remote_wait == pytest.approx(acquire.duration)
    assert acquire.remote_wait > 0
    assert isinstance(release, ReleaseEvent)
    assert (release.key, release.kind, release.outcome, release.error) == ("orders:1", "lock", "released", None)
    assert release.held_for is not None
    assert 0.04 < release.held_for < 5


async def test_a_wait_for_another_owner_is_a_remote_handoff(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    recorder = Recorder()
    async with (
        hybridlock.AsyncLockRegistry(server.url, observer=recorder) as registry,
        hybridlock.AsyncLockRegistry(server.url) as other,
    ):
        async with Holder(other.obtain("k")):
            waiter = spawn(lambda: take_and_give_back(registry.obtain("k")))
            await sleep(0.2)
            assert not waiter.done()
        assert await waiter.join() is True
    (acquire,) = recorder.of(AcquireEvent)
    assert acquire.outcome == "acquired"
    assert acquire.via == "server"
    assert acquire.server_attempts >= 2
    assert acquire.handoff == "remote"
    assert acquire.remote_wait > 0.1
    assert acquire.local_wait < acquire.remote_wait


async def test_a_wait_for_a_thread_of_this_registry_is_a_local_handoff(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    # (a hand-off window long enough for the holder's 0.2 s: past it, the lease goes back to the server)
    async with hybridlock.AsyncLockRegistry(server.url, observer=recorder, handoff_window=5.0) as registry:
        lock = registry.obtain("k")

        async def take_and_release() -> None:
            assert await lock.acquire(timeout=JOIN)
            await lock.release()

        async with Holder(lock):
            waiter = spawn(take_and_release)
            await sleep(0.2)
        await waiter.join()
    acquires = recorder.of(AcquireEvent)
    assert [event.via for event in acquires] == ["server", "local"]
    handed = acquires[1]
    assert (handed.outcome, handed.server_attempts, handed.handoff) == ("acquired", 0, "local")
    assert handed.local_wait > 0.1
    assert handed.remote_wait == 0
    releases = recorder.of(ReleaseEvent)
    assert [event.outcome for event in releases] == ["released", "released"]
    assert releases[0].held_for is not None
    assert releases[0].held_for > 0.1


async def test_timeouts_are_reported_with_where_the_time_went(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    async with (
        hybridlock.AsyncLockRegistry(server.url, observer=recorder) as registry,
        hybridlock.AsyncLockRegistry(server.url) as other,
    ):
        lock = registry.obtain("k")
        async with Holder(other.obtain("k")):
            assert await lock.acquire(timeout=0.2) is False  # waits in the server
            assert await lock.acquire(blocking=False) is False  # one attempt, refused
        async with Holder(lock):  # another task of this registry holds it: the wait is local
            assert await lock.acquire(timeout=0.2) is False
    remote, refused, local = [event for event in recorder.of(AcquireEvent) if event.outcome == "timed_out"]
    assert remote.via is None
    assert remote.handoff is None
    assert remote.server_attempts >= 1
    assert remote.duration >= 0.15
    assert remote.remote_wait >= 0.15
    assert refused.server_attempts == 1
    assert refused.duration < 5
    assert local.server_attempts == 0
    assert local.local_wait >= 0.15
    assert local.remote_wait == 0


async def test_a_deleted_key_is_reported_as_a_loss_and_a_lost_release(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=0.3, observer=recorder) as registry:
        lock = registry.obtain("k")
        assert await lock.acquire()
        await until(lambda: recorder.of(RenewalEvent), "a renewal round")
        renewal = recorder.of(RenewalEvent)[0]
        assert (renewal.registry_key, renewal.leases, renewal.renewed, renewal.lost) == ("hybridlock", 1, 1, 0)
        assert renewal.error is None
        assert redis_client.delete("hybridlock:{k}") == 1
        await until(lambda: lock.lost, "the renewer to find the key gone")
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
    assert [(event.key, event.kind) for event in recorder.of(LossEvent)] == [("k", "lock")]
    assert any(event.lost == 1 for event in recorder.of(RenewalEvent))
    (release,) = recorder.of(ReleaseEvent)
    assert release.outcome == "lost"
    assert isinstance(release.error, hybridlock.LockLostError)


async def test_a_failing_renewal_and_an_unreachable_server_are_reported(
    own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    caplog.set_level(logging.WARNING, logger="hybridlock")
    async with hybridlock.AsyncLockRegistry(own_server.url, expire_after=0.3, observer=recorder) as registry:
        lock = registry.obtain("k")
        assert await lock.acquire()
        own_server.kill()
        # The rounds fail until the lease has certainly ended; then the lock is reported lost.
        await until(lambda: lock.lost, "the unrenewed lease to be reported lost")
        await until(lambda: len([e for e in recorder.of(RenewalEvent) if e.error]) >= 2, "a second failed round")
        # Known lost: the loss is what release reports, the unreachable server its cause.
        with pytest.raises(hybridlock.LockLostError) as released:
            await lock.release()
        assert isinstance(released.value.__cause__, hybridlock.BackendUnavailableError)
        with pytest.raises(hybridlock.BackendUnavailableError):
            await registry.obtain("other").acquire(timeout=1)
    failed = [event for event in recorder.of(RenewalEvent) if event.error is not None]
    assert all((event.leases, event.renewed, event.lost) == (1, 0, 0) for event in failed)
    assert all(isinstance(event.error, hybridlock.BackendUnavailableError) for event in failed)
    assert [(event.key, event.kind) for event in recorder.of(LossEvent)] == [("k", "lock")]
    release = recorder.of(ReleaseEvent)[-1]
    assert release.outcome == "lost"
    assert isinstance(release.error, hybridlock.LockLostError)
    acquire = recorder.of(AcquireEvent)[-1]
    assert (acquire.key, acquire.outcome, acquire.via) == ("other", "error", None)
    assert isinstance(acquire.error, hybridlock.BackendUnavailableError)
    # Logged once for the streak of failed rounds, once for the lost lease: not once per round.
    renewer_logs = [r for r in caplog.records if r.name == "hybridlock.renewer"]
    assert len(renewer_logs) == 1, [r.getMessage() for r in renewer_logs]
    assert renewer_logs[0].levelno == logging.WARNING
    loss_logs = [r for r in caplog.records if r.name == "hybridlock.lock" and "lost" in r.getMessage()]
    assert len(loss_logs) == 1, [r.getMessage() for r in loss_logs]


async def test_read_write_and_multi_key_locks_are_reported_by_kind(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    async with hybridlock.AsyncLockRegistry(server.url, observer=recorder) as registry:
        rw = registry.obtain_read_write("catalog")
        async with rw.read_lock(), rw.read_lock():  # (the second is reentrant)
            pass
        async with rw.write_lock():
            pass
        async with registry.obtain_many(["b", "a"]):
            pass
    assert [(e.kind, e.key, e.outcome) for e in recorder.of(AcquireEvent)] == [
        ("read", "catalog", "acquired"),
        ("write", "catalog", "acquired"),
        ("multi", "a,b", "acquired"),
    ]
    assert [(e.kind, e.key, e.outcome) for e in recorder.of(ReleaseEvent)] == [
        ("read", "catalog", "released"),
        ("write", "catalog", "released"),
        ("multi", "a,b", "released"),
    ]
    assert all(event.via == "server" for event in recorder.of(AcquireEvent))


class Broken:
    """An observer whose every method raises."""

    def __init__(self) -> None:
        self.calls = 0

    def _fail(self, event: object) -> None:
        self.calls += 1
        raise RuntimeError("observer bug")

    on_acquire = on_release = on_renewal = on_loss = _fail


async def test_an_observer_that_raises_breaks_no_lock_and_is_logged_once(
    server: EmbeddedServer, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    caplog.set_level(logging.ERROR, logger="hybridlock")
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=0.3, observer=broken) as registry:
        lock = registry.obtain("k")
        for _ in range(3):
            async with lock:
                await sleep(0.15)  # long enough for a renewal round
        async with registry.obtain_read_write("rw").write_lock():
            pass
        assert not await lock.locked()
    assert broken.calls >= 8
    logs = [r for r in caplog.records if r.name == "hybridlock.observer"]
    assert len(logs) == 1, [r.getMessage() for r in logs]
    assert logs[0].levelno == logging.ERROR
    assert "observer bug" in (logs[0].exc_text or "") or logs[0].exc_info is not None


async def test_a_registry_refuses_what_cannot_be_an_observer() -> None:
    for bad in (Recorder, object(), 42):
        with pytest.raises(hybridlock.InvalidArgumentError):
            hybridlock.AsyncLocalLockRegistry(observer=bad)

    class OnlyLosses:
        def on_loss(self, event: LossEvent) -> None:
            pass

    # Any object with some of the methods will do; the missing ones are skipped.
    async with hybridlock.AsyncLocalLockRegistry(observer=OnlyLosses()) as registry, registry.obtain("k"):
        pass
