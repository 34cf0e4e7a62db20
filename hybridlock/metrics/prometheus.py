"""Prometheus metrics for hybridlock's locks: an observer that feeds ``prometheus_client`` counters and histograms.

Needs the ``prometheus`` extra (``pip install 'hybridlock[prometheus]'``, which brings ``prometheus_client``)::

    from prometheus_client import start_http_server
    from hybridlock.metrics.prometheus import PrometheusObserver

    observer = PrometheusObserver()                    # registers in prometheus_client's default registry
    registry = hybridlock.LockRegistry(url, observer=observer)
    start_http_server(9100)

One observer may serve several lock registries (their ``registry_key`` is a label). Create it once per
``CollectorRegistry``: a second one in the same registry would register the same metric names again, which
``prometheus_client`` refuses.

What is exported (``hybridlock_`` is ``namespace``; labels in braces)
--------------------------------------------------------------------
* ``hybridlock_acquires_total{registry_key, kind, outcome}``: finished acquires of a hold (reentrant ones are
  not counted); ``outcome`` is ``acquired``, ``timed_out`` (also a non-blocking attempt that found the lock
  busy), ``error`` or ``cancelled``.
* ``hybridlock_acquire_duration_seconds{registry_key, kind, outcome}``: how long each acquire took (histogram).
* ``hybridlock_acquire_wait_seconds{registry_key, kind, where}``: of that, ``where="local"`` queued behind
  threads (or tasks) of this process, ``where="remote"`` from the first server attempt on (histogram; acquires
  that returned, acquired or timed out).
* ``hybridlock_handoffs_total{registry_key, kind, scope}``: locks received by ``scope="local"`` hand-off (from a
  thread here, the server lease kept: no round trip) or ``scope="remote"`` (from another owner, after waiting in
  the server for it to let go).
* ``hybridlock_hold_duration_seconds{registry_key, kind}``: how long holds lasted, acquire to release (histogram).
* ``hybridlock_releases_total{registry_key, kind, outcome}``: ``released``, ``lost`` (the release raised
  ``LockLostError``), ``error`` or ``cancelled``.
* ``hybridlock_renewal_rounds_total{registry_key, outcome}``: renewal rounds, ``ok`` or ``failed`` (the server
  out of reach; the renewer retries); ``hybridlock_renewed_leases_total{registry_key}``: leases extended;
  ``hybridlock_renewal_duration_seconds{registry_key}``: how long a round took (histogram).
* ``hybridlock_losses_total{registry_key, kind}``: held leases found lost.
* ``hybridlock_errors_total{registry_key, operation, error}``: exceptions by ``operation`` (``acquire``,
  ``release``, ``renewal``) and ``error``, the exception's class name (``BackendUnavailableError``,
  ``LockLostError``, ...). Cancellations are not errors.

``kind`` is ``lock``, ``read``, ``write`` or ``multi``. The lock's own key is not a label by default: keys are
unbounded (``order:1``, ``order:2``, ...) and every distinct label value is a time series kept for ever. Pass
``key_label=True`` to add a ``key`` label to the per-lock metrics when the keys are few and fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from .._core.events import AcquireEvent, LockObserver, LossEvent, ReleaseEvent, RenewalEvent
from ._buckets import ACQUIRE_BUCKETS, HOLD_BUCKETS

__all__ = ["ACQUIRE_BUCKETS", "HOLD_BUCKETS", "PrometheusObserver"]


class PrometheusObserver(LockObserver):
    """A ``LockObserver`` that exports counters and histograms to ``registry`` (a ``prometheus_client``
    ``CollectorRegistry``; by default the process-wide one that ``start_http_server`` serves).

    ``namespace`` prefixes every metric name; ``key_label`` adds the lock's key as a label to the per-lock metrics
    (mind the cardinality: see the module's docstring); ``acquire_buckets`` and ``hold_buckets`` override the
    histograms' bucket bounds (seconds)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        namespace: str = "hybridlock",
        key_label: bool = False,
        acquire_buckets: Sequence[float] = ACQUIRE_BUCKETS,
        hold_buckets: Sequence[float] = HOLD_BUCKETS,
    ) -> None:
        self._key_label = key_label
        # (metric, label values) -> the metric's child for them: ``labels()`` costs a lock and some microseconds per
        # call, a dict lookup far less, and every event needs several. (It grows as the series do, no more.)
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        per_lock = ("registry_key", "kind", *(("key",) if key_label else ()))
        ns = namespace

        def counter(name: str, doc: str, labels: Sequence[str]) -> Counter:
            return Counter(name, doc, labels, namespace=ns, registry=registry)

        def histogram(name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, labels, namespace=ns, registry=registry, buckets=buckets)

        self.acquires = counter("acquires", "Finished acquires of a lock hold, by outcome.", (*per_lock, "outcome"))
        self.acquire_duration = histogram(
            "acquire_duration_seconds",
            "How long acquires took, local and remote wait together, by outcome.",
            (*per_lock, "outcome"),
            acquire_buckets,
        )
        self.acquire_wait = histogram(
            "acquire_wait_seconds",
            "Time acquires spent waiting behind threads of this process (local) and in the server (remote).",
            (*per_lock, "where"),
            acquire_buckets,
        )
        self.handoffs = counter(
            "handoffs",
            "Locks received from a thread of this process with the lease kept (local) or from another owner after "
            "waiting for it (remote).",
            (*per_lock, "scope"),
        )
        self.hold_duration = histogram(
            "hold_duration_seconds", "How long locks were held, acquire to release.", per_lock, hold_buckets
        )
        self.releases = counter("releases", "Releases of a lock hold, by outcome.", (*per_lock, "outcome"))
        self.renewal_rounds = counter(
            "renewal_rounds", "Renewal rounds of the registry's renewer, by outcome.", ("registry_key", "outcome")
        )
        self.renewed_leases = counter("renewed_leases", "Leases extended by renewal rounds.", ("registry_key",))
        self.renewal_duration = histogram(
            "renewal_duration_seconds", "How long renewal rounds took.", ("registry_key",), acquire_buckets
        )
        self.losses = counter("losses", "Held leases found lost.", per_lock)
        self.errors = counter(
            "errors", "Exceptions raised by lock operations, by operation and exception class.",
            ("registry_key", "operation", "error", *(("key",) if key_label else ())),
        )  # fmt: skip

    def _child(self, metric: Any, *labels: str) -> Any:
        child = self._children.get((metric, labels))
        if child is None:
            child = self._children[metric, labels] = metric.labels(*labels)
        return child

    def _lock_labels(self, registry_key: str, kind: str, key: str) -> tuple[str, ...]:
        return (registry_key, kind, key) if self._key_label else (registry_key, kind)

    def _error(self, registry_key: str, operation: str, error: BaseException, key: str | None) -> None:
        labels: tuple[str, ...] = (registry_key, operation, type(error).__name__)
        if self._key_label:
            labels += (key or "",)
        self._child(self.errors, *labels).inc()

    def on_acquire(self, event: AcquireEvent) -> None:
        labels = self._lock_labels(event.registry_key, event.kind, event.key)
        self._child(self.acquires, *labels, event.outcome).inc()
        self._child(self.acquire_duration, *labels, event.outcome).observe(event.duration)
        if event.outcome in ("acquired", "timed_out"):
            self._child(self.acquire_wait, *labels, "local").observe(event.local_wait)
            self._child(self.acquire_wait, *labels, "remote").observe(event.remote_wait)
        handoff = event.handoff
        if handoff is not None:
            self._child(self.handoffs, *labels, handoff).inc()
        if event.outcome == "error" and event.error is not None:
            self._error(event.registry_key, "acquire", event.error, event.key)

    def on_release(self, event: ReleaseEvent) -> None:
        labels = self._lock_labels(event.registry_key, event.kind, event.key)
        self._child(self.releases, *labels, event.outcome).inc()
        if event.held_for is not None:
            self._child(self.hold_duration, *labels).observe(event.held_for)
        if event.outcome in ("lost", "error") and event.error is not None:
            self._error(event.registry_key, "release", event.error, event.key)

    def on_renewal(self, event: RenewalEvent) -> None:
        outcome = "failed" if event.error is not None else "ok"
        self._child(self.renewal_rounds, event.registry_key, outcome).inc()
        self._child(self.renewed_leases, event.registry_key).inc(event.renewed)
        self._child(self.renewal_duration, event.registry_key).observe(event.duration)
        if event.error is not None:
            self._error(event.registry_key, "renewal", event.error, None)

    def on_loss(self, event: LossEvent) -> None:
        self._child(self.losses, *self._lock_labels(event.registry_key, event.kind, event.key)).inc()
