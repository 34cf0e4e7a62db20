"""The hand-off group (``--only handoff``): the local hand-off between the threads of one process, workloads 6-8,
with hand-off on (default barge window, and strict FIFO) and off; and the take-over between two owners, workload 10
(what lease retention costs the other owner)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..contenders import make_session, round_trips_sent
from ..measure import (
    Counter,
    LocalCounter,
    Metric,
    median_of_rounds,
    percentile,
)
from .base import Settings, Workload, _cycle, _ms, _row
from .contention import _many_processes, _one_process

# ---------------------------------------------------------------------------------------------------------------
# 6.-8. local hand-off between the threads of one process (issue 4)


LOCAL_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    # Filled in by the harness once the floor's row is in: this row's cycles/s over threading.RLock's.
    Metric("floor_ratio", "÷ RLock floor", "higher", 2, ratio=False),
    Metric("wait_p99_ms", "wait p99 (ms)", "lower", 2),
    Metric("wait_max_ms", "longest wait (ms)", "lower", 1),
    Metric("fairness", "fairness (min/mean cycles per thread)", "higher", 2),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 3),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 3),
)

LOCAL_PROCESSES_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("wait_p50_ms", "wait p50 (ms)", "lower", 2),
    Metric("wait_p99_ms", "wait p99 (ms)", "lower", 1),
    Metric("wait_max_ms", "longest wait, worst process (ms)", "lower", 0),
    Metric("wait_max_best_ms", "longest wait, best process (ms)", "lower", 0),
    Metric("jain", "Jain's index over processes", "higher", 3),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 2),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
)


def handoff_inproc(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.threads`` threads of this process on one key; the critical section is in-process (a Python
    counter read, ``time.sleep(0)``, written back), so what is left is the lock's own cost."""
    return _one_process(
        contender_id,
        url,
        settings,
        "handoff-inproc",
        LocalCounter(),
        settings.local_s,
        settings.local_max_cycles,
        LOCAL_METRICS,
    )


