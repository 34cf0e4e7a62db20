"""The core group (``--only core``): the plain lock against its peers, workloads 1-5 (uncontended; threads of one
process, and of four, on one key; a worker pool over many keys; the hand-off between two processes; one process
holding many locks)."""

from __future__ import annotations

import math
import multiprocessing
import random
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

import redis

from ..contenders import LockLike, Session, make_session, round_trips_sent
from ..measure import (
    Counter,
    KeyedCounter,
    Metric,
    command_delta,
    command_snapshot,
    median_of_rounds,
    percentile,
)
from .base import _SLACK, Settings, Workload, _collect, _cycle, _ms, _reap, _recv, _row, _server_cpu, _us
from .contention import _contention_round, _cycling_threads, _many_processes, _one_process

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


# ---------------------------------------------------------------------------------------------------------------
# 4. hand-off between processes


HANDOFF_METRICS = (
    Metric("handoff_median_ms", "hand-off median (ms)", "lower", 2),
    Metric("handoff_p99_ms", "hand-off p99 (ms)", "lower", 1),
    Metric("waiter_round_trips", "waiter round trips / acquire", "lower", 1),
)


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
)
