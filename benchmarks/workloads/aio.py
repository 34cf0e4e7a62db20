"""The asyncio group (``--only asyncio``): workloads 11-14, the tasks of one event loop (or of four processes'
loops) on one key, against redis-py's and pottery's asyncio locks, with ``asyncio.Lock`` as the in-process floor.

(Not named ``asyncio.py``, so that it never stands in for the standard library's module.)"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis

from ..contenders import AsyncSession, make_session, round_trips_sent
from ..measure import (
    AsyncCounter,
    CommandCounts,
    Counter,
    Metric,
    command_delta,
    command_snapshot,
    jain_index,
    percentile,
)
from .base import _SLACK, Settings, Workload, _ms, _row, _us
from .contention import _contention_round, _processes_row
from .core import UNCONTENDED_METRICS
from .handoff import LOCAL_PROCESSES_METRICS

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


# The asyncio workloads: hybridlock's asyncio API against redis-py's and pottery's, and asyncio.Lock as the floor
# where the workload stays in one process.
_ASYNC_CONTENDERS = ("hybridlock-async", "redis-py-async", "pottery-async", "asyncio-lock")

WORKLOADS = (
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
)
