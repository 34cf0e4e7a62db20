"""The ``hybridlock`` command line: ``python -m hybridlock <subcommand>`` (also installed as ``hybridlock``).

Each subcommand lives in its own module, which adds its parser with ``add_parser(subparsers)`` and sets
``func`` to the function that runs it and returns the exit status.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from . import __version__
from ._cli import demo as _demo
from ._cli import release as _release
from ._cli import run as _run
from ._cli import server as _server
from ._cli import show as _show
from ._cli.common import EXIT_SIGNALLED, EXIT_USAGE

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hybridlock",
        description="Reentrant locks across the threads of one process and across processes sharing Redis/Valkey.",
        epilog="The server-facing commands take the server from --server URL or $HYBRIDLOCK_SERVER_URL (a server, "
        "a redis+sentinel:// service or a redis+cluster:// cluster; --server given several times, or several URLs "
        "in the variable, make a quorum of independent servers), and the registry key from --registry-key or "
        "$HYBRIDLOCK_REGISTRY_KEY (default 'hybridlock'). Passwords are never printed.",
    )
    parser.add_argument("--version", action="version", version=f"hybridlock {__version__}")
    subparsers = parser.add_subparsers(title="subcommands", metavar="COMMAND")
    _run.add_parser(subparsers)
    _show.add_parsers(subparsers)
    _release.add_parser(subparsers)
    _demo.add_parser(subparsers)
    _server.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status (see
    ``hybridlock._cli.common.EXIT_STATUSES``)."""
    parser = build_parser()
    args = parse_command_line(parser, list(sys.argv[1:] if argv is None else argv))
    func = getattr(args, "func", None)
    if func is None:  # no subcommand given
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    # SIGTERM and SIGHUP end every subcommand as Ctrl-C does, through its clean-up (the demo stops its workers and
    # its throw-away server; run leaves the queue): status 128 + the signal's number, as a shell reports a death by
    # that signal. `run` handles them itself while it waits and while CMD runs (it passes them on to CMD).
    main_thread = threading.current_thread() is threading.main_thread()  # (only there can handlers be set)
    # A signal ignored when we started (`nohup` ignores SIGHUP) stays ignored.
    previous = {
        signum: signal.signal(signum, _ended)
        for signum in (_ENDING if main_thread else ())
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        status: int = func(args)
    except KeyboardInterrupt:
        return EXIT_SIGNALLED + signal.SIGINT
    except _Ended as exc:
        return EXIT_SIGNALLED + exc.signum
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return status


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """One grammar for every subcommand: ``hybridlock SUBCOMMAND``, then its options and arguments in any order
    (``inspect KEY --server URL`` as ``inspect --server URL KEY``). A first ``--`` ends them: what follows is
    ``run``'s CMD (its options, however they look, are CMD's), or for the other subcommands arguments that look like
    options (a key starting with ``-``). ``run`` takes CMD only after ``--`` (see ``run.py``), and a key starting
    with ``-`` between two: ``run [options] -- KEY -- CMD``."""
    subcommands: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subcommands.update(action.choices)
    if not argv or argv[0] not in subcommands:
        return parser.parse_args(argv)  # --help, --version, no or an unknown subcommand: argparse's own answers
    name, rest = argv[0], argv[1:]
    if name != "run":
        if "--" in rest:
            # (argparse's intermixed parsing loses what `--` means on Python 3.11: keys after it would be taken
            # for options. Its plain parsing keeps it, and still takes options before and after a key.)
            return subcommands[name].parse_args(rest)
        return subcommands[name].parse_intermixed_args(rest)
    run = subcommands[name]
    ends = rest.index("--") if "--" in rest else len(rest)
    key = None
    if ends < len(rest) and not _positionals(run, rest[:ends]) and "--" in rest[ends + 1 :]:
        # `run [options] -- KEY -- CMD`: the way to give a key that starts with `-`.
        second = rest.index("--", ends + 1)
        if second != ends + 2:
            run.error("between the two --, exactly one KEY: hybridlock run [options] -- KEY -- CMD ...")
        key, rest, ends = rest[ends + 1], [*rest[:ends], "KEY", *rest[second:]], ends + 1
    args, unknown = run.parse_known_intermixed_args(rest[:ends])
    if key is not None:
        args.key = key
    if args.before_dashes:
        # A word after KEY without `--` was CMD until options could follow KEY: refused, not guessed at (in
        # `run KEY cmd --timeout 5`, whose is --timeout?), with the way to say it.
        if ends == len(rest):
            run.error(f"CMD goes after --: hybridlock run [options] {args.key} -- {args.before_dashes[0]} ...")
        run.error(f"unexpected before --: {' '.join(args.before_dashes)}")
    if unknown:
        run.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.command = rest[ends + 1 :]
    return args


def _positionals(parser: argparse.ArgumentParser, words: list[str]) -> int:
    """How many of ``words`` are positional arguments for ``parser`` (not options, nor an option's value)."""
    count, value_next = 0, False
    for word in words:
        if value_next:
            value_next = False
        elif word.startswith("-") and len(word) > 1:
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            value_next = action is not None and action.nargs != 0 and "=" not in word
        else:
            count += 1
    return count


class _Ended(BaseException):
    """SIGTERM or SIGHUP arrived (a BaseException, as KeyboardInterrupt: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_ENDING = (signal.SIGTERM, signal.SIGHUP)


def _ended(signum: int, frame: FrameType | None) -> None:
    raise _Ended(signum)


if __name__ == "__main__":
    sys.exit(main())
