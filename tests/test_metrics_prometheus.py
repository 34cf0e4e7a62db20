"""The Prometheus exporter (``hybridlock.metrics.prometheus``) with the real ``prometheus_client``, on a real server.

Each test gives the exporter a ``CollectorRegistry`` of its own and reads the samples back with
``get_sample_value``, after driving locks through what each metric counts: uncontended cycles, a wait for another
owner, a local hand-off, timeouts, a deleted key, a killed server.
"""

from __future__ import annotations

import asyncio
import threading
import time

import prometheus_client
import pytest
import redis
from prometheus_client import CollectorRegistry

import hybridlock
from hybridlock.metrics.prometheus import PrometheusObserver
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server

JOIN = 10.0


def sample(metrics: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist (yet)."""
    labels.setdefault("registry_key", "hybridlock")
    value = metrics.get_sample_value(name, labels)
    return 0.0 if value is None else value


def until(predicate: object, what: str, within: float = JOIN) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_acquires_holds_handoffs_and_timeouts_are_counted(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    metrics = CollectorRegistry()
    observer = PrometheusObserver(metrics)
    with (
        hybridlock.LockRegistry(server.url, observer=observer, handoff_window=5.0) as registry,
        hybridlock.LockRegistry(server.url) as other,
    ):
        lock = registry.obtain("k")
        for _ in range(3):  # uncontended
            with lock, lock:  # (the inner one is reentrant: not counted)
                time.sleep(0.01)

        # A wait for another owner: a remote hand-off.
        rival = other.obtain("k")
        assert rival.acquire()
        waiter = threading.Thread(target=lambda: lock.acquire(timeout=JOIN) and lock.release())
        waiter.start()
        time.sleep(0.2)
        rival.release()
        waiter.join(JOIN)
        assert not waiter.is_alive()

        # A wait for a thread of this registry: a local hand-off.
        assert lock.acquire()
        waiter = threading.Thread(target=lambda: lock.acquire(timeout=JOIN) and lock.release())
        waiter.start()
        time.sleep(0.1)
        lock.release()
        waiter.join(JOIN)
        assert not waiter.is_alive()

        # Timeouts, remote and non-blocking.
        assert rival.acquire()
        assert lock.acquire(timeout=0.1) is False
        assert lock.acquire(blocking=False) is False
        rival.release()

    labels = {"kind": "lock"}
    assert sample(metrics, "hybridlock_acquires_total", outcome="acquired", **labels) == 6
    assert sample(metrics, "hybridlock_acquires_total", outcome="timed_out", **labels) == 2
    assert sample(metrics, "hybridlock_acquire_duration_seconds_count", outcome="acquired", **labels) == 6
    assert sample(metrics, "hybridlock_acquire_duration_seconds_sum", outcome="timed_out", **labels) >= 0.1
    assert sample(metrics, "hybridlock_acquire_wait_seconds_count", where="local", **labels) == 8
    assert sample(metrics, "hybridlock_acquire_wait_seconds_count", where="remote", **labels) == 8
    assert sample(metrics, "hybridlock_acquire_wait_seconds_sum", where="remote", **labels) >= 0.25
    assert sample(metrics, "hybridlock_acquire_wait_seconds_sum", where="local", **labels) >= 0.05
    assert sample(metrics, "hybridlock_handoffs_total", scope="remote", **labels) == 1
    assert sample(metrics, "hybridlock_handoffs_total", scope="local", **labels) == 1
    assert sample(metrics, "hybridlock_releases_total", outcome="released", **labels) == 6
    assert sample(metrics, "hybridlock_hold_duration_seconds_count", **labels) == 6
    assert sample(metrics, "hybridlock_hold_duration_seconds_sum", **labels) >= 0.03 + 0.1
    # Buckets are cumulative: every hold fits in the last finite bucket.
    assert sample(metrics, "hybridlock_hold_duration_seconds_bucket", le="3600.0", **labels) == 6
    assert sample(metrics, "hybridlock_losses_total", **labels) == 0
    assert b"hybridlock_acquires_total" in prometheus_client.generate_latest(metrics)


def test_a_loss_renewals_and_errors_are_counted(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    metrics = CollectorRegistry()
    with hybridlock.LockRegistry(
        server.url, registry_key="jobs", expire_after=0.3, observer=PrometheusObserver(metrics)
    ) as registry:
        lock = registry.obtain("k")
        assert lock.acquire()
        # A round that renewed the lease (a round may also find nothing due yet: counted "ok", renewing nothing).
        renewed = "hybridlock_renewed_leases_total"
        until(lambda: sample(metrics, renewed, registry_key="jobs") >= 1, "a renewal of the lease")
        redis_client.delete("jobs:{k}")
        until(lambda: lock.lost, "the renewer to find the key gone")
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
    assert sample(metrics, "hybridlock_renewed_leases_total", registry_key="jobs") >= 1
    assert sample(metrics, "hybridlock_renewal_duration_seconds_count", registry_key="jobs") >= 2
    assert sample(metrics, "hybridlock_losses_total", registry_key="jobs", kind="lock") == 1
    assert sample(metrics, "hybridlock_releases_total", registry_key="jobs", kind="lock", outcome="lost") == 1
    errors = "hybridlock_errors_total"
    assert sample(metrics, errors, registry_key="jobs", operation="release", error="LockLostError") == 1
    assert sample(metrics, "hybridlock_renewal_rounds_total", registry_key="jobs", outcome="failed") == 0


def test_an_unreachable_server_counts_failed_rounds_and_errors_by_class(own_server: EmbeddedServer) -> None:
    metrics = CollectorRegistry()
    with hybridlock.LockRegistry(own_server.url, expire_after=0.3, observer=PrometheusObserver(metrics)) as registry:
        lock = registry.obtain("k")
        assert lock.acquire()
        own_server.kill()
        until(lambda: lock.lost, "the unrenewed lease to be reported lost")
        with pytest.raises(hybridlock.LockLostError):  # known lost: the loss is what release reports
            lock.release()
        with pytest.raises(hybridlock.BackendUnavailableError):
            registry.obtain("other").acquire(timeout=1)
    unavailable = {"error": "BackendUnavailableError"}
    assert sample(metrics, "hybridlock_renewal_rounds_total", outcome="failed") >= 1
    assert sample(metrics, "hybridlock_errors_total", operation="renewal", **unavailable) >= 1
    assert sample(metrics, "hybridlock_errors_total", operation="release", error="LockLostError") == 1
    assert sample(metrics, "hybridlock_errors_total", operation="acquire", **unavailable) == 1
    assert sample(metrics, "hybridlock_acquires_total", kind="lock", outcome="error") == 1
    assert sample(metrics, "hybridlock_losses_total", kind="lock") == 1


def test_the_key_is_a_label_only_when_asked(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    plain, keyed = CollectorRegistry(), CollectorRegistry()
    with (
        hybridlock.LockRegistry(server.url, observer=PrometheusObserver(plain)) as one,
        hybridlock.LockRegistry(server.url, observer=PrometheusObserver(keyed, key_label=True)) as two,
    ):
        for registry in (one, two):
            for key in ("a", "b"):
                with registry.obtain(key):
                    pass
            with registry.obtain_read_write("rw").read_lock():
                pass
    assert sample(plain, "hybridlock_acquires_total", kind="lock", outcome="acquired") == 2
    assert sample(keyed, "hybridlock_acquires_total", kind="lock", outcome="acquired") == 0  # no such series
    for key in ("a", "b"):
        assert sample(keyed, "hybridlock_acquires_total", kind="lock", key=key, outcome="acquired") == 1
        assert sample(keyed, "hybridlock_hold_duration_seconds_count", kind="lock", key=key) == 1
    assert sample(keyed, "hybridlock_acquires_total", kind="read", key="rw", outcome="acquired") == 1
    assert sample(plain, "hybridlock_releases_total", kind="read", outcome="released") == 1


def test_asyncio_registries_feed_the_same_metrics(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    metrics = CollectorRegistry()
    observer = PrometheusObserver(metrics, namespace="app_locks")

    async def main() -> None:
        async with hybridlock.AsyncLockRegistry(server.url, observer=observer, handoff_window=5.0) as registry:
            lock = registry.obtain("k")

            async def cycle() -> None:
                async with lock:
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(asyncio.gather(*(cycle() for _ in range(4))), JOIN)
            async with registry.obtain_many(["x", "y"]):
                pass

    asyncio.run(main())
    assert sample(metrics, "app_locks_acquires_total", kind="lock", outcome="acquired") == 4
    # The first task went to the server; the other three were handed the lock by the task before them.
    assert sample(metrics, "app_locks_handoffs_total", kind="lock", scope="local") == 3
    assert sample(metrics, "app_locks_acquires_total", kind="multi", outcome="acquired") == 1
    assert sample(metrics, "app_locks_releases_total", kind="multi", outcome="released") == 1


def test_one_exporter_per_collector_registry() -> None:
    metrics = CollectorRegistry()
    PrometheusObserver(metrics)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        PrometheusObserver(metrics)
    PrometheusObserver(metrics, namespace="other")  # another namespace is another set of names
