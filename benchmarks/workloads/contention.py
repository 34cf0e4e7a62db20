"""The contention machinery several groups share: threads of one process, or of several processes started with
``spawn``, cycling on one key for a fixed time, each cycle timed and counted, and the rows they make.

Used by the core group's contention workloads (2, 3, 3b), the local hand-off (6-8), the read-mostly one (9), the
asyncio ones (13) and the prefork ones (15-17)."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple

import redis

from ..contenders import Session, make_session, round_trips_sent
from ..measure import (
    CommandCounts,
    Counter,
    LocalCounter,
    Metric,
    command_delta,
    command_snapshot,
    jain_index,
    percentile,
)
from .base import _SLACK, Settings, _collect, _cycle, _ms, _reap, _row, _server_cpu, _us


def _contend(
    session: Session,
    counter: Counter | LocalCounter,
    key: str,
    threads: int,
    duration: float,
    max_cycles: int,
    *,
    before_start: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Run ``threads`` threads, each cycling on ``key`` until ``duration`` has passed (or ``max_cycles``).

    Returns the raw material of a round: every acquire's wait, each thread's cycle count, the start and end on the
    system-wide monotonic clock, whether the holders shared the lock (``session.shared``: then each cycle read the
    counter instead of incrementing it), and the errors seen. ``before_start`` runs in the calling thread just
    before the threads are let go (a multi-process barrier, say)."""
    locks = [session.lock(key) for _ in range(threads)]
    waits: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    section = _section(session, counter)

    def step(index: int) -> None:
        waits[index].append(_cycle(locks[index], section))

    start, end = _cycling_threads(threads, step, duration, max_cycles, before_start, errors)
    return {
        "start": start,
        "end": end,
        "waits": [w for mine in waits for w in mine],
        "per_thread": [len(mine) for mine in waits],
        "shared": session.shared,
        "errors": errors,
    }


def _section(session: Session, counter: Counter | LocalCounter) -> Callable[[], Any]:
    """The critical section of a contention cycle: increment the counter, or, under a lock whose holders are let in
    together (a read lock), read it, which is what readers do and what they may do together."""
    if not session.shared:
        return counter.increment
    if not isinstance(counter, Counter):
        raise TypeError(f"{session.id}: a shared lock's cycles read a Redis counter")
    return counter.read


