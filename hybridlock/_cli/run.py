"""``hybridlock run KEY -- CMD ARGS...``: a distributed ``flock``: run a command while holding a lock.

The lock is a plain ``LockRegistry`` lock (a ``QuorumLockRegistry`` one when ``--server`` is given several times),
so a program using the library on the same key (and registry key) excludes the command and is excluded by it.
While the command runs, the registry's renewer keeps the lease alive. The command finds the lock's fencing token
in ``HYBRIDLOCK_FENCING_TOKEN`` (and the key in ``HYBRIDLOCK_KEY``, the registry key in
``HYBRIDLOCK_REGISTRY_KEY``), to pass on to whatever it writes.

Signals: SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent to ``hybridlock run`` are passed on to the command,
which decides what they mean (a supervisor's SIGHUP is often "reload") and when to end; ``hybridlock run`` then
releases the lock and exits with the command's status. A SIGINT typed at the terminal (Ctrl-C) already reaches the
command, which shares the terminal's process group, so it is not sent twice. Before the command starts, SIGTERM,
SIGINT or SIGHUP ends the wait for the lock at once (status 128 + the signal's number), and SIGUSR1/SIGUSR2 are
ignored (there is nobody to pass them to yet, and their default would kill the wait without releasing the place
in the queue).

If the lease is lost while the command runs (a renewal found the key gone or another owner's: the server lost it,
an operator ran ``hybridlock release --force``, or this process was paused longer than the lease), the command is
sent ``--lost-signal`` (SIGTERM by default), and SIGKILL ``--kill-after`` seconds later if given; whatever the
command then does, ``hybridlock run`` exits with ``EXIT_LOST``; the SIGKILL goes to everything the command started
as well.

Run once (``--at-least-for S``, with ``--at-most-for M`` if wanted): for cron on many hosts, each firing the same
occurrence; the first to take KEY runs CMD, every other skips at once (``EXIT_HELD``, saying who ran it) without
waiting, as ``registry.run_once`` does (docs/run-once.md): the key stays taken S seconds after the start however soon
CMD ends, so a host whose clock or schedule is a little late skips too, and the hold ends M seconds after the start
even while CMD runs, which is then sent ``--lost-signal`` as for any lost lease (``EXIT_LOST``).

If ``hybridlock run`` itself dies (SIGKILL, the OOM killer, a crash) nobody renews the lease, and another runner
gets the lock once it ends: so the command must not outlive its runner. It runs under a small keeper process
(``keeper.py``), which kills it, and on Linux everything it started (a pipeline, background jobs, daemons), with
SIGKILL as soon as the runner is gone; on other systems the command itself only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from .._core.config import MAX_SECONDS, long_lease_note, validate_timeout
from .._core.names import validate_key
from .._core.runonce import RunOnceBounds
from .._sync.lock import HybridLock
from .._sync.registry import LockRegistry, QuorumLockRegistry
from ..errors import HybridLockError, InvalidArgumentError, LockLostError, LongLeaseWarning
from . import keeper
from .common import (
    EXIT_CANNOT_RUN,
    EXIT_FAILED,
    EXIT_HELD,
    EXIT_LOST,
    EXIT_NOT_FOUND,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    CommandError,
    add_server_arguments,
    close_all,
    exit_status_epilog,
    open_servers,
    registry_key_of,
    report,
    server_urls_of,
)
from .show import who_holds

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_FAILED",
    "EXIT_HELD",
    "EXIT_LOST",
    "EXIT_NOT_FOUND",
    "EXIT_TIMEOUT",
    "add_parser",
]

FENCING_TOKEN_ENV = "HYBRIDLOCK_FENCING_TOKEN"
KEY_ENV = "HYBRIDLOCK_KEY"
REGISTRY_KEY_ENV_FOR_CHILD = "HYBRIDLOCK_REGISTRY_KEY"

_PROG = "hybridlock run"
_KEEPER = keeper.__file__  # run by its path (see keeper.py)
# Signals that end the wait for the lock (each would end the process by default: here it leaves cleanly).
_ENDING_THE_WAIT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Signals passed on to the command while it runs.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_IGNORED_WHILE_WAITING = (signal.SIGUSR1, signal.SIGUSR2)

_EPILOG = f"""{exit_status_epilog("run")}

environment given to the command:
  {FENCING_TOKEN_ENV}  the lock's fencing token (greater than every earlier holder's)
  {KEY_ENV}, {REGISTRY_KEY_ENV_FOR_CHILD}  the lock key and registry key
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0: {text!r}")
    return value


