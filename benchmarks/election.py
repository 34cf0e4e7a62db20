"""Leader election failover: how long from the leader's death, pause or stop to the next leader's election,
hybridlock's ``registry.leader_election`` against tooz's Redis driver, in one run on one server.

    python -m benchmarks.election                      # 3 candidates, lease 3 s, 3 trials per event and contender
    python -m benchmarks.election --trials 5 --json benchmarks/results/election/latest.json

Each trial starts ``--candidates`` processes (``spawn``: each its own client, and registry or coordinator) running
for one election, waits for one of them to be elected, then does one of:

* ``kill``: SIGKILL the leader (a crash);
* ``pause``: SIGSTOP the leader (a long GC pause, a frozen VM), then SIGCONT it once a successor is elected (or
  after ``3 x lease`` without one), and watch for ``--lease`` seconds whether the old leader is told it was deposed;
* ``stop``: the leader leaves gracefully (hybridlock: ``election.stop()``; tooz: ``coordinator.stop()``, which
  releases the leader lock; the Redis driver has no ``stand_down_group_leader``),

and measures the time from that moment (taken just before the signal is sent, or in the leader just before it
calls stop) to a successor's election callback (``on_elected``, or tooz's ``watch_elected_as_leader`` callback),
on the system-wide monotonic clock that every process shares. Trials alternate between the contenders.

Both get the same lease, ``--lease`` seconds (3 by default, a whole number since tooz's Redis lock takes whole
seconds): hybridlock ``LockRegistry(url, expire_after=lease)`` (renewal every lease / 3); tooz
``get_coordinator("redis://...?lock_timeout=<lease>", member)``, its leader lock renewed by ``heartbeat()`` every
lease / 3 as well (tooz's own heart thread would beat only every ``min(lock_timeout, membership_timeout)``, a whole
lease, which lets the lock lapse under a live leader), and ``run_watchers()`` called every ``--tooz-poll`` seconds
(0.1 by default): tooz elects only when a candidate polls, so its failover includes up to one poll interval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import platform
import queue
import signal
import statistics
import sys
import time
import traceback
from typing import Any

import hybridlock
from hybridlock.testing.server import EmbeddedServer

CONTENDERS = ("hybridlock", "tooz")
EVENTS = ("kill", "pause", "stop")
NAME = "bench-election"


def _hybridlock_candidate(url: str, lease: float, index: int, events: Any, stop: Any) -> None:
    def on_elected(epoch: int | None) -> None:
        events.put(("elected", index, time.monotonic(), epoch))

    def on_revoked() -> None:
        events.put(("revoked", index, time.monotonic(), None))

    with hybridlock.LockRegistry(url, expire_after=lease) as registry:
        election = registry.leader_election(NAME, on_elected=on_elected, on_revoked=on_revoked)
        election.start()
        events.put(("ready", index, time.monotonic(), None))
        stop.wait()
        asked = time.monotonic()
        election.stop()
        events.put(("stopped", index, asked, None))


def _tooz_candidate(url: str, lease: float, index: int, events: Any, stop: Any, poll: float) -> None:
    from tooz import coordination

    member = f"candidate-{index}-{os.getpid()}".encode()
    coordinator = coordination.get_coordinator(f"{url}?lock_timeout={int(lease)}", member)
    coordinator.start(start_heart=False)
    group = NAME.encode()
    with contextlib.suppress(coordination.GroupAlreadyExist):
        coordinator.create_group(group).get()
    coordinator.join_group(group).get()

    def on_elected(event: Any) -> None:
        events.put(("elected", index, time.monotonic(), None))

    coordinator.watch_elected_as_leader(group, on_elected)
    events.put(("ready", index, time.monotonic(), None))
    beat_every = lease / 3
    next_beat = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now >= next_beat:
            coordinator.heartbeat()
            next_beat = now + beat_every
        coordinator.run_watchers()
        stop.wait(poll)
    asked = time.monotonic()
    coordinator.stop()
    events.put(("stopped", index, asked, None))


def _candidate(contender: str, url: str, lease: float, poll: float, index: int, events: Any, stop: Any) -> None:
    try:
        if contender == "hybridlock":
            _hybridlock_candidate(url, lease, index, events, stop)
        else:
            _tooz_candidate(url, lease, index, events, stop, poll)
    except Exception:
        events.put(("error", index, time.monotonic(), traceback.format_exc(limit=5)))


class _Trial:
    """The candidate processes of one trial and the events they report."""

    def __init__(self, contender: str, url: str, candidates: int, lease: float, poll: float) -> None:
        context = multiprocessing.get_context("spawn")
        self.events = context.Queue()
        self.stops = [context.Event() for _ in range(candidates)]
        self.processes = [
            context.Process(target=_candidate, args=(contender, url, lease, poll, i, self.events, self.stops[i]))
            for i in range(candidates)
        ]
        for process in self.processes:
            process.start()
        self.seen: list[tuple[str, int, float, Any]] = []

    def next(self, kind: str, deadline: float, exclude: int | None = None) -> tuple[str, int, float, Any] | None:
        """The next event of ``kind`` (from a candidate other than ``exclude``) before the monotonic ``deadline``;
        None at the deadline. A candidate's error is raised."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                return None
            self.seen.append(event)
            if event[0] == "error":
                raise RuntimeError(f"candidate {event[1]}: {event[3]}")
            if event[0] == kind and event[1] != exclude:
                return event

    def close(self) -> None:
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
                    os.kill(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.join(10)


def trial(contender: str, event: str, url: str, candidates: int, lease: float, poll: float) -> dict[str, Any]:
    """One trial: elect, then ``event`` the leader, and time the next election."""
    run = _Trial(contender, url, candidates, lease, poll)
    try:
        first = run.next("elected", time.monotonic() + 120)
        if first is None:
            raise RuntimeError("nobody was elected within 120 s")
        leader = first[1]
        # Let the others reach their steady state (queued, or polling) and the leader renew once.
        time.sleep(lease / 2)
        pid = run.processes[leader].pid
        assert pid is not None
        result: dict[str, Any] = {"event": event, "leader": leader}
        if event == "stop":
            run.stops[leader].set()
            stopped = run.next("stopped", time.monotonic() + 4 * lease + 30)
            if stopped is None or stopped[1] != leader:
                raise RuntimeError("the leader did not stop")
            moment = stopped[2]
        else:
            moment = time.monotonic()
            os.kill(pid, signal.SIGKILL if event == "kill" else signal.SIGSTOP)
        # (A graceful stop waits for the hand-over, so the successor may have reported before the leader did.)
        early = [e for e in run.seen if e[0] == "elected" and e[1] != leader and e[2] >= moment]
        successor = early[0] if early else run.next("elected", moment + 3 * lease + 5, exclude=leader)
        result["failover_s"] = successor[2] - moment if successor else math.nan
        if event == "pause":
            os.kill(pid, signal.SIGCONT)
            resumed = time.monotonic()
            # Earlier events of the old leader's are in run.seen; a revocation after the resume is what it was told.
            told = run.next("revoked", resumed + lease + 1)
            result["told_deposed"] = told is not None and told[1] == leader
            result["told_after_resume_s"] = told[2] - resumed if told is not None else math.nan
        return result
    finally:
        run.close()


def _summary(values: list[float]) -> dict[str, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return {"median": math.nan, "min": math.nan, "max": math.nan}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def report(result: dict[str, Any]) -> str:
    settings = result["settings"]
    rows = result["trials"]
    lines = [
        "# Leader election failover",
        "",
        f"{settings['candidates']} candidate processes, lease {settings['lease']:g} s for both (hybridlock "
        f"`expire_after`, tooz `lock_timeout`; renewal every lease / 3 for both; tooz polling `run_watchers()` every "
        f"{settings['tooz_poll']:g} s), {settings['trials']} trials per event and contender, one server "
        f"({result['server']}), run of {result['started']} UTC; Python {result['python']}, {result['cpus']} cores, "
        f"load average {result['load_before']} before, {result['load_after']} after.",
        "",
        "Seconds from the event to a successor's election: median (fastest to slowest trial).",
        "",
        "| event | " + " | ".join(rows) + " |",
        "|---|" + "---:|" * len(rows),
    ]
    for event in (e for e in EVENTS if any(t["event"] == e for trials in rows.values() for t in trials)):
        cells = []
        for contender in rows:
            s = _summary([t["failover_s"] for t in rows[contender] if t["event"] == event])
            missed = sum(math.isnan(t["failover_s"]) for t in rows[contender] if t["event"] == event)
            cell = f"{s['median']:.3f} ({s['min']:.3f} to {s['max']:.3f})"
            if missed:
                cell += f", {missed} with no successor"
            cells.append(cell)
        lines.append(f"| {event} | " + " | ".join(cells) + " |")
    told = []
    for contender in rows if any(t["event"] == "pause" for trials in rows.values() for t in trials) else ():
        paused = [t for t in rows[contender] if t["event"] == "pause"]
        if contender == "tooz":
            told.append("no: no callback or flag (its next heartbeat logs a warning)")
        else:
            n = sum(bool(t.get("told_deposed")) for t in paused)
            delays = _summary([t.get("told_after_resume_s", math.nan) for t in paused])
            told.append(f"{n} of {len(paused)} (median {delays['median']:.2f} s after SIGCONT)")
    if told:
        lines.append("| paused leader told it was deposed, once resumed | " + " | ".join(told) + " |")
    for contender, trials in rows.items():
        for t in trials:
            if t.get("error"):
                lines.append(f"- {contender} {t['event']} error: `{t['error']}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.election", description=__doc__.split("\n")[0])
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--lease", type=int, default=3, help="seconds, both contenders (default 3)")
    parser.add_argument("--trials", type=int, default=3, help="per event and contender (default 3)")
    parser.add_argument("--tooz-poll", type=float, default=0.1)
    parser.add_argument("--events", default=",".join(EVENTS))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--json", default=None, help="write every trial here (and the table beside, .md)")
    args = parser.parse_args(argv)
    events = [e for e in args.events.split(",") if e]
    contenders = [c for c in args.contenders.split(",") if c]
    rows: dict[str, list[dict[str, Any]]] = {c: [] for c in contenders}
    result: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "trials": rows,
    }
    failed = False
    with EmbeddedServer() as server:
        result["server"] = " ".join(server.version().split()[:3])
        for number in range(args.trials):
            for event in events:
                for contender in contenders if number % 2 == 0 else reversed(contenders):
                    try:
                        row = trial(contender, event, server.url, args.candidates, args.lease, args.tooz_poll)
                    except Exception as exc:
                        failed = True
                        row = {"event": event, "failover_s": math.nan, "error": f"{type(exc).__name__}: {exc}"}
                    rows[contender].append(row)
                    print(f"trial {number + 1} {event} {contender}: {row}", file=sys.stderr, flush=True)
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
