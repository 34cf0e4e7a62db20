"""The workloads. Each takes a contender id and the server URL, and returns one result row for the tables.

Five measure the plain lock against its peers (issue 3), three the local hand-off between threads of one process
(issue 4), one a read-mostly load on a read-write lock (issue 5), four the asyncio API, and three ("prefork") N
processes of one thread or task each on one key, where every hand-over goes through the cross-process wake-up
path.

Every critical section increments a shared counter non-atomically (``measure.Counter``: GET then SET in Redis;
``measure.LocalCounter``: a Python int read, ``time.sleep(0)``, written back), and every workload checks at the end
that the counter equals the number of cycles run (of writes, in the read-mostly one): a lock that ever let two
holders in loses increments, and the run fails. Every loop is bounded both in count and in time.

Processes are started with the ``spawn`` method: each child builds its own client (and registry) from the URL, as
a separate program would, and nothing is inherited from the harness's threads.
"""

from __future__ import annotations

import asyncio
import gc
import math
import multiprocessing
import queue
import random
import statistics
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import redis

from .contenders import AsyncSession, LockLike, Session, make_session, round_trips_sent
from .measure import (
    AsyncCounter,
    CommandCounts,
    Counter,
    KeyedCounter,
    LocalCounter,
    Metric,
    command_delta,
    command_snapshot,
    jain_index,
    median_of_rounds,
    percentile,
)

__all__ = ["FULL", "METRICS", "QUICK", "WORKLOADS", "Settings"]

# How long a step may overrun its planned time before the harness gives up on it and fails the run.
_SLACK = 60.0


@dataclass(frozen=True)
class Settings:
    """Sizes and durations of one run (``QUICK`` or ``FULL``)."""

    rounds: int
    lease: float = 30.0
    # uncontended
    uncontended_cycles: int = 500
    uncontended_max_s: float = 5.0
    reentrant_depth: int = 100
    # the server's time per bare acquire + release (after each uncontended round): a loop of this many cycles,
    # bounded in time too; a long loop spreads the server's periodic work and the machine's noise over more cycles
    server_time_cycles: int = 10_000
    server_time_max_s: float = 60.0
    # 1 process x 8 threads, and 4 processes x 2 threads
    threads: int = 8
    processes: int = 4
    threads_per_process: int = 2
    contention_s: float = 6.0
    contention_max_cycles: int = 200_000  # per thread and round
    # hand-off
    handoffs: int = 30  # per round
    hold_min_s: float = 0.02
    hold_max_s: float = 0.12
    # scale
    scale_locks: int = 10_000
    scale_lease: float = 3.0
    scale_window_s: float = 9.0
    scale_acquire_max_s: float = 60.0
    # issue 4 (local hand-off: 1 process x `threads`, and `processes` x `threads_per_process`) and issue 5
    # (read-mostly): seconds per round, and a bound on each thread's cycles per round
    local_s: float = 5.0
    local_max_cycles: int = 1_000_000
    # read-mostly: processes x threads on one key, and the share of cycles that write
    rw_processes: int = 4
    rw_threads: int = 8
    rw_write_fraction: float = 0.05
    # asyncio: seconds per round; tasks of one loop; processes x tasks; waiting tasks and the timer's period
    async_s: float = 4.0
    async_tasks: int = 100
    async_processes: int = 4
    async_tasks_per_process: int = 50
    async_waiters: int = 1_000
    async_timer_period: float = 0.01
    # many keys: a pool of threads of one process, each cycle on a key drawn at random from many
    many_keys: int = 1_000
    many_threads: int = 64
    many_s: float = 5.0
    # prefork: N processes x 1 thread (or task) on one key (N: PREFORK_PROCESSES), seconds per round
    prefork_s: float = 5.0


QUICK = Settings(
    rounds=2,
    uncontended_cycles=200,
    uncontended_max_s=2.0,
    server_time_cycles=500,
    server_time_max_s=10.0,
    contention_s=1.0,
    handoffs=8,
    scale_locks=2_000,
    scale_window_s=2.5,
    scale_acquire_max_s=20.0,
    local_s=0.5,
    async_s=1.0,
    many_s=1.0,
    prefork_s=1.0,
)
FULL = Settings(rounds=3)


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _us(seconds: float) -> float:
    return seconds * 1_000_000.0


# ---------------------------------------------------------------------------------------------------------------
# 1. uncontended


UNCONTENDED_METRICS = (
    Metric("latency_median_us", "cycle median (µs)", "lower", 0),
    Metric("latency_p99_us", "cycle p99 (µs)", "lower", 0),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 2),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
    Metric("server_us_per_cycle", "server µs / cycle (commandstats)", "lower", 1),
    Metric("server_cpu_us_per_cycle", "server CPU µs / cycle", "lower", 1),
    Metric("reentrant_round_trips", "reentrant acquire: round trips", "lower", 2),
    Metric("reentrant_server_cmds", "reentrant acquire: server cmds", "lower", 2),
    Metric("reentrant_us", "reentrant acquire+release (µs)", "lower", 2),
)


