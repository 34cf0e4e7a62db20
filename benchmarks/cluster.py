"""Cluster scaling: aggregate throughput of hybridlock over many keys as a Redis Cluster grows from 1 to 3 masters.

    python -m benchmarks.cluster                 # 1, 2 and 3 masters, 5 rounds of 6 s each (about 3 minutes)
    python -m benchmarks.cluster --quick         # 2 rounds of 3 s (about a minute)

The run starts a cluster of each size (``hybridlock.testing.EmbeddedCluster``, masters only, on free loopback
ports), and the sizes take turns, round by round; each round runs ``--processes`` processes of ``--threads``
threads. Each thread, until the round ends, picks one of ``--keys`` keys at random, takes its lock, and increments
the key's counter non-atomically (GET, then SET) in the same slot as the lock (``ctr:{key}``), so the work follows
the lock to its master. Reported: cycles per second over all processes (median of the rounds), the scaling factor
against one master, and the check that every counter equals the cycles run under its lock.

On one machine the client processes and the masters share its cores: the factor says how far the cluster spreads
the server's share of the work, not what separate machines would give. The machine's core count and load are in
the report. Writes ``benchmarks/results/cluster/latest.md`` (also printed) and ``latest.json``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/cluster.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.cluster

import hybridlock
from hybridlock.testing.cluster import EmbeddedCluster
from hybridlock.testing.server import find_server_binary

REPO = Path(__file__).resolve().parent.parent
CTX = multiprocessing.get_context("spawn")


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cycle_worker(
    url: str, keys: list[str], threads: int, start_at: float, seconds: float, seed: int, out: Any
) -> None:
    """One process: ``threads`` threads lock random keys until ``start_at + seconds``; sends {key: cycles}."""
    counters = redis.cluster.RedisCluster.from_url(url.replace("redis+cluster://", "redis://").split(",")[0])
    done: dict[str, int] = {}
    guard = threading.Lock()
    errors: list[str] = []
    with hybridlock.LockRegistry(url, registry_key="bench", expire_after=30) as registry:

        def run(thread_no: int) -> None:
            rng = random.Random(seed * 1000 + thread_no)
            mine: dict[str, int] = {}
            while time.time() < start_at:
                time.sleep(0.001)
            deadline = start_at + seconds
            try:
                while time.time() < deadline:
                    key = rng.choice(keys)
                    with registry.obtain(key):
                        value = int(counters.get(f"ctr:{{{key}}}") or 0)
                        counters.set(f"ctr:{{{key}}}", value + 1)
                    mine[key] = mine.get(key, 0) + 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
            with guard:
                for key, count in mine.items():
                    done[key] = done.get(key, 0) + count

        pool = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join(seconds + 120)
    counters.close()
    out.send((done, errors))


def measure(
    cluster: EmbeddedCluster, processes: int, threads: int, keys: list[str], seconds: float, seed: int
) -> dict[str, Any]:
    """One round on ``cluster``: cycles/s over all processes, and whether every counter came out exact."""
    for master in cluster.masters:
        cluster.command(master, "FLUSHALL")
    start_at = time.time() + 3.0  # every process has built its registry by then
    pipes, workers = [], []
    for n in range(processes):
        parent, child = CTX.Pipe()
        worker = CTX.Process(
            target=_cycle_worker,
            args=(cluster.url, keys, threads, start_at, seconds, seed * 100 + n, child),
            daemon=True,
        )
        worker.start()
        child.close()
        pipes.append(parent)
        workers.append(worker)
    per_key: dict[str, int] = {}
    errors: list[str] = []
    for parent, worker in zip(pipes, workers, strict=True):
        if not parent.poll(seconds + 120):
            errors.append("a worker process did not report")
            continue
        done, worker_errors = parent.recv()
        errors.extend(worker_errors)
        for key, count in done.items():
            per_key[key] = per_key.get(key, 0) + count
        worker.join(10)
    client = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.masters[0].port)
    try:
        wrong = [key for key in keys if int(client.get(f"ctr:{{{key}}}") or 0) != per_key.get(key, 0)]
    finally:
        client.close()
    cycles = sum(per_key.values())
    return {"cycles": cycles, "cycles_per_s": cycles / seconds, "wrong_counters": len(wrong), "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s")
    parser.add_argument("--masters", default="1,2,3", help="cluster sizes to measure (default 1,2,3)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "cluster")
    args = parser.parse_args(argv)
    seconds = args.seconds or (3.0 if args.quick else 6.0)
    rounds = args.rounds or (2 if args.quick else 5)
    sizes = [int(size) for size in args.masters.split(",")]
    keys = [f"key{n}" for n in range(args.keys)]
    results: dict[int, dict[str, Any]] = {}
    failed = False
    load_before = os.getloadavg()[0]
    clusters: dict[int, EmbeddedCluster] = {}
    try:
        for size in sizes:
            _log(f"cluster of {size} master(s): starting")
            clusters[size] = EmbeddedCluster(masters=size, replicas=0).start()
        runs: dict[int, list[dict[str, Any]]] = {size: [] for size in sizes}
        # Sizes take turns, round by round, so that the machine's load drifting during the run (other work on its
        # cores) weighs on every size alike.
        for round_no in range(rounds):
            for size in sizes:
                run = measure(clusters[size], args.processes, args.threads, keys, seconds, seed=round_no)
                _log(
                    f"  {size} master(s), round {round_no + 1}: {run['cycles_per_s']:,.0f} cycles/s, "
                    f"{run['wrong_counters']} wrong"
                )
                failed |= bool(run["wrong_counters"] or run["errors"])
                runs[size].append(run)
    finally:
        for cluster in clusters.values():
            cluster.stop()
    for size in sizes:
        results[size] = {
            "rounds": runs[size],
            "median_cycles_per_s": statistics.median(run["cycles_per_s"] for run in runs[size]),
        }
    base = results[sizes[0]]["median_cycles_per_s"]
    lines = [
        "# Cluster scaling",
        "",
        f"{args.processes} processes x {args.threads} threads, {args.keys:,} keys chosen at random, each cycle a lock "
        f"and a non-atomic counter increment in the lock's slot; {rounds} rounds of {seconds:g} s per size, medians. "
        f"{os.cpu_count()} cores shared by the clients and every master; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after. Python {platform.python_version()}, {find_server_binary()}.",
        "",
        "| masters | cycles/s | scaling vs " + f"{sizes[0]} | counters exact |",
        "|---:|---:|---:|---|",
    ]
    for size in sizes:
        entry = results[size]
        exact = all(not run["wrong_counters"] and not run["errors"] for run in entry["rounds"])
        lines.append(
            f"| {size} | {entry['median_cycles_per_s']:,.0f} | {entry['median_cycles_per_s'] / base:.2f} | "
            f"{'yes' if exact else 'NO'} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.md").write_text(text, encoding="utf-8")
    settings = {"processes": args.processes, "threads": args.threads, "keys": args.keys, "seconds": seconds}
    settings["rounds"] = rounds
    report = json.dumps({"settings": settings, "results": results}, indent=2)
    (args.out / "latest.json").write_text(report, encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
