"""How often a Sentinel failover under load hands a held lock to a second owner, with and without replica
confirmation (``confirm_replicas``). A measurement, not a test: it asserts nothing and prints what it counted.

    python -m benchmarks.failover                       # 6 failovers per setting, about 4 minutes
    python -m benchmarks.failover --failovers 10 --workers 8 --out benchmarks/results/failover.md
    python -m benchmarks.failover --cycle 2000          # what confirmation costs an uncontended acquire/release

For each setting it starts a fresh service (a master, 2 replicas and 3 sentinels on free loopback ports,
``hybridlock.testing.SentinelService``), runs ``--workers`` threads, each its own owner (its own ``LockRegistry``
over a ``redis+sentinel://`` URL), taking and releasing ``--keys`` keys at random and holding each for 5-150 ms, and
forces failovers, alternating two kinds:

* ``SENTINEL FAILOVER`` with the old master left alive: it goes on taking writes from clients still connected to it
  until the sentinels turn it into a replica (they do when they next read its INFO, up to 10 s later), as a master
  cut off by a partition does;
* ``SIGKILL`` of the master: the sentinels notice it after 500 ms, promote a replica, and the killed node comes
  back empty as a replica.

Each owner also drops its connections now and then (``--churn``, about once a second by default), as pools that
grow and shrink, idle timeouts and restarts do in a real deployment: so, while the old master still takes writes,
some owners are on it and others on the new master, as clients on the two sides of a partition would be.

A shared in-process marker per key records who is inside the critical section. An entry while another owner is
inside is an *overlap*; it is a *double grant* when that other owner had not been told its lock was lost
(``lock.lost`` was False): two owners at once, each believing it held the lock. Also counted: acquires that
failed (server unreachable mid-failover, or not confirmed), and holders told at release that their lease was lost.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import hybridlock
from hybridlock.testing.sentinel import SentinelService


@dataclass
class Counts:
    acquired: int = 0
    overlaps: int = 0
    double_grants: int = 0
    told_lost: int = 0  # LockLostError at release
    unavailable: int = 0  # BackendUnavailableError from acquire (not confirmation)
    not_confirmed: int = 0  # ReplicationNotConfirmedError from acquire
    release_unavailable: int = 0  # BackendUnavailableError from release (the master was down)
    other_errors: int = 0
    other_kinds: dict[str, int] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def other(self, exc: Exception) -> None:
        with self.guard:
            self.other_errors += 1
            kind = f"{type(exc).__name__}: {exc}"[:140]
            self.other_kinds[kind] = self.other_kinds.get(kind, 0) + 1

    def add(self, name: str, n: int = 1) -> None:
        with self.guard:
            setattr(self, name, getattr(self, name) + n)


class Marker:
    """Who is inside each key's critical section (kept in this process, not in the server under test)."""

    def __init__(self, counts: Counts) -> None:
        self._guard = threading.Lock()
        self._inside: dict[str, list[Any]] = {}
        self._counts = counts

    def enter(self, key: str, lock: Any) -> None:
        with self._guard:
            others = self._inside.setdefault(key, [])
            for other in others:
                self._counts.add("overlaps")
                if not other.lost:
                    self._counts.add("double_grants")
            others.append(lock)

    def leave(self, key: str, lock: Any) -> None:
        with self._guard:
            self._inside[key].remove(lock)


def worker(url: str, options: dict[str, Any], keys: list[str], stop: threading.Event, counts: Counts,
           marker: Marker, seed: int) -> None:  # fmt: skip
    rng = random.Random(seed)
    with hybridlock.LockRegistry(url, expire_after=options["expire_after"], **options["confirm"]) as registry:
        next_churn = time.monotonic() + rng.expovariate(1 / options["churn"]) if options["churn"] else float("inf")
        while not stop.is_set():
            if time.monotonic() >= next_churn:
                # The next command connects anew, asking the sentinels where the master is.
                registry.backend.client.connection_pool.disconnect(inuse_connections=False)  # type: ignore[attr-defined]
                next_churn = time.monotonic() + rng.expovariate(1 / options["churn"])
            key = rng.choice(keys)
            lock = registry.obtain(key)
            try:
                if not lock.acquire(timeout=1.0):
                    continue
            except hybridlock.ReplicationNotConfirmedError:
                counts.add("not_confirmed")
                time.sleep(0.05)
                continue
            except hybridlock.BackendUnavailableError:
                counts.add("unavailable")
                time.sleep(0.05)
                continue
            except hybridlock.HybridLockError as exc:
                counts.other(exc)
                time.sleep(0.05)
                continue
            counts.add("acquired")
            marker.enter(key, lock)
            time.sleep(rng.uniform(0.005, 0.15))
            marker.leave(key, lock)
            try:
                lock.release()
            except hybridlock.LockLostError:
                counts.add("told_lost")
            except hybridlock.BackendUnavailableError:
                counts.add("release_unavailable")
            except hybridlock.HybridLockError as exc:
                counts.other(exc)