def uncontended(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """One thread, one key: the acquire+release cycle's latency (the critical section's own GET and SET are not
    timed) and what it costs the server; for reentrant locks, what a nested acquire costs."""
    session = make_session(contender_id, url, settings.lease)
    counter = Counter(url, f"bench-counter:uncontended:{contender_id}")
    stats = redis.Redis.from_url(url)
    try:
        lock = session.lock("uncontended")
        warmup = 20  # loads scripts and opens the connection outside the measured rounds
        for _ in range(warmup):
            _cycle(lock, counter.increment)
        cycles_run = warmup
        rounds = []
        for _ in range(settings.rounds):
            latencies: list[float] = []
            increments0 = counter.increments
            before, trips0 = command_snapshot(stats), round_trips_sent()
            deadline = time.monotonic() + settings.uncontended_max_s
            for _ in range(settings.uncontended_cycles):
                t0 = time.perf_counter()
                lock.acquire()
                t1 = time.perf_counter()
                try:
                    counter.increment()
                finally:
                    t2 = time.perf_counter()
                    lock.release()
                    t3 = time.perf_counter()
                latencies.append((t1 - t0) + (t3 - t2))
                if time.monotonic() > deadline:
                    break
            trips = round_trips_sent() - trips0
            delta = command_delta(before, command_snapshot(stats))
            n = len(latencies)
            cycles_run += n
            rounds.append(
                {
                    "cycles": n,
                    "latency_median_us": _us(statistics.median(latencies)),
                    "latency_p99_us": _us(percentile(latencies, 0.99)),
                    "round_trips_per_cycle": trips / n,
                    "server_cmds_per_cycle": delta.total(counter_increments=counter.increments - increments0) / n,
                    **_server_time_per_bare_cycle(lock, stats, settings.server_time_cycles, settings.server_time_max_s),
                }
            )
        if session.reentrant:
            for r in rounds:
                r.update(_reentrant_cost(session, lock, stats, settings.reentrant_depth))
        return _row(rounds, UNCONTENDED_METRICS, counter, cycles_run)
    finally:
        session.close()
        counter.close()
        stats.close()


def _server_time_per_bare_cycle(lock: LockLike, stats: redis.Redis, cycles: int, max_s: float) -> dict[str, float]:
    """The server's time per acquire+release with nothing in between, over a loop of ``cycles`` of them (fewer
    when ``max_s`` seconds run out first), two ways:

    * ``server_us_per_cycle``: ``INFO commandstats`` (its ``usec``) summed over every command the cycle sent and
      every command a script ran inside the server, which Redis counts both on its own and within the script's time
      (for every contender alike);
    * ``server_cpu_us_per_cycle``: the CPU time of the server's main thread (``INFO cpu``, user + system): what
      the cycle cost the one core that runs every command, reading requests and writing replies included.

    With no critical section, none of it is the counter's. The CPU time also counts the server's own periodic work
    over the loop (small next to thousands of cycles)."""
    before, cpu0 = command_snapshot(stats), _server_cpu(stats)
    deadline = time.monotonic() + max_s
    done = 0
    while done < cycles:
        lock.acquire()
        lock.release()
        done += 1
        if time.monotonic() > deadline:
            break
    cpu1, after = _server_cpu(stats), command_snapshot(stats)
    return {
        "server_time_cycles": done,
        "server_us_per_cycle": command_delta(before, after).total_usec() / done,
        "server_cpu_us_per_cycle": _us(cpu1 - cpu0) / done,
    }


def _server_cpu(stats: redis.Redis) -> float:
    """Seconds of CPU the server's main thread has used (the whole process's on a server that does not say)."""
    info = stats.info("cpu")
    if "used_cpu_user_main_thread" in info:
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _cycle(lock: LockLike, section: Callable[[], Any]) -> float:
    """One cycle: acquire ``lock``, run the critical ``section``, release. Returns the time spent inside
    ``acquire()`` (the wait)."""
    t0 = time.perf_counter()
    lock.acquire()
    t1 = time.perf_counter()
    try:
        section()
    finally:
        lock.release()
    return t1 - t0


def _reentrant_cost(session: Session, lock: LockLike, stats: redis.Redis, depth: int) -> dict[str, float]:
    lock.acquire()
    try:
        before, trips0 = command_snapshot(stats), round_trips_sent()
        t0 = time.perf_counter()
        for _ in range(depth):
            lock.acquire()
        for _ in range(depth):
            lock.release()
        elapsed = time.perf_counter() - t0
        trips = round_trips_sent() - trips0
        delta = command_delta(before, command_snapshot(stats))
    finally:
        lock.release()
    return {
        "reentrant_round_trips": trips / depth,
        "reentrant_server_cmds": delta.total() / depth,
        "reentrant_us": _us(elapsed / depth),
    }


# ---------------------------------------------------------------------------------------------------------------
# 2. and 3. contention: threads (of one or several processes) cycling on one key


CONTENTION_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("wait_p50_ms", "wait p50 (ms)", "lower", 2),
    Metric("wait_p99_ms", "wait p99 (ms)", "lower", 1),
    Metric("wait_max_ms", "longest wait (ms)", "lower", 0),
    Metric("fairness", "fairness (min/mean cycles per thread)", "higher", 2),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 2),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
)


PROCESSES_METRICS = (
    *CONTENTION_METRICS[:5],
    Metric("jain", "Jain's index over processes", "higher", 3),
    *CONTENTION_METRICS[5:],
)


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