def _cycling_threads(
    threads: int,
    step: Callable[[int], None],
    duration: float,
    max_cycles: int,
    before_start: Callable[[], None],
    errors: list[str],
) -> tuple[float, float]:
    """Run ``threads`` threads, thread ``index`` calling ``step(index)`` (one cycle) over and over until
    ``duration`` has passed (or ``max_cycles`` calls). All are let go at once, after ``before_start`` ran in the
    calling thread (a multi-process barrier, say).

    Returns the start and end on the system-wide monotonic clock; a thread's exception, and threads still running
    ``_SLACK`` seconds after the deadline, are appended to ``errors``."""
    gate = threading.Barrier(threads + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        try:
            gate.wait(timeout=_SLACK)
            end = deadline[0]
            cycles = 0
            while cycles < max_cycles and time.monotonic() < end:
                step(index)
                cycles += 1
        except Exception:
            errors.append(traceback.format_exc(limit=4))

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    before_start()
    start = time.monotonic()
    deadline[0] = start + duration
    gate.wait(timeout=_SLACK)
    for thread in workers:
        thread.join(timeout=max(0.0, deadline[0] + _SLACK - time.monotonic()))
    end = time.monotonic()
    hung = sum(thread.is_alive() for thread in workers)
    if hung:
        errors.append(f"{hung} thread(s) still running {_SLACK:.0f} s after the deadline")
    return start, end


def _contention_round(
    parts: Sequence[dict[str, Any]], trips: int, delta: Any, increments: int, reads: int = 0
) -> dict[str, Any]:
    """A contention round's results from its parts: ``increments`` and ``reads`` are the counter's GET + SET pairs
    and lone GETs in the server, left out of the server commands."""
    waits = [w for part in parts for w in part["waits"]]
    per_thread = [n for part in parts for n in part["per_thread"]]
    cycles = sum(per_thread)
    elapsed = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    mean = cycles / len(per_thread) if per_thread else 0.0
    return {
        "cycles": cycles,
        "elapsed_s": elapsed,
        "cycles_per_s": cycles / elapsed if elapsed > 0 else math.nan,
        "wait_p50_ms": _ms(percentile(waits, 0.50)),
        "wait_p99_ms": _ms(percentile(waits, 0.99)),
        "wait_max_ms": _ms(max(waits)) if waits else math.nan,
        "fairness": min(per_thread) / mean if mean else math.nan,
        "per_thread_cycles": per_thread,
        "round_trips_per_cycle": trips / cycles if cycles else math.nan,
        "server_cmds_per_cycle": (
            delta.total(counter_increments=increments, counter_reads=reads) / cycles if cycles else math.nan
        ),
    }


def _one_process(
    contender_id: str,
    url: str,
    settings: Settings,
    key: str,
    counter: Counter | LocalCounter,
    duration: float,
    max_cycles: int,
    metrics: Sequence[Metric],
) -> dict[str, Any]:
    """``settings.threads`` threads of this process cycle on ``key``, each cycle incrementing ``counter``."""
    session = None
    stats = redis.Redis.from_url(url)
    try:
        session = make_session(contender_id, url, settings.lease)
        cycles_run = 0
        for _ in range(settings.threads):  # warm-up, outside the rounds: one cycle per lock object
            _cycle(session.lock(key), counter.increment)
            cycles_run += 1
        rounds = []
        errors: list[str] = []
        for _ in range(settings.rounds):
            increments0 = counter.increments
            before, trips0 = command_snapshot(stats), round_trips_sent()
            part = _contend(session, counter, key, settings.threads, duration, max_cycles)
            trips = round_trips_sent() - trips0
            delta = command_delta(before, command_snapshot(stats))
            errors += part["errors"]
            cycles_run += sum(part["per_thread"])
            in_server = counter.increments - increments0 if counter.in_server else 0
            rounds.append(_contention_round([part], trips, delta, in_server))
            if part["errors"]:
                break
        return _row(rounds, metrics, counter, cycles_run, errors)
    finally:
        if session is not None:
            session.close()
        counter.close()
        stats.close()


def _contention_child(
    contender_id: str,
    url: str,
    settings: dict[str, Any],
    index: int,
    barrier: Any,
    results: Any,
    key: str = "processes",
    duration: float | None = None,
    max_cycles: int | None = None,
) -> None:
    """A child process of the multi-process contention workloads: its own session and threads, one round per
    barrier, cycling on ``key`` (and incrementing the counter of that name)."""

    def prepare(s: Settings, session: Session, counter: Counter) -> tuple[int, _ChildRound]:
        for _ in range(s.threads_per_process):
            _cycle(session.lock(key), _section(session, counter))

        def run_round(round_no: int, before_start: Callable[[], None]) -> dict[str, Any]:
            return _contend(
                session,
                counter,
                key,
                s.threads_per_process,
                s.contention_s if duration is None else duration,
                s.contention_max_cycles if max_cycles is None else max_cycles,
                before_start=before_start,
            )

        return 0 if session.shared else s.threads_per_process, run_round

    _child_rounds(contender_id, url, settings, index, barrier, results, key, prepare)


# A child's round: (round number, what to run just before its threads are let go) -> the round's part.
_ChildRound = Callable[[int, Callable[[], None]], dict[str, Any]]


def _child_rounds(
    contender_id: str,
    url: str,
    settings: dict[str, Any],
    index: int,
    barrier: Any,
    results: Any,
    counter_key: str,
    prepare: Callable[[Settings, Session, Counter], tuple[int, _ChildRound]],
) -> None:
    """The life of a child process started by ``_run_children``: its own session and counter (the one named
    ``counter_key``); ``prepare`` warms up and returns the counter increments of its warm-up, reported as "ready",
    and the function that runs one round. Then one round per barrier, each reported with the round trips it sent,
    until a round reports errors."""
    s = Settings(**settings)
    session = None
    counter = None
    try:
        session = make_session(contender_id, url, s.lease)
        counter = Counter(url, f"bench-counter:{counter_key}:{contender_id}", reset=False)
        warm, run_round = prepare(s, session, counter)
        results.put(("ready", index, warm))
        for round_no in range(s.rounds):
            trips0 = round_trips_sent()
            part = run_round(round_no, lambda: barrier.wait(timeout=_SLACK))
            part["round_trips"] = round_trips_sent() - trips0
            results.put(("round", index, round_no, part))
            if part["errors"]:
                return
    except BaseException:
        results.put(("error", index, traceback.format_exc(limit=6)))
    finally:
        if session is not None:
            session.close()
        if counter is not None:
            counter.close()


class _RawRound(NamedTuple):
    """One round of a multi-process workload as the harness saw it."""

    #: Each child's report, in child order (fewer than the children when one failed or hung).
    parts: list[dict[str, Any]]
    #: The server's command counts over the round.
    delta: CommandCounts
    #: CPU seconds of the server's main thread over the round.
    server_cpu_s: float


def _run_children(
    contender_id: str,
    url: str,
    settings: Settings,
    target: Callable[..., None],
    extra: tuple[Any, ...],
    processes: int,
    round_s: float,
    stats: redis.Redis,
    errors: list[str],
) -> tuple[int, list[_RawRound]]:
    """Start ``processes`` children running ``target(contender_id, url, settings, index, barrier, results,
    *extra)``. Each reports ("ready", index, cycles of its warm-up), then per round ("round", index, round_no,
    part) after the barrier let all of them go at once.

    Returns the warm-up cycles and, per round, the parts (in child order) with the server's command counts and its
    main thread's CPU seconds over the round (from just before the barrier to the last child's report). A round
    that came back short (a child failed or hung) is returned too, so its cycles can be counted, and ends the loop;
    so does a part that reports errors."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    children = [
        context.Process(
            target=target,
            args=(contender_id, url, asdict(settings), i, barrier, results, *extra),
            name=f"bench-{contender_id}-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    warm = 0
    rounds: list[_RawRound] = []
    try:
        for child in children:
            child.start()
        for message in _collect(results, "ready", processes, _SLACK, errors):
            warm += message[2]
        for _ in range(settings.rounds if not errors else 0):
            before, cpu0 = command_snapshot(stats), _server_cpu(stats)
            barrier.wait(timeout=_SLACK)
            got = _collect(results, "round", processes, round_s + _SLACK, errors)
            cpu1, delta = _server_cpu(stats), command_delta(before, command_snapshot(stats))
            parts = [m[3] for m in sorted(got, key=lambda m: m[1])]
            rounds.append(_RawRound(parts, delta, cpu1 - cpu0))
            if len(parts) != processes or errors or any(part["errors"] for part in parts):
                break
    except threading.BrokenBarrierError:
        errors.append("a child process never reached the start barrier")
    finally:
        if errors:
            barrier.abort()
        _reap(children, 10)
        results.close()
    return warm, rounds


def _many_processes(
    contender_id: str,
    url: str,
    settings: Settings,
    key: str,
    duration: float,
    max_cycles: int,
    metrics: Sequence[Metric],
) -> dict[str, Any]:
    def summarize(round_no: int, parts: list[dict[str, Any]], delta: CommandCounts) -> dict[str, Any]:
        # Per process: its cycles (Jain's index over them), and the longest wait any of its threads saw.
        per_process = [sum(part["per_thread"]) for part in parts]
        trips = sum(part["round_trips"] for part in parts)
        cycles = sum(per_process)
        reads = cycles if any(part["shared"] for part in parts) else 0
        result = _contention_round(parts, trips, delta, cycles - reads, reads)
        result["round"] = round_no
        result["per_process_cycles"] = per_process
        result["jain"] = jain_index(per_process)
        result["per_process_wait_max_ms"] = [_ms(max(part["waits"])) if part["waits"] else math.nan for part in parts]
        return result

    return _processes_row(
        contender_id,
        url,
        settings,
        key,
        _contention_child,
        (key, duration, max_cycles),
        settings.processes,
        duration,
        metrics,
        lambda part: 0 if part["shared"] else sum(part["per_thread"]),
        summarize,
    )


def _processes_row(
    contender_id: str,
    url: str,
    settings: Settings,
    counter_key: str,
    target: Callable[..., None],
    extra: tuple[Any, ...],
    processes: int,
    round_s: float,
    metrics: Sequence[Metric],
    increments: Callable[[dict[str, Any]], int],
    summarize: Callable[[int, list[dict[str, Any]], CommandCounts], dict[str, Any]],
) -> dict[str, Any]:
    """A multi-process workload's row: runs the children (``_run_children``), counts every part's counter
    ``increments`` (of short rounds too) for the counter check, and has ``summarize(round_no, parts, delta)``
    turn each round in which every child reported into a result; to which it adds the CPU time of the server's
    main thread over the round, in all (``server_cpu_ms``) and, when the result counts its ``cycles``, per cycle
    (``server_cpu_us_per_cycle``)."""
    counter = Counter(url, f"bench-counter:{counter_key}:{contender_id}")
    stats = redis.Redis.from_url(url)
    errors: list[str] = []
    try:
        cycles_run, raw = _run_children(contender_id, url, settings, target, extra, processes, round_s, stats, errors)
    finally:
        stats.close()
    rounds: list[dict[str, Any]] = []
    for round_no, (parts, delta, server_cpu_s) in enumerate(raw):
        for part in parts:
            errors += part["errors"]
            cycles_run += increments(part)
        if len(parts) == processes:
            result = summarize(round_no, parts, delta)
            result["server_cpu_ms"] = _ms(server_cpu_s)
            if result.get("cycles"):
                result["server_cpu_us_per_cycle"] = _us(server_cpu_s) / result["cycles"]
            rounds.append(result)
    try:
        return _row(rounds, metrics, counter, cycles_run, errors)
    finally:
        counter.close()
