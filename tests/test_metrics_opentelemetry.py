"""The OpenTelemetry exporter (``hybridlock.metrics.opentelemetry``) with the real OpenTelemetry API and SDK, on a
real server: a ``MeterProvider`` of the test's own, read back through the SDK's ``InMemoryMetricReader``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import hybridlock
from hybridlock.metrics.opentelemetry import OpenTelemetryObserver
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server

JOIN = 10.0


class Metrics:
    """The points an ``InMemoryMetricReader`` holds, by instrument name and attributes."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.points: dict[tuple[str, frozenset[tuple[str, Any]]], Any] = {}
        self.units: dict[str, str] = {}
        data = reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                assert scope.scope.name == "hybridlock"
                for metric in scope.metrics:
                    self.units[metric.name] = metric.unit or ""
                    for point in metric.data.data_points:
                        self.points[metric.name, frozenset(point.attributes.items())] = point

    def point(self, name: str, **attributes: str) -> Any:
        attributes.setdefault("registry_key", "hybridlock")
        return self.points.get((name, frozenset(attributes.items())))

    def value(self, name: str, **attributes: str) -> float:
        point = self.point(name, **attributes)
        return 0 if point is None else point.value


def until(predicate: Any, what: str, within: float = JOIN) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_acquires_waits_handoffs_holds_and_a_loss_are_recorded(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    observer = OpenTelemetryObserver(provider)
    try:
        with (
            hybridlock.LockRegistry(server.url, observer=observer, expire_after=0.3, handoff_window=5.0) as registry,
            hybridlock.LockRegistry(server.url) as other,
        ):
            lock = registry.obtain("k")
            with lock:
                time.sleep(0.05)
            # A wait for another owner (remote hand-off), then for a thread here (local hand-off).
            rival = other.obtain("k")
            assert rival.acquire()
            waiter = threading.Thread(target=lambda: lock.acquire(timeout=JOIN) and lock.release())
            waiter.start()
            time.sleep(0.2)
            rival.release()
            waiter.join(JOIN)
            assert lock.acquire()
            waiter = threading.Thread(target=lambda: lock.acquire(timeout=JOIN) and lock.release())
            waiter.start()
            time.sleep(0.1)
            lock.release()
            waiter.join(JOIN)
            assert rival.acquire()
            assert lock.acquire(timeout=0.1) is False
            rival.release()
            # A loss: the key deleted under the holder.
            assert lock.acquire()
            until(lambda: Metrics(reader).value("hybridlock.renewed_leases") >= 1, "a lease renewed")
            redis_client.delete("hybridlock:{k}")
            until(lambda: lock.lost, "the renewer to find the key gone")
            with pytest.raises(hybridlock.LockLostError):
                lock.release()
        metrics = Metrics(reader)
    finally:
        provider.shutdown()
    lock_kind = {"kind": "lock"}
    assert metrics.value("hybridlock.acquires", outcome="acquired", **lock_kind) == 5
    assert metrics.value("hybridlock.acquires", outcome="timed_out", **lock_kind) == 1
    assert metrics.value("hybridlock.handoffs", scope="remote", **lock_kind) == 1
    assert metrics.value("hybridlock.handoffs", scope="local", **lock_kind) == 1
    assert metrics.value("hybridlock.releases", outcome="released", **lock_kind) == 4
    assert metrics.value("hybridlock.releases", outcome="lost", **lock_kind) == 1
    assert metrics.value("hybridlock.losses", **lock_kind) == 1
    assert metrics.value("hybridlock.errors", operation="release", **{"error.type": "LockLostError"}) == 1
    assert metrics.value("hybridlock.renewal.rounds", outcome="ok") >= 1
    assert metrics.value("hybridlock.renewed_leases") >= 1
    duration = metrics.point("hybridlock.acquire.duration", outcome="acquired", **lock_kind)
    assert duration.count == 5
    assert duration.sum > 0.15  # the remote hand-off waited 0.2 s
    assert tuple(duration.explicit_bounds)[:3] == (0.0001, 0.00025, 0.0005)  # the advised buckets, in seconds
    remote_wait = metrics.point("hybridlock.acquire.wait", where="remote", **lock_kind)
    assert remote_wait.count == 6
    assert remote_wait.sum > 0.25
    hold = metrics.point("hybridlock.hold.duration", **lock_kind)
    assert hold.count == 5
    assert hold.sum > 0.05 + 0.1
    assert metrics.units["hybridlock.acquire.duration"] == "s"


def test_the_key_is_an_attribute_only_when_asked(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    plain, keyed = InMemoryMetricReader(), InMemoryMetricReader()
    plain_provider, keyed_provider = MeterProvider(metric_readers=[plain]), MeterProvider(metric_readers=[keyed])
    try:
        with (
            hybridlock.LockRegistry(server.url, observer=OpenTelemetryObserver(plain_provider)) as one,
            hybridlock.LockRegistry(
                server.url, observer=OpenTelemetryObserver(keyed_provider, key_attribute=True)
            ) as two,
        ):
            for registry in (one, two):
                for key in ("a", "b"):
                    with registry.obtain(key):
                        pass
        plain_metrics, keyed_metrics = Metrics(plain), Metrics(keyed)
    finally:
        plain_provider.shutdown()
        keyed_provider.shutdown()
    assert plain_metrics.value("hybridlock.acquires", kind="lock", outcome="acquired") == 2
    assert keyed_metrics.value("hybridlock.acquires", kind="lock", outcome="acquired") == 0
    for key in ("a", "b"):
        assert keyed_metrics.value("hybridlock.acquires", kind="lock", key=key, outcome="acquired") == 1
