"""The ``hybridlock`` command line: ``python -m hybridlock <subcommand>`` (also installed as ``hybridlock``).

Each subcommand lives in its own module, which adds its parser with ``add_parser(subparsers)`` and sets
``func`` to the function that runs it and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__
from ._cli import demo as _demo
from ._cli import release as _release
from ._cli import run as _run
from ._cli import show as _show

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
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no subcommand given
        parser.print_help(sys.stderr)
        return 2
    status: int = func(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
