"""``hybridlock release --force KEY``: an operator's way out (Redisson's ``forceUnlock``).

It deletes the lock's holder key, whoever holds it, and wakes the head of the queue exactly as the holder's own
release would (the backend's own release, run on the holder's behalf: compare-and-delete, then publish), so
waiters take the lock at once instead of sleeping out the lease. The holder is not told directly: it learns at its
next renewal (within a third of its lease) that the lease is gone, as a loss (``lock.lost``, ``on_lost``,
``LockLostError`` at release; ``hybridlock run`` then signals its command). Until then it may still believe it
holds the lock, which is what fencing tokens are for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import redis

from .._core.names import lock_names, read_write_names
from ..errors import HybridLockError
from .common import (
    CommandError,
    Server,
    add_server_arguments,
    close_all,
    confirm,
    open_servers,
    registry_key_of,
    report,
    server_urls_of,
)
from .inspection import read_locks

__all__ = ["add_parser"]

RELEASED, NOT_HELD, USAGE, SERVER_FAILED = 0, 1, 2, 3
_PROG = "hybridlock release"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "release",
        help="force-release a lock whoever holds it (an operator's way out)",
        description="Delete KEY's holder key whoever holds it, and wake the next waiting owner as a release "
        "would. The holder learns of it at its next renewal, as a lost lease. Asks for confirmation on a "
        "terminal unless --yes is given.",
        epilog="exit status: 0 released; 1 the lock was not held (or changed hands meanwhile: nothing was "
        "released); 2 usage error, no server given, or not confirmed; 3 the server could not be reached or refused.",
    )
    parser.add_argument("key", metavar="KEY", help="lock key, as given to registry.obtain()")
    parser.add_argument("--force", action="store_true", required=True, help="required: yes, whoever holds it")
    parser.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    parser.add_argument(
        "--read-write",
        action="store_true",
        help="KEY is a read-write lock: release its writer, or when none writes, every reader's hold",
    )
    add_server_arguments(parser)
    parser.set_defaults(func=_command)


def _command(args: argparse.Namespace) -> int:
    try:
        return _release(args)
    except CommandError as exc:
        return report(_PROG, exc)


def _release(args: argparse.Namespace) -> int:
    urls = server_urls_of(args, USAGE)
    registry_key = registry_key_of(args, USAGE)
    kind = "read-write" if args.read_write else "lock"
    servers = open_servers(urls, USAGE, SERVER_FAILED)
    try:
        (server,) = servers
        try:
            (state,) = read_locks(server.client, registry_key, [(args.key, kind)])
            if not args.read_write:
                holders, reading = [state["holder"]], False
            elif state["writer"] is not None:
                holders, reading = [state["writer"]], False
            else:
                holders, reading = state["readers"], True
            holders = [holder for holder in holders if holder is not None]
            if not holders:
                print(f"{_PROG}: {args.key!r} is not held: nothing to release", file=sys.stderr)
                return NOT_HELD
            shown = "; ".join(_shown(holder) for holder in holders)
            what = f"the read holds of {args.key!r}" if reading else repr(args.key)
            if not args.yes:
                if not sys.stdin.isatty():
                    raise CommandError("not a terminal, so cannot ask: give --yes to release without asking", USAGE)
                if not confirm(f"Release {what}, held by {shown}, by force?"):
                    print(f"{_PROG}: not released", file=sys.stderr)
                    return USAGE
            released = sum(
                _run_release(server, registry_key, args.key, holder["owner"], args.read_write, reading)
                for holder in holders
            )
        except (redis.RedisError, redis.exceptions.RedisClusterException, HybridLockError) as exc:
            raise server.error(exc, SERVER_FAILED) from None
    finally:
        close_all(servers)
    if not released:
        print(f"{_PROG}: {args.key!r} changed hands meanwhile: nothing released", file=sys.stderr)
        return NOT_HELD
    print(f"released {what} (was held by {shown})")
    return RELEASED


def _shown(holder: dict[str, Any]) -> str:
    return ", ".join(str(part) for part in (holder["owner"], holder.get("host"), holder.get("pid")) if part)


def _run_release(server: Server, registry_key: str, key: str, owner: str, read_write: bool, reading: bool) -> bool:
    # The holder's own release, run on its behalf: it deletes only if the holder is still `owner`, so a lock that
    # changed hands since we looked is left alone (a reader's: only that owner's read hold). On a cluster the
    # backend sends it to the node serving the key's slot; under Sentinel, to the current master.
    backend = server.backend
    if reading:
        return backend.release_read(read_write_names(registry_key, key), owner)
    if read_write:
        return backend.release_write(read_write_names(registry_key, key), owner)
    return backend.release(lock_names(registry_key, key), owner, notify=True)
