"""What every workload shares: the run's sizes (``Settings``, ``QUICK``, ``FULL``), the ``Workload`` record, a
result row with its counter check (``_row``), one timed cycle, and the plumbing of child processes (collecting
their messages, reaping them)."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from ..contenders import LockLike
from ..measure import (
    Counter,
    LocalCounter,
    Metric,
    median_of_rounds,
)

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


def _reap(children: Sequence[Any], wait: float) -> None:
    """Join our children (those that started), giving each ``wait`` seconds before ending it by its handle."""
    for child in children:
        if child.pid is None:
            continue  # never started (an earlier one's start failed)
        child.join(timeout=wait)
        if child.is_alive():
            child.terminate()  # our own child, by its handle
            child.join(timeout=5)


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


def _recv(conn: Any, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"no message from the other process within {timeout:.0f} s")
    return conn.recv()


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
