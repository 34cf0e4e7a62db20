"""What the server-facing subcommands share: where the servers are, the registry key, and error reporting.

The server comes from ``--server URL`` or else the ``HYBRIDLOCK_SERVER_URL`` environment variable (there is no
default: a lock tool that quietly used the wrong server would exclude nobody); the registry key from
``--registry-key`` or ``HYBRIDLOCK_REGISTRY_KEY``, default ``hybridlock``. A URL is only ever shown with its
password masked.

One URL is one server, in any form a ``LockRegistry`` takes: ``redis://``, ``rediss://``, ``unix://``, a Sentinel
service (``redis+sentinel://``: the commands work on its current master, named ``sentinel://<service>/<db>``) or a
cluster (``redis+cluster://``: each key on the node serving its slot). Two URLs or more (``--server`` given again,
or several in the environment variable, separated by white space, or by commas where the next URL starts) are a
quorum of independent servers, as ``QuorumLockRegistry`` takes: each must be a server or a Sentinel service, never
a cluster, and no server may appear twice.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import redis
from redis.sentinel import MasterNotFoundError

from .._core.names import validate_registry_key
from .._core.urls import parse_sentinel_url
from .._sync.backends.cluster import RedisClusterBackend, is_cluster_url, redis_cluster_client_from_url
from .._sync.backends.redis import RedisBackend, redis_client_from_url
from ..backends.clients import library_family, login_of, login_refused, redacted, redacted_url
from ..errors import BackendUnavailableError, HybridLockError

__all__ = [
    "EXIT_CANNOT_RUN",
    "EXIT_FAILED",
    "EXIT_HELD",
    "EXIT_LOST",
    "EXIT_NOT_DONE",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "REGISTRY_KEY_ENV",
    "SERVER_ENV",
    "CommandError",
    "Server",
    "add_server_arguments",
    "exit_status_epilog",
    "on_each",
    "open_servers",
    "registry_key_of",
    "server_urls_of",
    "split_server_urls",
]

SERVER_ENV = "HYBRIDLOCK_SERVER_URL"
REGISTRY_KEY_ENV = "HYBRIDLOCK_REGISTRY_KEY"
DEFAULT_REGISTRY_KEY = "hybridlock"

# -- exit statuses ------------------------------------------------------------------------------------------------
# One table for every subcommand: a condition has one status whichever subcommand meets it. hybridlock's own
# failures are numbered as timeout(1) and a shell number theirs (124-127), above what commands commonly use, so that
# `run`, which exits with its command's status, stays tellable apart from it. Shown by each subcommand's --help and
# in docs/command-line.md ("Exit statuses"), which tests/test_cli_grammar.py checks against this table.
EXIT_OK = 0  # done (`run`: the command's own status instead)
EXIT_NOT_DONE = 1  # a plain "no": release found the lock not held; the demo's count came out wrong
EXIT_USAGE = 2  # the command line is wrong: bad option or value, no server given, servers that make no quorum, ...
EXIT_HELD = 75  # --no-wait (or --at-least-for: skipped), another owner has the lock (sysexits' EX_TEMPFAIL)
EXIT_LOST = 122  # the lease was lost while the command ran
EXIT_TIMEOUT = 124  # --timeout passed before the lock was acquired (as timeout(1))
EXIT_FAILED = 125  # the server could not be reached or refused; or hybridlock failed otherwise (as timeout(1))
EXIT_CANNOT_RUN = 126  # the command was found but could not be run (as a shell)
EXIT_NOT_FOUND = 127  # the command was not found (as a shell)
EXIT_SIGNALLED = 128  # + N: signal N (SIGINT, SIGTERM, SIGHUP) ended the command line before it finished

# (status as shown, meaning, the subcommands that give it)
EXIT_STATUSES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        str(EXIT_OK),
        "done; for run: CMD's own status instead, 128+N when signal N killed CMD (as a shell reports it); for "
        "server: stopped by Ctrl-C, SIGTERM or SIGHUP, the way it is meant to end",
        ("run", "inspect", "list", "release", "demo", "server"),
    ),
    (
        str(EXIT_NOT_DONE),
        "release: the lock was not held, or changed hands meanwhile (nothing released); demo: the "
        "count came out wrong or a worker failed",
        ("release", "demo"),
    ),
    (
        str(EXIT_USAGE),
        "usage error: an unknown option or a bad value (a malformed server URL, a key no lock can have), no "
        "server given, servers that make no quorum "
        "(one given twice, a cluster among them), run without -- before CMD or without CMD, release not confirmed",
        ("run", "inspect", "list", "release", "demo", "server"),
    ),
    (
        str(EXIT_HELD),
        "--no-wait, and another owner holds the lock (said who: host, pid, since when); --at-least-for: skipped, "
        "another owner has the key or ran CMD less than --at-least-for ago",
        ("run",),
    ),
    (
        str(EXIT_LOST),
        "the lease was lost while CMD ran, or --at-most-for ended the hold (CMD was sent --lost-signal)",
        ("run",),
    ),
    (str(EXIT_TIMEOUT), "--timeout passed before the lock was acquired (said who holds it)", ("run",)),
    (
        str(EXIT_FAILED),
        "the server could not be reached or refused (a refused login too; over a quorum: fewer than a "
        "majority answered); demo, server: no server could be started (server: or it ended by itself)",
        ("run", "inspect", "list", "release", "demo", "server"),
    ),
    (str(EXIT_CANNOT_RUN), "CMD could not be run", ("run",)),
    (str(EXIT_NOT_FOUND), "CMD was not found", ("run",)),
    (
        "128+N",
        "signal N (SIGINT: 130, SIGTERM: 143, SIGHUP: 129) ended it before it finished (run: while waiting "
        "for the lock; once CMD runs, the signal is passed on to CMD)",
        ("run", "inspect", "list", "release", "demo"),
    ),
)


def exit_status_epilog(subcommand: str) -> str:
    """The rows of ``EXIT_STATUSES`` that ``subcommand`` gives, for its ``--help`` (a ``RawDescriptionHelpFormatter``
    keeps the lines)."""
    rows = [
        textwrap.fill(meaning, width=100, initial_indent=f"  {status:<7}", subsequent_indent=" " * 9)
        for status, meaning, where in EXIT_STATUSES
        if subcommand in where
    ]
    return "exit status:\n" + "\n".join(rows)


# Where one URL of a list ends: white space, or a comma followed by the next URL's scheme. A comma alone does not
# end a URL: sentinel and cluster URLs list their hosts with commas (redis+sentinel://h1,h2/service).
T = TypeVar("T")

_URL_SEPARATOR = re.compile(r"\s+|,\s*(?=[A-Za-z][A-Za-z0-9+.-]*://)")


class CommandError(Exception):
    """A subcommand cannot go on: the message is printed (never with a password) and the command exits."""

    def __init__(self, message: str, status: int, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason or message  # what went wrong, without the server's name (shown beside it)


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        metavar="URL",
        action="append",
        help="the lock server: redis://:password@host:6379/0, rediss://..., unix://..., a Sentinel service "
        "(redis+sentinel://host:26379,.../service[/db]) or a cluster (redis+cluster://host:port,...). Given two "
        "times or more: a quorum of independent servers, as QuorumLockRegistry takes (default: "
        f"${SERVER_ENV}, which may list several URLs separated by spaces or commas)",
    )
    parser.add_argument(
        "--registry-key",
        metavar="PREFIX",
        help=f"the registry key every lock name starts with (default: ${REGISTRY_KEY_ENV}, else "
        f"{DEFAULT_REGISTRY_KEY!r})",
    )


def split_server_urls(text: str) -> list[str]:
    """The URLs listed in ``text`` (``HYBRIDLOCK_SERVER_URL``): separated by white space, or by a comma where the
    next URL starts (``redis://a:6379,redis://b:6379``); a comma between hosts stays in its URL."""
    return [url for url in _URL_SEPARATOR.split(text.strip()) if url]


def server_urls_of(args: argparse.Namespace, status: int) -> list[str]:
    """The URLs given, in order: ``--server`` (each one URL, as given), else ``$HYBRIDLOCK_SERVER_URL``."""
    urls: list[str] = list(args.server or []) or split_server_urls(os.environ.get(SERVER_ENV, ""))
    if not urls:
        raise CommandError(f"no server given: use --server URL or set {SERVER_ENV}", status)
    if not all(url.strip() for url in urls):
        raise CommandError("an empty server URL was given", status)
    return urls


def registry_key_of(args: argparse.Namespace, status: int) -> str:
    registry_key = args.registry_key or os.environ.get(REGISTRY_KEY_ENV) or DEFAULT_REGISTRY_KEY
    try:
        return validate_registry_key(registry_key)
    except HybridLockError as exc:
        raise CommandError(str(exc), status) from None


class Server:
    """One server a command reads and writes: a single server, a Sentinel service's current master, or a cluster.

    ``client`` reads (text replies); ``backend`` runs the lock's own scripts (``release --force``), routed to the
    key's node on a cluster and to the current master under Sentinel. ``name`` is how messages show it: the URL
    without its password, ``sentinel://<service>/<db>`` for a Sentinel service."""

    def __init__(self, url: str, backend: RedisBackend | RedisClusterBackend, name: str) -> None:
        self.url = url
        self.backend = backend
        self.name = name
        self.cluster = isinstance(backend, RedisClusterBackend)

    @property
    def client(self) -> Any:
        return self.backend.client

    def error(self, exc: BaseException, status: int) -> CommandError:
        """A client error as a ``CommandError`` naming this server, without its password."""
        refused = login_refused(
            exc, library_family("redis"), login_of(self.client), operation="the command", key=None, server=self.name
        )
        if refused is not None:  # (told as the backend tells it: who was refused where, how to give the password)
            exc = refused
        if isinstance(exc, HybridLockError):
            return CommandError(redacted(str(exc), self.url), status, redacted(exc.message, self.url))
        if isinstance(exc, MasterNotFoundError):
            # redis-py's own text is the repr of a sentinel client: say what it means instead.
            sentinels = ", ".join(f"{host}:{port}" for host, port in parse_sentinel_url(self.url).sentinels)
            reason = f"no master found: the sentinels ({sentinels}) could not be reached, or none knows a master"
        else:
            reason = redacted(str(exc), self.url)
        return CommandError(f"server {self.name}: {reason}", status, reason)

    def close(self) -> None:
        self.backend.close()  # the client too, and a Sentinel client's connections to the sentinels


def open_server(url: str, usage: int, unreachable: int) -> Server:
    """A ``Server`` for ``url`` with short timeouts (a command line should not hang on a dead server): no I/O but
    for a cluster, whose client asks a node for the cluster's layout at once."""
    try:
        if is_cluster_url(url):
            cluster_client = redis_cluster_client_from_url(url, decode_responses=True)
            name = redacted_url(url)
            return Server(url, RedisClusterBackend(cluster_client, owns_client=True, address=name), name)
        client = redis_client_from_url(url, decode_responses=True)
    except BackendUnavailableError as exc:
        raise CommandError(redacted(str(exc), url), unreachable) from None
    except ValueError as exc:
        raise CommandError(f"not a valid server URL: {redacted_url(url)} ({redacted(str(exc), url)})", usage) from None
    backend = RedisBackend(client, owns_client=True)
    # A Sentinel service is named by its service (the master may change); a server by its URL as given.
    name = backend.address if backend.address.startswith("sentinel://") else redacted_url(url)
    return Server(url, backend, name)


def open_servers(urls: list[str], usage: int, unreachable: int) -> list[Server]:
    """A ``Server`` per URL. Two or more make a quorum: a cluster among them, or a server given twice (however
    spelt: ``redis://h:6379`` and ``redis://h:6379/0`` are one), is a usage error naming it."""
    if len(urls) > 1:
        for url in urls:
            if is_cluster_url(url):
                raise CommandError(
                    f"{redacted_url(url)} is a cluster: a quorum is made of independent servers (redis://, "
                    "rediss://, unix:// or redis+sentinel:// URLs); give a cluster as the only --server",
                    usage,
                )
    servers: list[Server] = []
    try:
        for url in urls:
            servers.append(open_server(url, usage, unreachable))
        seen: dict[str, Server] = {}
        for server in servers:
            # The backend's address is the server itself (host, port, db; a Sentinel service and db).
            address = server.backend.address
            if address in seen:
                raise CommandError(
                    f"a quorum's servers must be distinct: {seen[address].name} and {server.name} are both {address}",
                    usage,
                )
            seen[address] = server
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def on_each(servers: list[Server], call: Callable[[Server], T], status: int) -> list[T | CommandError]:
    """``call(server)`` on every server at once, so a hung server costs its socket timeout, not the sum of them:
    each one's result, or the ``CommandError`` (with ``status``) naming it when it could not be reached or
    refused."""

    def guarded(server: Server) -> T | CommandError:
        try:
            return call(server)
        except (redis.RedisError, redis.exceptions.RedisClusterException, HybridLockError) as exc:
            return server.error(exc, status)

    with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="hybridlock-cli") as pool:
        return list(pool.map(guarded, servers))


def close_all(servers: list[Server]) -> None:
    for server in servers:
        server.close()


def report(prog: str, error: CommandError) -> int:
    print(f"{prog}: {error}", file=sys.stderr)
    return error.status


def confirm(question: str, stream: Any = None) -> bool:
    """Ask ``question`` on the terminal; True only for an explicit yes."""
    stream = stream or sys.stdin
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = stream.readline()
    return answer.strip().lower() in {"y", "yes"}
