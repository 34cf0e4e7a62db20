"""A semaphore under contention: N single-threaded processes share P permits of one key.

    python -m benchmarks.semaphore                               # 16 processes, 4 permits, 3 rounds of 4 s
    python -m benchmarks.semaphore --processes 8 --permits 2 --rounds 1 --seconds 2

Each process loops: acquire a permit (the time it waited is recorded), count itself inside on the server (``INCR``;
the count must never pass the permits), hold the permit ``--hold`` seconds, count itself out, release. Reported per
round: cycles/s over all processes, the longest wait any process had, and Jain's fairness index over the processes'
cycle counts (1.0: every process got as many turns; 1/N: one process got them all). The server is one the run
starts (``HYBRIDLOCK_REDIS_SERVER`` picks the binary). Its own module, not part of ``benchmarks.run``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import redis

import hybridlock
from hybridlock.testing.server import EmbeddedServer


def _worker(url: str, permits: int, seconds: float, hold: float, start_at: float, out: Any) -> None:
    client = redis.Redis.from_url(url)
    cycles = 0
    longest = 0.0
    most = 0
    with hybridlock.LockRegistry(url) as registry:
        semaphore = registry.obtain_semaphore("bench", permits)
        while time.time() < start_at:
            time.sleep(0.001)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            asked = time.monotonic()
            if not semaphore.acquire(timeout=max(0.0, end - asked)):
                break
            longest = max(longest, time.monotonic() - asked)
            try:
                most = max(most, client.incr("bench:inside"))
                if hold:
                    time.sleep(hold)
                client.decr("bench:inside")
            finally:
                semaphore.release()
            cycles += 1
    client.close()
    out.put((cycles, longest, most))


def jain(counts: list[int]) -> float:
    """Jain's fairness index of ``counts``: (sum x)^2 / (n * sum x^2)."""
    total = sum(counts)
    squares = sum(count * count for count in counts)
    return total * total / (len(counts) * squares) if squares else 0.0


def run_round(url: str, processes: int, permits: int, seconds: float, hold: float) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 3.0  # (every child started and connected by then)
    children = [
        context.Process(target=_worker, args=(url, permits, seconds, hold, start_at, out)) for _ in range(processes)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=seconds + 60) for _ in children]
    for child in children:
        child.join(10)
    counts = [cycles for cycles, _, _ in results]
    most = max(inside for _, _, inside in results)
    if most > permits:
        raise AssertionError(f"{most} holders inside a semaphore of {permits}")
    return {
        "cycles_per_s": sum(counts) / seconds,
        "longest_wait_s": max(longest for _, longest, _ in results),
        "jain": jain(counts),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.semaphore", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--permits", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--hold", type=float, default=0.001, help="seconds each permit is held (default 0.001)")
    args = parser.parse_args(argv)
    rows = []
    with EmbeddedServer() as server:
        for index in range(args.rounds):
            redis.Redis.from_url(server.url).flushall()
            row = run_round(server.url, args.processes, args.permits, args.seconds, args.hold)
            rows.append(row)
            print(
                f"round {index + 1}: {row['cycles_per_s']:.0f} cycles/s, longest wait {row['longest_wait_s']:.3f} s, "
                f"Jain {row['jain']:.3f}"
            )
    print(
        f"median of {len(rows)} ({args.processes} processes x 1 thread, {args.permits} permits, hold {args.hold} s): "
        f"{statistics.median(r['cycles_per_s'] for r in rows):.0f} cycles/s, "
        f"longest wait {statistics.median(r['longest_wait_s'] for r in rows):.3f} s, "
        f"Jain {statistics.median(r['jain'] for r in rows):.3f}"
    )


if __name__ == "__main__":
    main()
