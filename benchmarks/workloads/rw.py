"""The read-write group (``--only rw``): workload 9, a read-write lock under a read-mostly load."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..contenders import LockLike, Session
from ..measure import (
    CommandCounts,
    Counter,
    Metric,
    percentile,
)
from .base import Settings, Workload, _cycle, _ms
from .contention import _child_rounds, _ChildRound, _cycling_threads, _processes_row

# ---------------------------------------------------------------------------------------------------------------
# 9. read-mostly: a read-write lock under 95 % reads (issue 5)


READ_MOSTLY_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("writes_per_s", "writes/s", "higher", 0),
    Metric("read_wait_p50_ms", "read wait p50 (ms)", "lower", 2),
    Metric("read_wait_p99_ms", "read wait p99 (ms)", "lower", 1),
    Metric("write_wait_p50_ms", "write wait p50 (ms)", "lower", 1),
    Metric("write_wait_p99_ms", "write wait p99 (ms)", "lower", 0),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 3),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
)


def _read_mostly_threads(
    pairs: Sequence[tuple[LockLike, LockLike]],
    counter: Counter,
    duration: float,
    max_cycles: int,
    write_fraction: float,
    seed: int,
    before_start: Callable[[], None],
) -> dict[str, Any]:
    """One thread per (read lock, write lock) pair, each for ``duration`` seconds (or ``max_cycles``): a write
    (probability ``write_fraction``, from a seeded generator) increments the counter (GET, SET) under the write
    lock, a read GETs it under the read lock."""
    n = len(pairs)
    read_waits: list[list[float]] = [[] for _ in range(n)]
    write_waits: list[list[float]] = [[] for _ in range(n)]
    errors: list[str] = []
    rngs = [random.Random(seed * 1000 + index) for index in range(n)]

    def step(index: int) -> None:
        read_lock, write_lock = pairs[index]
        if rngs[index].random() < write_fraction:
            write_waits[index].append(_cycle(write_lock, counter.increment))
        else:
            read_waits[index].append(_cycle(read_lock, counter.read))

    start, end = _cycling_threads(n, step, duration, max_cycles, before_start, errors)
    return {
        "start": start,
        "end": end,
        "read_waits": [w for mine in read_waits for w in mine],
        "write_waits": [w for mine in write_waits for w in mine],
        "reads": sum(len(mine) for mine in read_waits),
        "writes": sum(len(mine) for mine in write_waits),
        "errors": errors,
    }


def _read_mostly_child(
    contender_id: str,
    url: str,
    settings: dict[str, Any],
    index: int,
    barrier: Any,
    results: Any,
) -> None:
    """A child process of the read-mostly workload: its own session, ``rw_threads`` threads, one round per
    barrier."""

    def prepare(s: Settings, session: Session, counter: Counter) -> tuple[int, _ChildRound]:
        # Each thread's pair is made here, before the rounds (for the per-thread model: its own registry).
        pairs = [session.read_write("read-mostly") for _ in range(s.rw_threads)]
        for read_lock, write_lock in pairs:  # warm-up: one read and one write through each pair
            _cycle(write_lock, counter.increment)
            _cycle(read_lock, counter.read)

        def run_round(round_no: int, before_start: Callable[[], None]) -> dict[str, Any]:
            return _read_mostly_threads(
                pairs,
                counter,
                s.local_s,
                s.local_max_cycles,
                s.rw_write_fraction,
                seed=100 * round_no + index,
                before_start=before_start,
            )

        return len(pairs), run_round

    _child_rounds(contender_id, url, settings, index, barrier, results, "read-mostly", prepare)


def read_mostly(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.rw_processes`` x ``settings.rw_threads`` threads on one key, ``rw_write_fraction`` of the cycles
    writing. The counter check counts writes (reads do not change it)."""

    def summarize(round_no: int, parts: list[dict[str, Any]], delta: CommandCounts) -> dict[str, Any]:
        reads = sum(part["reads"] for part in parts)
        writes = sum(part["writes"] for part in parts)
        cycles = reads + writes
        elapsed = max(p["end"] for p in parts) - min(p["start"] for p in parts)
        read_waits = [w for part in parts for w in part["read_waits"]]
        write_waits = [w for part in parts for w in part["write_waits"]]
        trips = sum(part["round_trips"] for part in parts)
        # Lock commands: everything less the critical sections' own (a read's GET, a write's GET and SET).
        lock_commands = delta.total() - reads - 2 * writes
        return {
            "round": round_no,
            "cycles": cycles,
            "reads": reads,
            "writes": writes,
            "elapsed_s": elapsed,
            "cycles_per_s": cycles / elapsed if elapsed > 0 else math.nan,
            "writes_per_s": writes / elapsed if elapsed > 0 else math.nan,
            "read_wait_p50_ms": _ms(percentile(read_waits, 0.50)),
            "read_wait_p99_ms": _ms(percentile(read_waits, 0.99)),
            "write_wait_p50_ms": _ms(percentile(write_waits, 0.50)),
            "write_wait_p99_ms": _ms(percentile(write_waits, 0.99)),
            "wait_max_ms": _ms(max(read_waits + write_waits, default=math.nan)),
            "per_process_cycles": [part["reads"] + part["writes"] for part in parts],
            "round_trips_per_cycle": trips / cycles if cycles else math.nan,
            "server_cmds_per_cycle": lock_commands / cycles if cycles else math.nan,
        }

    return _processes_row(
        contender_id,
        url,
        settings,
        "read-mostly",
        _read_mostly_child,
        (),
        settings.rw_processes,
        settings.local_s,
        READ_MOSTLY_METRICS,
        lambda part: part["writes"],
        summarize,
    )


WORKLOADS = (
    Workload(
        "read-mostly",
        "9. Read-mostly: four processes x 8 threads, 95 % reads",
        "Four processes with eight threads each cycle on one key for a fixed time; each cycle is a write with "
        "probability 5 % (seeded per thread), else a read. A read GETs a Redis value under the read lock; a write "
        "GETs and SETs it (the counter, checked at the end against the writes made) under the write lock. "
        "Compared: hybridlock's read-write lock (one remote read hold per process, shared by its reader threads), "
        "hybridlock's plain lock for reads and writes alike, and a model of Redisson's read-write lock, where "
        "each reader thread holds a read hold of its own in the server (here: one registry per thread, since a "
        "registry is one owner). In parentheses: the read-write lock ÷ that row. Waits are the time inside "
        "acquire().",
        read_mostly,
        READ_MOSTLY_METRICS,
        in_process=False,
        group="rw",
        contenders=("hybridlock-rw", "hybridlock", "per-thread-holds"),
        baseline="hybridlock-rw",
        labels=(("hybridlock", "hybridlock plain lock"),),
    ),
)
