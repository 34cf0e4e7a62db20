"""Run hybridlock's benchmark suite: one server, every workload, every lock library, in one run.

    python -m benchmarks.run                       # the full run (about 20 minutes on 2 cores)
    python -m benchmarks.run --quick               # a smoke run (several minutes)
    python -m benchmarks.run --only handoff,rw     # only the workloads of issues 4 and 5
    python -m benchmarks.run --only prefork        # only N processes x 1 thread (or task) on one key

Writes benchmarks/results/latest.md (also printed), latest.json and latest.png. Exits 1 when a counter check
failed or a workload raised, 2 when no server could be started.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmarks/run.py
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from benchmarks import report
from benchmarks.contenders import CONTENDERS, contender_available
from benchmarks.measure import median_of_rounds
from benchmarks.workloads import FULL, PREFORK_PROCESSES, QUICK, WORKLOADS, Settings, Workload
from hybridlock.testing.server import EmbeddedServer, ServerNotFoundError

REPO = Path(__file__).resolve().parent.parent
#: The contenders of every workload, in table order; in-process ones only where the workload allows.
MAIN_CONTENDERS = ("hybridlock", "redis-py", "python-redis-lock", "pottery", "rlock")
#: Names for --only: each selects a set of workloads (the issue that set their targets, in the alias).
GROUPS = {
    "core": "core",
    "issue3": "core",
    "handoff": "handoff",
    "issue4": "handoff",
    "rw": "rw",
    "issue5": "rw",
    "asyncio": "asyncio",
    "prefork": "prefork",
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    except OSError:
        pass
    return f"{platform.system()} {platform.release()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{memory}"


def _load() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "hybridlock"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"
    return f"git {rev}" + (" + uncommitted changes in hybridlock/" if dirty else "")


def _server_version(url: str, server: EmbeddedServer) -> str:
    client = redis.Redis.from_url(url)
    try:
        info = client.info("server")
    finally:
        client.close()
    name = "valkey" if "valkey_version" in info else "redis"
    version = info.get("valkey_version") or info.get("redis_version")
    return f"{name}-server {version} ({server.binary})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short durations, fewer locks: a smoke run")
    parser.add_argument("--rounds", type=int, help="rounds per measurement (default: 2 quick, 3 full)")
    parser.add_argument(
        "--server-time-cycles",
        type=int,
        help="bare acquire + release cycles over which the uncontended workload measures the server's time per "
        "cycle, once per round (default: 500 quick, 10,000 full)",
    )
    parser.add_argument("--workloads", help="comma-separated subset of: " + ", ".join(w.name for w in WORKLOADS))
    parser.add_argument(
        "--only",
        help="comma-separated groups of workloads: core (1-5, issue 3), handoff (6-8, "
        "issue 4), rw (9, issue 5); issue3, issue4, issue5 work too; asyncio (11-14); prefork (15-17: 8 and 16 "
        "processes x 1 thread, 8 processes x 1 task). Combines with --workloads (a workload runs if either names it)",
    )
    parser.add_argument("--contenders", help="comma-separated subset of: " + ", ".join(CONTENDERS))
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "benchmarks" / "results",
        help="where latest.md, latest.json and latest.png go (default: %(default)s)",
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="also put the tables into benchmarks/README.md (between its results markers)",
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and not 1 <= args.rounds <= 20:
        parser.error("--rounds must be between 1 and 20")
    if args.server_time_cycles is not None and not 1 <= args.server_time_cycles <= 1_000_000:
        parser.error("--server-time-cycles must be between 1 and 1,000,000")
    return args


def _selected(text: str | None, known: list[str], what: str) -> list[str]:
    if not text:
        return known
    chosen = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return chosen


def _contenders_of(workload: Workload, available: list[str]) -> list[str]:
    """The contenders that run ``workload``, in table order."""
    order = workload.contenders or (*MAIN_CONTENDERS[:1], *workload.extra, *MAIN_CONTENDERS[1:])
    return [c for c in order if c in available and (workload.in_process or CONTENDERS[c].uses_server)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings: Settings = QUICK if args.quick else FULL
    if args.rounds is not None:
        settings = dataclasses.replace(settings, rounds=args.rounds)
    if args.server_time_cycles is not None:
        settings = dataclasses.replace(settings, server_time_cycles=args.server_time_cycles)
    if args.only or args.workloads:
        groups = {GROUPS[g] for g in _selected(args.only, list(GROUPS), "group")} if args.only else set()
        names = set(_selected(args.workloads, [w.name for w in WORKLOADS], "workload")) if args.workloads else set()
        workloads = [w for w in WORKLOADS if w.group in groups or w.name in names]
    else:
        workloads = list(WORKLOADS)
    wanted = _selected(args.contenders, list(CONTENDERS), "contender")

    load_start = _load()
    versions: dict[str, str] = {}
    skipped: list[str] = []
    available: list[str] = []
    for cid in CONTENDERS:
        if cid not in wanted:
            continue
        ok, detail = contender_available(cid)
        if ok:
            available.append(cid)
            if cid == "hybridlock" or CONTENDERS[cid].distribution != "hybridlock":  # variants: same version
                versions[cid] = detail
        else:
            skipped.append(f"{CONTENDERS[cid].title}: {detail}")
            _log(f"note: skipping {CONTENDERS[cid].title}: {detail}")
    # The header lists the libraries of the contenders that take part in the chosen workloads, not every one
    # available (an asyncio-only run has no thread contenders); hybridlock's variants report hybridlock's version.
    taking_part = {c for workload in workloads for c in _contenders_of(workload, available)}
    versions = {
        cid: version
        for cid, version in versions.items()
        if cid in taking_part
        or (cid == "hybridlock" and any(CONTENDERS[c].distribution == "hybridlock" for c in taking_part))
    }
    if "hybridlock" in versions:
        versions["hybridlock"] += f" ({_git_revision()})"

    try:
        server = EmbeddedServer().start()
    except (ServerNotFoundError, RuntimeError) as exc:
        _log(f"cannot start a server: {exc}")
        return 2
    failures: list[str] = []
    started = time.monotonic()
    results: dict[str, Any] = {"meta": {}, "workloads": {}, "failures": failures}
    try:
        url = server.url
        admin = redis.Redis.from_url(url)
        results["meta"] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "quick" if args.quick else "full",
            "rounds": settings.rounds,
            "machine": _machine(),
            "python": f"{platform.python_implementation()} {platform.python_version()}",
            "server": _server_version(url, server),
            "load_start": load_start,
            "versions": versions,
            "titles": {cid: cls.title for cid, cls in CONTENDERS.items()},
            "skipped": skipped,
            "settings": settings.__dict__,
        }
        _log(f"server {results['meta']['server']} on {url}; load average {load_start}")
        for workload in workloads:
            ids = _contenders_of(workload, available)
            params = _params(workload.name, settings)
            entry: dict[str, Any] = {
                "title": workload.title,
                "description": workload.description,
                "params": params,
                "metrics": workload.metrics,
                "baseline": workload.baseline,
                "labels": dict(workload.labels),
                "rows": {},
                "notes": [],
            }
            results["workloads"][workload.name] = entry
            # Either every contender runs all its rounds in one go, or (interleave) one round at a time, in turn.
            passes = [(ids, settings)]
            if workload.interleave and settings.rounds > 1:
                passes = [(ids, dataclasses.replace(settings, rounds=1))] * settings.rounds
            for pass_ids, pass_settings in passes:
                for cid in pass_ids:
                    admin.flushall()
                    _log(f"[{workload.name}] {cid} ...")
                    t0 = time.monotonic()
                    try:
                        row = workload.run(cid, url, pass_settings)
                    except Exception:
                        row = {"rounds": [], "median": {}, "errors": [traceback.format_exc(limit=8)], "count_ok": True}
                    row["seconds"] = round(time.monotonic() - t0, 1)
                    if cid in entry["rows"]:
                        row = _merge_rows(entry["rows"][cid], row, workload.metrics)
                    entry["rows"][cid] = row
                    _log(
                        f"[{workload.name}] {cid} done in {row['seconds']} s: "
                        + ", ".join(f"{k}={_short(v)}" for k, v in row.get("median", {}).items())
                    )
            for cid in ids:
                row = entry["rows"][cid]
                if not row.get("count_ok", True):
                    failures.append(
                        f"{workload.name} / {cid}: counter ended at {row['count_final']}, expected "
                        f"{row['count_expected']} (two holders overlapped, or a cycle was lost)"
                    )
                for error in row.get("errors", []):
                    failures.append(f"{workload.name} / {cid}: {error.strip()}")
                _notes(workload.name, cid, row, entry["notes"])
            _derived(entry)
            entry["notes"] += report.round_ratios(entry)
        admin.close()
    finally:
        server.stop()
    results["meta"]["load_end"] = _load()
    results["meta"]["seconds"] = round(time.monotonic() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    text = report.markdown(results)
    (args.out / "latest.md").write_text(text)
    report.write_json(results, args.out / "latest.json")
    try:
        report.write_chart(results, args.out / "latest.png")
        report.write_workload_charts(results, args.out / "charts")
    except ImportError as exc:
        _log(f"note: no chart: {exc}")
    print(text)
    _log(f"wrote {args.out}/latest.md, latest.json, latest.png in {results['meta']['seconds']} s")
    if args.update_readme:
        _update_readme(REPO / "benchmarks" / "README.md", text)
    if failures:
        _log(f"{len(failures)} failure(s):")
        for failure in failures:
            _log(f"  - {failure.splitlines()[0] if failure else failure}")
        return 1
    return 0


README_START = "<!-- results: written by `python -m benchmarks.run --update-readme` -->"
README_END = "<!-- end of results -->"


def _update_readme(path: Path, text: str) -> None:
    readme = path.read_text()
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        _log(f"note: {path} has no results markers; left alone")
        return
    # The run's own headings sit two levels below the README's section heading.
    body = "\n".join("##" + line if line.startswith("#") else line for line in text.splitlines()[1:]).strip()
    path.write_text(readme[: start + len(README_START)] + "\n\n" + body + "\n\n" + readme[end:])
    _log(f"updated {path}")


def _merge_rows(earlier: dict[str, Any], later: dict[str, Any], metrics: Any) -> dict[str, Any]:
    """One contender's row from two runs of a workload (interleaved rounds): rounds joined, medians retaken,
    counter checks and errors combined."""
    rounds = earlier.get("rounds", []) + later.get("rounds", [])
    merged = {
        "rounds": rounds,
        "median": median_of_rounds(rounds, metrics),
        "errors": earlier.get("errors", []) + later.get("errors", []),
        "count_ok": earlier.get("count_ok", True) and later.get("count_ok", True),
        "seconds": round(earlier.get("seconds", 0) + later.get("seconds", 0), 1),
    }
    for key in ("count_expected", "count_final"):
        if key in earlier or key in later:
            merged[key] = earlier.get(key, 0) + later.get(key, 0)
    return merged


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _params(name: str, s: Settings) -> dict[str, Any]:
    if name == "uncontended":
        return {
            "cycles per round": s.uncontended_cycles,
            "bare cycles for the server's time": s.server_time_cycles,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "threads":
        return {"threads": s.threads, "seconds per round": s.contention_s, "rounds": s.rounds, "lease s": s.lease}
    if name == "processes":
        return {
            "processes": s.processes,
            "threads each": s.threads_per_process,
            "seconds per round": s.contention_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "many-keys":
        return {
            "threads": s.many_threads,
            "keys": s.many_keys,
            "seconds per round": s.many_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "handoff":
        return {
            "hand-offs per round": s.handoffs,
            "hold ms": f"{s.hold_min_s * 1000:.0f}-{s.hold_max_s * 1000:.0f}",
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "scale":
        return {"locks": s.scale_locks, "lease s": s.scale_lease, "window s": s.scale_window_s, "rounds": 1}
    if name in ("handoff-inproc", "handoff-redis"):
        return {"threads": s.threads, "seconds per round": s.local_s, "rounds": s.rounds, "lease s": s.lease}
    if name == "handoff-procs":
        return {
            "processes": s.processes,
            "threads each": s.threads_per_process,
            "seconds per round": s.local_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "takeover":
        return {"acquires per round": 2 * s.handoffs, "rounds": s.rounds, "lease s": s.lease}
    if name == "async-uncontended":
        return {"cycles per round": s.uncontended_cycles, "rounds": s.rounds, "lease s": s.lease}
    if name == "async-tasks":
        return {"tasks": s.async_tasks, "seconds per round": s.async_s, "rounds": s.rounds, "lease s": s.lease}
    if name == "async-processes":
        return {
            "processes": s.async_processes,
            "tasks each": s.async_tasks_per_process,
            "seconds per round": s.async_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "async-loop":
        return {
            "tasks": s.async_waiters,
            "timer period ms": round(s.async_timer_period * 1000),
            "seconds per round": s.async_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name in PREFORK_PROCESSES:
        return {
            "processes": PREFORK_PROCESSES[name],
            "tasks each" if name.startswith("async") else "threads each": 1,
            "seconds per round": s.prefork_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    if name == "read-mostly":
        return {
            "processes": s.rw_processes,
            "threads each": s.rw_threads,
            "writes": f"{s.rw_write_fraction:.0%}",
            "seconds per round": s.local_s,
            "rounds": s.rounds,
            "lease s": s.lease,
        }
    return {}


def _derived(entry: dict[str, Any]) -> None:
    """Columns computed across a workload's rows once they are all in: each row's cycles/s over the in-process
    floor's (threading.RLock), from the medians of this run."""
    if not any(m.key == "floor_ratio" for m in entry["metrics"]):
        return
    floor = entry["rows"].get("rlock", {}).get("median", {}).get("cycles_per_s")
    for row in entry["rows"].values():
        ours = row.get("median", {}).get("cycles_per_s")
        if "median" in row:
            row["median"]["floor_ratio"] = ours / floor if ours is not None and floor else None


