"""The quorum workload: hybridlock's QuorumLockRegistry against pottery's Redlock over the same N masters, in one run.

    python -m benchmarks.quorum                 # N = 3 servers started here, 3 rounds
    python -m benchmarks.quorum --servers 5 --rounds 5 --json out.json

Two measurements, each a median over rounds, contenders alternating within each round so machine load hits them
alike:

* uncontended cycle: one thread takes and releases one key, again and again (µs per acquire + release);
* contended throughput: ``--processes`` processes x ``--threads`` threads take and release one key for
  ``--seconds`` seconds (cycles per second over all of them), with a non-atomic counter in the first server
  checked exact at the end (an overlap would lose increments).

pottery's Redlock is given the same masters (one ``redis.Redis`` client per server) and, as hybridlock, a lease
of 10 s; each thread uses a Redlock object of its own (its token is per object). hybridlock's threads of one
process share the local lock (and hand the lease to each other), which is the point of its design.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

import hybridlock
from hybridlock.testing import EmbeddedServer

LEASE = 10.0
CONTENDERS = ("hybridlock-quorum", "pottery-redlock")


def _locker(contender: str, urls: list[str], key: str) -> tuple[Callable[[], Any], Callable[[], None]]:
    """(a factory of one thread's lock, a close function) for ``contender`` over ``urls``."""
    if contender == "hybridlock-quorum":
        registry = hybridlock.QuorumLockRegistry(urls, expire_after=LEASE)
        return (lambda: registry.obtain(key)), registry.close
    from pottery import Redlock

    masters = {redis.Redis.from_url(url) for url in urls}

    def close() -> None:
        for client in masters:
            client.close()

    return (lambda: Redlock(key=f"bench-pottery:{key}", masters=masters, auto_release_time=LEASE)), close


def uncontended(contender: str, urls: list[str], cycles: int) -> float:
    """Median µs of one acquire + release, no other owner."""
    make, close = _locker(contender, urls, "uncontended")
    lock = make()
    try:
        for _ in range(20):  # warm up connections and script caches
            lock.acquire()
            lock.release()
        times = []
        for _ in range(cycles):
            started = time.perf_counter()
            lock.acquire()
            lock.release()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e6
    finally:
        close()


def _contend_in_process(contender: str, urls: list[str], threads: int, seconds: float, out: Any) -> None:
    make, close = _locker(contender, urls, "contended")
    data = redis.Redis.from_url(urls[0])
    counter = f"bench-quorum:{contender}:counter"
    stop_at = time.monotonic() + seconds
    counts = [0] * threads
    errors: list[str] = []

    def work(index: int) -> None:
        lock = make()
        try:
            while time.monotonic() < stop_at:
                if not lock.acquire(timeout=LEASE):
                    continue
                try:
                    value = int(data.get(counter) or 0)
                    data.set(counter, value + 1)
                finally:
                    lock.release()
                counts[index] += 1
        except Exception as exc:  # reported, not hidden
            errors.append(f"{type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    close()
    data.close()
    out.put((sum(counts), errors))


def contended(contender: str, urls: list[str], processes: int, threads: int, seconds: float) -> dict[str, Any]:
    """Cycles per second over ``processes`` x ``threads``, and whether the counter stayed exact."""
    data = redis.Redis.from_url(urls[0])
    counter = f"bench-quorum:{contender}:counter"
    data.delete(counter)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    children = [
        context.Process(target=_contend_in_process, args=(contender, urls, threads, seconds, out))
        for _ in range(processes)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=seconds + 120) for _ in children]
    for child in children:
        child.join(timeout=30)
    cycles = sum(count for count, _ in results)
    errors = [error for _, errs in results for error in errs]
    exact = int(data.get(counter) or 0) == cycles
    data.close()
    return {"cycles_per_s": cycles / seconds, "exact": exact, "errors": errors[:3]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    servers = [EmbeddedServer().start() for _ in range(args.servers)]
    urls = [server.url for server in servers]
    rows: dict[str, dict[str, list[Any]]] = {c: {"cycle_us": [], "cycles_per_s": [], "exact": []} for c in CONTENDERS}
    try:
        for round_no in range(args.rounds):
            for contender in CONTENDERS if round_no % 2 == 0 else reversed(CONTENDERS):
                rows[contender]["cycle_us"].append(uncontended(contender, urls, args.cycles))
                result = contended(contender, urls, args.processes, args.threads, args.seconds)
                rows[contender]["cycles_per_s"].append(result["cycles_per_s"])
                rows[contender]["exact"].append(result["exact"])
                print(f"round {round_no + 1} {contender}: {rows[contender]['cycle_us'][-1]:.0f} µs/cycle, "
                      f"{result['cycles_per_s']:.0f} cycles/s, exact={result['exact']} {result['errors']}",
                      flush=True)  # fmt: skip
    finally:
        for server in servers:
            server.stop()
    summary = {
        contender: {
            "uncontended_cycle_us_median": statistics.median(row["cycle_us"]),
            "contended_cycles_per_s_median": statistics.median(row["cycles_per_s"]),
            "always_exact": all(row["exact"]),
            "rounds": row,
        }
        for contender, row in rows.items()
    }
    print(f"\nN = {args.servers} servers, {args.processes} processes x {args.threads} threads, medians of "
          f"{args.rounds} rounds:")  # fmt: skip
    for contender, row in summary.items():
        print(f"  {contender:18} uncontended {row['uncontended_cycle_us_median']:8.0f} µs   contended "
              f"{row['contended_cycles_per_s_median']:8.0f} cycles/s   exact={row['always_exact']}")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"servers": args.servers, "settings": vars(args), "results": summary}, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
