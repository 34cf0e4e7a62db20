"""Cancellation at every await point of acquire and release, on one real server and on a quorum of three: whatever
the step a task is cancelled at, it leaves nothing behind (no lease held by nobody, no place in a server queue, no
local mutex stuck), and another owner gets the lock at once.

The sweep: for n = 0, 1, 2, ... start the attempt, let the event loop run n steps, cancel it, and check the servers'
keys and the local state; stop once an attempt ran to its end before the cancel came. A round trip spans several
loop steps, so the sweep lands in every await, and at several moments of each; a variant drops the pooled
connections first, so that every call reconnects and the sweep lands inside the reconnects too. Anything a
cancelled task gives back is given back shielded before its ``CancelledError`` reaches the canceller, so the
checks run at once (over a quorum: on a majority at once; a call to the last server may still be finishing in its
lane, followed by the give-back, so that one gets ``SETTLE`` seconds). Also: a task cancelled inside
``async with lock:`` releases it, and a lease its holder forgets ends and is reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.testing.server import EmbeddedServer
from tests._async.helpers import EXCLUSIVE, Kind, kinds
from tests._tasks import awaited

pytestmark = pytest.mark.server

MAX_STEPS = 600  # no attempt here needs more loop steps than this to finish (the sweep fails if one does)
WAITING_STEPS = 120  # how far the sweep goes into a wait that cannot end
SETTLE = 2.0  # seconds a quorum's last server may take to settle after a cancel (a call finishing in its lane)


def server_state(client: redis.Redis) -> dict[bytes, Any]:
    """The server's lock state: every key but the fencing counters (which outlive every tenancy, by design) and the
    owners' descriptions for operators (``<registry_key>:owner:<client_id>``, written by the renewer when it will)."""
    state: dict[bytes, Any] = {}
    for key in sorted(client.keys()):
        if key.endswith(b":fence") or b":owner:" in key:
            continue
        kind = client.type(key)
        if kind == b"string":
            state[key] = client.get(key)
        elif kind == b"zset":
            state[key] = client.zrange(key, 0, -1)
        elif kind == b"hash":
            state[key] = client.hgetall(key)
        else:
            state[key] = kind
    return state


class Store:
    """Where the swept locks live: one server, or a quorum of three independent ones; with an admin client each."""

    def __init__(self, name: str, urls: list[str], clients: list[redis.Redis]) -> None:
        self.name = name
        self.urls = urls
        self.clients = clients
        self.majority = len(clients) // 2 + 1

    def registry(self, **options: Any) -> hybridlock.AsyncLockRegistry:
        if self.name == "quorum":
            return hybridlock.AsyncQuorumLockRegistry(self.urls, **options)
        return hybridlock.AsyncLockRegistry(self.urls[0], **options)

    def skip_unless_supports(self, kind: Kind) -> None:
        if self.name == "quorum" and kind.name in ("write", "read"):
            pytest.skip("read-write locks are refused over a quorum (tests/_async/test_quorum.py checks it)")

    def state(self) -> list[dict[bytes, Any]]:
        return [server_state(client) for client in self.clients]

    async def expect(self, expected: list[dict[bytes, Any]], when: str) -> None:
        """Every server's state is ``expected``: at once on a majority (all of one server), on every server within
        ``SETTLE`` seconds."""
        state = self.state()
        settled = sum(1 for have, want in zip(state, expected, strict=True) if have == want)
        assert settled >= self.majority, f"{when}: {state}"
        deadline = time.monotonic() + SETTLE
        while state != expected:
            assert time.monotonic() < deadline, f"{when}, still after {SETTLE} s: {state}"
            await asyncio.sleep(0.01)
            state = self.state()

    def drop_connections(self) -> None:
        """Close every client connection but the admin's (as a server ``timeout``, a proxy reset or a failover
        would): the next call of each registry reconnects first."""
        for client in self.clients:
            client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


