"""The observer where one API differs from the other: ``threading.Condition(lock)`` (threads) and cancellation
(asyncio). The shared cases are in ``tests/_async/test_observer.py`` and its generated twin."""

from __future__ import annotations

import asyncio
import threading
from functools import partial
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.metrics import AcquireEvent, LockObserver, ReleaseEvent
from hybridlock.testing.server import EmbeddedServer
from tests._tasks import awaited

pytestmark = pytest.mark.server

JOIN = 10.0


class Recorder(LockObserver):
    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_acquire(self, event: AcquireEvent) -> None:
        self.events.append(event)

    def on_release(self, event: ReleaseEvent) -> None:
        self.events.append(event)


def test_a_condition_wait_is_a_release_and_an_acquire(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    recorder = Recorder()
    with hybridlock.LockRegistry(server.url, observer=recorder) as registry:
        lock = registry.obtain("k")
        condition = threading.Condition(lock)
        with lock, condition:  # depth 2: wait() gives back both levels, and the server lease
            assert condition.wait(0.1) is False
            assert lock.hold_count == 2
    kinds = [(type(event).__name__, event.outcome) for event in recorder.events]
    assert kinds == [
        ("AcquireEvent", "acquired"),  # with lock
        ("ReleaseEvent", "released"),  # wait() lets go of every level
        ("AcquireEvent", "acquired"),  # and takes them back
        ("ReleaseEvent", "released"),  # the outer with's exit (the inner one only counts)
    ]
    assert all(event.via == "server" for event in recorder.events[::2])


def test_a_cancelled_acquire_and_a_cancelled_holder_are_reported(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    recorder = Recorder()

    async def main() -> None:
        async with (
            hybridlock.AsyncLockRegistry(server.url, observer=recorder) as registry,
            hybridlock.AsyncLockRegistry(server.url) as other,
        ):
            rival = other.obtain("k")
            assert await rival.acquire()
            waiter = asyncio.ensure_future(awaited(partial(registry.obtain("k").acquire, timeout=JOIN)))
            await asyncio.sleep(0.2)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            await rival.release()
            assert await registry.obtain("k").acquire(timeout=JOIN)  # nothing was left behind
            await registry.obtain("k").release()

    asyncio.run(asyncio.wait_for(main(), JOIN * 2))
    cancelled, acquired = recorder.events[0], recorder.events[1]
    assert isinstance(cancelled, AcquireEvent)
    assert (cancelled.outcome, cancelled.via, cancelled.handoff) == ("cancelled", None, None)
    assert isinstance(cancelled.error, asyncio.CancelledError)
    assert cancelled.server_attempts >= 1
    assert cancelled.duration > 0.15
    assert (acquired.outcome, acquired.via) == ("acquired", "server")
    assert isinstance(recorder.events[2], ReleaseEvent)


def test_what_counts_as_a_handoff() -> None:
    def event(kind: str, outcome: str, via: str | None, attempts: int) -> AcquireEvent:
        return AcquireEvent("r", "k", kind, outcome, via, 0.1, 0.05, 0.05, attempts)  # type: ignore[arg-type]

    assert event("lock", "acquired", "local", 0).handoff == "local"
    assert event("write", "acquired", "server", 3).handoff == "remote"
    assert event("multi", "acquired", "server", 1).handoff is None  # free at once
    assert event("read", "acquired", "local", 0).handoff is None  # joined this process's read hold
    assert event("read", "acquired", "server", 2).handoff == "remote"
    assert event("lock", "timed_out", None, 4).handoff is None


def test_coroutine_methods_are_refused_on_both_sides() -> None:
    class Awaiting:
        async def on_acquire(self, event: AcquireEvent) -> None:
            pass

    # Called synchronously, an async method would only make a coroutine nobody awaits: nothing observed.
    with pytest.raises(hybridlock.InvalidArgumentError, match="coroutine"):
        hybridlock.LocalLockRegistry(observer=Awaiting())
    with pytest.raises(hybridlock.InvalidArgumentError, match="coroutine"):
        hybridlock.AsyncLocalLockRegistry(observer=Awaiting())
