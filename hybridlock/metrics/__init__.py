"""Metrics and events: the instrumentation hook every registry takes (``observer=``), with no dependency.

    from hybridlock.metrics import LockObserver

    class Counting(LockObserver):
        def on_acquire(self, event):
            if event.outcome == "timed_out":
                timeouts[event.key] += 1

    registry = hybridlock.LockRegistry(url, observer=Counting())

The observer is told of every acquire of a hold (``AcquireEvent``: outcome, latency, local and remote wait, whether
it came from the server or a thread here, errors), every release (``ReleaseEvent``: hold time, outcome), every
renewal round (``RenewalEvent``) and every lease found lost (``LossEvent``). Ready-made exporters live beside this
module and need their optional extra: ``hybridlock.metrics.prometheus`` (``pip install hybridlock[prometheus]``).
"""

from .._core.events import (
    AcquireEvent,
    AcquireOutcome,
    LockKind,
    LockObserver,
    LossEvent,
    ReleaseEvent,
    ReleaseOutcome,
    RenewalEvent,
)

__all__ = [
    "LockObserver",
    "AcquireEvent",
    "ReleaseEvent",
    "RenewalEvent",
    "LossEvent",
    "AcquireOutcome",
    "ReleaseOutcome",
    "LockKind",
]
