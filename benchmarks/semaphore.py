"""A semaphore under contention: N single-threaded processes share P permits of one key, hybridlock against the
Python Redis semaphores people use, in one run on one server.

    python -m benchmarks.semaphore                        # 16 processes, 4 permits, 3 rounds of 5 s per contender
    python -m benchmarks.semaphore --processes 8 --permits 2 --rounds 1 --seconds 2
    python -m benchmarks.semaphore --json benchmarks/results/semaphore/latest.json

Each process (started with ``spawn``, once for the whole run: its own client, and registry) runs every
contender's rounds in turn, and in each loops: acquire a permit (the wait is timed),
run the critical section, release. The critical section costs what the lock benchmarks' does, two commands to the
same server (there a ``GET`` then ``SET`` of a counter; here ``INCR`` then ``DECR`` of a count of the holders
inside, since up to P holders are in at once): ``INCR`` returns how many are inside, and a count above the permits
fails the run. Reported per contender, as medians over the rounds (contenders take turns within each round, in an
order that alternates, so that machine load hits them alike): cycles/s over all processes, the longest wait any
process had, wait p50 and p99, Jain's fairness index over the processes' cycle counts ((Σx)² / (n·Σx²): 1.0 =
equal shares, 1/n = one process took them all), server commands per cycle (``INFO commandstats``, a script's
own commands included, less the critical section's two and connection handshakes) and scripts called per cycle
(``EVALSHA`` and the like, each one client command). A contender whose library does not import is skipped with a
note. Its own module, not part of ``benchmarks.run``.

Contenders (every lease or expiry 30 s, as in the lock benchmarks):

* ``hybridlock``: ``LockRegistry(url, expire_after=30).obtain_semaphore(key, permits)``, ``acquire(timeout=...)``;
* ``limiters`` (PyPI ``redis-rate-limiters``, otovo): ``SyncSemaphore(name, capacity, max_sleep=30, expiry=30,
  connection=client)`` as a context manager: a Redis list of P tokens taken with ``BLPOP`` and pushed back on exit;
  a holder that dies takes its token with it (the list's expiry only resets the whole semaphore when idle);
* ``py-redis-semaphore`` (PyPI ``py-redis-semaphore``, module ``redis_semaphore``): ``Semaphore(client,
  SemaphoreConfig(name, limit=P, lock_timeout=30, acquire_timeout=30))``: a sorted set of leased slots, renewed by a
  heartbeat thread per holder, waiters woken through ``BLPOP`` (its default ``acquire_mode``);
* ``redis-semaphore`` (PyPI ``redis-semaphore`` 0.2.2, bluele, 2016, also module ``redis_semaphore``: only one of
  the two can be installed, and the run takes whichever imports): ``Semaphore(client, count=P,
  namespace=key)``, ``acquire(timeout=30)`` (``BLPOP`` on a list of tokens) and ``release()``;
* ``redis-semaphore-eval`` (PyPI, 2021): its ``semaphore(client, key, limit=P, expire_in=30, timeout=30)`` context
  manager, retried on ``FailedToAcquireLock`` (it waits for one wake-up, tries once more and gives up: a caller
  that must get in loops, as here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis

import hybridlock
from hybridlock.testing.server import EmbeddedServer

from .measure import command_delta, command_snapshot, jain_index, percentile

LEASE = 30
KEY = "bench-semaphore"
INSIDE = "bench-semaphore:inside"
CONTENDERS = ("hybridlock", "limiters", "py-redis-semaphore", "redis-semaphore", "redis-semaphore-eval")

#: An acquire is (acquire(timeout) -> bool, release()); a contender's factory makes one in a child process and
#: returns it with a close function.
Acquirer = tuple[Callable[[float], bool], Callable[[], None], Callable[[], None]]


def _hybridlock(url: str, permits: int) -> Acquirer:
    registry = hybridlock.LockRegistry(url, expire_after=LEASE)
    semaphore = registry.obtain_semaphore(KEY, permits)
    return (lambda timeout: semaphore.acquire(timeout=timeout)), semaphore.release, registry.close


def _limiters(url: str, permits: int) -> Acquirer:
    from limiters import MaxSleepExceededError, SyncSemaphore

    client = redis.Redis.from_url(url)
    semaphore = SyncSemaphore(name=KEY, capacity=permits, max_sleep=LEASE, expiry=LEASE, connection=client)

    def acquire(timeout: float) -> bool:
        try:
            semaphore.__enter__()
        except MaxSleepExceededError:
            return False
        return True

    return acquire, (lambda: semaphore.__exit__(None, None, None)), client.close


def _redis_semaphore_module() -> tuple[Any, bool]:
    """The installed ``redis_semaphore`` module and whether it is py-redis-semaphore's (it has ``SemaphoreConfig``)
    rather than bluele's redis-semaphore."""
    import redis_semaphore

    return redis_semaphore, hasattr(redis_semaphore, "SemaphoreConfig")