def _timeout(text: str) -> float:
    """``--timeout``: seconds >= 0, or -1 (or inf) to wait as long as it takes, as ``acquire(timeout=-1)`` and
    Django's ``--lock-timeout -1``; a value ``acquire`` would refuse is refused here, as a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        validate_timeout(True, value)
    except InvalidArgumentError:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0 (at most {MAX_SECONDS:g}), or -1 to wait as long as it takes: {text!r}"
        ) from None
    return value


def _signal(text: str) -> signal.Signals:
    name = text.upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a signal: {text!r}") from None


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a command while holding a lock (a distributed flock)",
        description="Take KEY's lock (waiting for it unless --no-wait), run CMD while the lease is renewed, "
        "release the lock when CMD ends and exit with CMD's status. SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 are "
        "passed on to CMD. If "
        "the lease is lost meanwhile, CMD is sent --lost-signal and hybridlock exits with a status of its own.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] KEY -- CMD [ARGS...]",
    )
    parser.add_argument("key", metavar="KEY", help="lock key, as given to registry.obtain()")
    wait = parser.add_mutually_exclusive_group()
    wait.add_argument(
        "--timeout", type=_timeout, metavar="S", help="wait at most S seconds for the lock (-1: as long as it takes)"
    )
    wait.add_argument("--no-wait", "-n", action="store_true", help=f"fail at once (status {EXIT_HELD}) when held")
    wait.add_argument(
        "--at-least-for",
        type=_seconds,
        metavar="S",
        help=f"run once (cron on many hosts): skip at once (status {EXIT_HELD}) when another owner has KEY or ran "
        "CMD less than S seconds ago; keep KEY S seconds after the start however soon CMD ends",
    )
    parser.add_argument(
        "--at-most-for",
        type=_seconds,
        metavar="S",
        help="with --at-least-for: the hold ends S seconds after the start even while CMD runs (CMD is then sent "
        "--lost-signal)",
    )
    parser.add_argument(
        "--expire-after",
        type=_seconds,
        default=30.0,
        metavar="S",
        help="the lease in seconds, renewed every third of it while CMD runs (default: 30)",
    )
    parser.add_argument(
        "--lost-signal",
        type=_signal,
        default=signal.SIGTERM,
        metavar="SIG",
        help="signal sent to CMD if the lease is lost, by name or number (default: TERM)",
    )
    parser.add_argument(
        "--kill-after",
        type=_seconds,
        metavar="S",
        help="after sending --lost-signal, send SIGKILL if CMD still runs S seconds later",
    )
    add_server_arguments(parser)
    # CMD is what follows the first `--`, split off before parsing (hybridlock.__main__.parse_command_line), which
    # refuses a word found here.
    parser.add_argument("before_dashes", nargs="*", metavar="-- CMD [ARGS...]", help="the command and its arguments")
    parser.set_defaults(func=_command)


class _Interrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived while waiting for the lock."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _signals_end_the_wait() -> Iterator[None]:
    """Until CMD starts: SIGTERM, SIGINT or SIGHUP ends the wait (``_Interrupted``, which leaves the queue on its
    way out); SIGUSR1/SIGUSR2 are ignored (nobody to pass them to yet). The handlers before are put back after."""

    def interrupted(signum: int, frame: FrameType | None) -> None:
        raise _Interrupted(signum)

    previous = {signum: signal.signal(signum, interrupted) for signum in _ENDING_THE_WAIT}
    previous.update({signum: signal.signal(signum, signal.SIG_IGN) for signum in _IGNORED_WHILE_WAITING})
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _command(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if not command:
        print(f"{_PROG}: no command given (hybridlock run [options] KEY -- CMD [ARGS...])", file=sys.stderr)
        return EXIT_USAGE
    if args.at_most_for is not None and args.at_least_for is None:
        print(
            f"{_PROG}: --at-most-for goes with --at-least-for (run once); a run that waits for the lock holds it "
            "while CMD runs",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        validate_key(args.key)  # (a key obtain() would refuse: told before any server is asked, not as a traceback)
        if args.at_least_for is not None:
            # Told before any server is asked, in the command's words.
            RunOnceBounds.checked(args.at_least_for, args.at_most_for)
    except InvalidArgumentError as exc:
        print(
            f"{_PROG}: {exc}".replace("at_least_for", "--at-least-for").replace("at_most_for", "--at-most-for"),
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        urls = server_urls_of(args, EXIT_USAGE)
        registry_key = registry_key_of(args, EXIT_USAGE)
        if len(urls) > 1:
            # A list that is no quorum (a cluster in it, a server twice) is a usage error, told before any wait.
            close_all(open_servers(urls, EXIT_USAGE, EXIT_FAILED))
        registry: LockRegistry
        note = long_lease_note("--expire-after", args.expire_after)
        if note is not None:  # said here in the command's words (the registry's warning speaks of expire_after=)
            print(f"{_PROG}: warning: {note}", file=sys.stderr)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", LongLeaseWarning)
                if len(urls) > 1:
                    registry = QuorumLockRegistry(urls, registry_key=registry_key, expire_after=args.expire_after)
                else:
                    registry = LockRegistry(urls[0], registry_key=registry_key, expire_after=args.expire_after)
        except InvalidArgumentError as exc:
            # A value no server could take (a malformed URL, a bad setting): a usage error, as for every subcommand.
            raise CommandError(str(exc), EXIT_USAGE) from None
        except HybridLockError as exc:
            raise CommandError(str(exc), EXIT_FAILED) from None
    except CommandError as exc:
        return report(_PROG, exc)
    try:
        if args.at_least_for is not None:
            return _run_once(registry, args, command, urls)
        return _hold_and_run(registry, args, command, urls)
    finally:
        registry.close()


def _run_once(registry: LockRegistry, args: argparse.Namespace, command: list[str], urls: list[str]) -> int:
    """``--at-least-for``: CMD as ``registry.run_once``'s function; skipped (``EXIT_HELD``) when another owner has
    the key."""
    lock = registry.obtain(args.key)
    lost = threading.Event()

    def job() -> int:
        # From here the signals are CMD's (passed on while it runs, in _run_child); once it has ended, one arriving
        # while the key is kept or released is ignored, not allowed to cut that short: the run is over.
        for signum in _ENDING_THE_WAIT:
            signal.signal(signum, signal.SIG_IGN)
        return _run_child(lock, registry, args, command, lost)

    try:
        with _signals_end_the_wait():
            result = registry.run_once(args.key, job, at_least_for=args.at_least_for, at_most_for=args.at_most_for)
    except _Interrupted as exc:
        return 128 + exc.signum
    except LockLostError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return EXIT_LOST
    except HybridLockError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not result.ran:
        print(f"{_PROG}: skipped {args.key!r}: {who_holds(urls, registry.registry_key, args.key)}", file=sys.stderr)
        return EXIT_HELD
    if lost.is_set():
        return _lost_while_running(args.key)
    status = result.result
    assert isinstance(status, int)  # (job's)
    return status


def _hold_and_run(registry: LockRegistry, args: argparse.Namespace, command: list[str], urls: list[str]) -> int:
    lock = registry.obtain(args.key)
    failed = _acquire(lock, args, urls, registry.registry_key)
    if failed is not None:
        return failed
    lost = threading.Event()
    status = EXIT_FAILED
    try:
        status = _run_child(lock, registry, args, command, lost)
    finally:
        try:
            lock.release()
        except LockLostError:
            lost.set()
        except HybridLockError as exc:
            # The key ends with its lease; the command's status is still the one to report.
            print(f"{_PROG}: could not release {args.key!r}: {exc}", file=sys.stderr)
    if lost.is_set():
        return _lost_while_running(args.key)
    return status


def _lost_while_running(key: str) -> int:
    """Say that the lease of ``key`` was lost while CMD ran (whatever CMD's own status), and return ``EXIT_LOST``."""
    print(f"{_PROG}: the lease of {key!r} was lost while the command ran", file=sys.stderr)
    return EXIT_LOST


def _acquire(lock: HybridLock, args: argparse.Namespace, urls: list[str], registry_key: str) -> int | None:
    """Take the lock: None once held, else the exit status to end with (refused or timed out: saying who holds it,
    as ``inspect`` does)."""

    try:
        with _signals_end_the_wait():
            if args.no_wait:
                got = lock.acquire(blocking=False)
            elif args.timeout is not None:
                got = lock.acquire(timeout=args.timeout)
            else:
                got = lock.acquire()
    except _Interrupted as exc:
        return 128 + exc.signum
    except HybridLockError as exc:
        print(f"{_PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if got:
        return None
    who = who_holds(urls, registry_key, args.key)
    if args.no_wait:
        # Over a quorum, refused means not taken on a majority: held elsewhere, or servers out of reach.
        refused = "is held by another owner" if len(urls) == 1 else "could not be taken on a majority of the servers"
        print(f"{_PROG}: {args.key!r} {refused}: {who}", file=sys.stderr)
        return EXIT_HELD
    print(f"{_PROG}: timed out after {args.timeout:g} s waiting for {args.key!r}: {who}", file=sys.stderr)
    return EXIT_TIMEOUT


def _run_child(
    lock: HybridLock, registry: LockRegistry, args: argparse.Namespace, command: list[str], lost: threading.Event
) -> int:
    env = dict(os.environ)
    env[FENCING_TOKEN_ENV] = str(lock.fencing_token)
    env[KEY_ENV] = args.key
    env[REGISTRY_KEY_ENV_FOR_CHILD] = registry.registry_key
    guard = threading.Lock()
    child: _Kept | None = None

    def tell_child_lost() -> None:
        # From the renewer's thread (or below, if the lease was lost before the child started).
        if child is None or child.ended:
            return
        child.send(args.lost_signal)
        if args.kill_after is not None:
            timer = threading.Timer(args.kill_after, child.send, (signal.SIGKILL,))
            timer.daemon = True
            timer.start()

    def on_lost(_lock: object) -> None:
        with guard:
            lost.set()
            tell_child_lost()

    lock.on_lost(on_lost)
    # Block forwarding until the child exists, so a signal arriving meanwhile is not lost: handled after start.
    pending: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: pending.append(signum)) for signum in _FORWARDED}
    try:
        with guard:
            try:
                child = _Kept(command, env)
            except OSError as exc:
                print(f"{_PROG}: cannot start {sys.executable} to run the command ({exc.strerror})", file=sys.stderr)
                return EXIT_FAILED
            if lost.is_set() or lock.lost:
                lost.set()
                tell_child_lost()
        try:
            forward = _forwarder(child)
            for signum in _FORWARDED:
                signal.signal(signum, forward)
            for early in pending:
                forward(early, None)
            returncode = child.wait()
        finally:
            # Whatever ends this wait early (a bug, a KeyboardInterrupt), the command does not outlive it: the lock
            # is released next.
            child.close()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return returncode if returncode >= 0 else 128 - returncode