def many_keys(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """A worker pool: ``settings.many_threads`` threads of one process, each cycle on a key drawn (seeded, per
    thread and round) from ``settings.many_keys``; the critical section increments that key's counter."""
    session = None
    counter = KeyedCounter(url, f"bench-counter:many:{contender_id}", settings.many_keys)
    stats = redis.Redis.from_url(url)
    threads = settings.many_threads
    try:
        session = make_session(contender_id, url, settings.lease)
        _cycle(session.lock("many:0"), partial(counter.increment, 0))  # loads scripts, opens the connection
        cycles_run = 1
        rounds = []
        errors: list[str] = []
        for round_no in range(settings.rounds):
            draws = [random.Random(1000 * round_no + i) for i in range(threads)]
            waits: list[list[float]] = [[] for _ in range(threads)]
            increments0 = counter.increments
            before, trips0 = command_snapshot(stats), round_trips_sent()

            def step(index: int, draws: list[random.Random] = draws, waits: list[list[float]] = waits) -> None:
                key = draws[index].randrange(settings.many_keys)
                lock = session.lock(f"many:{key}")  # type: ignore[union-attr]  # (made above)
                waits[index].append(_cycle(lock, partial(counter.increment, key)))

            round_errors: list[str] = []
            start, end = _cycling_threads(
                threads, step, settings.many_s, settings.contention_max_cycles, lambda: None, round_errors
            )
            trips = round_trips_sent() - trips0
            delta = command_delta(before, command_snapshot(stats))
            part = {
                "start": start,
                "end": end,
                "waits": [w for mine in waits for w in mine],
                "per_thread": [len(mine) for mine in waits],
                "errors": round_errors,
            }
            errors += round_errors
            cycles_run += sum(part["per_thread"])
            rounds.append(_contention_round([part], trips, delta, counter.increments - increments0))
            if round_errors:
                break
        return _row(rounds, CONTENTION_METRICS, counter, cycles_run, errors)
    finally:
        if session is not None:
            session.close()
        counter.close()
        stats.close()


def threads_one_process(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.threads`` threads of this process on one key."""
    return _one_process(
        contender_id,
        url,
        settings,
        "threads",
        Counter(url, f"bench-counter:threads:{contender_id}"),
        settings.contention_s,
        settings.contention_max_cycles,
        CONTENTION_METRICS,
    )


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


def _reap(children: Sequence[Any], wait: float) -> None:
    """Join our children (those that started), giving each ``wait`` seconds before ending it by its handle."""
    for child in children:
        if child.pid is None:
            continue  # never started (an earlier one's start failed)
        child.join(timeout=wait)
        if child.is_alive():
            child.terminate()  # our own child, by its handle
            child.join(timeout=5)


def threads_many_processes(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.processes`` processes x ``settings.threads_per_process`` threads on one key."""
    return _many_processes(
        contender_id,
        url,
        settings,
        "processes",
        settings.contention_s,
        settings.contention_max_cycles,
        PROCESSES_METRICS,
    )


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


def _collect(results: Any, kind: str, count: int, timeout: float, errors: list[str]) -> list[tuple[Any, ...]]:
    """Take ``count`` messages of ``kind`` from the children's queue within ``timeout`` seconds; an error message
    or running out of time records an error and returns what arrived."""
    got: list[tuple[Any, ...]] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        try:
            message = results.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            errors.append(f"only {len(got)} of {count} child processes reported '{kind}' within {timeout:.0f} s")
            break
        if message[0] == "error":
            errors.append(f"child {message[1]}: {message[2]}")
            break
        got.append(message)
    return got


# ---------------------------------------------------------------------------------------------------------------
# 4. hand-off between processes


HANDOFF_METRICS = (
    Metric("handoff_median_ms", "hand-off median (ms)", "lower", 2),
    Metric("handoff_p99_ms", "hand-off p99 (ms)", "lower", 1),
    Metric("waiter_round_trips", "waiter round trips / acquire", "lower", 1),
)


def _recv(conn: Any, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"no message from the other process within {timeout:.0f} s")
    return conn.recv()


def _handoff_holder(contender_id: str, url: str, settings: dict[str, Any], conn: Any, results: Any) -> None:
    """Takes the lock, lets the waiter block on it, holds it a random while, and releases it: the hand-off time is
    from just before its ``release()`` to just after the waiter's ``acquire()`` returned, both read on
    ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for the whole machine on Linux)."""

    def play(s: Settings, lock: LockLike, counter: Counter) -> None:
        timeout = s.hold_max_s + _SLACK
        # Start only once the waiter has finished its own warm-up cycle, or it would be blocked in that one.
        if _recv(conn, timeout) != "ready":
            raise RuntimeError("hand-off protocol out of step")
        rng = random.Random(12345)
        for round_no in range(s.rounds):
            samples, trips = [], []
            for _ in range(s.handoffs):
                lock.acquire()
                try:
                    counter.increment()
                    conn.send("held")
                    if _recv(conn, timeout) != "waiting":
                        raise RuntimeError("hand-off protocol out of step")
                    # The waiter is inside acquire() now; a random hold puts the release at a random point of its
                    # polling cycle, as happens in real use.
                    time.sleep(rng.uniform(s.hold_min_s, s.hold_max_s))
                    released_at = time.monotonic()
                finally:
                    lock.release()
                acquired_at, waiter_trips = _recv(conn, timeout)
                samples.append(acquired_at - released_at)
                trips.append(waiter_trips)
            results.put(("round", 0, round_no, {"samples": samples, "waiter_trips": trips}))
        conn.send("done")

    _handoff_side(0, contender_id, url, settings, results, play)


def _handoff_waiter(contender_id: str, url: str, settings: dict[str, Any], conn: Any, results: Any) -> None:
    def play(s: Settings, lock: LockLike, counter: Counter) -> None:
        conn.send("ready")
        timeout = s.hold_max_s + _SLACK
        for _ in range(s.rounds * s.handoffs + 1):  # the last message is "done"
            message = _recv(conn, 4 * timeout)
            if message == "done":
                return
            conn.send("waiting")
            trips0 = round_trips_sent()
            lock.acquire()
            acquired_at = time.monotonic()
            trips = round_trips_sent() - trips0
            try:
                counter.increment()
            finally:
                lock.release()
            conn.send((acquired_at, trips))

    _handoff_side(1, contender_id, url, settings, results, play)


def _handoff_side(
    index: int,
    contender_id: str,
    url: str,
    settings: dict[str, Any],
    results: Any,
    play: Callable[[Settings, LockLike, Counter], None],
) -> None:
    """The life of one process of the hand-off workload (``index`` 0: the holder, 1: the waiter): its own session
    and lock, a warm-up cycle reported as "ready", then its part, ``play``; a failure is reported as "error"."""
    s = Settings(**settings)
    session = None
    try:
        session = make_session(contender_id, url, s.lease)
        lock = session.lock("handoff")
        counter = Counter(url, f"bench-counter:handoff:{contender_id}", reset=False)
        _cycle(lock, counter.increment)
        results.put(("ready", index, 1))
        play(s, lock, counter)
    except BaseException:
        results.put(("error", index, traceback.format_exc(limit=6)))
    finally:
        if session is not None:
            session.close()


def handoff(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """Two processes pass the lock back and forth: what a waiting process loses to the lock's wake-up path."""
    counter = Counter(url, f"bench-counter:handoff:{contender_id}")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    holder_end, waiter_end = context.Pipe()
    children = [
        context.Process(
            target=_handoff_holder,
            args=(contender_id, url, asdict(settings), holder_end, results),
            name=f"bench-{contender_id}-holder",
            daemon=True,
        ),
        context.Process(
            target=_handoff_waiter,
            args=(contender_id, url, asdict(settings), waiter_end, results),
            name=f"bench-{contender_id}-waiter",
            daemon=True,
        ),
    ]
    errors: list[str] = []
    rounds: list[dict[str, Any]] = []
    cycles_run = 0
    try:
        for child in children:
            child.start()
        cycles_run += sum(m[2] for m in _collect(results, "ready", 2, _SLACK, errors))
        per_round = settings.handoffs * (settings.hold_max_s + 1.0) + _SLACK
        for _ in range(settings.rounds if not errors else 0):
            got = _collect(results, "round", 1, per_round, errors)
            if not got:
                break
            data = got[0][3]
            samples = data["samples"]
            cycles_run += 2 * len(samples)
            rounds.append(
                {
                    "handoffs": len(samples),
                    "handoff_median_ms": _ms(statistics.median(samples)),
                    "handoff_p99_ms": _ms(percentile(samples, 0.99)),
                    "waiter_round_trips": statistics.mean(data["waiter_trips"]),
                    "samples_ms": [round(_ms(x), 3) for x in samples],
                }
            )
    finally:
        _reap(children, 10 if not errors else 1)
        results.close()
    try:
        return _row(rounds, HANDOFF_METRICS, counter, cycles_run, errors)
    finally:
        counter.close()


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


# ---------------------------------------------------------------------------------------------------------------
# 5. scale: one process holding many locks


SCALE_METRICS = (
    Metric("period_s", "measured period (s)", "lower", 2, ratio=False),
    Metric("round_trips_per_period", "renewal round trips / period", "lower", 0),
    Metric("cpu_ms_per_period", "CPU ms / period", "lower", 1),
    Metric("cpu_percent", "CPU % of one core", "lower", 1),
    Metric("server_ms_per_period", "server busy ms / period", "lower", 1),
    Metric("server_ms_per_call", "server ms per renewal call", "lower", 3),
    Metric("acquired", "locks acquired", "higher", 0),
    Metric("locks_kept", "locks still held at the end", "higher", 0),
    Metric("acquire_s", "acquire all (s)", "lower", 2),
)


def scale(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """One thread takes ``settings.scale_locks`` locks with a short lease and holds them for a while.

    Libraries that renew leases themselves (hybridlock: one background thread per registry; python-redis-lock:
    one thread per lock) are left to do it. For the others one background thread renews every held lock once per
    period (``lease / 3``), as their users have to write it, from the first acquire on. At the end, the locks
    whose keys are still in the server are counted: a lease that ran out is a lock lost."""
    session = make_session(contender_id, url, settings.scale_lease)
    stats = redis.Redis.from_url(url)
    n = settings.scale_locks
    keys = [f"scale:{i}" for i in range(n)]
    thread_errors: list[str] = []
    old_hook = threading.excepthook
    # python-redis-lock's renewal threads die with an exception when their lock is gone: count, don't print.
    threading.excepthook = lambda args: thread_errors.append(f"{args.exc_type.__name__}: {args.exc_value}")
    held: list[LockLike] = []
    errors: list[str] = []
    by_hand = None if session.renews_itself else _ByHandRenewal(session, held, settings.scale_lease / 3)
    try:
        locks = [session.renewing_lock(key) for key in keys]
        if by_hand is not None:
            by_hand.start()
        start = time.monotonic()
        for lock in locks:
            if time.monotonic() - start > settings.scale_acquire_max_s:
                break  # reported in the "acquired" column; a failure only for hybridlock
            lock.acquire()
            held.append(lock)
        acquire_s = time.monotonic() - start
        # Let one renewal round pass before measuring: the first one loads the script (NOSCRIPT, then EVAL or
        # SCRIPT LOAD), a one-time cost that would otherwise weigh on a short window.
        time.sleep(settings.scale_lease / 3 + 0.2)
        names = [session.server_key(k) or "" for k in keys[: len(held)]]
        alive_before = _count_present(stats, names)

        before, trips0, cpu0 = command_snapshot(stats), round_trips_sent(), time.process_time()
        window_start = time.monotonic()
        time.sleep(settings.scale_window_s)
        window = time.monotonic() - window_start
        cpu = time.process_time() - cpu0
        trips = round_trips_sent() - trips0
        delta = command_delta(before, command_snapshot(stats))
        kept = _count_present(stats, names)
        renew_failures = by_hand.failures if by_hand is not None else None

        # A "period" is the time in which every live lock got its lease reset once. It is counted, not assumed:
        # each reset is one PEXPIRE (or EXPIRE) in the server, whether a script sent it for 10,000 keys or a
        # client for one, so periods = resets / live locks. That holds for a background renewer whose rounds do
        # not line up with the window, for one thread per lock, and for a by-hand pass slower than lease/3. When
        # locks die during the window (a library that cannot keep up), the live count is the mean of its start
        # and end, an approximation the notes under the table point out.
        resets = delta.lease_resets()
        alive = (alive_before + kept) / 2
        periods = resets / alive if alive else math.nan
        script_calls = delta.scripts()

        def per_period(amount: float) -> float:
            return amount / periods if periods and periods == periods else math.nan

        result = {
            "locks": n,
            "lease_s": settings.scale_lease,
            "window_s": window,
            "periods": periods,
            "period_s": per_period(window),
            "round_trips_per_period": per_period(trips),
            "script_calls_per_period": per_period(script_calls),
            "cpu_ms_per_period": _ms(per_period(cpu)),
            "cpu_percent": 100.0 * cpu / window,
            "server_ms_per_period": per_period(delta.total_usec() / 1000),
            "server_ms_per_call": delta.script_usec() / 1000 / script_calls if script_calls else math.nan,
            "acquired": len(held),
            "alive_at_window_start": alive_before,
            "locks_kept": kept,
            "locks_lost_reported": sum(session.lost(lock) for lock in held),
            "acquire_s": acquire_s,
        }
        if by_hand is not None:
            times = by_hand.pass_times
            result["pass_s_median"] = statistics.median(times) if times else math.nan
            result["pass_s_max"] = max(times) if times else math.nan
            result["renew_failures"] = renew_failures
    finally:
        # Release while the by-hand renewal still runs, so that no lease ends during the release loop itself.
        release_start = time.monotonic()
        release_errors = 0
        for lock in held:
            try:
                lock.release()
            except Exception:
                release_errors += 1  # a lease that ran out: already counted as not kept
        release_s = time.monotonic() - release_start
        if by_hand is not None:
            by_hand.stop()
        threading.excepthook = old_hook
        session.close()
        stats.close()
    result["release_s"] = release_s
    result["release_errors"] = release_errors
    result["renewal_thread_errors"] = len(thread_errors)
    if thread_errors:
        result["renewal_thread_error_sample"] = thread_errors[0]
    row = {"rounds": [result], "median": median_of_rounds([result], SCALE_METRICS), "errors": errors}
    row["count_ok"] = True  # no counter here: the check is locks_kept, reported (a peer may legitimately lose)
    if contender_id.startswith("hybridlock"):
        if len(held) != n:
            errors.append(f"acquired only {len(held)} of {n} locks in {settings.scale_acquire_max_s:.0f} s")
        if kept != len(held):
            errors.append(f"kept only {kept} of {len(held)} locks alive through the window")
    return row


class _ByHandRenewal:
    """The renewal thread a user of a library without renewal writes: every period, renew each held lock once
    (one call per lock, the only way their API offers); when a pass takes longer than the period, the next one
    starts at once."""

    def __init__(self, session: Session, held: list[LockLike], period: float) -> None:
        self.session = session
        self.held = held  # appended to by the acquiring thread
        self.period = period
        self.pass_times: list[float] = []
        self.failures = 0
        self._gone: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-by-hand-renewal", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=_SLACK)

    def _run(self) -> None:
        next_due = time.monotonic() + self.period
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            start = time.monotonic()
            for lock in list(self.held):
                if self._stop.is_set():
                    return
                if id(lock) in self._gone:
                    continue
                try:
                    self.session.renew_by_hand(lock)
                except Exception:  # the lease had run out: the library says so by raising
                    self._gone.add(id(lock))
                    self.failures += 1
            self.pass_times.append(time.monotonic() - start)
            next_due = start + self.period


def _count_present(client: redis.Redis, names: Sequence[str]) -> int:
    present = 0
    for i in range(0, len(names), 1000):
        with client.pipeline(transaction=False) as pipe:
            for name in names[i : i + 1000]:
                pipe.exists(name)
            present += sum(pipe.execute())
    return present


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


# ---------------------------------------------------------------------------------------------------------------
# 11.-14. asyncio: the tasks of one event loop (or of four processes' loops) on one key


ASYNC_UNCONTENDED_METRICS = tuple(
    Metric(m.key, m.label.replace("holding thread", "holding task"), m.better, m.digits) for m in UNCONTENDED_METRICS
)

ASYNC_TASKS_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("wait_p50_ms", "wait p50 (ms)", "lower", 2),
    Metric("wait_p99_ms", "wait p99 (ms)", "lower", 1),
    Metric("wait_max_ms", "longest wait (ms)", "lower", 0),
    Metric("fairness", "fairness (min/mean cycles per task)", "higher", 2),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 3),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
)

ASYNC_PROCESSES_METRICS = LOCAL_PROCESSES_METRICS


class _GcPauses:
    """The cyclic garbage collector's pauses in this process while in the ``with`` block: their total and the
    longest (seconds)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.longest = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self.total += pause
            self.longest = max(self.longest, pause)

    def __enter__(self) -> _GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)


# The event-loop workload leaves the first 0.1 s of a round out of the timer's ticks: starting a thousand tasks
# keeps the loop busy for some milliseconds, whatever the lock.
_SETTLE_S = 0.1

ASYNC_LOOP_METRICS = (
    Metric("lateness_max_ms", "timer lateness, worst (ms)", "lower", 1),
    Metric("lateness_p99_ms", "timer lateness p99 (ms)", "lower", 2),
    Metric("lateness_p50_ms", "timer lateness p50 (ms)", "lower", 2),
    Metric("lateness_own_max_ms", "worst lateness, less GC and time off CPU (ms)", "lower", 1),
    Metric("gc_pause_max_ms", "longest GC pause (ms)", "lower", 1),
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("wait_max_ms", "longest wait (ms)", "lower", 0),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 3),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
)


async def _acycle(lock: Any, section: Callable[[], Awaitable[Any]]) -> float:
    """``_cycle`` for a task: acquire, run the critical section, release; returns the time inside ``acquire()``."""
    t0 = time.perf_counter()
    await lock.acquire()
    t1 = time.perf_counter()
    try:
        await section()
    finally:
        await lock.release()
    return t1 - t0


async def _contend_tasks(
    session: AsyncSession,
    counter: AsyncCounter,
    key: str,
    tasks: int,
    duration: float,
    max_cycles: int,
    *,
    bounded: bool = False,
) -> dict[str, Any]:
    """``_contend`` for tasks: ``tasks`` tasks of the running loop, each cycling on ``key`` until ``duration`` has
    passed (or ``max_cycles``); a task's lock object is its own (or, for hybridlock, the key's one object).

    As with threads, a task waiting when the time is up goes on waiting until it gets the lock, so every wait is
    measured whole. ``bounded`` instead gives each acquire the time left as a timeout, and a wait cut short that
    way counts among the waits (at least that long): for a thousand polling tasks, which would otherwise take
    minutes to all get their last turn."""
    locks = [session.lock(key) for _ in range(tasks)]
    waits: list[list[float]] = [[] for _ in range(tasks)]
    cut = [False] * tasks
    errors: list[str] = []
    start = time.monotonic()
    end = start + duration

    async def worker(index: int) -> None:
        lock = locks[index]
        try:
            cycles = 0
            while cycles < max_cycles and (now := time.monotonic()) < end:
                t0 = time.perf_counter()
                if bounded:
                    acquired = await session.acquire_within(lock, end - now)
                else:
                    acquired = bool(await lock.acquire())
                waits[index].append(time.perf_counter() - t0)  # a wait cut short by the round's end counts too
                if not acquired:
                    cut[index] = True
                    break
                try:
                    await counter.increment()
                finally:
                    await lock.release()
                cycles += 1
        except Exception:
            errors.append(traceback.format_exc(limit=4))

    running = [asyncio.ensure_future(worker(i)) for i in range(tasks)]
    _, hung = await asyncio.wait(running, timeout=duration + _SLACK)
    for task in hung:
        task.cancel()
    if hung:
        errors.append(f"{len(hung)} task(s) still running {_SLACK:.0f} s after the deadline")
        await asyncio.wait(hung, timeout=10)
    # Cycles per task: every wait but a last one cut short by the round's end was followed by a cycle.
    per_task = [len(mine) - (len(mine) > 0 and cut[index]) for index, mine in enumerate(waits)]
    return {
        "start": start,
        "end": time.monotonic(),
        "waits": [w for mine in waits for w in mine],
        "per_thread": per_task,
        "errors": errors,
    }


def _in_loop(
    contender_id: str,
    url: str,
    settings: Settings,
    counter_key: str,
    metrics: Sequence[Metric],
    body: Callable[[AsyncSession, AsyncCounter, redis.Redis], Awaitable[tuple[list[dict[str, Any]], list[str]]]],
) -> dict[str, Any]:
    """An asyncio workload of this process: a fresh event loop running ``body(session, counter, stats)``, which
    returns the rounds and errors. The counter's final value is checked, as in every workload, against the
    increments made (warm-up included)."""
    check = Counter(url, f"bench-counter:{counter_key}:{contender_id}")  # resets the key; reads it at the end
    stats = redis.Redis.from_url(url)
    increments = [0]

    async def main() -> tuple[list[dict[str, Any]], list[str]]:
        session = make_session(contender_id, url, settings.lease)
        assert isinstance(session, AsyncSession), f"{contender_id} is not an asyncio contender"
        counter = AsyncCounter(url, check.key)
        try:
            return await body(session, counter, stats)
        finally:
            increments[0] = counter.increments
            await session.aclose()
            await counter.close()

    try:
        rounds, errors = asyncio.run(main())
        return _row(rounds, metrics, check, increments[0], errors)
    finally:
        check.close()
        stats.close()


def async_uncontended(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``uncontended`` for one task: the acquire+release cycle, and for reentrant locks a nested acquire."""

    async def body(session: AsyncSession, counter: AsyncCounter, stats: redis.Redis) -> Any:
        lock = session.lock("async-uncontended")
        for _ in range(20):  # warm-up: scripts loaded, connections open
            await _acycle(lock, counter.increment)
        rounds = []
        for _ in range(settings.rounds):
            latencies: list[float] = []
            increments0 = counter.increments
            before, trips0 = command_snapshot(stats), round_trips_sent()
            deadline = time.monotonic() + settings.uncontended_max_s
            for _ in range(settings.uncontended_cycles):
                t0 = time.perf_counter()
                await lock.acquire()
                t1 = time.perf_counter()
                try:
                    await counter.increment()
                finally:
                    t2 = time.perf_counter()
                    await lock.release()
                    t3 = time.perf_counter()
                latencies.append((t1 - t0) + (t3 - t2))
                if time.monotonic() > deadline:
                    break
            trips = round_trips_sent() - trips0
            delta = command_delta(before, command_snapshot(stats))
            n = len(latencies)
            rounds.append(
                {
                    "cycles": n,
                    "latency_median_us": _us(statistics.median(latencies)),
                    "latency_p99_us": _us(percentile(latencies, 0.99)),
                    "round_trips_per_cycle": trips / n,
                    "server_cmds_per_cycle": delta.total(counter_increments=counter.increments - increments0) / n,
                }
            )
            if session.reentrant:
                rounds[-1].update(await _async_reentrant_cost(lock, stats, settings.reentrant_depth))
        return rounds, []

    return _in_loop(contender_id, url, settings, "async-uncontended", ASYNC_UNCONTENDED_METRICS, body)


async def _async_reentrant_cost(lock: Any, stats: redis.Redis, depth: int) -> dict[str, float]:
    await lock.acquire()
    try:
        before, trips0 = command_snapshot(stats), round_trips_sent()
        t0 = time.perf_counter()
        for _ in range(depth):
            await lock.acquire()
        for _ in range(depth):
            await lock.release()
        elapsed = time.perf_counter() - t0
        trips = round_trips_sent() - trips0
        delta = command_delta(before, command_snapshot(stats))
    finally:
        await lock.release()
    return {
        "reentrant_round_trips": trips / depth,
        "reentrant_server_cmds": delta.total() / depth,
        "reentrant_us": _us(elapsed / depth),
    }


async def _task_rounds(
    session: AsyncSession,
    counter: AsyncCounter,
    stats: redis.Redis,
    key: str,
    tasks: int,
    settings: Settings,
    during: Callable[[float], Any] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rounds of ``tasks`` tasks cycling on ``key`` in this loop, after a warm-up cycle through each task's lock
    object. ``during(end)``, when given, is started as a task of its own for each round, with the round's end on
    the monotonic clock (a timer, say), and the tasks' acquires are bounded by that end (see ``_contend_tasks``);
    it is cancelled after the round, and what it returns, a dict, is merged into the round's results."""
    for _ in range(min(tasks, 8)):
        await _acycle(session.lock(key), counter.increment)
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    for _ in range(settings.rounds):
        increments0 = counter.increments
        before, trips0 = command_snapshot(stats), round_trips_sent()
        side = asyncio.ensure_future(during(time.monotonic() + settings.async_s)) if during is not None else None
        part = await _contend_tasks(
            session, counter, key, tasks, settings.async_s, settings.local_max_cycles, bounded=during is not None
        )
        extra: dict[str, Any] = {}
        if side is not None:
            side.cancel()
            outcome = (await asyncio.gather(side, return_exceptions=True))[0]
            if isinstance(outcome, BaseException):
                errors.append(f"{type(outcome).__name__}: {outcome}")
            else:
                extra = outcome
        trips = round_trips_sent() - trips0
        delta = command_delta(before, command_snapshot(stats))
        errors += part["errors"]
        result = _contention_round([part], trips, delta, counter.increments - increments0)
        result.update(extra)
        rounds.append(result)
        if part["errors"]:
            break
    return rounds, errors


def async_tasks(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.async_tasks`` tasks of one event loop on one key."""

    async def body(session: AsyncSession, counter: AsyncCounter, stats: redis.Redis) -> Any:
        return await _task_rounds(session, counter, stats, "async-tasks", settings.async_tasks, settings)

    return _in_loop(contender_id, url, settings, "async-tasks", ASYNC_TASKS_METRICS, body)


def async_loop_lag(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.async_waiters`` tasks of one event loop cycle on one key (so nearly all of them are waiting at
    any time) while a periodic timer in the same loop sleeps ``settings.async_timer_period`` seconds over and
    over: how late each of its wake-ups comes is how long the loop was kept from its other work. The tasks'
    acquires end with the round (``bounded``): a thousand pollers would take minutes to all get a last turn."""

    async def timer(end: float) -> dict[str, Any]:
        # Ticks due once the thousand tasks have started (the first _SETTLE_S of the round) and woken before the
        # round's end (where every waiting task's acquire times out at once): both are the harness's doing.
        settled = end - settings.async_s + _SETTLE_S
        lateness: list[float] = []
        own: list[float] = []
        gc_pauses = _GcPauses()
        try:
            with gc_pauses:
                while True:
                    due = time.monotonic() + settings.async_timer_period
                    cpu0, gc0 = time.process_time(), gc_pauses.total
                    await asyncio.sleep(settings.async_timer_period)
                    woke = time.monotonic()
                    if woke >= end:
                        break
                    if due >= settled:
                        late = max(0.0, woke - due)
                        lateness.append(late)
                        # What the loop's own work can account for: no more than the CPU time the process used
                        # during the sleep (on a shared machine the rest is the OS running other processes), less
                        # the cyclic garbage collector's pauses in it (the interpreter's, whatever the lock).
                        own.append(max(0.0, min(late, time.process_time() - cpu0) - (gc_pauses.total - gc0)))
        except asyncio.CancelledError:
            pass
        return {
            "ticks": len(lateness),
            "lateness_max_ms": _ms(max(lateness, default=math.nan)),
            "lateness_p99_ms": _ms(percentile(lateness, 0.99)),
            "lateness_p50_ms": _ms(percentile(lateness, 0.50)),
            "lateness_own_max_ms": _ms(max(own, default=math.nan)),
            "gc_pause_max_ms": _ms(gc_pauses.longest),
        }

    async def body(session: AsyncSession, counter: AsyncCounter, stats: redis.Redis) -> Any:
        return await _task_rounds(session, counter, stats, "async-loop", settings.async_waiters, settings, timer)

    return _in_loop(contender_id, url, settings, "async-loop", ASYNC_LOOP_METRICS, body)


def _async_contention_child(
    contender_id: str,
    url: str,
    settings: dict[str, Any],
    index: int,
    barrier: Any,
    results: Any,
    key: str = "async-procs",
) -> None:
    """A child process of the multi-process asyncio workloads: its own event loop, session and
    ``async_tasks_per_process`` tasks cycling on ``key`` (and incrementing the counter of that name), one round per
    barrier (waited for off the loop, so the library's background tasks keep running)."""
    s = Settings(**settings)

    async def main() -> None:
        session = make_session(contender_id, url, s.lease)
        assert isinstance(session, AsyncSession)
        counter = AsyncCounter(url, f"bench-counter:{key}:{contender_id}")
        try:
            for _ in range(min(s.async_tasks_per_process, 8)):
                await _acycle(session.lock(key), counter.increment)
            results.put(("ready", index, counter.increments))
            for round_no in range(s.rounds):
                await asyncio.to_thread(barrier.wait, _SLACK)
                trips0 = round_trips_sent()
                part = await _contend_tasks(
                    session, counter, key, s.async_tasks_per_process, s.async_s, s.local_max_cycles
                )
                part["round_trips"] = round_trips_sent() - trips0
                results.put(("round", index, round_no, part))
                if part["errors"]:
                    return
        finally:
            await session.aclose()
            await counter.close()

    try:
        asyncio.run(main())
    except BaseException:
        results.put(("error", index, traceback.format_exc(limit=6)))


def async_processes(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """``settings.async_processes`` processes x ``settings.async_tasks_per_process`` tasks on one key: throughput,
    each process's longest wait, and Jain's index over the processes' cycles."""
    return _async_many_processes(contender_id, url, settings, "async-procs", ASYNC_PROCESSES_METRICS)


def _async_many_processes(
    contender_id: str, url: str, settings: Settings, key: str, metrics: Sequence[Metric]
) -> dict[str, Any]:
    def summarize(round_no: int, parts: list[dict[str, Any]], delta: CommandCounts) -> dict[str, Any]:
        per_process = [sum(part["per_thread"]) for part in parts]
        trips = sum(part["round_trips"] for part in parts)
        result = _contention_round(parts, trips, delta, sum(per_process))
        waits_max = [_ms(max(part["waits"])) if part["waits"] else math.nan for part in parts]
        result.update(
            round=round_no,
            per_process_cycles=per_process,
            jain=jain_index(per_process),
            per_process_wait_max_ms=waits_max,
            wait_max_best_ms=min((w for w in waits_max if not math.isnan(w)), default=math.nan),
        )
        return result

    return _processes_row(
        contender_id,
        url,
        settings,
        key,
        _async_contention_child,
        (key,),
        settings.async_processes,
        settings.async_s,
        metrics,
        lambda part: sum(part["per_thread"]),
        summarize,
    )


# ---------------------------------------------------------------------------------------------------------------
# 15.-17. prefork: N processes of one thread (or one task) each on one key, as a prefork server's workers are


PREFORK_METRICS = (
    Metric("cycles_per_s", "cycles/s", "higher", 0),
    Metric("jain", "Jain's index over processes", "higher", 3),
    Metric("wait_max_ms", "longest wait (ms)", "lower", 0),
    Metric("wait_p50_ms", "wait p50 (ms)", "lower", 2),
    Metric("wait_p99_ms", "wait p99 (ms)", "lower", 1),
    Metric("server_cmds_per_cycle", "server cmds / cycle", "lower", 2),
    Metric("round_trips_per_cycle", "round trips / cycle", "lower", 2),
    Metric("server_cpu_us_per_cycle", "server CPU µs / cycle", "lower", 1),
)

#: The prefork workloads' process counts, by workload name.
PREFORK_PROCESSES = {"procs-8x1": 8, "procs-16x1": 16, "async-procs-8x1": 8}


def procs_8x1(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """8 processes x 1 thread on one key."""
    return _prefork(contender_id, url, settings, "procs-8x1")


def procs_16x1(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """16 processes x 1 thread on one key."""
    return _prefork(contender_id, url, settings, "procs-16x1")


def _prefork(contender_id: str, url: str, settings: Settings, name: str) -> dict[str, Any]:
    """``PREFORK_PROCESSES[name]`` processes of one thread each cycle on one key for ``settings.prefork_s``
    seconds per round: the multi-process contention workload with one thread per process."""
    shape = replace(settings, processes=PREFORK_PROCESSES[name], threads_per_process=1)
    return _many_processes(
        contender_id, url, shape, name, settings.prefork_s, settings.contention_max_cycles, PREFORK_METRICS
    )


def async_procs_8x1(contender_id: str, url: str, settings: Settings) -> dict[str, Any]:
    """8 processes x 1 task (each process its own event loop) on one key, ``settings.prefork_s`` seconds per
    round."""
    shape = replace(
        settings,
        async_processes=PREFORK_PROCESSES["async-procs-8x1"],
        async_tasks_per_process=1,
        async_s=settings.prefork_s,
    )
    return _async_many_processes(contender_id, url, shape, "async-procs-8x1", PREFORK_METRICS)


# ---------------------------------------------------------------------------------------------------------------


def _row(
    rounds: list[dict[str, Any]],
    metrics: Sequence[Metric],
    counter: Counter | LocalCounter,
    cycles_run: int,
    errors: Sequence[str] = (),
) -> dict[str, Any]:
    """A contender's result in one workload: the rounds, their medians, and the counter check."""
    final = counter.value()
    return {
        "rounds": rounds,
        "median": median_of_rounds(rounds, metrics),
        "count_expected": cycles_run,
        "count_final": final,
        "count_ok": final == cycles_run,
        "errors": list(errors),
    }


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    description: str
    run: Callable[[str, str, Settings], dict[str, Any]]
    metrics: Sequence[Metric]
    #: Whether in-process locks (threading.RLock) take part.
    in_process: bool
    #: Variants that take part here besides the main contenders (by id).
    extra: tuple[str, ...] = ()
    #: Which set of workloads this belongs to (``--only``): "core" (issue 3), "handoff" (issue 4), "rw" (issue 5),
    #: "asyncio", "prefork".
    group: str = "core"
    #: When set, exactly these contenders take part (by id, in table order) instead of the main ones.
    contenders: tuple[str, ...] | None = None
    #: The row every other row's ratio is taken against.
    baseline: str = "hybridlock"
    #: Row names that differ from the contender's title in this workload.
    labels: tuple[tuple[str, str], ...] = ()
    #: Run the contenders' rounds in turn (A B C, A B C, ...) instead of all of A's first: for workloads whose
    #: point is a ratio between rows, so that a slow drift of the machine does not land on one row.
    interleave: bool = False


# The local hand-off workloads (issue 4) compare hybridlock with hand-off on (by default with a 2 ms barge window;
# also with strict FIFO) and off against redis-py.
_HANDOFF_CONTENDERS = ("hybridlock", "hybridlock-fifo", "hybridlock-nohandoff", "redis-py")
_HANDOFF_LABELS = (("hybridlock", "hybridlock (hand-off on)"),)
# The asyncio workloads: hybridlock's asyncio API against redis-py's and pottery's, and asyncio.Lock as the floor
# where the workload stays in one process.
_ASYNC_CONTENDERS = ("hybridlock-async", "redis-py-async", "pottery-async", "asyncio-lock")
# The prefork workloads: the plain lock and each half of the read-write lock against the peers.
_PREFORK_CONTENDERS = ("hybridlock", "hybridlock-write", "hybridlock-read", "redis-py", "python-redis-lock", "pottery")
_PREFORK_DESCRIPTION = (
    "Eight processes of one thread each (each its own client, and registry), as a prefork server's workers are, "
    "cycle on one key for a fixed time; the critical section is the Redis counter (GET, then SET). Jain's index is "
    "over the processes' cycle counts, (Σx)² / (n·Σx²): 1 = equal shares, 1/8 = one process took all. Server "
    "cmds / cycle: the calls of every command in INFO commandstats over the round (a script's EVALSHA once per "
    "call, and each command it ran inside the server), less the harness's own (INFO, connection handshakes) and "
    "the critical section's GET and SET; round trips are counted on the client. Server CPU µs / cycle: the CPU "
    "time of the server's main thread (INFO cpu, user + system) over the round, per cycle, the critical section's "
    "two commands included. hybridlock's read-write lock takes part with each half alone: the write half excludes "
    "as the plain lock does; the read half lets every reader in at once, so its row (critical section: one GET) "
    "waits for nobody and shows what taking and giving back a shared read hold costs with 8 processes at it."
)

WORKLOADS = (
    Workload(
        "uncontended",
        "1. Uncontended: one thread, acquire + release",
        "One thread takes and releases one key over and over; the cycle time excludes the critical section's own "
        "GET and SET. Round trips are counted on the client, server commands from INFO commandstats (which also "
        "counts the commands a Lua script runs). A reentrant acquire is a nested acquire by the holding thread.",
        uncontended,
        UNCONTENDED_METRICS,
        in_process=True,
        extra=("hybridlock-retain",),
        interleave=True,
    ),
    Workload(
        "threads",
        "2. One process, 8 threads, one key",
        "Eight threads of one process cycle on one key for a fixed time. Wait is the time inside acquire(); the "
        "longest wait is the worst any thread saw; fairness is the slowest thread's cycle count over the mean "
        "(1 = every thread got its share, 0 = one starved).",
        threads_one_process,
        CONTENTION_METRICS,
        in_process=True,
        interleave=True,
    ),
    Workload(
        "processes",
        "3. Four processes x 2 threads, one key",
        "Four processes (each its own client, and registry) with two threads each cycle on one key for a fixed "
        "time. Jain's index is over the processes' cycle counts, (Σx)² / (n·Σx²): 1 = equal shares, 0.25 = one "
        "process took all.",
        threads_many_processes,
        PROCESSES_METRICS,
        in_process=False,
        extra=("hybridlock-retain",),
        interleave=True,
    ),
    Workload(
        "many-keys",
        "3b. A worker pool: one process, 64 threads, 1,000 keys",
        "Sixty-four threads of one process each take a key drawn at random (seeded) from 1,000, increment that "
        "key's Redis counter (GET, then SET) under its lock, release, and draw again, for a fixed time: a worker "
        "pool spread over many keys, where two threads meet on one key now and then. hybridlock's threads share "
        "the registry's lock object of a key; the other libraries make a lock object per cycle.",
        many_keys,
        CONTENTION_METRICS,
        in_process=True,
        interleave=True,
    ),
    Workload(
        "handoff",
        "4. Hand-off between two processes",
        "Process A holds the lock while process B waits in acquire(); after a random 20-120 ms A releases. "
        "Hand-off is from just before A's release() to just after B's acquire() returns (one system-wide "
        "monotonic clock). Waiter round trips count what B sent while waiting.",
        handoff,
        HANDOFF_METRICS,
        in_process=False,
        extra=("hybridlock-spin",),
        interleave=True,
    ),
    Workload(
        "scale",
        "5. Scale: one process holding many locks",
        "One thread acquires the locks with a 3 s lease and holds them through a window. hybridlock (one "
        "renewal thread per registry) and python-redis-lock (one thread per lock) renew by themselves; for "
        "redis-py and pottery a background thread renews each lock once per lease/3, as their users must write "
        "it (a pass over all locks, one call each; the next starts at once when one took longer). A period is "
        "the time in which every live lock's lease was reset once, counted from the server's PEXPIRE/EXPIRE "
        "calls, so it is measured, not assumed. Round trips, CPU (the whole process's) and server time are per "
        "period; server ms per renewal call is how long one renewal command kept the (single-threaded) server "
        "busy.",
        scale,
        SCALE_METRICS,
        in_process=False,
    ),
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
    Workload(
        "async-uncontended",
        "11. asyncio, uncontended: one task, acquire + release",
        "As 1., from one task of an event loop: the asyncio locks on a redis.asyncio client (hybridlock's "
        "AsyncLockRegistry, redis-py's redis.asyncio Lock, pottery's AIORedlock), the critical section's GET and "
        "SET awaited through a client of its own and not timed. A reentrant acquire is a nested acquire by the "
        "holding task.",
        async_uncontended,
        ASYNC_UNCONTENDED_METRICS,
        in_process=True,
        group="asyncio",
        contenders=_ASYNC_CONTENDERS,
        baseline="hybridlock-async",
    ),
    Workload(
        "async-tasks",
        "12. asyncio: one process, 100 tasks, one key",
        "A hundred tasks of one event loop cycle on one key for a fixed time; the critical section is the Redis "
        "counter (GET, then SET, awaited). hybridlock's tasks share the key's one lock object (ownership is per "
        "task); redis-py's and pottery's locks keep one token per object, so each task has its own. Wait is the "
        "time inside acquire(); fairness is the slowest task's cycle count over the mean.",
        async_tasks,
        ASYNC_TASKS_METRICS,
        in_process=True,
        group="asyncio",
        contenders=_ASYNC_CONTENDERS,
        baseline="hybridlock-async",
        interleave=True,
    ),
    Workload(
        "async-processes",
        "13. asyncio: four processes x 50 tasks, one key",
        "Four processes, each with its own event loop, client (and registry), run 50 tasks each on one key for a "
        "fixed time; the critical section is the Redis counter. For each process, the longest wait any of its "
        "tasks saw: the table gives the worst and the best process's. Jain's index is over the processes' cycle "
        "counts (1 = equal shares, 0.25 = one process took all).",
        async_processes,
        ASYNC_PROCESSES_METRICS,
        in_process=False,
        group="asyncio",
        contenders=_ASYNC_CONTENDERS,
        baseline="hybridlock-async",
        interleave=True,
    ),
    Workload(
        "async-loop",
        "14. asyncio: the event loop while 1,000 tasks wait",
        "A thousand tasks of one event loop cycle on one key (the Redis counter inside), so at any time all but "
        "one of them wait in acquire(), while a timer task in the same loop sleeps 10 ms over and over. Its "
        "lateness (each wake-up's delay past its due time) is how long the loop was kept from other work: by the "
        "lock's waiters and wake-ups, and by the critical sections' own round trips, which the asyncio.Lock row "
        "(no server lock at all) shows alone. Here a task stops waiting when the round ends (its acquire is given "
        "the time left as a timeout; the wait so far counts), and the timer's ticks are those due from 0.1 s into "
        "the round (once the tasks have started) that woke before its end. The worst lateness less GC and time "
        "off CPU takes from each tick's lateness the cyclic garbage collector's pauses during that sleep (the "
        "interpreter's, whatever the lock) and counts no more than the CPU time the process used in it (on a shared "
        "machine the rest is the OS running other processes): what the loop's own work accounts for.",
        async_loop_lag,
        ASYNC_LOOP_METRICS,
        in_process=True,
        group="asyncio",
        contenders=_ASYNC_CONTENDERS,
        baseline="hybridlock-async",
        interleave=True,
    ),
    Workload(
        "procs-8x1",
        "15. Prefork: 8 processes x 1 thread, one key",
        _PREFORK_DESCRIPTION,
        procs_8x1,
        PREFORK_METRICS,
        in_process=False,
        group="prefork",
        contenders=_PREFORK_CONTENDERS,
        interleave=True,
    ),
    Workload(
        "procs-16x1",
        "16. Prefork: 16 processes x 1 thread, one key",
        "As 15., with sixteen processes (Jain's index: 1/16 = one process took all).",
        procs_16x1,
        PREFORK_METRICS,
        in_process=False,
        group="prefork",
        contenders=_PREFORK_CONTENDERS,
        interleave=True,
    ),
    Workload(
        "async-procs-8x1",
        "17. asyncio prefork: 8 processes x 1 task, one key",
        "As 15., each process running one task in an event loop of its own, on a redis.asyncio client: hybridlock's "
        "AsyncLockRegistry against redis-py's asyncio Lock and pottery's AIORedlock. In parentheses: hybridlock "
        "(asyncio) ÷ that row.",
        async_procs_8x1,
        PREFORK_METRICS,
        in_process=False,
        group="prefork",
        contenders=_ASYNC_CONTENDERS[:3],
        baseline="hybridlock-async",
        interleave=True,
    ),
)

METRICS = {w.name: w.metrics for w in WORKLOADS}
