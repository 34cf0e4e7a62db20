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
    previous = {signum: signal.signal(signum, _ended) for signum in _ENDING} if main_thread else {}
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
    options (a key starting with ``-``). ``run`` takes CMD only after ``--`` (see ``run.py``)."""
    subcommands: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subcommands.update(action.choices)
    if not argv or argv[0] not in subcommands:
        return parser.parse_args(argv)  # --help, --version, no or an unknown subcommand: argparse's own answers
    name, rest = argv[0], argv[1:]
    if name != "run":
        return subcommands[name].parse_intermixed_args(rest)
    run = subcommands[name]
    ends = rest.index("--") if "--" in rest else len(rest)
    args, unknown = run.parse_known_intermixed_args(rest[:ends])
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
