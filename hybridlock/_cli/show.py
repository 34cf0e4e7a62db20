"""``hybridlock inspect KEY...`` and ``hybridlock list [PATTERN]``: who holds a lock, since when, who waits.

Both only read (see ``inspection.py``). Exit status: 0 done, 2 usage or no server given, 3 the server could not be
reached or refused a command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import redis

from .common import (
    CommandError,
    add_server_arguments,
    close_all,
    open_servers,
    registry_key_of,
    report,
    server_urls_of,
)
from .inspection import read_locks, scan_keys

__all__ = ["add_parsers"]

USAGE, SERVER_FAILED = 2, 3

_STATUSES = "exit status: 0 done; 2 usage error or no server given; 3 the server could not be reached or refused."


def add_parsers(subparsers: Any) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="show who holds locks, for how long still, who waits and the fencing counter",
        description="Show each KEY's lock: its holder (owner id, host, pid, thread or task, since when), the "
        "remaining lease, the owners waiting in queue order and the fencing counter; for a read-write lock its "
        "writer, readers and waiting writers. Read only.",
        epilog=_STATUSES,
    )
    inspect.add_argument("keys", nargs="+", metavar="KEY", help="lock key, as given to registry.obtain()")
    inspect.add_argument("--read-write", action="store_true", help="the keys are read-write locks (obtain_read_write)")
    inspect.add_argument("--json", action="store_true", help="print JSON (one object with a list of locks)")
    add_server_arguments(inspect)
    inspect.set_defaults(func=_inspect)

    listing = subparsers.add_parser(
        "list",
        help="list the locks held or waited for",
        description="List the locks of the registry that are held or waited for, with their holder, remaining "
        "lease, waiters and fencing counter. Uses SCAN (never KEYS), so it does not block the server. Read only.",
        epilog=_STATUSES,
    )
    listing.add_argument(
        "pattern", nargs="?", default="*", metavar="PATTERN", help="a glob over lock keys, as SCAN MATCH (default: *)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON (one object with a list of locks)")
    add_server_arguments(listing)
    listing.set_defaults(func=_list)


def _inspect(args: argparse.Namespace) -> int:
    kind = "read-write" if args.read_write else "lock"
    return _run(args, "hybridlock inspect", lambda client, registry_key: [(key, kind) for key in args.keys], True)


def _list(args: argparse.Namespace) -> int:
    return _run(
        args, "hybridlock list", lambda client, registry_key: scan_keys(client, registry_key, args.pattern), False
    )


def _run(args: argparse.Namespace, prog: str, keys_of: Any, detailed: bool) -> int:
    try:
        urls = server_urls_of(args, USAGE)
        registry_key = registry_key_of(args, USAGE)
        servers = open_servers(urls, USAGE, SERVER_FAILED)
        try:
            (server,) = servers
            try:
                keys = keys_of(server.client, registry_key)
                locks = read_locks(server.client, registry_key, keys)
            except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
                raise server.error(exc, SERVER_FAILED) from None
        finally:
            close_all(servers)
    except CommandError as exc:
        return report(prog, exc)
    if args.json:
        document = {"server": server.name, "registry_key": registry_key, "locks": locks}
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif detailed:
        now = time.time()
        print("\n\n".join(_describe(lock, now) for lock in locks))
    else:
        now = time.time()
        if not locks:
            print(f"no lock of registry {registry_key!r} is held or waited for")
        for lock in locks:
            print(_one_line(lock, now))
    return 0


def _who(owner: dict[str, Any] | None, now: float) -> str:
    if owner is None:
        return "nobody"
    parts = [owner["owner"]]
    if owner.get("host") or owner.get("pid"):
        parts.append(f"on {owner.get('host') or '?'} pid {owner.get('pid') or '?'}")
    if owner.get("thread"):
        parts.append(f"thread {owner['thread']!r}")
    if owner.get("acquired_at"):
        parts.append(f"since {_when(owner['acquired_at'], now)}")
    return ", ".join(parts)


def _when(at: float, now: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))
    return f"{stamp} UTC ({max(0.0, now - at):.1f} s ago)"


def _lease(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 0:
        return "no expiry"
    return f"{ms / 1000:.1f} s left"


def _describe(lock: dict[str, Any], now: float) -> str:
    lines = [f"{lock['key']}  ({lock['kind']}, {lock['name']})"]
    if lock["kind"] == "lock":
        lines.append(f"  holder:  {_who(lock['holder'], now)}")
        lines.append(f"  lease:   {_lease(lock['lease_remaining_ms'])}")
        waiting = lock["waiting"]
    else:
        lines.append(f"  writer:  {_who(lock['writer'], now)}")
        lines.append(f"  lease:   {_lease(lock['writer_lease_remaining_ms'])}")
        for reader in lock["readers"]:
            lines.append(f"  reader:  {_who(reader, now)}; {_lease(reader['lease_remaining_ms'])}")
        waiting = lock["writers_waiting"]
    lines.append(f"  fencing counter: {lock['fencing_counter'] if lock['fencing_counter'] is not None else '-'}")
    if not waiting:
        lines.append("  waiting: nobody")
    for place, owner in enumerate(waiting, 1):
        lines.append(f"  waiting {place}: {_who(owner, now)}")
    return "\n".join(lines)


def _one_line(lock: dict[str, Any], now: float) -> str:
    if lock["kind"] == "lock":
        holder, lease, waiting = lock["holder"], lock["lease_remaining_ms"], lock["waiting"]
    else:
        holder, lease, waiting = lock["writer"], lock["writer_lease_remaining_ms"], lock["writers_waiting"]
    if holder is not None:
        state = f"held by {_who(holder, now)}; {_lease(lease)}"
    elif lock["kind"] == "read-write" and lock["readers"]:
        state = f"read by {len(lock['readers'])} owner(s)"
    else:
        state = "free"
    return f"{lock['key']} [{lock['kind']}]: {state}; {len(waiting)} waiting"
