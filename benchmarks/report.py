"""Turning a run's results into the Markdown tables, the JSON file and the PNG chart.

Every table puts, next to each contender's number, hybridlock's number divided by it, both from the same run:
absolute times on a shared two-core machine move from run to run, ratios much less.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .measure import Metric

__all__ = ["markdown", "round_ratios", "targets", "write_chart", "write_json", "write_workload_charts"]

BASELINE = "hybridlock"


def _number(value: float | None, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or math.isnan(ours) or math.isnan(theirs):
        return ""
    if theirs == 0:
        return "=" if ours == 0 else "∞"
    r = ours / theirs
    if r == 0:
        return "0"
    if r >= 100:
        return f"{r:,.0f}"
    if r >= 10:
        return f"{r:.1f}"
    if r >= 0.1:
        return f"{r:.2f}"
    return f"{r:.3f}"


def _arrow(metric: Metric) -> str:
    return "↓" if metric.better == "lower" else "↑"


def table(workload: Mapping[str, Any], titles: Mapping[str, str]) -> list[str]:
    """One workload's Markdown table: a row per contender, a column per metric, ratios in parentheses."""
    metrics: Sequence[Metric] = workload["metrics"]
    rows: Mapping[str, Any] = workload["rows"]
    baseline = workload.get("baseline", BASELINE)
    labels = {**titles, **workload.get("labels", {})}
    base = rows.get(baseline, {}).get("median", {})
    lines = [
        "| lock | " + " | ".join(f"{m.label} {_arrow(m)}" if m.ratio else m.label for m in metrics) + " |",
        "|---|" + "---:|" * len(metrics),
    ]
    for cid, row in rows.items():
        if row.get("skipped"):
            continue
        median = row.get("median", {})
        cells = []
        for m in metrics:
            value = median.get(m.key)
            cell = _number(value, m.digits)
            ratio = "" if cid == baseline or not m.ratio else _ratio(base.get(m.key), value)
            if ratio and cell != "n/a":
                cell += f" ({ratio})"
            cells.append(cell)
        flag = "" if row.get("count_ok", True) and not row.get("errors") else " ⚠"
        lines.append(f"| {labels.get(cid, cid)}{flag} | " + " | ".join(cells) + " |")
    return lines


