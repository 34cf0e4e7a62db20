"""What the server-facing subcommands share: where the server is, the registry key, and error reporting.

The server comes from ``--server URL`` or else the ``HYBRIDLOCK_SERVER_URL`` environment variable (there is no
default: a lock tool that quietly used the wrong server would exclude nobody); the registry key from
``--registry-key`` or ``HYBRIDLOCK_REGISTRY_KEY``, default ``hybridlock``. A URL is only ever shown with its
password masked.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import redis

from .._core.names import validate_registry_key
from .._core.urls import is_sentinel_url
from ..backends.clients import redacted, redacted_url
from ..errors import HybridLockError

__all__ = [
    "REGISTRY_KEY_ENV",
    "SERVER_ENV",
    "CommandError",
    "add_server_arguments",
    "client_for",
    "registry_key_of",
    "server_url_of",
]

SERVER_ENV = "HYBRIDLOCK_SERVER_URL"
REGISTRY_KEY_ENV = "HYBRIDLOCK_REGISTRY_KEY"
DEFAULT_REGISTRY_KEY = "hybridlock"


class CommandError(Exception):
    """A subcommand cannot go on: the message is printed (never with a password) and the command exits."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        metavar="URL",
        help=f"the lock server, e.g. redis://:password@host:6379/0 or rediss://... (default: ${SERVER_ENV})",
    )
    parser.add_argument(
        "--registry-key",
        metavar="PREFIX",
        help=f"the registry key every lock name starts with (default: ${REGISTRY_KEY_ENV}, else "
        f"{DEFAULT_REGISTRY_KEY!r})",
    )


def server_url_of(args: argparse.Namespace, status: int) -> str:
    url: str | None = args.server or os.environ.get(SERVER_ENV)
    if not url:
        raise CommandError(f"no server given: use --server URL or set {SERVER_ENV}", status)
    return url


def registry_key_of(args: argparse.Namespace, status: int) -> str:
    registry_key = args.registry_key or os.environ.get(REGISTRY_KEY_ENV) or DEFAULT_REGISTRY_KEY
    try:
        return validate_registry_key(registry_key)
    except HybridLockError as exc:
        raise CommandError(str(exc), status) from None


def client_for(url: str, status: int) -> redis.Redis:
    """A client for ``url`` with short timeouts (a command line should not hang on a dead server).

    ``inspect``, ``list`` and ``release --force`` read and write one server's keys directly: a cluster or Sentinel
    URL is refused with what to give instead (``run`` takes every URL a registry takes)."""
    scheme = url.partition("://")[0].lower()
    if scheme.endswith("+cluster") or is_sentinel_url(url):
        raise CommandError(
            f"{redacted_url(url)}: this command reads one server's keys; give the redis:// URL of the server that "
            "holds the lock (a cluster: the node serving the key's slot; Sentinel: the current master)",
            status,
        )
    try:
        return redis.Redis.from_url(url, socket_timeout=5.0, socket_connect_timeout=5.0, decode_responses=True)
    except ValueError as exc:
        raise CommandError(f"not a valid server URL: {redacted_url(url)} ({redacted(str(exc), url)})", status) from None


def server_error(exc: BaseException, url: str, status: int) -> CommandError:
    """A client error as a ``CommandError`` naming the server, without its password."""
    return CommandError(f"server {redacted_url(url)}: {redacted(str(exc), url)}", status)


def report(prog: str, error: CommandError) -> int:
    print(f"{prog}: {error}", file=sys.stderr)
    return error.status


def confirm(question: str, stream: Any = None) -> bool:
    """Ask ``question`` on the terminal; True only for an explicit yes."""
    stream = stream or sys.stdin
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stream.readline()
    return answer.strip().lower() in {"y", "yes"}