class _Kept:
    """The command, run under ``keeper.py`` (see there): it dies with this process, however this process ends.

    Signals reach it through a pipe to the keeper (``send``); the pipe's end (this process's, by any death) tells
    the keeper to kill the command and everything it started. ``wait`` gives the command's status (the keeper's
    own, which is the command's, 128 + N for a signal N; 127/126 when it was not found or could not be run, the
    keeper having said so)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        # The write end is only ever in this process (not inheritable, and subprocess closes the others' copies):
        # its end is this process's end.
        control_read, self._control = os.pipe()
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", _KEEPER, str(control_read), "--", *command],
                env=env,
                pass_fds=(control_read,),
            )
        except BaseException:
            os.close(self._control)
            raise
        finally:
            os.close(control_read)
        # send() may come from a signal handler, the renewer's thread or a timer: never after the pipe is closed
        # (its descriptor's number may be another file's by then). Reentrant: a handler may run inside close().
        self._guard = threading.RLock()
        self._closed = False

    @property
    def ended(self) -> bool:
        return self._process.returncode is not None

    def send(self, signum: int) -> None:
        """Pass ``signum`` on to the command (SIGKILL: to it and everything it started); nothing once it ended."""
        with self._guard:
            if self._closed:
                return
            try:
                os.write(self._control, bytes([signum]))
            except OSError:
                pass  # it has just ended

    def wait(self) -> int:
        return self._process.wait()

    def close(self) -> None:
        """Make sure the command has ended (SIGKILL to it and what it started if not), then close the pipe."""
        if self._process.poll() is None:
            self.send(signal.SIGKILL)
            self._process.wait()
        with self._guard:
            if not self._closed:
                self._closed = True
                os.close(self._control)


def _forwarder(child: _Kept) -> Callable[[int, FrameType | None], None]:
    def forward(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and _terminal_foreground():
            return  # typed at the terminal: the child, in our process group, got it already
        child.send(signum)

    return forward


def _terminal_foreground() -> bool:
    """Whether this process is in its terminal's foreground process group (where Ctrl-C's SIGINT goes)."""
    for stream in (sys.stdin, sys.stderr):
        try:
            if stream is not None and stream.isatty():
                return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
        except (OSError, ValueError):
            continue
    return False