@pytest.fixture(params=["redis", pytest.param("quorum", marks=pytest.mark.quorum)])
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "redis":
        server: EmbeddedServer = request.getfixturevalue("server")
        yield Store("redis", [server.url], [request.getfixturevalue("redis_client")])
        return
    urls: list[str] = request.getfixturevalue("quorum_urls")  # (flushed)
    clients = [redis.Redis.from_url(url) for url in urls]
    try:
        yield Store("quorum", urls, clients)
    finally:
        for client in clients:
            client.close()


def mutexes_of(lock: Any) -> list[Any]:
    """The local mutexes behind a lock (one per key for a multi-key lock; a read-write pair has its own state)."""
    if isinstance(lock, hybridlock.AsyncMultiLock):
        return [part._mutex for part in lock.locks]
    mutex = getattr(lock, "_mutex", None)
    return [] if mutex is None else [mutex]


async def sweep(
    attempt: Callable[[], Awaitable[object]],
    check: Callable[[int], Awaitable[None]],
    before_cancel: Callable[[], Awaitable[None]] | None = None,
    max_steps: int = MAX_STEPS,
    must_finish: bool = True,
) -> int:
    """Cancel ``attempt()`` after 0, 1, 2, ... loop steps (counted from ``before_cancel()``, if given), calling
    ``check(n)`` after each; returns the first n at which the attempt had finished before its cancel."""
    for steps in range(max_steps):
        task = asyncio.create_task(awaited(attempt))
        if before_cancel is not None:
            await before_cancel()
        for _ in range(steps):
            await asyncio.sleep(0)
        requested = task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except asyncio.CancelledError:
            pass
        await check(steps)
        if not task.cancelled():
            task.result()  # an attempt that failed otherwise fails the test
            # On Python 3.11 a cancel can be lost below us (redis-py awaits asyncio.wait_for, which drops a cancel
            # that arrives as its inner call completes: CPython gh-86296, fixed in 3.12); the attempt then simply
            # runs to its end, which the check has just found clean. The sweep ends when the attempt was done
            # before its cancel came.
            if not requested:
                return steps
    assert not must_finish, f"the attempt did not finish within {max_steps} loop steps"
    return max_steps


@pytest.mark.parametrize("reconnect", [False, True], ids=["warm", "reconnecting"])
@kinds()
async def test_cancelled_anywhere_in_an_uncontended_acquire_and_release(
    store: Store, kind: Kind, reconnect: bool
) -> None:
    store.skip_unless_supports(kind)
    async with store.registry() as mine, store.registry() as theirs:
        lock = kind.make(mine, "k")
        rival = kind.rival(theirs, "k")

        async def attempt() -> None:
            if reconnect:
                store.drop_connections()
            assert await lock.acquire(timeout=5)
            if reconnect:
                store.drop_connections()  # the release reconnects first: a cancel can land before it is sent
            await lock.release()

        async def check(steps: int) -> None:
            await store.expect([{}] * len(store.clients), f"left behind after a cancel at step {steps}")
            assert not any(m.locked() for m in mutexes_of(lock)), f"local mutex stuck after step {steps}"
            assert await rival.acquire(blocking=False), f"another owner could not take it after step {steps}"
            await rival.release()

        finished_at = await sweep(attempt, check)
        assert finished_at > 2, "the sweep never landed inside the round trips"


@kinds()
async def test_cancelled_anywhere_while_waiting_for_another_owner(store: Store, kind: Kind) -> None:
    store.skip_unless_supports(kind)
    async with store.registry() as mine, store.registry() as theirs:
        lock = kind.make(mine, "k")
        rival = kind.rival(theirs, "k")
        assert await rival.acquire(timeout=5)
        held_state = store.state()

        async def check(steps: int) -> None:
            await store.expect(held_state, f"a wait cancelled at step {steps} left a trace")
            assert not any(m.locked() for m in mutexes_of(lock)), f"local mutex stuck after step {steps}"

        await sweep(lambda: lock.acquire(timeout=0.5), check, max_steps=WAITING_STEPS, must_finish=False)
        await rival.release()
        assert await lock.acquire(timeout=1), "the lock stayed unreachable after the cancelled waits"
        await lock.release()


