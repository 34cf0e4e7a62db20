"""A Sentinel-managed master: sentinel URLs, the service named in every message, clients given directly, replica
clients refused, and replica confirmation (``confirm_replicas``) against real replicas that stop answering.

Failovers are in ``test_sentinel_failover.py``; the lock contract over the service is in ``tests/_async`` (and
``tests/_sync``), backends ``sentinel`` and ``sentinel-confirmed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

import hybridlock
from hybridlock._core.urls import parse_sentinel_url
from hybridlock.testing.sentinel import SentinelService
from hybridlock.testing.server import EmbeddedServer

SERVICE = "hybridlock-test"
NAME = f"sentinel://{SERVICE}/0"


# -- URLs (no server) ------------------------------------------------------------------------------------------------


def test_a_sentinel_url_names_sentinels_service_db_and_logins() -> None:
    url = parse_sentinel_url("redis+sentinel://app:s3cret@h1:26380,h2,[::1]:26381/orders/3?sentinel_password=pw")
    assert url.sentinels == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert (url.service, url.db, url.username) == ("orders", 3, "app")
    assert (url.password, url.sentinel_password) == ("s3cret", "pw")
    assert not url.tls
    assert "s3cret" not in repr(url)
    assert "pw'" not in repr(url)
    assert parse_sentinel_url("rediss+sentinel://h/svc?db=2").db == 2
    assert parse_sentinel_url("rediss+sentinel://h/svc").tls
    assert parse_sentinel_url("redis+sentinel://:only@h/svc").password == "only"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1,h2", "service name"),
        ("redis+sentinel:///svc", "sentinel host"),
        ("redis+sentinel://h/svc/x", "db must be"),
        ("redis+sentinel://h/svc/1?db=1", "not both"),
        ("redis+sentinel://h:99999/svc", "port"),
        ("redis+sentinel://h/svc?sentinel_pasword=x", "unknown sentinel URL option"),
        ("redis+sentinel://h/a/1/2", "path"),
    ],
)
def test_a_bad_sentinel_url_is_refused_saying_why_without_its_password(url: str, says: str) -> None:
    url = url.replace("://", "://user:hunter22@", 1)
    with pytest.raises(hybridlock.InvalidArgumentError, match=says) as caught:
        hybridlock.LockRegistry(url)
    assert "hunter22" not in str(caught.value)


def test_replication_not_confirmed_error_survives_pickling() -> None:
    import pickle

    error = hybridlock.ReplicationNotConfirmedError("x", key="k", server=NAME, acknowledged=1, required=2)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.key, copy.server, copy.acknowledged, copy.required, str(copy)) == ("k", NAME, 1, 2, str(error))
    assert isinstance(copy, ConnectionError)


def test_confirm_options_are_checked() -> None:
    backend = hybridlock.backends.MemoryBackend()
    with pytest.raises(hybridlock.InvalidArgumentError, match="confirm_replicas"):
        hybridlock.LockRegistry(backend, confirm_replicas=-1)
    with pytest.raises(hybridlock.InvalidArgumentError, match="renewal period"):
        hybridlock.LockRegistry("redis://127.0.0.1:1/0", expire_after=3, confirm_replicas=1, confirm_timeout=1.0)
    with pytest.raises(hybridlock.InvalidArgumentError, match="not a backend"):
        hybridlock.LockRegistry(backend, confirm_replicas=1)
    registry = hybridlock.LockRegistry("redis://127.0.0.1:1/0", expire_after=0.6, confirm_replicas=1)
    try:  # the default timeout fits the renewal period of a short lease
        assert registry.backend.confirmation is not None  # type: ignore[attr-defined]
        assert registry.backend.confirmation.timeout == pytest.approx(0.1)  # type: ignore[attr-defined]
    finally:
        registry.close()


def test_a_replica_client_is_refused() -> None:
    manager = redis.sentinel.Sentinel([("127.0.0.1", 1)])
    with pytest.raises(hybridlock.InvalidArgumentError, match=f"sentinel://{SERVICE}.*slave_for"):
        hybridlock.LockRegistry(manager.slave_for(SERVICE))


# -- the service named -----------------------------------------------------------------------------------------------


def _client_kwargs() -> dict[str, object]:
    return {"socket_timeout": 5, "socket_connect_timeout": 5, "retry": Retry(NoBackoff(), 1)}


@pytest.mark.server
@pytest.mark.sentinel
def test_every_message_names_the_service(sentinel_url: str) -> None:
    with hybridlock.LockRegistry(sentinel_url, expire_after=5) as a, hybridlock.LockRegistry(sentinel_url) as b:
        assert a.server == b.server == NAME
        assert NAME in repr(a)
        lock = a.obtain("orders:1")
        assert lock.acquire(timeout=5)
        with pytest.raises(hybridlock.LockNotOwnedError) as not_owned:
            b.obtain("orders:1").release()
        assert NAME in str(not_owned.value)
        assert not_owned.value.server == NAME
        assert not b.obtain("orders:1").acquire(blocking=False)
        lock.release()


def _recorded_sentinels(monkeypatch: pytest.MonkeyPatch, sentinel_class: type) -> list[Any]:
    """Every ``sentinel_class`` made from now on, with its ``close``/``aclose`` taken away as in redis-py before 8.1
    (which has neither): what a registry must close by itself."""
    made: list[Any] = []
    init = sentinel_class.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(sentinel_class, "__init__", recording_init)
    monkeypatch.delattr(
        sentinel_class, "aclose" if sentinel_class is redis.asyncio.sentinel.Sentinel else "close", raising=False
    )
    return made


def _open_sentinel_connections(managers: list[Any]) -> list[Any]:
    pools = [sentinel.connection_pool for manager in managers for sentinel in manager.sentinels]
    connections = [c for pool in pools for c in (*pool._available_connections, *pool._in_use_connections)]
    # (a thread-side connection of redis-py before 6 has no is_connected, only its socket)
    return [c for c in connections if (c.is_connected if hasattr(c, "is_connected") else c._sock is not None)]


@pytest.mark.server
@pytest.mark.sentinel
def test_close_closes_the_sentinel_connections_of_a_sentinel_url(
    monkeypatch: pytest.MonkeyPatch, sentinel_url: str
) -> None:
    managers = _recorded_sentinels(monkeypatch, redis.sentinel.Sentinel)
    with hybridlock.LockRegistry(sentinel_url) as registry, registry.obtain("orders:1"):
        assert len(managers) == 1
        assert _open_sentinel_connections(managers)  # (it asked the sentinels where the master is)
    assert not _open_sentinel_connections(managers)


@pytest.mark.server
@pytest.mark.sentinel
async def test_aclose_closes_the_sentinel_connections_of_a_sentinel_url(
    monkeypatch: pytest.MonkeyPatch, sentinel_url: str
) -> None:
    managers = _recorded_sentinels(monkeypatch, redis.asyncio.sentinel.Sentinel)
    async with hybridlock.AsyncLockRegistry(sentinel_url) as registry, registry.obtain("orders:1"):
        assert len(managers) == 1
        assert _open_sentinel_connections(managers)
    assert not _open_sentinel_connections(managers)


@pytest.mark.server
@pytest.mark.sentinel
def test_a_master_for_client_works_and_is_named(sentinel_service: SentinelService, sentinel_url: str) -> None:
    manager = redis.sentinel.Sentinel(sentinel_service.sentinel_addresses, **_client_kwargs())  # type: ignore[no-untyped-call]
    client = manager.master_for(SERVICE, **_client_kwargs())  # type: ignore[no-untyped-call]
    try:
        with hybridlock.LockRegistry(client, expire_after=5) as registry:
            assert registry.server == NAME
            with registry.obtain("k") as lock:
                assert lock.fencing_token is not None
                with sentinel_service.node_client(sentinel_service.master()) as master:
                    assert master.get("hybridlock:{k}") == registry.client_id
    finally:
        client.close()
        manager.close()


@pytest.mark.server
@pytest.mark.sentinel
async def test_an_asyncio_master_for_client_works_and_is_named(
    sentinel_service: SentinelService, sentinel_url: str
) -> None:
    manager = redis.asyncio.sentinel.Sentinel(sentinel_service.sentinel_addresses, socket_timeout=5)
    client = manager.master_for(SERVICE, socket_timeout=5, socket_connect_timeout=5)
    try:
        async with hybridlock.AsyncLockRegistry(client, expire_after=5) as registry:
            assert registry.server == NAME
            other = hybridlock.AsyncLockRegistry(sentinel_url)
            async with registry.obtain("k"):
                assert not await other.obtain("k").acquire(blocking=False)
            assert await other.obtain("k").acquire(timeout=5)
            await other.obtain("k").release()
            await other.aclose()
    finally:
        await client.aclose()
        await manager.aclose()


# -- replica confirmation ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def replicas_stopped(service: SentinelService) -> Iterator[None]:
    """Both replicas frozen (SIGSTOP): WAIT counts none of them. Resumed, and the service settled, afterwards."""
    replicas = service.replicas()
    for replica in replicas:
        replica.pause()
    try:
        yield
    finally:
        for replica in replicas:
            replica.resume()
        service.wait_healthy()


@pytest.mark.server
@pytest.mark.sentinel
def test_a_confirmed_acquire_fails_clearly_and_gives_the_lease_back_without_replicas(
    sentinel_service: SentinelService, sentinel_url: str
) -> None:
    options = {"expire_after": 5.0, "confirm_replicas": 2, "confirm_timeout": 0.2}
    with hybridlock.LockRegistry(sentinel_url, **options) as registry:  # type: ignore[arg-type]
        lock = registry.obtain("orders:7")
        with lock:  # both replicas up: confirmed
            assert lock.fencing_token is not None
        with replicas_stopped(sentinel_service):
            started = time.monotonic()
            with pytest.raises(hybridlock.ReplicationNotConfirmedError) as caught:
                lock.acquire(timeout=5)
            assert time.monotonic() - started < 3  # one WAIT timeout, not the acquire's whole timeout
            error = caught.value
            assert isinstance(error, hybridlock.BackendUnavailableError)
            assert (error.key, error.server, error.acknowledged, error.required) == ("orders:7", NAME, 0, 2)
            assert "0 of 2" in str(error)
            assert "given back" in str(error)
            assert NAME in str(error)
            assert not lock.is_held_by_current_thread()
            with sentinel_service.node_client(sentinel_service.master()) as master:
                assert master.exists("hybridlock:{orders:7}") == 0  # given back in the server too
            # Every kind refuses the same way.
            with pytest.raises(hybridlock.ReplicationNotConfirmedError):
                registry.obtain_read_write("catalog").read_lock().acquire(timeout=1)
            with pytest.raises(hybridlock.ReplicationNotConfirmedError):
                registry.obtain_read_write("catalog").write_lock().acquire(timeout=1)
            with pytest.raises(hybridlock.ReplicationNotConfirmedError):
                registry.obtain_many(["a", "b"]).acquire(timeout=1)
        with lock:  # replicas back: confirmed again
            pass
        # One replica is enough when one is asked for.
    with hybridlock.LockRegistry(sentinel_url, expire_after=5.0, confirm_replicas=1) as registry:
        replica = sentinel_service.replicas()[0]
        replica.pause()
        try:
            with registry.obtain("orders:8"):
                pass
        finally:
            replica.resume()
            sentinel_service.wait_healthy()


@pytest.mark.server
@pytest.mark.sentinel
def test_an_unconfirmed_renewal_does_not_extend_the_lease_and_the_holder_is_told(
    sentinel_service: SentinelService, sentinel_url: str
) -> None:
    lost = threading.Event()
    with hybridlock.LockRegistry(sentinel_url, expire_after=1.5, confirm_replicas=2, confirm_timeout=0.1) as registry:
        lock = registry.obtain("orders:9")
        lock.on_lost(lambda _lock: lost.set())
        assert lock.acquire(timeout=5)
        try:
            lock.renew()  # confirmed: fine
            with replicas_stopped(sentinel_service):
                before = lock.valid_until
                with pytest.raises(hybridlock.ReplicationNotConfirmedError, match="renewal not confirmed"):
                    lock.renew()
                assert lock.valid_until == before  # not extended
                # The renewer's rounds are not confirmed either: the lease is reported lost when it runs out.
                assert lost.wait(5), "the holder was not told"
                assert lock.lost
        finally:
            with pytest.raises(hybridlock.LockLostError):
                lock.release()


@pytest.mark.server
@pytest.mark.sentinel
def test_a_lease_the_master_reports_gone_is_lost_at_once_even_when_not_confirmed(
    sentinel_service: SentinelService, sentinel_url: str
) -> None:
    # With the replicas frozen no renewal is confirmed, but the master's own answer still counts: a lease it reports
    # gone is lost at that renewal (by hand or the renewer's), not only once valid_until passes.
    lost = threading.Event()
    with hybridlock.LockRegistry(sentinel_url, expire_after=9.0, confirm_replicas=2, confirm_timeout=0.1) as registry:
        by_hand, by_renewer = registry.obtain("orders:10"), registry.obtain("orders:11")
        by_renewer.on_lost(lambda _lock: lost.set())
        assert by_hand.acquire(timeout=5)
        assert by_renewer.acquire(timeout=5)
        with replicas_stopped(sentinel_service):
            with sentinel_service.node_client(sentinel_service.master()) as master:
                master.delete("hybridlock:{orders:10}", "hybridlock:{orders:11}")
            with pytest.raises(hybridlock.LockLostError):
                by_hand.renew()
            assert by_hand.lost
            lease_end = by_renewer.valid_until
            assert lease_end is not None
            assert lost.wait(6), "the renewer did not report the lease the master had lost"
            assert time.monotonic() < lease_end, "reported only when the lease ran out, not at the renewal"
        for lock in (by_hand, by_renewer):
            with pytest.raises(hybridlock.LockLostError):
                lock.release()


@pytest.mark.server
@pytest.mark.sentinel
async def test_asyncio_confirmed_acquire_without_replicas(sentinel_service: SentinelService, sentinel_url: str) -> None:
    async with hybridlock.AsyncLockRegistry(sentinel_url, confirm_replicas=2, confirm_timeout=0.2) as registry:
        lock = registry.obtain("orders:10")
        async with lock:
            pass
        replicas = sentinel_service.replicas()
        for replica in replicas:
            replica.pause()
        try:
            with pytest.raises(hybridlock.ReplicationNotConfirmedError, match="given back"):
                await lock.acquire(timeout=5)
        finally:
            for replica in replicas:
                replica.resume()
        await asyncio.to_thread(sentinel_service.wait_healthy)
        assert await lock.acquire(timeout=5)
        await lock.release()


# -- confirmation on disk (WAITAOF) ----------------------------------------------------------------------------------


def _has_waitaof(server: EmbeddedServer) -> bool:
    with redis.Redis.from_url(server.url) as client:
        version = str(client.info("server")["redis_version"])  # Valkey reports the Redis version it follows
    return tuple(int(part) for part in version.split(".")[:2]) >= (7, 2)


@pytest.mark.server
def test_confirm_fsync_waits_for_the_masters_aof() -> None:
    with EmbeddedServer(extra_args=("--appendonly", "yes", "--appendfsync", "everysec")) as server:
        if not _has_waitaof(server):
            pytest.skip(f"{server.version()} has no WAITAOF")
        options = {"expire_after": 6.0, "confirm_fsync": True, "confirm_timeout": 1.5}
        with hybridlock.LockRegistry(server.url, **options) as registry, registry.obtain("k") as lock:  # type: ignore[arg-type]
            lock.renew()  # WAITAOF 1 0: fsynced locally (everysec: within about a second)


@pytest.mark.server
def test_a_refused_confirmation_gives_the_lease_back(redis_client: redis.Redis, server: EmbeddedServer) -> None:
    # No AOF here (WAITAOF refuses numlocal=1), or no WAITAOF at all (Redis 7.0): either way the server answers the
    # confirmation with an error after the acquire script took the lease, which must not be left behind.
    with hybridlock.LockRegistry(server.url, expire_after=3.0, confirm_fsync=True) as registry:
        with pytest.raises(hybridlock.ReplicationNotConfirmedError, match=r"refused WAITAOF.*given back") as caught:
            registry.obtain("k").acquire(timeout=2)
        assert caught.value.server == server.url
        assert redis_client.exists("hybridlock:{k}") == 0
        assert not registry.obtain("k").locked()