def _notes(name: str, cid: str, row: dict[str, Any], notes: list[str]) -> None:
    """Facts worth a line under a table that the columns do not show."""
    if name in ("processes", "handoff-procs", "async-processes", *PREFORK_PROCESSES) and row.get("rounds"):
        waits = "; ".join(" / ".join(f"{w:,.0f}" for w in r["per_process_wait_max_ms"]) for r in row["rounds"])
        shares = "; ".join(" / ".join(f"{n:,}" for n in r["per_process_cycles"]) for r in row["rounds"])
        notes.append(f"{cid}: longest wait per process (ms), round by round: {waits}. Cycles per process: {shares}.")
    if name == "scale" and row.get("rounds"):
        r = row["rounds"][0]
        if r.get("renewal_thread_errors"):
            notes.append(
                f"{cid}: {r['renewal_thread_errors']} renewal threads died "
                f"(e.g. {r.get('renewal_thread_error_sample', '')})."
            )
        if r.get("pass_s_median") is not None:
            notes.append(
                f"{cid}: one by-hand renewal pass took {r['pass_s_median']:.2f} s (median), "
                f"{r.get('pass_s_max', 0):.2f} s (longest); {r.get('renew_failures', 0):,} renewals "
                "found the lock already expired."
            )
        if r.get("acquired", r["locks"]) < r["locks"]:
            notes.append(f"{cid}: acquired only {r['acquired']:,} of {r['locks']:,} locks within the time limit.")
        if r.get("locks_kept") is not None and r["locks_kept"] < r.get("acquired", r["locks"]):
            notes.append(
                f"{cid}: only {r['locks_kept']:,} of {r['acquired']:,} locks were still held at the end "
                f"({r.get('alive_at_window_start', 0):,} at the start of the window): its per-period "
                "numbers are for the locks it still held, and approximate."
            )


if __name__ == "__main__":
    sys.exit(main())
