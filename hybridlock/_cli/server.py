"""``hybridlock server``: a throw-away Redis/Valkey server for a first try, serving until Ctrl-C.

It starts ``hybridlock.testing.EmbeddedServer`` (the binary named by ``HYBRIDLOCK_REDIS_SERVER``, else
``redis-server`` or ``valkey-server`` on the ``PATH``, else the Valkey binary the ``test`` extra installs) on a free
loopback port, in a temporary directory, without persistence, and prints one line to standard output::

    export REDIS_URL=redis://127.0.0.1:40123/0 HYBRIDLOCK_SERVER_URL=redis://127.0.0.1:40123/0

to run in the terminal where the examples (which read ``REDIS_URL``) and the command line (which reads
``HYBRIDLOCK_SERVER_URL``) run. Ctrl-C (SIGINT), SIGTERM or SIGHUP (its terminal closing) stops the server and
removes its directory: that is how it is meant to end, so it exits 0 then. A signal ignored when it started (as
``nohup`` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from types import FrameType
from typing import Any

from ..testing.server import EmbeddedServer, ServerNotFoundError
from .common import EXIT_FAILED, EXIT_OK, SERVER_ENV, exit_status_epilog

__all__ = ["add_parser"]

_PROG = "hybridlock server"
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_CHECK_EVERY = 0.5  # how often it looks whether the server process is still alive (seconds)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "server",
        help="start a throw-away server for a first try; print the export line; serve until Ctrl-C",
        description="Start a throw-away Redis or Valkey server on a loopback port (the binary named by "
        "$HYBRIDLOCK_REDIS_SERVER, else redis-server or valkey-server on the PATH, else the test extra's Valkey), "
        f"print 'export REDIS_URL=URL {SERVER_ENV}=URL' for the examples and the command line, and serve until "
        "Ctrl-C, SIGTERM or SIGHUP, which stop it and remove its files. Nothing is kept: not for production.",
        epilog=exit_status_epilog("server"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--port", type=_port, metavar="N", default=None, help="listen on 127.0.0.1 port N (default: a free port)"
    )
    parser.set_defaults(func=_command)
    return parser


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is from 1 to 65535, not {port}")
    return port


def _command(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Set before the server starts, so that a signal arriving while it starts still stops it (once started).
    previous = {
        signum: signal.signal(signum, stopping)
        for signum in _STOPPING
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        try:
            server = EmbeddedServer()
            server.start(port=args.port)
        except (ServerNotFoundError, RuntimeError) as exc:
            print(f"{_PROG}: no server could be started: {exc}", file=sys.stderr)
            return EXIT_FAILED
        try:
            url = shlex.quote(server.url)
            print(f"export REDIS_URL={url} {SERVER_ENV}={url}", flush=True)
            print(
                f"{_PROG}: {os.path.basename(server.binary)} (pid {server.pid}) serves {server.url}: run the line "
                "above in the terminal where you run the examples; Ctrl-C here stops the server and removes its "
                "files",
                file=sys.stderr,
                flush=True,
            )
            while not stop.wait(_CHECK_EVERY):
                process = server.process
                if process is not None and process.poll() is not None:
                    print(f"{_PROG}: the server ended by itself (status {process.returncode})", file=sys.stderr)
                    return EXIT_FAILED
            return EXIT_OK
        finally:
            server.stop()
            print(f"{_PROG}: stopped; its files are removed", file=sys.stderr)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