def handoff_redis(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.threads`` threads of this process on one key; the critical section is two Redis commands."""
    return _one_process(
        contender_id,
        url,
        settings,
        "handoff-redis",
        Counter(url, f"bench-counter:handoff-redis:{contender_id}"),
        settings.local_s,
        settings.local_max_cycles,
        LOCAL_METRICS,
    )


def handoff_processes(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.processes`` x ``settings.threads_per_process`` threads on one key (critical section: two Redis
    commands): whether hand-off inside each process costs the others."""
    row = _many_processes(
        contender_id,
        url,
        settings,
        "handoff-procs",
        settings.local_s,
        settings.local_max_cycles,
        LOCAL_PROCESSES_METRICS,
    )
    for r in row["rounds"]:
        r["wait_max_best_ms"] = min((w for w in r["per_process_wait_max_ms"] if not math.isnan(w)), default=math.nan)
    row["median"] = median_of_rounds(row["rounds"], LOCAL_PROCESSES_METRICS)
    return row


# ---------------------------------------------------------------------------------------------------------------
# 10. take-over: two owners taking turns on one key (what lease retention costs the other owner)

TAKEOVER_METRICS = (
    Metric("takeover_median_ms", "acquire by the other owner, median (ms)", "lower", 2),
    Metric("takeover_p99_ms", "acquire by the other owner, p99 (ms)", "lower", 1),
    Metric("round_trips_per_acquire", "round trips / acquire (both owners)", "lower", 1),
)


def takeover(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """Two owners (two sessions, each its own client and registry) take turns on one key with nobody waiting: an
    owner's acquire comes right after the other owner's release, so a lease the other keeps idle (retain_for)
    must be given back first. Timed: each acquire."""
    owners = [make_session(contender_id, url, settings.lease) for _ in range(2)]
    counter = Counter(url, f"bench-counter:takeover:{contender_id}")
    try:
        locks = [owner.lock("takeover") for owner in owners]
        for lock in locks:  # warm-up: scripts loaded, subscriptions open
            _cycle(lock, counter.increment)
        cycles_run = 2
        rounds = []
        for _ in range(settings.rounds):
            samples: list[float] = []
            trips0 = round_trips_sent()
            for turn in range(2 * settings.handoffs):
                samples.append(_cycle(locks[turn % 2], counter.increment))
            cycles_run += len(samples)
            rounds.append(
                {
                    "takeover_median_ms": _ms(statistics.median(samples)),
                    "takeover_p99_ms": _ms(percentile(samples, 0.99)),
                    "round_trips_per_acquire": (round_trips_sent() - trips0) / len(samples),
                }
            )
        return _row(rounds, TAKEOVER_METRICS, counter, cycles_run)
    finally:
        for owner in owners:
            owner.close()
        counter.close()


# The local hand-off workloads (issue 4) compare hybridlock with hand-off on (by default with a 2 ms barge window;
# also with strict FIFO) and off against redis-py.
_HANDOFF_CONTENDERS = ("hybridlock", "hybridlock-fifo", "hybridlock-nohandoff", "redis-py")
_HANDOFF_LABELS = (("hybridlock", "hybridlock (hand-off on)"),)

WORKLOADS = (
    Workload(
        "handoff-inproc",
        "6. Local hand-off: one process, 8 threads, in-process critical section",
        "Eight threads of one process cycle on one key for a fixed time; the critical section reads a Python "
        "counter, calls time.sleep(0) (which lets the other threads run) and writes the counter back, so nearly all "
        "that is left is the lock's own cost. hybridlock runs with hand-off on (the default: handoff_limit=64, "
        "handoff_window=0.05) and off (handoff_limit=0). In parentheses: hybridlock with hand-off on ÷ that row, "
        "so on the hand-off-off row it is on ÷ off. ÷ RLock floor is each row's cycles/s over threading.RLock's "
        "in this run. Round trips are counted on the client; server commands are INFO commandstats (Lua's inner "
        "commands included).",
        handoff_inproc,
        LOCAL_METRICS,
        in_process=True,
        group="handoff",
        contenders=(*_HANDOFF_CONTENDERS, "rlock"),
        labels=_HANDOFF_LABELS,
        interleave=True,
    ),
    Workload(
        "handoff-redis",
        "7. Local hand-off: one process, 8 threads, two Redis commands inside",
        "As 6., but the critical section is the usual Redis counter (GET, then SET: two round trips through a "
        "client of its own, not counted).",
        handoff_redis,
        LOCAL_METRICS,
        in_process=True,
        group="handoff",
        contenders=(*_HANDOFF_CONTENDERS, "rlock"),
        labels=_HANDOFF_LABELS,
        interleave=True,
    ),
    Workload(
        "handoff-procs",
        "8. Local hand-off: four processes x 2 threads, one key",
        "Four processes (each its own client and registry) with two threads each cycle on one key for a fixed "
        "time; the critical section is the Redis counter. For each process, the longest wait any of its threads "
        "saw: the table gives the worst and the best process's (the notes below list all four, round by round). "
        "Jain's index is over the processes' cycle counts, (Σx)² / (n·Σx²): 1 = equal shares, 0.25 = one "
        "process took all.",
        handoff_processes,
        LOCAL_PROCESSES_METRICS,
        in_process=False,
        group="handoff",
        contenders=_HANDOFF_CONTENDERS,
        labels=_HANDOFF_LABELS,
        interleave=True,
    ),
    Workload(
        "takeover",
        "10. Take-over: two owners taking turns on one key",
        "Two owners in one process (each its own client and registry, as two processes would be) take turns on one "
        "key, each acquire right after the other owner's release, nobody waiting: the cost of lease retention to "
        "the other owner. With retain_for the released lease is still kept, idle, so the acquire fails once, "
        "announces itself, and waits for the keeper to give the lease back. Timed: each acquire() (median and "
        "p99 of 2 x hand-offs per round). Round trips are both owners', per acquire.",
        takeover,
        TAKEOVER_METRICS,
        in_process=True,
        group="handoff",
        contenders=("hybridlock-retain", "hybridlock", "redis-py"),
        baseline="hybridlock-retain",
    ),
)