@kinds()
async def test_cancelled_anywhere_as_another_owner_releases_to_it(store: Store, kind: Kind) -> None:
    # The test's task holds the rival (another owner); the swept task waits for it in the server and is cancelled
    # n steps after the release that wakes it.
    store.skip_unless_supports(kind)
    async with store.registry() as mine, store.registry() as theirs:
        lock = kind.make(mine, "k")
        rival = kind.rival(theirs, "k")

        async def attempt() -> None:
            assert await lock.acquire(timeout=5)
            await lock.release()

        async def hold_until_it_waits_then_release() -> None:
            await asyncio.sleep(0.03)  # the attempt (started just before) is in its remote wait by now
            await rival.release()

        async def check(steps: int) -> None:
            await store.expect([{}] * len(store.clients), f"left behind after a cancel at step {steps}")
            assert not any(m.locked() for m in mutexes_of(lock)), f"local mutex stuck after step {steps}"
            assert await rival.acquire(timeout=1), f"another owner could not take it after step {steps}"

        assert await rival.acquire(timeout=5)
        await sweep(attempt, check, before_cancel=hold_until_it_waits_then_release)
        await rival.release()


@kinds(*EXCLUSIVE)
async def test_cancelled_anywhere_as_a_task_here_hands_the_lock_over(store: Store, kind: Kind) -> None:
    # The test's task holds the lock; the swept task of the same registry waits on the local mutex and is cancelled
    # n steps after the release that hands the lock (and perhaps the lease) to it.
    store.skip_unless_supports(kind)
    async with store.registry() as mine, store.registry() as theirs:
        lock = kind.make(mine, "k")
        rival = kind.rival(theirs, "k")

        async def attempt() -> None:
            assert await lock.acquire(timeout=5)
            await lock.release()

        async def release_to_it() -> None:
            for _ in range(5):
                await asyncio.sleep(0)  # the attempt queues on the local mutex
            await lock.release()

        async def check(steps: int) -> None:
            await store.expect([{}] * len(store.clients), f"left behind after a cancel at step {steps}")
            assert not any(m.locked() for m in mutexes_of(lock)), f"local mutex stuck after step {steps}"
            assert await rival.acquire(blocking=False), f"another owner could not take it after step {steps}"
            await rival.release()
            assert await lock.acquire(blocking=False), f"could not take it here again after step {steps}"

        assert await lock.acquire(timeout=5)
        await sweep(attempt, check, before_cancel=release_to_it)
        await lock.release()


# -- cancelled while holding; a lease its holder forgets ---------------------------------------------------------------