def _py_redis_semaphore(url: str, permits: int) -> Acquirer:
    module, theirs = _redis_semaphore_module()
    if not theirs:
        raise ImportError("redis_semaphore is bluele's redis-semaphore, not py-redis-semaphore")
    client = redis.Redis.from_url(url)
    config = module.SemaphoreConfig(name=KEY, limit=permits, lock_timeout=LEASE, acquire_timeout=LEASE)
    semaphore = module.Semaphore(client, config)
    return (lambda timeout: bool(semaphore.acquire().success)), semaphore.release, client.close


def _bluele_redis_semaphore(url: str, permits: int) -> Acquirer:
    module, theirs = _redis_semaphore_module()
    if theirs:
        raise ImportError("redis_semaphore is py-redis-semaphore, not bluele's redis-semaphore")
    client = redis.Redis.from_url(url)
    semaphore = module.Semaphore(client, count=permits, namespace=KEY)

    def acquire(timeout: float) -> bool:
        try:
            semaphore.acquire(timeout=max(1, math.ceil(timeout)))
        except module.NotAvailable:
            return False
        return True

    return acquire, semaphore.release, client.close


def _redis_semaphore_eval(url: str, permits: int) -> Acquirer:
    import redis_semaphore_eval

    client = redis.Redis.from_url(url)
    held: list[contextlib.ExitStack] = []

    def acquire(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(
                    redis_semaphore_eval.semaphore(
                        client, KEY, limit=permits, expire_in=LEASE, timeout=max(1, math.ceil(timeout))
                    )
                )
            except redis_semaphore_eval.FailedToAcquireLock:
                if time.monotonic() >= deadline:
                    return False
                continue
            held.append(stack)
            return True

    return acquire, (lambda: held.pop().close()), client.close


FACTORIES: dict[str, Callable[[str, int], Acquirer]] = {
    "hybridlock": _hybridlock,
    "limiters": _limiters,
    "py-redis-semaphore": _py_redis_semaphore,
    "redis-semaphore": _bluele_redis_semaphore,
    "redis-semaphore-eval": _redis_semaphore_eval,
}


def available(contender: str) -> str | None:
    """None when ``contender``'s library imports (the right one, for the two ``redis_semaphore``), else why not."""
    try:
        if contender == "limiters":
            import limiters  # noqa: F401
        elif contender in ("py-redis-semaphore", "redis-semaphore"):
            _, theirs = _redis_semaphore_module()
            if theirs != (contender == "py-redis-semaphore"):
                return "module redis_semaphore is the other distribution's"
        elif contender == "redis-semaphore-eval":
            import redis_semaphore_eval  # noqa: F401
    except ImportError as exc:
        return f"does not import ({exc})"
    return None


def _child(schedule: list[str], url: str, permits: int, seconds: float, barrier: Any, out: Any) -> None:
    """One process of the run: for each contender of ``schedule`` in turn, make its semaphore, wait for the
    others at the barrier, cycle for ``seconds`` and report. The processes live for the whole run, so the rounds
    do not pay for starting 16 interpreters each."""
    counter = redis.Redis.from_url(url)
    for contender in schedule:
        barrier.wait(timeout=300)  # the harness has flushed the server
        waits: list[float] = []
        cycles = extra = most = 0
        error = None
        close: Callable[[], None] = lambda: None  # noqa: E731
        acquirer = None
        try:
            acquire, release, close = acquirer = FACTORIES[contender](url, permits)
        except Exception:
            error = traceback.format_exc(limit=5)
        barrier.wait(timeout=300)  # every process ready: go
        try:
            end = time.monotonic() + seconds
            while acquirer is not None:
                asked = time.monotonic()
                if asked >= end:
                    break
                if not acquire(LEASE):
                    raise RuntimeError(f"no permit within {LEASE} s")
                got = time.monotonic()
                try:
                    most = max(most, counter.incr(INSIDE))
                    counter.decr(INSIDE)
                finally:
                    release()
                if got <= end:  # a permit granted after the end is given back, not counted
                    waits.append(got - asked)
                    cycles += 1
                else:
                    extra += 1
        except Exception:
            error = traceback.format_exc(limit=5)
        finally:
            with contextlib.suppress(Exception):
                close()
            out.put({"cycles": cycles, "extra": extra, "waits": waits, "most": most, "error": error})
    counter.close()


def _round(
    url: str, stats: redis.Redis, barrier: Any, out: Any, processes: int, permits: int, seconds: float
) -> dict[str, Any]:
    """One contender's round, the children at the first barrier: flush, let them set up, time them."""
    stats.flushall()
    barrier.wait(timeout=300)
    barrier.wait(timeout=300)
    before = command_snapshot(stats)
    started = time.monotonic()
    parts = [out.get(timeout=seconds + 2 * LEASE + 120) for _ in range(processes)]
    elapsed = time.monotonic() - started
    delta = command_delta(before, command_snapshot(stats))
    errors = [p["error"] for p in parts if p["error"]]
    counts = [p["cycles"] for p in parts]
    waits = [w for p in parts for w in p["waits"]]
    cycles = sum(counts)
    run = cycles + sum(p["extra"] for p in parts)
    most = max(p["most"] for p in parts)
    return {
        "cycles": cycles,
        "cycles_per_s": cycles / seconds,
        "elapsed_s": elapsed,
        "wait_max_ms": max(waits) * 1e3 if waits else math.nan,
        "wait_p50_ms": percentile(waits, 0.50) * 1e3,
        "wait_p99_ms": percentile(waits, 0.99) * 1e3,
        "jain": jain_index(counts),
        "per_process_cycles": counts,
        "server_cmds_per_cycle": (delta.total() - 2 * run) / run if run else math.nan,
        "scripts_per_cycle": delta.scripts() / run if run else math.nan,
        # Where the server's commands go: the five most called, per cycle (a script's own commands included).
        "top_commands_per_cycle": {
            name: round(n / run, 2) for name, n in sorted(delta.calls.items(), key=lambda kv: -kv[1])[:5]
        }
        if run
        else {},
        "most_inside": most,
        "overfilled": most > permits,
        "errors": errors[:3],
    }


METRICS = (
    ("cycles_per_s", "cycles/s", "higher", 0),
    ("wait_max_ms", "longest wait (ms)", "lower", 0),
    ("wait_p50_ms", "wait p50 (ms)", "lower", 1),
    ("wait_p99_ms", "wait p99 (ms)", "lower", 0),
    ("jain", "Jain's index over processes", "higher", 3),
    ("server_cmds_per_cycle", "server cmds / cycle", "lower", 1),
    ("scripts_per_cycle", "scripts called / cycle", "lower", 1),
)


def _ratio_note(rows: dict[str, list[dict[str, Any]]], contender: str, key: str, better: str) -> str:
    """hybridlock's value over ``contender``'s, round by round (the spread the median hides): as "how many times
    better", so above 1 means hybridlock did better whichever way the metric reads."""
    ratios = []
    for mine, theirs in zip(rows["hybridlock"], rows[contender], strict=False):
        a, b = mine[key], theirs[key]
        if not a or not b or math.isnan(a) or math.isnan(b):
            continue
        ratios.append(a / b if better == "higher" else b / a)
    return f"{min(ratios):.2f} to {max(ratios):.2f}" if ratios else "n/a"


def report(result: dict[str, Any]) -> str:
    """The markdown table of a run: medians per contender, and hybridlock's advantage (x, round-by-round range)."""
    rows: dict[str, list[dict[str, Any]]] = result["rounds"]
    names = [c for c in CONTENDERS if c in rows]
    settings = result["settings"]
    lines = [
        f"# Semaphore: {settings['processes']} processes x 1 thread, {settings['permits']} permits",
        "",
        f"Medians of {settings['rounds']} rounds of {settings['seconds']:g} s per contender (contenders alternating "
        f"within each round), one server ({result['server']}), run of {result['started']} UTC; Python "
        f"{result['python']}, {result['cpus']} cores, load average {result['load_before']} before, "
        f"{result['load_after']} after. Critical section: INCR then DECR of the count of holders inside.",
        "",
        "| metric | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for key, label, better, digits in METRICS:
        cells = []
        for name in names:
            values = [r[key] for r in rows[name] if not math.isnan(r[key])]
            median = statistics.median(values) if values else math.nan
            cell = f"{median:,.{digits}f}"
            if name != "hybridlock" and "hybridlock" in rows:
                cell += f" ({_ratio_note(rows, name, key, better)})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append(
        "| never more than the permits inside | "
        + " | ".join("yes" if not any(r["overfilled"] for r in rows[n]) else "**no**" for n in names)
        + " |"
    )
    lines += [
        "",
        "In parentheses: how many times better hybridlock did than that contender, lowest and highest over the "
        "rounds (above 1: hybridlock better).",
    ]
    for name, why in result["skipped"].items():
        lines.append(f"- {name}: not run, {why}")
    for name in names:
        for row in rows[name]:
            for error in row["errors"]:
                lines.append(f"- {name} error: `{error.strip().splitlines()[-1]}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.semaphore", description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--permits", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", default=None, help="write every round's numbers here (and the table beside, .md)")
    args = parser.parse_args(argv)
    wanted = [c for c in args.contenders.split(",") if c]
    unknown = set(wanted) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
    skipped = {c: why for c in wanted if (why := available(c)) is not None}
    names = [c for c in wanted if c not in skipped]
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", file=sys.stderr)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "skipped": skipped,
        "rounds": rows,
    }
    failed = False
    schedule = [name for index in range(args.rounds) for name in (names if index % 2 == 0 else names[::-1])]
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    barrier = context.Barrier(args.processes + 1)
    with EmbeddedServer() as server:
        result["server"] = " ".join(server.version().split()[:3])
        stats = redis.Redis.from_url(server.url)
        children = [
            context.Process(target=_child, args=(schedule, server.url, args.permits, args.seconds, barrier, out))
            for _ in range(args.processes)
        ]
        for child in children:
            child.start()
        try:
            for step, name in enumerate(schedule):
                row = _round(server.url, stats, barrier, out, args.processes, args.permits, args.seconds)
                rows[name].append(row)
                failed |= row["overfilled"] or bool(row["errors"])
                print(
                    f"round {step // len(names) + 1} {name}: {row['cycles_per_s']:.0f} cycles/s, longest wait "
                    f"{row['wait_max_ms']:.0f} ms, Jain {row['jain']:.3f}, {row['server_cmds_per_cycle']:.1f} "
                    f"server cmds/cycle, at most {row['most_inside']} inside"
                    + (f", errors: {row['errors'][0].strip().splitlines()[-1]}" if row["errors"] else ""),
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for child in children:
                child.join(30)
                if child.is_alive():
                    child.kill()
            stats.close()
    result["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    table = report(result)
    print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=1)
        with open(os.path.splitext(args.json)[0] + ".md", "w", encoding="utf-8") as file:
            file.write(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
