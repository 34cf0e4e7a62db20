"""``hybridlock release --force KEY``: an operator's way out (Redisson's ``forceUnlock``).

It deletes the lock's holder key, whoever holds it, and wakes the head of the queue exactly as the holder's own
release would (the backend's own release, run on the holder's behalf: compare-and-delete, then publish), so
waiters take the lock at once instead of sleeping out the lease. The holder is not told directly: it learns at its
next renewal (within a third of its lease) that the lease is gone, as a loss (``lock.lost``, ``on_lost``,
``LockLostError`` at release; ``hybridlock run`` then signals its command). Until then it may still believe it
holds the lock, which is what fencing tokens are for.

On a cluster the release goes to the master serving the key's slot; under Sentinel, to the current master. Over a
quorum (``--server`` given several times) it is run on every server that holds the lock, each reported: status 0
if it was released on at least one and a majority of the servers answered.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import redis

from .._core.names import lock_names, read_write_names
from .._core.quorum import majority
from .._sync.backends.quorum import READ_WRITE_REFUSED
from ..errors import HybridLockError
from .common import (
    EXIT_FAILED,
    EXIT_NOT_DONE,
    EXIT_OK,
    EXIT_USAGE,
    CommandError,
    Server,
    add_server_arguments,
    close_all,
    confirm,
    exit_status_epilog,
    on_each,
    open_servers,
    registry_key_of,
    report,
    server_urls_of,
)
from .inspection import read_locks

__all__ = ["add_parser"]

RELEASED, NOT_HELD, USAGE, SERVER_FAILED = EXIT_OK, EXIT_NOT_DONE, EXIT_USAGE, EXIT_FAILED
_PROG = "hybridlock release"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "release",
        help="force-release a lock whoever holds it (an operator's way out)",
        description="Delete KEY's holder key whoever holds it, and wake the next waiting owner as a release "
        "would. The holder learns of it at its next renewal, as a lost lease. Asks for confirmation on a "
        "terminal unless --yes is given. Over a quorum (--server given several times) it releases on every server "
        "that holds it and reports each.",
        epilog=exit_status_epilog("release"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    if len(urls) > 1 and args.read_write:
        raise CommandError(READ_WRITE_REFUSED, USAGE)
    servers = open_servers(urls, USAGE, SERVER_FAILED)
    try:
        if len(servers) > 1:
            return _release_on_quorum(args, servers, registry_key)
        (server,) = servers
        try:
            holders, reading = _holders_on(server, registry_key, args.key, args.read_write)
            if not holders:
                print(f"{_PROG}: {args.key!r} is not held: nothing to release", file=sys.stderr)
                return NOT_HELD
            shown = "; ".join(_shown(holder) for holder in holders)
            what = f"the read holds of {args.key!r}" if reading else repr(args.key)
            _confirm(args, f"Release {what}, held by {shown}, by force?")
            released = sum(
                _run_release(server, registry_key, args.key, _value_of(holder), args.read_write, reading)
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


def _holders_on(server: Server, registry_key: str, key: str, read_write: bool) -> tuple[list[dict[str, Any]], bool]:
    """Who holds ``key`` on ``server``: its holder, or a read-write lock's writer, or else its readers (then
    ``reading`` is True)."""
    kind = "read-write" if read_write else "lock"
    (state,) = read_locks(server.client, registry_key, [(key, kind)])
    if not read_write:
        holders, reading = [state["holder"]], False
    elif state["writer"] is not None:
        holders, reading = [state["writer"]], False
    else:
        holders, reading = state["readers"], True
    return [holder for holder in holders if holder is not None], reading


def _confirm(args: argparse.Namespace, question: str) -> None:
    """Ask unless ``--yes``; a ``CommandError`` (status 2) when there is no terminal to ask on, or no yes."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError("not a terminal, so cannot ask: give --yes to release without asking", USAGE)
    if not confirm(question):
        raise CommandError("not released", USAGE)


def _release_on_quorum(args: argparse.Namespace, servers: list[Server], registry_key: str) -> int:
    """The force release on every server of a quorum that holds the lock (each holder's own release, run on its
    behalf, as on one server), reported per server. Released where it could be even when fewer than a majority
    answered (``EXIT_FAILED`` then: an unreachable server may still hold it until its lease ends)."""
    needed = majority(len(servers))
    found = on_each(servers, lambda server: _holders_on(server, registry_key, args.key, False)[0], SERVER_FAILED)
    holder_on = {
        server.name: result[0]
        for server, result in zip(servers, found, strict=True)
        if not isinstance(result, CommandError) and result
    }
    failures = {
        server.name: result for server, result in zip(servers, found, strict=True) if isinstance(result, CommandError)
    }
    answered = len(servers) - len(failures)
    if not holder_on:
        if answered < needed:
            raise CommandError(_too_few(needed, len(servers), failures.values()), SERVER_FAILED)
        print(
            f"{_PROG}: {args.key!r} is held on none of the {answered} servers that answered: nothing to release",
            file=sys.stderr,
        )
        return NOT_HELD
    shown = "; ".join(f"{name}: {_shown(holder)}" for name, holder in holder_on.items())
    _confirm(args, f"Release {args.key!r} on {len(holder_on)} of {len(servers)} servers ({shown}), by force?")
    holding = [server for server in servers if server.name in holder_on]
    done = on_each(
        holding,
        lambda server: _run_release(server, registry_key, args.key, _value_of(holder_on[server.name]), False, False),
        SERVER_FAILED,
    )
    outcome = {server.name: result for server, result in zip(holding, done, strict=True)}
    released = sum(1 for result in outcome.values() if result is True)
    print(f"released {args.key!r} on {released} of {len(servers)} servers")
    for server in servers:
        result = outcome.get(server.name)
        if server.name in failures:
            said = f"unreachable ({failures[server.name].reason}): it may hold the lock until its lease ends"
        elif server.name not in holder_on:
            said = "not held"
        elif isinstance(result, CommandError):
            said = f"not released ({result.reason})"
        elif result:
            said = f"released (was held by {_shown(holder_on[server.name])})"
        else:
            said = "changed hands meanwhile: not released"
        print(f"  {server.name}: {said}")
    if answered < needed:
        print(f"{_PROG}: {_too_few(needed, len(servers), failures.values())}", file=sys.stderr)
        return SERVER_FAILED
    if not released and any(isinstance(result, CommandError) for result in outcome.values()):
        return SERVER_FAILED  # every server that held it refused the release: not "not held"
    return RELEASED if released else NOT_HELD


def _too_few(needed: int, total: int, failures: Any) -> str:
    return f"fewer than a majority ({needed} of {total}) of the quorum's servers answered; " + "; ".join(
        str(failure) for failure in failures
    )


def _shown(holder: dict[str, Any]) -> str:
    return ", ".join(str(part) for part in (holder["owner"], holder.get("host"), holder.get("pid")) if part)


def _value_of(holder: dict[str, Any]) -> str:
    """What the holder key holds, for the compare-and-delete: the owner id, or for a lock granted by a release
    ("<owner>|<token>") or a key kept after a run-once job (shown as its owner's, ``kept``) the value it holds."""
    value: str = holder.get("value") or holder["owner"]
    return value


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
