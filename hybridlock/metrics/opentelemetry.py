"""OpenTelemetry metrics for hybridlock's locks: an observer that records to OpenTelemetry instruments.

Needs the ``opentelemetry`` extra (``pip install 'hybridlock[opentelemetry]'``, which brings ``opentelemetry-api``;
an SDK and an exporter are the application's choice, as always with OpenTelemetry)::

    from hybridlock.metrics.opentelemetry import OpenTelemetryObserver

    registry = hybridlock.LockRegistry(url, observer=OpenTelemetryObserver())   # the global MeterProvider

The instruments mirror ``hybridlock.metrics.prometheus`` (see there for what each counts), named in OpenTelemetry's
dotted style, durations in seconds:

* counters ``hybridlock.acquires`` (attributes ``registry_key``, ``kind``, ``outcome``), ``hybridlock.handoffs``
  (``scope``: ``local`` or ``remote``), ``hybridlock.releases`` (``outcome``), ``hybridlock.losses``,
  ``hybridlock.renewal.rounds`` (``registry_key``, ``outcome``: ``ok`` or ``failed``), ``hybridlock.renewed_leases``
  and ``hybridlock.errors`` (``registry_key``, ``operation``, ``error.type``: the exception's class name);
* histograms ``hybridlock.acquire.duration`` (``outcome``), ``hybridlock.acquire.wait`` (``where``: ``local`` or
  ``remote``), ``hybridlock.hold.duration`` and ``hybridlock.renewal.duration``, with bucket boundaries suited to
  lock timings (an advisory: a View of the application's may override them).

As with Prometheus, the lock's key is an attribute only with ``key_attribute=True`` (keys are usually unbounded).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import metrics

from .._core.events import AcquireEvent, LockObserver, LossEvent, ReleaseEvent, RenewalEvent
from ._buckets import ACQUIRE_BUCKETS, HOLD_BUCKETS

__all__ = ["OpenTelemetryObserver"]

_Attributes = dict[str, str]


class OpenTelemetryObserver(LockObserver):
    """A ``LockObserver`` that records to instruments of a meter from ``meter_provider`` (default: the global
    one). ``key_attribute`` adds the lock's key to the per-lock instruments' attributes; ``acquire_buckets`` and
    ``hold_buckets`` are the histograms' advised bucket boundaries (seconds)."""

    def __init__(
        self,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        key_attribute: bool = False,
        acquire_buckets: Sequence[float] = ACQUIRE_BUCKETS,
        hold_buckets: Sequence[float] = HOLD_BUCKETS,
    ) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            own_version = version("hybridlock")
        except PackageNotFoundError:  # a source tree never installed
            own_version = ""
        meter = metrics.get_meter("hybridlock", own_version, meter_provider=meter_provider)
        self._key_attribute = key_attribute

        def histogram(name: str, description: str, buckets: Sequence[float]) -> metrics.Histogram:
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
            )

        self.acquires = meter.create_counter("hybridlock.acquires", "{acquire}", "Finished acquires of a lock hold.")
        self.acquire_duration = histogram(
            "hybridlock.acquire.duration", "How long acquires took, local and remote wait together.", acquire_buckets
        )
        self.acquire_wait = histogram(
            "hybridlock.acquire.wait",
            "Time acquires spent waiting behind threads of this process (local) and in the server (remote).",
            acquire_buckets,
        )
        self.handoffs = meter.create_counter(
            "hybridlock.handoffs", "{handoff}", "Locks received from a thread here (local) or another owner (remote)."
        )
        self.hold_duration = histogram("hybridlock.hold.duration", "How long locks were held.", hold_buckets)
        self.releases = meter.create_counter("hybridlock.releases", "{release}", "Releases of a lock hold.")
        self.renewal_rounds = meter.create_counter("hybridlock.renewal.rounds", "{round}", "Renewal rounds.")
        self.renewed_leases = meter.create_counter(
            "hybridlock.renewed_leases", "{lease}", "Leases extended by renewal rounds."
        )
        self.renewal_duration = histogram(
            "hybridlock.renewal.duration", "How long renewal rounds took.", acquire_buckets
        )
        self.losses = meter.create_counter("hybridlock.losses", "{loss}", "Held leases found lost.")
        self.errors = meter.create_counter("hybridlock.errors", "{error}", "Exceptions raised by lock operations.")

    def _lock_attributes(self, registry_key: str, kind: str, key: str) -> _Attributes:
        attributes = {"registry_key": registry_key, "kind": kind}
        if self._key_attribute:
            attributes["key"] = key
        return attributes

    def _error(self, registry_key: str, operation: str, error: BaseException, key: str | None) -> None:
        attributes = {"registry_key": registry_key, "operation": operation, "error.type": type(error).__name__}
        if self._key_attribute and key is not None:
            attributes["key"] = key
        self.errors.add(1, attributes)

    def on_acquire(self, event: AcquireEvent) -> None:
        attributes = self._lock_attributes(event.registry_key, event.kind, event.key)
        with_outcome = {**attributes, "outcome": event.outcome}
        self.acquires.add(1, with_outcome)
        self.acquire_duration.record(event.duration, with_outcome)
        if event.outcome in ("acquired", "timed_out"):
            self.acquire_wait.record(event.local_wait, {**attributes, "where": "local"})
            self.acquire_wait.record(event.remote_wait, {**attributes, "where": "remote"})
        handoff = event.handoff
        if handoff is not None:
            self.handoffs.add(1, {**attributes, "scope": handoff})
        if event.outcome == "error" and event.error is not None:
            self._error(event.registry_key, "acquire", event.error, event.key)

    def on_release(self, event: ReleaseEvent) -> None:
        attributes = self._lock_attributes(event.registry_key, event.kind, event.key)
        self.releases.add(1, {**attributes, "outcome": event.outcome})
        if event.held_for is not None:
            self.hold_duration.record(event.held_for, attributes)
        if event.outcome in ("lost", "error") and event.error is not None:
            self._error(event.registry_key, "release", event.error, event.key)

    def on_renewal(self, event: RenewalEvent) -> None:
        registry = {"registry_key": event.registry_key}
        self.renewal_rounds.add(1, {**registry, "outcome": "failed" if event.error is not None else "ok"})
        self.renewed_leases.add(event.renewed, registry)
        self.renewal_duration.record(event.duration, registry)
        if event.error is not None:
            self._error(event.registry_key, "renewal", event.error, None)

    def on_loss(self, event: LossEvent) -> None:
        self.losses.add(1, self._lock_attributes(event.registry_key, event.kind, event.key))
