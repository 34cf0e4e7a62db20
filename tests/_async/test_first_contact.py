"""First contact with the server: ``registry.ping()`` fails at start-up as the first lock would, and the fencing
counters' retention (``fence_retention``) reaches the server. Real servers, each test on a server of its own or a
flushed one.

Written for asyncio; ``tests/_sync/test_first_contact.py`` is generated from it.
"""

from __future__ import annotations

import logging
import re

import pytest
import redis.asyncio

import hybridlock
from hybridlock._core.config import FENCE_RETENTION, QUORUM_FENCE_RETENTION
from hybridlock.backends import AsyncRedisBackend
from hybridlock.testing import EmbeddedServer
from hybridlock.testing.server import _free_port

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

PASSWORD = "first-pw-8d21"
WRONG = "wrong-pw-40ab"


def closed_url() -> str:
    """A server URL nobody listens on."""
    return f"redis://127.0.0.1:{_free_port()}/0"


async def first_acquire_error(connection: object, **options: object) -> hybridlock.HybridLockError:
    """What the first lock's acquire raises on ``connection``."""
    with pytest.raises(hybridlock.HybridLockError) as excinfo:
        await first_acquire(connection, **options)
    return excinfo.value


async def first_acquire(connection: object, **options: object) -> None:
    async with hybridlock.AsyncLockRegistry(connection, **options) as registry:  # type: ignore[arg-type]
        await registry.obtain("job").acquire(timeout=5)


async def ping_error(connection: object, **options: object) -> hybridlock.HybridLockError:
    with pytest.raises(hybridlock.HybridLockError) as excinfo:
        await ping(connection, **options)
    return excinfo.value


async def ping(connection: object, **options: object) -> float:
    async with hybridlock.AsyncLockRegistry(connection, **options) as registry:  # type: ignore[arg-type]
        return await registry.ping()


_SCRIPT = re.compile(r" script: [0-9a-f]{40}, on @user_script:\d+\.")


def same_error(pinged: hybridlock.HybridLockError, acquired: hybridlock.HybridLockError) -> None:
    """The ping's error is the first acquire's: the same class and message, for the operation "ping" and no key."""
    assert type(pinged) is type(acquired), (pinged, acquired)
    assert acquired.key == "job"
    assert pinged.key is None
    assert pinged.server == acquired.server
    # (A server error inside a script names the script and its line: the ping's script is not the acquire's.)
    expected = (
        _SCRIPT.sub("", acquired.message)
        .replace("during acquire", "during ping")
        .replace("acquire refused", "ping refused")
    )
    assert _SCRIPT.sub("", pinged.message) == expected, (pinged, acquired)
    assert "ping" in pinged.message


# -- ping ------------------------------------------------------------------------------------------------------------