@kinds("plain", "write", "read", "multi")
async def test_a_holder_cancelled_inside_async_with_releases(store: Store, kind: Kind) -> None:
    store.skip_unless_supports(kind)
    async with store.registry() as mine, store.registry() as theirs:
        lock = kind.make(mine, "k")
        inside = asyncio.Event()

        async def hold() -> None:
            async with lock:
                inside.set()
                await asyncio.sleep(30)

        task = asyncio.create_task(hold())
        await asyncio.wait_for(inside.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await store.expect([{}] * len(store.clients), "left behind by the cancelled holder")
        rival = kind.rival(theirs, "k")
        assert await rival.acquire(blocking=False), "the cancelled holder's lease was left behind"
        await rival.release()


async def test_a_holder_cancelled_while_its_release_subscribes_still_releases(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    # With a task of this registry queued, the final release first subscribes to the lock's announcements (the first
    # local hand-off of a tenancy), an await the holder's task can be cancelled in. Made deterministic by a
    # subscription that never comes. Before the fix, the cancelled task ended still owning the lock: the lease stayed
    # in the server and the queued task timed out.
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        lock = registry.obtain("k")
        backend = registry._context.backend
        subscribing = asyncio.Event()

        async def never_subscribed(names: Any, owner: str) -> Any:
            subscribing.set()
            await asyncio.sleep(30)

        async def hold() -> None:
            async with lock:
                waiter_task = asyncio.create_task(waiter())
                for _ in range(20):
                    await asyncio.sleep(0)  # the waiter queues on the local mutex
                assert lock._mutex.waiting
                backends_watch = backend.watch
                backend.watch = never_subscribed  # type: ignore[method-assign]
                holder_state.append((waiter_task, backends_watch))

        async def waiter() -> bool:
            got = await lock.acquire(timeout=5)
            if got:
                await lock.release()
            return got

        holder_state: list[Any] = []
        task = asyncio.create_task(hold())
        await asyncio.wait_for(subscribing.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        waiter_task, backends_watch = holder_state[0]
        backend.watch = backends_watch  # type: ignore[method-assign]
        assert await asyncio.wait_for(waiter_task, 10), "the lock stayed with the cancelled holder"
        assert not await lock.locked()
        assert server_state(redis_client) == {}


async def test_a_forgotten_lease_ends_and_its_holder_is_told(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    # Without auto_renew nothing watches the lease: the holder learns of its end at its next renew() or release().
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=0.3, auto_renew=False) as mine, \
            hybridlock.AsyncLockRegistry(server.url) as theirs:  # fmt: skip
        told: list[object] = []
        mine.on_lost(told.append)
        lock = mine.obtain("k")
        assert await lock.acquire()
        valid_until = lock.valid_until
        assert lock.lost is False
        assert valid_until is not None
        other = theirs.obtain("k")
        assert await other.acquire(timeout=2), "the forgotten lease did not end"
        assert time.monotonic() > valid_until, "another owner got in before valid_until"
        with pytest.raises(hybridlock.LockLostError):
            await lock.renew()
        assert lock.lost is True
        assert told == [lock], "on_lost callbacks were not called once"
        await other.release()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
        assert not lock.is_held_by_current_task()


async def test_a_wait_cancelled_as_its_event_is_set_is_still_cancelled() -> None:
    """The event every background wait and poll sleeps on (``AsyncEvent``): a task cancelled in the same loop
    iteration as the event is set must see its ``CancelledError``. ``asyncio.wait_for`` before Python 3.12 returns
    True instead, so a task cancelled by its caller's timeout could go on to take a lock the caller gave up on."""
    from hybridlock._async._compat import AsyncEvent

    event = AsyncEvent()
    waiting = asyncio.ensure_future(event.wait(10))
    await asyncio.sleep(0)  # the task now waits on the event
    event.set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await event.wait(0)


@pytest.mark.parametrize("held", [False, True], ids=["taken", "refused"])
async def test_a_cancel_swallowed_inside_a_server_call_still_cancels_the_acquire(
    server: EmbeddedServer, redis_client: redis.Redis, held: bool
) -> None:
    """Python 3.11's ``asyncio.wait_for``, which redis-py waits in, loses a cancellation that lands as the call it
    wraps completes (fixed in 3.12): the task's ``cancelling()`` counts the request, but no ``CancelledError``
    comes. An acquire cancelled so must still end cancelled (not wait out its timeout, nor return holding the lock)
    and leave nothing behind. Simulated here: the attempt's call swallows a cancel of its task as it returns."""
    async with hybridlock.AsyncLockRegistry(server.url) as theirs, hybridlock.AsyncLockRegistry(server.url) as mine:
        holder = theirs.obtain("k")
        if held:
            assert await holder.acquire()
        before = server_state(redis_client)
        backend = mine._context.backend
        real = backend.try_acquire

        async def swallowing(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass  # as wait_for does when the inner call completed first
            return result

        backend.try_acquire = swallowing  # type: ignore[method-assign]
        lock = mine.obtain("k")
        start = time.monotonic()
        acquiring = asyncio.ensure_future(awaited(partial(lock.acquire, timeout=10)))
        with pytest.raises(asyncio.CancelledError):
            await acquiring
        assert time.monotonic() - start < 5, "the acquire waited out its timeout instead of ending cancelled"
        assert not lock.is_held_by_current_task()
        assert server_state(redis_client) == before, "the cancelled acquire left a lease or a queue place behind"
        backend.try_acquire = real  # type: ignore[method-assign]
        if held:
            await holder.release()
        assert await lock.acquire(timeout=5), "the local lock was left taken"
        await lock.release()