def run_setting(name: str, confirm: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    counts = Counts()
    marker = Marker(counts)
    keys = [f"key:{i}" for i in range(args.keys)]
    options = {"expire_after": args.expire_after, "confirm": confirm, "churn": args.churn}
    with SentinelService(f"bench-{name}") as service:
        stop = threading.Event()
        threads = [
            threading.Thread(target=worker, args=(service.url(), options, keys, stop, counts, marker, seed))
            for seed in range(args.workers)
        ]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        kinds: list[str] = []
        # Double grants counted from one failover's start to the next one's, by the kind of failover.
        by_kind = {"failover": 0, "kill": 0}
        before = 0
        for index in range(args.failovers):
            time.sleep(args.between)
            if kinds:
                by_kind[kinds[-1]] += counts.double_grants - before
            before = counts.double_grants
            if index % 2 == 0:
                kinds.append("failover")
                service.failover(timeout=60, demote_old=False)
            else:
                kinds.append("kill")
                service.kill_master(timeout=60)
            print(f"  {name}: {kinds[-1]} {index + 1}/{args.failovers} done, {counts.acquired} acquires, "
                  f"{counts.double_grants} double grants so far", file=sys.stderr)  # fmt: skip
        time.sleep(args.between)
        if kinds:
            by_kind[kinds[-1]] += counts.double_grants - before
        stop.set()
        for thread in threads:
            thread.join(30)
        elapsed = time.monotonic() - started
    return {
        "setting": name,
        "failovers": f"{kinds.count('failover')} SENTINEL FAILOVER + {kinds.count('kill')} SIGKILL",
        "seconds": round(elapsed, 1),
        **{k: v for k, v in vars(counts).items() if k not in ("guard", "other_kinds")},
        "other_kinds": counts.other_kinds,
        "double_grants_by_kind": f"{by_kind['failover']} after SENTINEL FAILOVER, {by_kind['kill']} after SIGKILL",
    }


def cycle_cost(settings: list[str], cycles: int) -> str:
    """The uncontended acquire/release cycle's median, per setting, on one service with no failover."""
    lines = ["| setting | uncontended cycle median (µs) | p99 (µs) |", "|---|---:|---:|"]
    with SentinelService("bench-cycle") as service:
        for setting in settings:
            confirm = {} if setting == "off" else {"confirm_replicas": int(setting)}
            with hybridlock.LockRegistry(service.url(), expire_after=10, **confirm) as registry:
                lock = registry.obtain("cycle")
                times = []
                for _ in range(cycles):
                    started = time.perf_counter()
                    lock.acquire()
                    lock.release()
                    times.append(time.perf_counter() - started)
            times.sort()
            label = "no confirmation" if setting == "off" else f"confirm_replicas={setting}"
            median, p99 = times[len(times) // 2] * 1e6, times[int(len(times) * 0.99)] * 1e6
            lines.append(f"| {label} | {median:,.0f} | {p99:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failovers", type=int, default=6, help="failovers per setting (alternating kinds)")
    parser.add_argument("--workers", type=int, default=8, help="owners (threads, one registry each)")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--expire-after", type=float, default=3.0)
    parser.add_argument("--between", type=float, default=3.0, help="seconds of load before each failover")
    parser.add_argument("--churn", type=float, default=1.0, help="mean seconds between reconnects (0: never)")
    parser.add_argument("--settings", default="off,1,2", help="comma-separated: off, or a confirm_replicas value")
    parser.add_argument("--out", help="also write the table (Markdown) to this file")
    parser.add_argument("--cycle", type=int, default=0, help="instead: time this many uncontended cycles per setting")
    args = parser.parse_args(argv)
    if args.cycle:
        print(cycle_cost(args.settings.split(","), args.cycle))
        return 0
    # Stopped by its pid (SIGTERM), it still stops the servers it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))

    rows = []
    for setting in args.settings.split(","):
        confirm = {} if setting == "off" else {"confirm_replicas": int(setting)}
        label = "no confirmation" if setting == "off" else f"confirm_replicas={setting}"
        print(f"{label} ...", file=sys.stderr)
        rows.append(run_setting(setting, confirm, args) | {"setting": label})

    columns = ["setting", "failovers", "seconds", "acquired", "overlaps", "double_grants", "told_lost",
               "unavailable", "not_confirmed", "release_unavailable", "other_errors"]  # fmt: skip
    lines = [
        f"Sentinel failovers under load: {args.workers} owners on {args.keys} keys, holds of 5-150 ms, "
        f"expire_after={args.expire_after:g} s, {args.between:g} s of load before each failover, reconnects every "
        f"{args.churn:g} s on average "
        f"(benchmarks/failover.py; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(str(row[c]) for c in columns) + " |" for row in rows),
    ]
    lines += ["", *(f"{row['setting']}: double grants {row['double_grants_by_kind']}" for row in rows)]
    lines += ["", *(f"{row['setting']}, other errors: {row['other_kinds']}" for row in rows if row["other_kinds"])]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as out:
            out.write(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