async def test_ping_of_a_reachable_server_returns_the_round_trip_and_leaves_nothing(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        seconds = await registry.ping()
        assert isinstance(seconds, float)
        assert 0 < seconds < 5
        assert await registry.ping() > 0  # again: the script is cached now (EVALSHA)
    assert redis_client.keys("*") == [], "ping left a key behind"


async def test_ping_of_an_unreachable_server_raises_what_the_first_lock_would() -> None:
    url = closed_url()
    pinged = await ping_error(url)
    assert isinstance(pinged, hybridlock.BackendUnavailableError)
    assert pinged.server == url
    same_error(pinged, await first_acquire_error(url))


async def test_ping_with_a_wrong_password_raises_what_the_first_lock_would(own_server: EmbeddedServer) -> None:
    with redis.Redis.from_url(own_server.url) as admin:
        admin.config_set("requirepass", PASSWORD)
    url = f"redis://:{WRONG}@127.0.0.1:{own_server.port}/0"
    pinged = await ping_error(url)
    assert isinstance(pinged, hybridlock.AuthenticationFailedError)
    assert WRONG not in str(pinged)
    same_error(pinged, await first_acquire_error(url))
    async with hybridlock.AsyncLockRegistry(f"redis://:{PASSWORD}@127.0.0.1:{own_server.port}/0") as registry:
        assert await registry.ping() > 0


async def test_ping_as_a_user_refused_evalsha_raises_what_the_first_lock_would(own_server: EmbeddedServer) -> None:
    with redis.Redis.from_url(own_server.url) as admin:
        admin.execute_command(
            "ACL", "SETUSER", "locker", "on", ">locker-pw", "~hybridlock:*", "&hybridlock:*", "+@all", "-evalsha"
        )
    url = f"redis://locker:locker-pw@127.0.0.1:{own_server.port}/0"
    pinged = await ping_error(url)
    assert "NOPERM" in pinged.message or "permission" in pinged.message, pinged
    same_error(pinged, await first_acquire_error(url))


async def test_ping_reloads_the_scripts_a_server_lost(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        await registry.ping()
        redis_client.script_flush()  # a restart, a failover: EVALSHA answers NOSCRIPT, EVAL follows
        assert await registry.ping() > 0


async def test_ping_of_a_replica_fails_as_the_first_lock(server: EmbeddedServer, own_server: EmbeddedServer) -> None:
    with redis.Redis.from_url(own_server.url) as replica:
        replica.replicaof("127.0.0.1", server.port)
        try:
            pinged = await ping_error(own_server.url)
            assert isinstance(pinged, hybridlock.BackendUnavailableError)
            assert "read-only replica" in pinged.message
            same_error(pinged, await first_acquire_error(own_server.url))
        finally:
            replica.replicaof("NO", "ONE")


async def test_ping_of_a_closed_registry_raises(server: EmbeddedServer) -> None:
    registry = hybridlock.AsyncLockRegistry(server.url)
    await registry.aclose()
    with pytest.raises(hybridlock.RegistryClosedError):
        await registry.ping()


async def test_ping_of_a_local_registry_has_nothing_to_reach() -> None:
    async with hybridlock.AsyncLocalLockRegistry() as registry:
        assert 0 <= await registry.ping() < 1


@pytest.mark.quorum
async def test_ping_of_a_quorum_needs_a_majority(quorum_urls: list[str], caplog: pytest.LogCaptureFixture) -> None:
    async with hybridlock.AsyncQuorumLockRegistry(quorum_urls) as registry:
        assert await registry.ping() > 0
    # One of three down: a lock would still be taken, so the ping answers, and says which server did not.
    down = closed_url()
    caplog.set_level(logging.WARNING, logger="hybridlock.backend")
    async with hybridlock.AsyncQuorumLockRegistry([*quorum_urls[:2], down]) as registry:
        assert await registry.ping() > 0
    assert any(down in record.getMessage() for record in caplog.records), caplog.text
    # Two of three down: no majority, as the first acquire finds.
    servers = [quorum_urls[0], closed_url(), closed_url()]
    async with hybridlock.AsyncQuorumLockRegistry(servers) as registry:
        with pytest.raises(hybridlock.BackendUnavailableError) as excinfo:
            await registry.ping()
        with pytest.raises(hybridlock.BackendUnavailableError) as acquired:
            await registry.obtain("job").acquire(timeout=5)
    assert excinfo.value.key is None
    assert excinfo.value.server == acquired.value.server
    for url in servers[1:]:
        assert url in str(excinfo.value)


@pytest.mark.sentinel
async def test_ping_of_a_sentinel_service(sentinel_url: str) -> None:
    async with hybridlock.AsyncLockRegistry(sentinel_url) as registry:
        assert await registry.ping() > 0


@pytest.mark.cluster
async def test_ping_of_a_cluster(cluster_url: str) -> None:
    async with hybridlock.AsyncLockRegistry(cluster_url) as registry:
        assert await registry.ping() > 0


# -- fence_retention -------------------------------------------------------------------------------------------------


def fence_ttl(url: str, key: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.pttl(f"hybridlock:{{{key}}}:fence"))


async def take(registry: hybridlock.AsyncLockRegistry, key: str) -> None:
    lock = registry.obtain(key)
    await lock.acquire(timeout=5)
    await lock.release()


async def test_fence_retention_reaches_the_server(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    async with hybridlock.AsyncLockRegistry(server.url) as registry:
        assert registry.fence_retention == FENCE_RETENTION
        await take(registry, "default")
    assert FENCE_RETENTION * 1000 - 60_000 < fence_ttl(server.url, "default") <= FENCE_RETENTION * 1000
    async with hybridlock.AsyncLockRegistry(server.url, fence_retention=120) as registry:
        assert registry.fence_retention == 120
        await take(registry, "short")
        await take(registry, "short")  # the acquire that finds the counter sets it again
    assert 60_000 < fence_ttl(server.url, "short") <= 120_000
    # A client passed in, too.
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        async with hybridlock.AsyncLockRegistry(client, fence_retention=90) as registry:
            await take(registry, "client")
    finally:
        await client.aclose()
    assert 60_000 < fence_ttl(server.url, "client") <= 90_000


async def test_a_backend_object_and_its_registry_given_the_same_retention_agree(server: EmbeddedServer) -> None:
    # Found by review: the backend keeps whole milliseconds, and a float compare refused the very value it was given.
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        backend = AsyncRedisBackend(client, fence_retention=100.0004)
        async with hybridlock.AsyncLockRegistry(backend, fence_retention=100.0004) as registry:
            await take(registry, "same")
        with pytest.raises(hybridlock.InvalidArgumentError, match="fence_retention"):
            hybridlock.AsyncLockRegistry(AsyncRedisBackend(client, fence_retention=100), fence_retention=101)
    finally:
        await client.aclose()


async def test_a_lease_longer_than_the_default_retention_keeps_its_counter_as_long(server: EmbeddedServer) -> None:
    lease = FENCE_RETENTION * 2
    with pytest.warns(hybridlock.LongLeaseWarning):
        registry = hybridlock.AsyncLockRegistry(server.url, expire_after=lease)
    async with registry:
        assert registry.fence_retention == lease


@pytest.mark.quorum
async def test_fence_retention_reaches_every_quorum_server(quorum_urls: list[str]) -> None:
    async with hybridlock.AsyncQuorumLockRegistry(quorum_urls) as registry:
        assert registry.fence_retention == QUORUM_FENCE_RETENTION
        await take(registry, "default")
    for url in quorum_urls:
        assert QUORUM_FENCE_RETENTION * 1000 - 60_000 < fence_ttl(url, "default") <= QUORUM_FENCE_RETENTION * 1000
    async with hybridlock.AsyncQuorumLockRegistry(quorum_urls, fence_retention=300) as registry:
        await take(registry, "short")
    for url in quorum_urls:
        assert 240_000 < fence_ttl(url, "short") <= 300_000


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), "60", True, 10.0])
async def test_an_invalid_fence_retention_is_refused_naming_it(server: EmbeddedServer, value: object) -> None:
    # 10 s is shorter than the lease (30 s): a counter must outlive the lease it fenced.
    for make in (
        lambda: hybridlock.AsyncLockRegistry(server.url, fence_retention=value),  # type: ignore[arg-type]
        lambda: hybridlock.AsyncQuorumLockRegistry([server.url], fence_retention=value),  # type: ignore[arg-type]
    ):
        with pytest.raises(hybridlock.InvalidArgumentError, match="fence_retention"):
            make()


async def test_a_backend_object_keeps_its_own_retention(server: EmbeddedServer) -> None:
    client = redis.asyncio.Redis.from_url(server.url)
    try:
        backend = AsyncRedisBackend(client, fence_retention=100)
        with pytest.raises(hybridlock.InvalidArgumentError, match="fence_retention"):
            hybridlock.AsyncLockRegistry(backend, fence_retention=200)
        async with hybridlock.AsyncLockRegistry(backend) as registry:
            assert registry.fence_retention == 100
            await take(registry, "backend")
        assert 60_000 < fence_ttl(server.url, "backend") <= 100_000
        with pytest.raises(hybridlock.InvalidArgumentError, match="fence_retention"):
            hybridlock.AsyncLockRegistry(backend, expire_after=120)  # a lease longer than its counters
    finally:
        await client.aclose()