def targets(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The targets of issues 3 and 4 and of the asyncio API, as this run measured them (issue 5 sets none: its
    workload is reported), and the prefork workloads' headline numbers, reported."""
    w = results["workloads"]

    def med(workload: str, cid: str, key: str) -> float | None:
        return w.get(workload, {}).get("rows", {}).get(cid, {}).get("median", {}).get(key)

    def ratio(workload: str, key: str, peer: str) -> float | None:
        ours, theirs = med(workload, BASELINE, key), med(workload, peer, key)
        if ours is None or theirs is None or theirs == 0:
            return None
        return ours / theirs

    out = []
    issue: list[int | str] = [3]

    def add(name: str, measured: str, met: bool | str | None) -> None:
        if met is not None:  # None: the workload was not run
            out.append({"issue": issue[0], "target": name, "measured": measured, "met": met})

    rt = med("uncontended", BASELINE, "round_trips_per_cycle")
    # The renewal thread may send one renewal inside a measured round: allow for it.
    add(
        "uncontended cycle in 2 round trips",
        f"{_number(rt, 2)} round trips per cycle",
        None if rt is None else rt <= 2.05,
    )
    re = med("uncontended", BASELINE, "reentrant_round_trips")
    add("reentrant acquire in 0 round trips", f"{_number(re, 2)} round trips", None if re is None else re == 0)
    r = ratio("threads", "cycles_per_s", "redis-py")
    add(
        "8 threads: throughput ≥ redis-py Lock's",
        f"hybridlock ÷ redis-py = {_number(r, 2)}",
        None if r is None else r >= 1.0,
    )
    r = ratio("threads", "wait_max_ms", "redis-py")
    ours, theirs = med("threads", BASELINE, "wait_max_ms"), med("threads", "redis-py", "wait_max_ms")
    add(
        "8 threads: longest wait ≤ 1/10 of redis-py Lock's",
        f"{_number(ours, 0)} ms vs {_number(theirs, 0)} ms (ratio {_number(r, 3)})",
        None if r is None else r <= 0.1,
    )
    h = med("handoff", BASELINE, "handoff_median_ms")
    hp = med("handoff", "redis-py", "handoff_median_ms")
    add(
        "cross-process hand-off median ≤ 2 ms",
        f"{_number(h, 2)} ms (redis-py Lock: {_number(hp, 1)} ms)",
        None if h is None else h <= 2.0,
    )
    s = med("scale", BASELINE, "round_trips_per_period")
    locks = w.get("scale", {}).get("params", {}).get("locks")
    add(
        f"{locks or 10_000:,} held locks renewed in ≤ 1 round trip per slot per period (one server: 1)",
        f"{_number(s, 2)} round trips per period",
        None if s is None else s <= 1.05,
    )

    issue[0] = 4
    # "Near 0" round trips per cycle: at most one round trip per ten cycles.
    near_zero = 0.1
    floor = med("handoff-inproc", BASELINE, "floor_ratio")
    on_off = ratio("handoff-inproc", "cycles_per_s", "hybridlock-nohandoff")
    rt = med("handoff-inproc", BASELINE, "round_trips_per_cycle")
    add(
        "8 threads, in-process critical section: ≥ 0.8x the RLock floor",
        f"{_number(floor, 2)}x ({_number(med('handoff-inproc', BASELINE, 'cycles_per_s'), 0)} vs "
        f"{_number(med('handoff-inproc', 'rlock', 'cycles_per_s'), 0)} cycles/s)",
        None if floor is None else floor >= 0.8,
    )
    add(
        "8 threads, in-process critical section: ≥ 3x hand-off off",
        f"on ÷ off = {_number(on_off, 2)} ({_number(med('handoff-inproc', 'hybridlock-nohandoff', 'cycles_per_s'), 0)}"
        " cycles/s off)",
        None if on_off is None else on_off >= 3.0,
    )
    add(
        f"8 threads, in-process critical section: round trips per cycle near 0 (≤ {near_zero})",
        f"{_number(rt, 3)} round trips, {_number(med('handoff-inproc', BASELINE, 'server_cmds_per_cycle'), 3)} "
        "server cmds per cycle",
        None if rt is None else rt <= near_zero,
    )
    floor = med("handoff-redis", BASELINE, "floor_ratio")
    add(
        "8 threads, two Redis commands inside: ≥ 0.9x the RLock floor",
        f"{_number(floor, 2)}x ({_number(med('handoff-redis', BASELINE, 'cycles_per_s'), 0)} vs "
        f"{_number(med('handoff-redis', 'rlock', 'cycles_per_s'), 0)} cycles/s; on ÷ off = "
        f"{_number(ratio('handoff-redis', 'cycles_per_s', 'hybridlock-nohandoff'), 2)})",
        None if floor is None else floor >= 0.9,
    )
    on_off = ratio("handoff-procs", "cycles_per_s", "hybridlock-nohandoff")
    # The rounds are interleaved (on, off, on, off, ...), so round i of each was measured under the same load.
    paired = [
        a["cycles_per_s"] / b["cycles_per_s"]
        for a, b in zip(
            w.get("handoff-procs", {}).get("rows", {}).get(BASELINE, {}).get("rounds", []),
            w.get("handoff-procs", {}).get("rows", {}).get("hybridlock-nohandoff", {}).get("rounds", []),
            strict=False,
        )
        if a.get("cycles_per_s") and b.get("cycles_per_s")
    ]
    spread = f"; round by round on ÷ off: {', '.join(_number(x, 2) for x in paired)}" if paired else ""
    add(
        "4 processes x 2 threads: cycles/s with hand-off on ≥ off; longest wait of any process and Jain's index "
        "reported",
        f"on ÷ off = {_number(on_off, 2)}{spread} ({_number(med('handoff-procs', BASELINE, 'cycles_per_s'), 0)} vs "
        f"{_number(med('handoff-procs', 'hybridlock-nohandoff', 'cycles_per_s'), 0)} cycles/s); longest wait of "
        f"any process {_number(med('handoff-procs', BASELINE, 'wait_max_ms'), 0)} ms on, "
        f"{_number(med('handoff-procs', 'hybridlock-nohandoff', 'wait_max_ms'), 0)} ms off; Jain "
        f"{_number(med('handoff-procs', BASELINE, 'jain'), 3)} on, "
        f"{_number(med('handoff-procs', 'hybridlock-nohandoff', 'jain'), 3)} off",
        None if on_off is None else on_off >= 1.0,
    )

    # Issue 11: cross-process speed.
    issue[0] = 11
    ours_us, theirs_us = (
        med("uncontended", BASELINE, "server_us_per_cycle"),
        med("uncontended", "redis-py", "server_us_per_cycle"),
    )
    r = ratio("uncontended", "server_us_per_cycle", "redis-py")
    add(
        "uncontended: server time per cycle ≤ 1.5x redis-py Lock's",
        f"{_number(ours_us, 1)} µs vs {_number(theirs_us, 1)} µs (ratio {_number(r, 2)}); commands "
        f"{_number(med('uncontended', BASELINE, 'server_cmds_per_cycle'), 1)} vs "
        f"{_number(med('uncontended', 'redis-py', 'server_cmds_per_cycle'), 1)}",
        None if r is None else r <= 1.5,
    )
    r = ratio("uncontended", "server_cpu_us_per_cycle", "redis-py")
    add(
        "uncontended: server CPU time per cycle (INFO cpu, main thread) reported",
        f"{_number(med('uncontended', BASELINE, 'server_cpu_us_per_cycle'), 1)} µs vs "
        f"{_number(med('uncontended', 'redis-py', 'server_cpu_us_per_cycle'), 1)} µs (ratio {_number(r, 2)})",
        None if r is None else "reported",
    )
    r = ratio("processes", "cycles_per_s", "redis-py")
    add(
        "4 processes x 2 threads: throughput ≥ redis-py Lock's",
        f"hybridlock ÷ redis-py = {_number(r, 2)} ({_number(med('processes', BASELINE, 'cycles_per_s'), 0)} vs "
        f"{_number(med('processes', 'redis-py', 'cycles_per_s'), 0)} cycles/s)",
        None if r is None else r >= 1.0,
    )
    r = ratio("processes", "wait_max_ms", "redis-py")
    add(
        "4 processes x 2 threads: longest wait ≤ 1/20 of redis-py Lock's",
        f"{_number(med('processes', BASELINE, 'wait_max_ms'), 0)} ms vs "
        f"{_number(med('processes', 'redis-py', 'wait_max_ms'), 0)} ms (ratio {_number(r, 3)})",
        None if r is None else r <= 0.05,
    )
    j = med("processes", BASELINE, "jain")
    add(
        "4 processes x 2 threads: Jain's index over processes ≥ 0.95",
        f"{_number(j, 3)} (redis-py: {_number(med('processes', 'redis-py', 'jain'), 3)})",
        None if j is None else j >= 0.95,
    )
    h, hp = med("handoff", BASELINE, "handoff_median_ms"), med("handoff", "python-redis-lock", "handoff_median_ms")
    r = ratio("handoff", "handoff_median_ms", "python-redis-lock")
    add(
        "cross-process hand-off p50 ≤ python-redis-lock's",
        f"{_number(h, 2)} ms vs {_number(hp, 2)} ms (ratio {_number(r, 2)})",
        None if r is None else r <= 1.0,
    )
    t, floor = med("threads", BASELINE, "cycles_per_s"), med("threads", "rlock", "cycles_per_s")
    add(
        "1 process x 8 threads: ≥ 0.85x threading.RLock",
        f"{_number(t / floor if t and floor else None, 2)}x ({_number(t, 0)} vs {_number(floor, 0)} cycles/s)",
        None if not t or not floor else t / floor >= 0.85,
    )
    r = ratio("many-keys", "cycles_per_s", "redis-py")
    add(
        "1,000 keys x 64 threads: throughput ≥ redis-py Lock's",
        f"hybridlock ÷ redis-py = {_number(r, 2)} ({_number(med('many-keys', BASELINE, 'cycles_per_s'), 0)} vs "
        f"{_number(med('many-keys', 'redis-py', 'cycles_per_s'), 0)} cycles/s)",
        None if r is None else r >= 1.0,
    )

    # The asyncio API, against redis-py's asyncio Lock (the ratios' other side) in the same run.
    issue[0] = "asyncio"
    aio, peer = "hybridlock-async", "redis-py-async"

    def aratio(workload: str, key: str) -> float | None:
        ours, theirs = med(workload, aio, key), med(workload, peer, key)
        return None if ours is None or theirs is None or theirs == 0 else ours / theirs

    rt = med("async-uncontended", aio, "round_trips_per_cycle")
    add(
        "uncontended cycle (one task) in 2 round trips",
        f"{_number(rt, 2)} round trips per cycle",
        None if rt is None else rt <= 2.05,
    )
    re = med("async-uncontended", aio, "reentrant_round_trips")
    add(
        "reentrant acquire (same task) in 0 round trips",
        f"{_number(re, 2)} round trips",
        None if re is None else re == 0,
    )
    r = aratio("async-tasks", "cycles_per_s")
    add(
        "100 tasks, one process: throughput ≥ 3x redis-py asyncio Lock's",
        f"hybridlock ÷ redis-py = {_number(r, 2)} ({_number(med('async-tasks', aio, 'cycles_per_s'), 0)} vs "
        f"{_number(med('async-tasks', peer, 'cycles_per_s'), 0)} cycles/s)",
        None if r is None else r >= 3.0,
    )
    r = aratio("async-tasks", "wait_max_ms")
    add(
        "100 tasks, one process: longest wait ≤ 1/10 of redis-py asyncio Lock's",
        f"{_number(med('async-tasks', aio, 'wait_max_ms'), 0)} ms vs "
        f"{_number(med('async-tasks', peer, 'wait_max_ms'), 0)} ms (ratio {_number(r, 3)})",
        None if r is None else r <= 0.1,
    )
    c = med("async-processes", aio, "cycles_per_s")
    add(
        "4 processes x 50 tasks: throughput, longest wait and Jain's index reported",
        f"{_number(c, 0)} cycles/s (redis-py: {_number(med('async-processes', peer, 'cycles_per_s'), 0)}); longest "
        f"wait of any process {_number(med('async-processes', aio, 'wait_max_ms'), 0)} ms (redis-py: "
        f"{_number(med('async-processes', peer, 'wait_max_ms'), 0)}); Jain "
        f"{_number(med('async-processes', aio, 'jain'), 3)} (redis-py: "
        f"{_number(med('async-processes', peer, 'jain'), 3)})",
        None if c is None else "reported",
    )
    lag = med("async-loop", aio, "lateness_max_ms")
    add(
        "1,000 waiting tasks: a 10 ms timer's worst lateness < 10 ms",
        f"{_number(lag, 1)} ms (redis-py: {_number(med('async-loop', peer, 'lateness_max_ms'), 1)} ms; "
        f"asyncio.Lock floor: {_number(med('async-loop', 'asyncio-lock', 'lateness_max_ms'), 1)} ms); less GC "
        f"pauses and time off CPU: {_number(med('async-loop', aio, 'lateness_own_max_ms'), 1)} ms (longest GC "
        f"pause {_number(med('async-loop', aio, 'gc_pause_max_ms'), 1)} ms)",
        None if lag is None else lag < 10.0,
    )

    # Prefork workers: N processes of one thread (or task) on one key. Reported, each against the peers of the
    # same run, for a change to the wake-up path between processes to be measured against.
    issue[0] = "prefork"
    for workload, shape in (("procs-8x1", "8 processes x 1 thread"), ("procs-16x1", "16 processes x 1 thread")):
        c = med(workload, BASELINE, "cycles_per_s")
        add(
            f"{shape}: throughput, longest wait and Jain's index reported",
            "; ".join(
                f"{_name(cid)} {_number(med(workload, cid, 'cycles_per_s'), 0)} "
                f"cycles/s, longest wait {_number(med(workload, cid, 'wait_max_ms'), 0)} ms, Jain "
                f"{_number(med(workload, cid, 'jain'), 3)}"
                for cid in (BASELINE, "redis-py", "python-redis-lock")
            ),
            None if c is None else "reported",
        )
    kinds = (("plain", BASELINE), ("write", "hybridlock-write"), ("read", "hybridlock-read"))
    cmds = med("procs-8x1", BASELINE, "server_cmds_per_cycle")
    add(
        "8 processes x 1 thread: server commands and round trips per cycle reported, per lock kind",
        "; ".join(
            f"{kind} {_number(med('procs-8x1', cid, 'server_cmds_per_cycle'), 1)} cmds, "
            f"{_number(med('procs-8x1', cid, 'round_trips_per_cycle'), 2)} round trips"
            for kind, cid in kinds
        )
        + f" (redis-py: {_number(med('procs-8x1', 'redis-py', 'server_cmds_per_cycle'), 1)}, "
        f"{_number(med('procs-8x1', 'redis-py', 'round_trips_per_cycle'), 2)}; python-redis-lock: "
        f"{_number(med('procs-8x1', 'python-redis-lock', 'server_cmds_per_cycle'), 1)}, "
        f"{_number(med('procs-8x1', 'python-redis-lock', 'round_trips_per_cycle'), 2)})",
        None if cmds is None else "reported",
    )
    cpu = med("procs-8x1", BASELINE, "server_cpu_us_per_cycle")
    add(
        "8 processes x 1 thread: server main-thread CPU per cycle reported (the critical section's GET and SET "
        "included)",
        f"{_number(cpu, 1)} µs (redis-py: {_number(med('procs-8x1', 'redis-py', 'server_cpu_us_per_cycle'), 1)}, "
        f"python-redis-lock: {_number(med('procs-8x1', 'python-redis-lock', 'server_cpu_us_per_cycle'), 1)})",
        None if cpu is None else "reported",
    )
    c = med("async-procs-8x1", aio, "cycles_per_s")
    add(
        "asyncio, 8 processes x 1 task: throughput, longest wait and Jain's index reported",
        "; ".join(
            f"{_name(cid)} {_number(med('async-procs-8x1', cid, 'cycles_per_s'), 0)} "
            f"cycles/s, longest wait {_number(med('async-procs-8x1', cid, 'wait_max_ms'), 0)} ms, Jain "
            f"{_number(med('async-procs-8x1', cid, 'jain'), 3)}"
            for cid in (aio, peer, "pottery-async")
        ),
        None if c is None else "reported",
    )
    return out


def markdown(results: Mapping[str, Any]) -> str:
    meta = results["meta"]
    titles = meta["titles"]
    lines = [
        "# hybridlock benchmarks",
        "",
        f"- Date: {meta['date']} · mode: **{meta['mode']}** ({meta['rounds']} rounds per measurement; medians quoted)",
        f"- Machine: {meta['machine']}",
        f"- Load average at start: {meta['load_start']} · at end: {meta.get('load_end', 'n/a')} — other "
        "engineers run tests on this machine at the same time, so absolute times are noisy; compare the ratios.",
        f"- Python: {meta['python']} · server: {meta['server']} (one server on 127.0.0.1, started for this run)",
        "- Libraries: " + ", ".join(f"{titles.get(k, k)} {v}" for k, v in meta["versions"].items()),
    ]
    for note in meta.get("skipped", []):
        lines.append(f"- Skipped: {note}")
    lines += [
        "",
        "Numbers are medians over the rounds. In parentheses: **hybridlock's value ÷ this lock's**, measured in "
        "the same run (in each table, hybridlock is the first row: with hand-off on, its default, in 6-8, its "
        "read-write lock in 9, its asyncio API in 11-14 and 17). ↓ marks columns where lower is better (a ratio "
        "below 1 favours hybridlock), ↑ where higher is better (a ratio above 1 favours hybridlock). ⚠ marks a row "
        "with an error or a wrong count.",
        "",
        "## Targets",
        "",
        "| set by | target | this run | met |",
        "|---|---|---|---|",
    ]
    for t in targets(results):
        met = {True: "yes", False: "**no**", None: "n/a", "reported": "reported"}[t["met"]]
        lines.append(f"| {t['issue']} | {t['target']} | {t['measured']} | {met} |")
    for name, workload in results["workloads"].items():
        del name
        lines += ["", f"## {workload['title']}", "", workload["description"], ""]
        params = ", ".join(f"{k}={v}" for k, v in workload["params"].items())
        lines += [f"Parameters: {params}.", ""]
        lines += table(workload, titles)
        notes = workload.get("notes", [])
        if notes:
            lines.append("")
            lines += [f"- {n}" for n in notes]
    failures = results.get("failures", [])
    lines += ["", "## Checks", ""]
    if failures:
        lines += [f"- **FAILED** {f}" for f in failures]
    else:
        lines.append("- Every counter ended at its number of cycles; no workload raised an error.")
    return "\n".join(lines) + "\n"


def write_json(results: Mapping[str, Any], path: Path) -> None:
    def encode(obj: Any) -> Any:
        if isinstance(obj, Metric):
            return {"key": obj.key, "label": obj.label, "better": obj.better}
        if isinstance(obj, float) and math.isnan(obj):
            return None
        raise TypeError(type(obj).__name__)

    def clean(obj: Any) -> Any:
        # JSON has no NaN: write null.
        if isinstance(obj, float) and math.isnan(obj):
            return None
        if isinstance(obj, Mapping):
            return {k: clean(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [clean(v) for v in obj]
        return obj

    path.write_text(json.dumps(clean(results), indent=1, default=encode, ensure_ascii=False) + "\n")


def round_ratios(workload: Mapping[str, Any]) -> list[str]:
    """Notes giving, for each peer, hybridlock's ratio on the workload's first metric round by round (rounds are
    matched by index; with interleaved rounds, round i of every row ran under the same load): the spread the
    medians hide."""
    baseline = workload.get("baseline", BASELINE)
    rows = workload["rows"]
    ours = rows.get(baseline, {}).get("rounds", [])
    metric = next((m for m in workload["metrics"] if m.ratio), None)
    if not ours or metric is None:
        return []
    notes = []
    for cid, row in rows.items():
        if cid == baseline:
            continue
        pairs = [
            a[metric.key] / b[metric.key]
            for a, b in zip(ours, row.get("rounds", []), strict=False)
            if a.get(metric.key) and b.get(metric.key)
        ]
        if pairs:
            notes.append(
                f"{baseline} ÷ {cid}, {metric.label}, round by round: "
                + ", ".join(_number(x, 3 if x < 0.1 else 2) for x in pairs)
                + "."
            )
    return notes


# One chart per workload (``write_workload_charts``): its throughput (or latency) and its longest wait, hybridlock
# against each peer. Workloads not listed get their first two metrics.
_WORKLOAD_PANELS: dict[str, tuple[str, ...]] = {
    "uncontended": ("latency_median_us", "server_us_per_cycle", "server_cpu_us_per_cycle"),
    "threads": ("cycles_per_s", "wait_max_ms"),
    "processes": ("cycles_per_s", "wait_max_ms", "jain"),
    "many-keys": ("cycles_per_s", "wait_max_ms"),
    "handoff": ("handoff_median_ms", "handoff_p99_ms"),
    "scale": ("round_trips_per_period", "cpu_percent"),
    "handoff-inproc": ("cycles_per_s", "wait_max_ms"),
    "handoff-redis": ("cycles_per_s", "wait_max_ms"),
    "handoff-procs": ("cycles_per_s", "wait_max_ms", "jain"),
    "read-mostly": ("cycles_per_s", "write_wait_p99_ms"),
    "takeover": ("takeover_median_ms", "takeover_p99_ms"),
    "async-tasks": ("cycles_per_s", "wait_max_ms"),
    "async-processes": ("cycles_per_s", "wait_max_ms", "jain"),
    "async-loop": ("lateness_max_ms", "lateness_own_max_ms"),
    "procs-8x1": ("cycles_per_s", "wait_max_ms", "jain", "server_cmds_per_cycle", "server_cpu_us_per_cycle"),
    "procs-16x1": ("cycles_per_s", "wait_max_ms", "jain", "server_cmds_per_cycle", "server_cpu_us_per_cycle"),
    "async-procs-8x1": ("cycles_per_s", "wait_max_ms", "jain", "server_cmds_per_cycle", "server_cpu_us_per_cycle"),
}
# Metrics whose bars read better on a log scale (waits spanning milliseconds to seconds).
_LOG_METRICS = frozenset(
    {
        "wait_max_ms",
        "handoff_median_ms",
        "handoff_p99_ms",
        "round_trips_per_period",
        "takeover_p99_ms",
        "lateness_max_ms",
    }
)


def write_workload_charts(results: Mapping[str, Any], directory: Path) -> list[Path]:
    """One PNG per workload of the run, ``<directory>/<workload>.png``, each with a panel per metric of
    ``_WORKLOAD_PANELS``; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    meta = results["meta"]
    written = []
    for wname, workload in results["workloads"].items():
        keys = [m.key for m in workload["metrics"]]
        wanted = [k for k in _WORKLOAD_PANELS.get(wname, tuple(keys[:2])) if k in keys]
        if not wanted or not workload["rows"]:
            continue
        fig, axes = plt.subplots(1, len(wanted), figsize=(4.6 * len(wanted) + 0.6, 4.6), squeeze=False)
        fig.suptitle(
            f"{workload['title']}\n{meta['date']}, medians of {meta['rounds']} rounds, {meta['server']}", fontsize=10
        )
        for ax, key in zip(axes.flat, wanted, strict=True):
            _draw_panel(ax, workload, key, key in _LOG_METRICS, title=False)
        fig.text(
            0.5,
            0.01,
            "Bars: median over rounds; whiskers: fastest and slowest round. Dark orange: hybridlock "
            "(the row ratios are taken against); light orange: other hybridlock modes; blue: peers; grey: the "
            "in-process floor.",
            ha="center",
            fontsize=8,
        )
        fig.tight_layout(rect=(0, 0.04, 1, 0.9))
        path = directory / f"{wname}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# (workload, metric key, log scale)
_PANELS = (
    ("uncontended", "latency_median_us", False),
    ("uncontended", "round_trips_per_cycle", False),
    ("threads", "cycles_per_s", False),
    ("threads", "wait_max_ms", True),
    ("processes", "cycles_per_s", False),
    ("handoff", "handoff_median_ms", True),
    ("scale", "round_trips_per_period", True),
    ("scale", "cpu_percent", False),
    ("handoff-inproc", "cycles_per_s", False),
    ("handoff-inproc", "round_trips_per_cycle", False),
    ("handoff-redis", "cycles_per_s", False),
    ("handoff-procs", "cycles_per_s", False),
    ("handoff-procs", "jain", False),
    ("read-mostly", "cycles_per_s", False),
    ("read-mostly", "round_trips_per_cycle", False),
    ("async-uncontended", "latency_median_us", False),
    ("async-tasks", "cycles_per_s", False),
    ("async-tasks", "wait_max_ms", True),
    ("async-processes", "cycles_per_s", False),
    ("async-processes", "jain", False),
    ("async-loop", "lateness_max_ms", True),
    ("async-loop", "lateness_own_max_ms", False),
    ("procs-8x1", "cycles_per_s", False),
    ("procs-8x1", "server_cmds_per_cycle", False),
    ("procs-16x1", "cycles_per_s", False),
    ("async-procs-8x1", "cycles_per_s", False),
)

_SHORT = {
    "hybridlock": "hybridlock",
    "hybridlock-spin": "hybridlock\nspin",
    "redis-py": "redis-py",
    "python-redis-lock": "python-\nredis-lock",
    "pottery": "pottery",
    "rlock": "RLock",
    "hybridlock-nohandoff": "hybridlock\nhand-off off",
    "hybridlock-fifo": "hybridlock\nstrict FIFO",
    "hybridlock-retain": "hybridlock\nretain_for",
    "hybridlock-rw": "hybridlock\nread-write",
    "hybridlock-write": "hybridlock\nwrite half",
    "hybridlock-read": "hybridlock\nread half",
    "per-thread-holds": "per-thread\nread holds",
    "hybridlock-async": "hybridlock\nasyncio",
    "redis-py-async": "redis-py\nasyncio",
    "pottery-async": "pottery\nAIORedlock",
    "asyncio-lock": "asyncio.Lock",
}


def _name(cid: str) -> str:
    """A contender's short name on one line."""
    return _SHORT.get(cid, cid).replace("-\n", "-").replace("\n", " ")


def write_chart(results: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in _PANELS if p[0] in results["workloads"]]
    if not panels:
        return
    columns = min(5, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.9 * columns + 1, 4.1 * rows + 0.6), squeeze=False)
    meta = results["meta"]
    fig.suptitle(
        f"hybridlock benchmarks — {meta['date']} — {meta['mode']} run, medians of {meta['rounds']} rounds; "
        f"{meta['server']}; load avg at start {meta['load_start']}",
        fontsize=11,
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_axis_off()
    for ax, (wname, key, log) in zip(axes.flat, panels, strict=False):
        _draw_panel(ax, results["workloads"][wname], key, log, name=wname)
    fig.text(
        0.5,
        0.01,
        "Bars: median over rounds; whiskers: fastest and slowest round. Dark orange: the row the "
        "table's ratios are taken against (hybridlock; its read-write lock in Read-mostly); light orange: other "
        "hybridlock modes; blue: peers and models; grey: the in-process floor; hatched: lost locks. "
        "Ratios: latest.md.",
        ha="center",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1 - 0.35 / (4.1 * rows + 0.6)))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _draw_panel(
    ax: Any, workload: Mapping[str, Any], key: str, log: bool, *, name: str = "", title: bool = True
) -> None:
    """One bar chart: every row's median of ``key`` with whiskers to its fastest and slowest round. ``title``: put
    the workload's name over the metric's (False when the figure has the workload's title already)."""
    wname = name
    baseline = workload.get("baseline", BASELINE)
    metric = next(m for m in workload["metrics"] if m.key == key)
    names, values, lows, highs, lost = [], [], [], [], []
    for cid, row in workload["rows"].items():
        value = row.get("median", {}).get(key) if not row.get("skipped") else None
        if value is None or math.isnan(value):
            continue
        per_round = [r[key] for r in row.get("rounds", []) if r.get(key) is not None and not math.isnan(r[key])]
        names.append(cid)
        values.append(value)
        lows.append(value - min(per_round, default=value))
        highs.append(max(per_round, default=value) - value)
        first = row["rounds"][0] if row.get("rounds") else {}
        kept, acquired = first.get("locks_kept"), first.get("acquired")
        lost.append(f"kept {kept:,}\nof {acquired:,}" if kept is not None and acquired and kept < acquired else "")
    # Dark orange: the row the table's ratios are taken against; light: other hybridlock variants.
    colors = ["#d9480f" if n == baseline else ("#f59f00" if n.startswith(BASELINE) else "#5c7cfa") for n in names]
    colors = [c if n not in ("rlock", "asyncio-lock") else "#adb5bd" for n, c in zip(names, colors, strict=True)]
    x = range(len(names))
    bars = ax.bar(x, values, color=colors, yerr=[lows, highs], capsize=3, ecolor="#495057")
    for bar, note in zip(bars, lost, strict=True):
        if note:  # a library that lost locks: its per-period numbers cover only the ones it kept
            bar.set_hatch("//")
            bar.set_alpha(0.55)
            ax.annotate(
                note,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                xytext=(0, -4),
                textcoords="offset points",
                ha="center",
                va="top",
                fontsize=7,
                color="#c92a2a",
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1},
            )
    labels = workload.get("labels", {})
    ax.set_xticks(
        list(x), [labels[n].replace(" ", "\n", 1) if n in labels else _SHORT.get(n, n) for n in names], fontsize=8
    )
    heading = workload["title"].split(". ", 1)[-1].replace(": ", ":\n", 1)
    if wname == "scale":
        params = workload["params"]
        heading = f"Scale: {params.get('locks', 0):,} locks held, {params.get('lease s')} s lease"
    better = f"{metric.label} ({'lower' if metric.better == 'lower' else 'higher'} is better)"
    ax.set_title(f"{heading}\n{better}" if title else better, fontsize=9)
    if log and values and min(values) > 0:
        ax.set_yscale("log")
    elif log:
        ax.set_yscale("symlog", linthresh=1)
    for i, v in enumerate(values):
        ax.annotate(
            f"{v:.3g}" if v < 100 else f"{v:,.0f}",
            (i, v),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax.grid(axis="y", alpha=0.3)
