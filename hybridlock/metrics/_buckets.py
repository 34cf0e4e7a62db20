"""Histogram bucket bounds (seconds) suited to lock timings, shared by the exporters."""

from __future__ import annotations

__all__ = ["ACQUIRE_BUCKETS", "HOLD_BUCKETS"]

#: From a local hand-off (microseconds) and one round trip (a fraction of a millisecond) to long waits.
ACQUIRE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Holds range from microseconds (a counter update) to minutes (a batch job).
HOLD_BUCKETS: tuple[float, ...] = (
    0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
