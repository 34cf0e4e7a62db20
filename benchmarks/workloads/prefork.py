"""The prefork group (``--only prefork``): workloads 15-17, N processes of one thread (or one task) each on one
key, as a prefork server's workers are, where every hand-over goes through the cross-process wake-up path."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..measure import (
    Metric,
)
from .aio import _ASYNC_CONTENDERS, _async_many_processes
from .base import Settings, Workload
from .contention import _many_processes

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
