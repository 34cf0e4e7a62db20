"""The asyncio backends (``AsyncMemoryBackend``, ``AsyncRedisBackend`` on a real server), driven directly.

The blocking backends are generated from these sources and covered by the whole suite through the registries; here
the asyncio side is run as written: each test is a plain function that runs its coroutine with ``asyncio.run``
(no plugin), and builds its backends inside that loop, since an asyncio client belongs to the loop it first ran in.
Two backends on one server are two owners, as two processes are; on the memory side two owners share one backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis
import redis.asyncio
import valkey

import hybridlock
from hybridlock._async.backends.redis import redis_client_from_url
from hybridlock._core.names import lock_names, read_write_names
from hybridlock.backends import AsyncLockBackend, AsyncMemoryBackend, AsyncRedisBackend, RedisBackend
from hybridlock.backends.redis import redis_client_from_url as sync_client_from_url
from hybridlock.testing.server import EmbeddedServer

LEASE_MS = 10_000
REGISTRY_KEY = "hybridlock"

#: Makes a backend inside the running loop. Two calls are two owners' backends on one server (the same memory store).
BackendMaker = Callable[[], AsyncLockBackend]


@pytest.fixture(params=["memory", "redis"])
def make_backend(request: pytest.FixtureRequest) -> Iterator[BackendMaker]:
    if request.param == "memory":
        shared = AsyncMemoryBackend()
        yield lambda: shared
        return
    server: EmbeddedServer = request.getfixturevalue("server")
    request.getfixturevalue("redis_client")  # flushes the server
    yield lambda: AsyncRedisBackend(redis_client_from_url(server.url), owns_client=True)


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(body())  # the suite's per-test timeout bounds it


async def _closed(*backends: AsyncLockBackend) -> None:
    for backend in {id(b): b for b in backends}.values():
        await backend.aclose()


async def _subscribed(watch: hybridlock.backends.AsyncReleaseWatch) -> int:
    """Wait until the watch's subscription is confirmed (at once in memory); returns its epoch. The confirmation
    itself is a change the watch reports once (its first ``wait`` returns True): that is consumed here."""
    for _ in range(500):
        epoch = watch.epoch()
        if epoch is not None:
            await watch.wait(0)
            return epoch
        await asyncio.sleep(0.01)
    raise AssertionError("the watch was never confirmed")


def test_acquire_renew_release(make_backend: BackendMaker) -> None:
    async def body() -> None:
        mine, theirs = make_backend(), make_backend()
        names = lock_names(REGISTRY_KEY, "plain")
        try:
            got = await mine.try_acquire(names, "A", LEASE_MS, queue=False)
            assert got.acquired
            assert got.fencing_token is not None
            refused = await theirs.try_acquire(names, "B", LEASE_MS, queue=False)
            assert not refused.acquired
            assert refused.holder_ttl is not None
            assert 0 < refused.holder_ttl <= LEASE_MS / 1000
            assert await theirs.is_locked(names)
            assert await mine.renew([names], "A", LEASE_MS) == [True]
            assert await theirs.renew([names], "B", LEASE_MS) == [False]
            assert await theirs.release(names, "B", notify=True) is False  # not B's to release
            assert await mine.release(names, "A", notify=True) is True
            assert not await mine.is_locked(names)
            assert await mine.release(names, "A", notify=True) is False  # already gone: reported as lost
            again = await theirs.try_acquire(names, "B", LEASE_MS, queue=False)
            assert again.acquired
            assert again.fencing_token is not None
            assert again.fencing_token > got.fencing_token
        finally:
            await _closed(mine, theirs)

    run(body)


def test_waiters_queue_in_arrival_order(make_backend: BackendMaker) -> None:
    async def body() -> None:
        holder, first, second = make_backend(), make_backend(), make_backend()
        names = lock_names(REGISTRY_KEY, "queued")
        try:
            assert (await holder.try_acquire(names, "A", LEASE_MS, queue=False)).acquired
            assert not (await first.try_acquire(names, "B", LEASE_MS, queue=True)).acquired
            assert not (await second.try_acquire(names, "C", LEASE_MS, queue=True)).acquired
            assert await first.keep_waiting([names], "B") == [True]
            assert await holder.keep_waiting([names], "nobody") == [False]
            assert await holder.release(names, "A", notify=True)
            # Free, but B heads the queue: C is refused, B gets it.
            assert not (await second.try_acquire(names, "C", LEASE_MS, queue=True)).acquired
            got = await first.try_acquire(names, "B", LEASE_MS, queue=True)
            assert got.acquired
            assert got.contended
            await second.cancel_wait(names, "C")
            assert await second.keep_waiting([names], "C") == [False]
            assert await first.release(names, "B", notify=True)
        finally:
            await _closed(holder, first, second)

    run(body)


def test_a_release_wakes_the_watching_waiter(make_backend: BackendMaker) -> None:
    async def body() -> None:
        holder, waiting = make_backend(), make_backend()
        names = lock_names(REGISTRY_KEY, "watched")
        wanted: list[int] = []
        assert holder.on_wanted(lambda: wanted.append(1))
        try:
            assert (await holder.try_acquire(names, "A", LEASE_MS, queue=False)).acquired
            # The holder watches its own lock to hear that others want it (as a registry retaining a lease does).
            holder_watch = await holder.watch(names, "A")
            watch = await waiting.watch(names, "B")
            assert holder_watch is not None
            assert watch is not None
            await _subscribed(holder_watch)
            epoch = await _subscribed(watch)
            assert not (await waiting.try_acquire(names, "B", LEASE_MS, queue=True)).acquired
            assert watch.epoch() == epoch  # nothing was missed between the attempt and the wait
            woken = asyncio.ensure_future(watch.wait(10))
            await asyncio.sleep(0.05)
            assert not woken.done()
            loop = asyncio.get_running_loop()
            released_at = loop.time()
            assert await holder.release(names, "A", notify=True)
            assert await woken is True
            assert loop.time() - released_at < 2
            assert (await waiting.try_acquire(names, "B", LEASE_MS, queue=True)).acquired
            for _ in range(200):  # the "wanted" announcement reaches the holder's listener
                if holder_watch.contended():
                    break
                await asyncio.sleep(0.01)
            assert holder_watch.contended()
            assert wanted
            assert await watch.wait(0) is False  # nothing new since the last wake-up
            holder_watch.close()
            watch.close()
            watch.close()  # idempotent
            assert await waiting.release(names, "B", notify=True)
        finally:
            await _closed(holder, waiting)

    run(body)


def test_read_write(make_backend: BackendMaker) -> None:
    async def body() -> None:
        one, two = make_backend(), make_backend()
        names = read_write_names(REGISTRY_KEY, "catalog")
        try:
            assert (await one.try_acquire_read(names, "A", LEASE_MS)).acquired
            assert (await two.try_acquire_read(names, "B", LEASE_MS)).acquired
            assert await one.renew([names.read], "A", LEASE_MS) == [True]
            writer = await two.try_acquire_write(names, "C", LEASE_MS, wait=True)
            assert not writer.acquired
            assert not (await one.try_acquire_read(names, "D", LEASE_MS)).acquired  # a writer waits: no new readers
            assert await two.keep_waiting([names.write], "C") == [True]
            assert await one.release_read(names, "A")
            assert await two.release_read(names, "B")
            assert not await two.release_read(names, "B")
            written = await two.try_acquire_write(names, "C", LEASE_MS, wait=True)
            assert written.acquired
            assert written.fencing_token is not None
            assert not (await one.try_acquire_read(names, "A", LEASE_MS)).acquired
            assert await two.release_write(names, "C")
            assert not await two.release_write(names, "C")
            # A writer that gives up lets readers in again.
            assert (await one.try_acquire_read(names, "A", LEASE_MS)).acquired
            assert not (await two.try_acquire_write(names, "C", LEASE_MS, wait=True)).acquired
            assert not (await two.try_acquire_read(names, "B", LEASE_MS)).acquired
            await two.cancel_write_wait(names, "C")
            assert (await two.try_acquire_read(names, "B", LEASE_MS)).acquired
        finally:
            await _closed(one, two)

    run(body)


def test_several_locks_all_or_nothing(make_backend: BackendMaker) -> None:
    async def body() -> None:
        one, two = make_backend(), make_backend()
        x, y, z = (lock_names(REGISTRY_KEY, key) for key in ("x", "y", "z"))
        try:
            assert await one.can_acquire_together([x, y])
            got = await one.try_acquire_many([x, y], "A", LEASE_MS, queue=False)
            assert got.acquired
            assert len(got.parts) == 2
            refused = await two.try_acquire_many([z, y], "B", LEASE_MS, queue=False)
            assert not refused.acquired
            assert refused.blocked_by == 1
            assert not await two.is_locked(z)  # none taken
            assert await one.renew([x, y], "A", LEASE_MS) == [True, True]
            assert await one.release(x, "A", notify=True)
            assert await one.release(y, "A", notify=True)
            assert (await two.try_acquire_many([z, y], "B", LEASE_MS, queue=False)).acquired
        finally:
            await _closed(one, two)

    run(body)


def test_cancelling_a_watch_wait_leaves_no_task_behind(make_backend: BackendMaker) -> None:
    async def body() -> None:
        backend = make_backend()
        names = lock_names(REGISTRY_KEY, "cancelled")
        watch = await backend.watch(names, "B")
        assert watch is not None
        await _subscribed(watch)
        waiting = asyncio.ensure_future(watch.wait(30))
        await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # The watch is still usable after a cancelled wait: a release still wakes it (B queues first, as every
        # waiter does: a release with nobody queued announces nothing).
        other = make_backend()
        assert (await other.try_acquire(names, "A", LEASE_MS, queue=False)).acquired
        assert not (await backend.try_acquire(names, "B", LEASE_MS, queue=True)).acquired
        assert await other.release(names, "A", notify=True)
        assert await watch.wait(10) is True
        watch.close()
        await _closed(backend, other)
        leftover = asyncio.all_tasks() - {asyncio.current_task()}
        assert not leftover, leftover

    run(body)


def test_a_cancelled_watch_call_leaves_no_subscription_behind(server: EmbeddedServer, redis_client: redis.Redis):
    async def body() -> None:
        backend = AsyncRedisBackend(redis_client_from_url(server.url), owns_client=True)
        names = lock_names(REGISTRY_KEY, "abandoned")
        first = await backend.watch(names, "A")  # starts the listener and its connection
        assert first is not None
        await _subscribed(first)
        first.close()
        other = lock_names(REGISTRY_KEY, "abandoned-too")
        call = asyncio.ensure_future(backend.watch(other, "B"))
        await asyncio.sleep(0)  # inside watch(), sending its SUBSCRIBE
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        subscriber = backend._subscriber  # type: ignore[attr-defined]
        assert other.channel not in subscriber._refs  # the watch nobody got was closed
        for _ in range(500):  # idle channels are dropped, then the listener ends with its connection
            if subscriber._worker is None:
                break
            await asyncio.sleep(0.01)
        assert subscriber._worker is None
        await backend.aclose()
        assert not asyncio.all_tasks() - {asyncio.current_task()}

    run(body)


def test_a_blocking_client_is_refused_by_the_asyncio_backend() -> None:
    for client in (redis.Redis(), valkey.Valkey()):  # never connected
        with pytest.raises(hybridlock.InvalidArgumentError) as excinfo:
            AsyncRedisBackend(client)
        message = str(excinfo.value)
        assert "blocking client" in message
        assert ".asyncio." in message
    with pytest.raises(hybridlock.InvalidArgumentError, match="an asyncio client"):
        RedisBackend(redis.asyncio.Redis())


def test_a_flushed_script_cache_costs_one_eval(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    async def body() -> None:
        backend = AsyncRedisBackend(redis_client_from_url(server.url), owns_client=True)
        names = lock_names(REGISTRY_KEY, "flushed")
        try:
            redis_client.script_flush()
            assert (await backend.try_acquire(names, "A", LEASE_MS, queue=False)).acquired
            redis_client.script_flush()
            assert await backend.renew([names], "A", LEASE_MS) == [True]
            assert await backend.release(names, "A", notify=True)
        finally:
            await backend.aclose()

    run(body)


def test_an_unreachable_server_raises_backend_unavailable_naming_key_and_server() -> None:
    async def body() -> None:
        backend = AsyncRedisBackend(redis_client_from_url("redis://127.0.0.1:1/0"), owns_client=True)
        try:
            with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
                await backend.try_acquire(lock_names(REGISTRY_KEY, "nowhere"), "A", LEASE_MS, queue=False)
            assert excinfo.value.key == "nowhere"
            assert excinfo.value.server == "redis://127.0.0.1:1/0"
        finally:
            await backend.aclose()

    run(body)


def test_the_sync_helpers_keep_their_import_paths() -> None:
    from hybridlock.backends import redis_pubsub
    from hybridlock.backends.redis import ScriptRunner, translated_errors

    assert redis_pubsub.Subscriber.__module__ == "hybridlock._sync.backends.pubsub"
    assert ScriptRunner.__module__ == "hybridlock._sync.backends.redis"
    assert callable(translated_errors)
    assert isinstance(sync_client_from_url("redis://127.0.0.1:1/0"), redis.Redis)


def test_a_valkey_asyncio_client_works(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    import valkey.asyncio

    async def body() -> None:
        backend = AsyncRedisBackend(valkey.asyncio.Valkey.from_url(server.url, socket_timeout=5), owns_client=True)
        names = lock_names(REGISTRY_KEY, "valkey")
        try:
            assert backend.address == server.url
            assert (await backend.try_acquire(names, "A", LEASE_MS, queue=False)).acquired
            watch = await backend.watch(names, "B")
            assert watch is not None
            await _subscribed(watch)
            assert not (await backend.try_acquire(names, "B", LEASE_MS, queue=True)).acquired  # B waits in the queue
            assert await backend.release(names, "A", notify=True)
            assert await watch.wait(10) is True
            watch.close()
        finally:
            await backend.aclose()

    run(body)


def _quiet_asyncio_client(server: EmbeddedServer, **kwargs: object) -> redis.asyncio.Redis:
    """An asyncio client with the settings that keep hybridlock's timeout promise (so it draws no warning)."""
    from redis.asyncio.retry import Retry as AsyncRetry
    from redis.backoff import NoBackoff

    return redis.asyncio.Redis(
        port=server.port,
        socket_timeout=5,
        socket_connect_timeout=5,
        retry=AsyncRetry(NoBackoff(), 1),
        **kwargs,  # type: ignore[arg-type]
    )


