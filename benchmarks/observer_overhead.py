"""What the instrumentation hook costs: the same acquire/release cycles without an observer, with a do-nothing one,
and with the Prometheus exporter.

    PYTHONPATH=. python benchmarks/observer_overhead.py [--rounds 7] [--cycles 20000]

Three cycles, each timed in ``rounds`` interleaved rounds so that machine load falls on every variant alike (the
best round per variant is the least disturbed by other work; the median is shown beside it): an in-process lock
(``LocalLockRegistry``: no server, so the hook's share is as large as it gets), a reentrant acquire/release of a
held lock (only counts: not reported, so only the check is paid), and an uncontended cycle on a real server (two
round trips). Point ``PYTHONPATH`` at another checkout to time code that has no hook at all (``observer=`` is
then not passed).
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hybridlock
from hybridlock.testing.server import EmbeddedServer


def _variants() -> dict[str, Callable[[], Any]]:
    """name -> a factory of the observer to pass (None: pass nothing)."""
    if "observer" not in inspect.signature(hybridlock.LockRegistry).parameters:
        return {"no hook (this checkout has none)": lambda: None}
    from prometheus_client import CollectorRegistry

    from hybridlock.metrics import LockObserver
    from hybridlock.metrics.prometheus import PrometheusObserver

    return {
        "no observer": lambda: None,
        "do-nothing observer": LockObserver,
        "PrometheusObserver": lambda: PrometheusObserver(CollectorRegistry()),
    }


def _registry(make: Callable[[], Any], url: str | None) -> Any:
    observer = make()
    options = {} if observer is None else {"observer": observer}
    if url is None:
        return hybridlock.LocalLockRegistry(**options)
    return hybridlock.LockRegistry(url, **options)


def _time_cycles(lock: Any, cycles: int, reentrant: bool) -> float:
    """Seconds per acquire/release cycle."""
    acquire, release = lock.acquire, lock.release
    if reentrant:
        acquire()
    start = time.perf_counter()
    for _ in range(cycles):
        acquire()
        release()
    elapsed = time.perf_counter() - start
    if reentrant:
        release()
    return elapsed / cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=20000, help="in-process cycles per round (server: / 20)")
    args = parser.parse_args()
    variants = _variants()
    with EmbeddedServer() as server:
        workloads = [
            ("in-process cycle (LocalLockRegistry)", None, args.cycles, False),
            ("reentrant cycle (held lock)", None, args.cycles, True),
            ("uncontended server cycle (Redis)", server.url, max(args.cycles // 20, 100), False),
        ]
        print(f"hybridlock from {Path(hybridlock.__file__).parent}; {args.rounds} rounds, µs per cycle")
        for title, url, cycles, reentrant in workloads:
            timings: dict[str, list[float]] = {name: [] for name in variants}
            registries = {name: _registry(make, url) for name, make in variants.items()}
            try:
                for registry in registries.values():  # warm up: connections, scripts loaded
                    _time_cycles(registry.obtain("bench"), max(cycles // 10, 10), reentrant)
                for _ in range(args.rounds):
                    for name, registry in registries.items():
                        timings[name].append(_time_cycles(registry.obtain("bench"), cycles, reentrant))
            finally:
                for registry in registries.values():
                    registry.close()
            base = min(next(iter(timings.values())))
            print(f"\n{title}")
            for name, values in timings.items():
                best, median = min(values), statistics.median(values)
                print(f"  {name:24} best {best * 1e6:8.2f}  (x{best / base:.3f}), median {median * 1e6:8.2f}")


if __name__ == "__main__":
    main()