def test_an_asyncio_single_connection_client_keeps_its_one_connection(server: EmbeddedServer) -> None:
    # The asyncio client makes its single connection at its first command: the scripts must go through it then,
    # not over connections the script runner would take from the pool.
    async def main() -> int:
        client = _quiet_asyncio_client(server, single_connection_client=True)
        registry = hybridlock.AsyncLockRegistry(client)
        try:
            await client.ping()  # the client's one connection
            lock = registry.obtain("one-connection")
            for _ in range(5):
                async with lock:
                    assert lock.fencing_token is not None
            pool = client.connection_pool
            return len(pool._available_connections) + len(pool._in_use_connections)
        finally:
            await registry.aclose()
            await client.aclose()

    assert asyncio.run(main()) == 1


def test_asyncio_lock_cycles_reuse_the_runners_connections(server: EmbeddedServer) -> None:
    async def main() -> list[int]:
        client = _quiet_asyncio_client(server)
        registry = hybridlock.AsyncLockRegistry(client)
        taken: list[int] = []
        try:
            lock = registry.obtain("spares")
            async with lock:
                pass
            pool = client.connection_pool
            get_connection = pool.get_connection

            async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
                taken.append(1)
                return await get_connection(*args, **kwargs)

            pool.get_connection = counted  # type: ignore[method-assign]
            for _ in range(20):
                async with lock:
                    pass
        finally:
            await registry.aclose()
            await client.aclose()
        return taken

    assert asyncio.run(main()) == [], "an asyncio lock cycle took a connection from the pool"
