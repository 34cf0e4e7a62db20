"""``hybridlock inspect KEY...`` and ``hybridlock list [PATTERN]``: who holds a lock, since when, who waits.

Both only read (see ``inspection.py``), from one server, a Sentinel service's current master or a cluster (each
lock at its slot's master), or from every server of a quorum (``--server`` given several times): then each lock is
shown with its holder on each server and a verdict, held by an owner only if that owner holds it on a majority
(``N // 2 + 1``) of all the servers; a server that cannot be reached counts as not holding it and is shown so.

Exit statuses: the table in ``common.py`` (``EXIT_STATUSES``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from typing import Any

import redis

from .._core.quorum import majority
from .._protocol.scripts import MAX_TOKEN
from .._sync.backends.quorum import READ_WRITE_REFUSED
from .common import (
    EXIT_FAILED,
    EXIT_USAGE,
    CommandError,
    Server,
    add_server_arguments,
    close_all,
    exit_status_epilog,
    on_each,
    open_servers,
    registry_key_of,
    report,
    server_urls_of,
)
from .inspection import read_locks, scan_keys

__all__ = ["add_parsers", "who_holds"]

USAGE, SERVER_FAILED = EXIT_USAGE, EXIT_FAILED

_QUORUM = "Over a quorum a lock is held by an owner only if that owner holds it on a majority of the servers."


def add_parsers(subparsers: Any) -> None:
    inspect = subparsers.add_parser(
        "inspect",
        help="show who holds locks, for how long still, who waits and the fencing counter",
        description="Show each KEY's lock: its holder (owner id, host, pid, thread or task, where it took the lock, "
        "since when, and whether that thread or task ended without releasing it), the remaining lease, the owners "
        "waiting in queue order and the fencing counter; for a read-write lock its writer, readers and waiting "
        "writers. Read only.",
        epilog=f"{_QUORUM}\n\n{exit_status_epilog('inspect')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    inspect.add_argument("keys", nargs="+", metavar="KEY", help="lock key, as given to registry.obtain()")
    kinds = inspect.add_mutually_exclusive_group()
    kinds.add_argument("--read-write", action="store_true", help="the keys are read-write locks (obtain_read_write)")
    kinds.add_argument(
        "--semaphore", action="store_true", help="the keys are semaphores (obtain_semaphore): each permit's holder"
    )
    inspect.add_argument("--json", action="store_true", help="print JSON (one object with a list of locks)")
    add_server_arguments(inspect)
    inspect.set_defaults(func=_inspect)

    listing = subparsers.add_parser(
        "list",
        help="list the locks held or waited for",
        description="List the locks of the registry that are held or waited for, with their holder, remaining "
        "lease, waiters and fencing counter. Uses SCAN (never KEYS), so it does not block the server. Read only.",
        epilog=f"{_QUORUM}\n\n{exit_status_epilog('list')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    listing.add_argument(
        "pattern", nargs="?", default="*", metavar="PATTERN", help="a glob over lock keys, as SCAN MATCH (default: *)"
    )
    listing.add_argument("--json", action="store_true", help="print JSON (one object with a list of locks)")
    add_server_arguments(listing)
    listing.set_defaults(func=_list)


def _inspect(args: argparse.Namespace) -> int:
    kind = "read-write" if args.read_write else "semaphore" if args.semaphore else "lock"
    return _run(args, "hybridlock inspect", lambda client, registry_key: [(key, kind) for key in args.keys], True)


def _list(args: argparse.Namespace) -> int:
    return _run(
        args, "hybridlock list", lambda client, registry_key: scan_keys(client, registry_key, args.pattern), False
    )


def _in_use(lock: dict[str, Any]) -> bool:
    """For ``list``: a semaphore is found by its config, which outlives its permits; listed only while a permit is
    held or someone waits, as a lock is."""
    return lock["kind"] != "semaphore" or bool(lock["held"] or lock["waiting"])


def _run(args: argparse.Namespace, prog: str, keys_of: Any, detailed: bool) -> int:
    try:
        urls = server_urls_of(args, USAGE)
        registry_key = registry_key_of(args, USAGE)
        if len(urls) > 1 and getattr(args, "read_write", False):
            raise CommandError(READ_WRITE_REFUSED, USAGE)
        if len(urls) > 1 and getattr(args, "semaphore", False):
            raise CommandError("a quorum of servers has no semaphores (QuorumLockRegistry refuses them)", USAGE)
        servers = open_servers(urls, USAGE, SERVER_FAILED)
        try:
            if len(servers) > 1:
                return _run_quorum(args, prog, servers, registry_key, keys_of, detailed)
            (server,) = servers
            try:
                keys = keys_of(server.client, registry_key)
                locks = read_locks(server.client, registry_key, keys)
                if not detailed:
                    locks = [lock for lock in locks if _in_use(lock)]
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


# -- a quorum --------------------------------------------------------------------------------------------------------


def _run_quorum(
    args: argparse.Namespace, prog: str, servers: list[Server], registry_key: str, keys_of: Any, detailed: bool
) -> int:
    """Read every server at once (``list``: first the keys each one knows, then the union of them everywhere) and
    give each lock a verdict by majority. Fewer than a majority answering is a ``CommandError`` (``EXIT_FAILED``)."""
    needed = majority(len(servers))
    answering = servers
    keys: list[tuple[str, str]] = []
    found: list[Any] = [None] * len(servers)
    if detailed:  # inspect: the keys given, in their order
        keys = keys_of(None, registry_key)
    else:
        found = on_each(servers, lambda server: keys_of(server.client, registry_key), SERVER_FAILED)
        # (a quorum has no semaphores: a config found there is another registry's, on one of these servers alone)
        keys = sorted(
            {key for result in found if not isinstance(result, CommandError) for key in result if key[1] != "semaphore"}
        )
        answering = [s for s, result in zip(servers, found, strict=True) if not isinstance(result, CommandError)]
    read = on_each(answering, lambda server: read_locks(server.client, registry_key, keys), SERVER_FAILED)
    read_by_name = {server.name: result for server, result in zip(answering, read, strict=True)}
    # Each server's states, or why it could not be listed or read.
    outcomes: list[list[dict[str, Any]] | CommandError] = [
        result if isinstance(result, CommandError) else read_by_name[server.name]
        for server, result in zip(servers, found, strict=True)
    ]
    failures = {server.name: o for server, o in zip(servers, outcomes, strict=True) if isinstance(o, CommandError)}
    if len(servers) - len(failures) < needed:
        raise CommandError(
            f"fewer than a majority ({needed} of {len(servers)}) of the quorum's servers answered; "
            + "; ".join(str(failure) for failure in failures.values()),
            SERVER_FAILED,
        )
    locks = [
        _quorum_lock(
            key,
            kind,
            [(s.name, o if isinstance(o, CommandError) else o[index]) for s, o in zip(servers, outcomes, strict=True)],
            needed,
        )
        for index, (key, kind) in enumerate(keys)
    ]
    if args.json:
        document = {
            "servers": [server.name for server in servers],
            "majority": needed,
            "registry_key": registry_key,
            "unreachable": [{"server": name, "error": error.reason} for name, error in failures.items()],
            "locks": locks,
        }
        json.dump(document, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for error in failures.values():
        print(f"{prog}: unreachable, counted as not holding: {error}", file=sys.stderr)
    now = time.time()
    if detailed:
        print("\n\n".join(_describe_quorum(lock, now) for lock in locks))
    else:
        if not locks:
            answered = len(servers) - len(failures)
            print(
                f"no lock of registry {registry_key!r} is held or waited for on any of the {answered} servers "
                "that answered"
            )
        for lock in locks:
            print(f"{lock['key']} [{lock['kind']}]: {lock['verdict']}")
    return 0


def who_holds(urls: list[str], registry_key: str, key: str) -> str:
    """Who holds the plain lock ``key``, as ``inspect`` describes a holder (owner id, host, pid, thread, where and
    since when it took it; the lease left), in one line for a message (``run --no-wait`` refused); over a quorum,
    each server's holder. Read afresh, through clients of its own; never raises: what could not be read is said."""
    try:
        servers = open_servers(urls, USAGE, SERVER_FAILED)
    except CommandError as exc:
        return f"who holds it could not be read ({exc})"
    try:
        found = on_each(
            servers, lambda server: read_locks(server.client, registry_key, [(key, "lock")])[0], SERVER_FAILED
        )
    finally:
        close_all(servers)
    now = time.time()
    said = []
    for server, state in zip(servers, found, strict=True):
        if isinstance(state, CommandError):
            shown = f"who holds it could not be read ({state.reason})"
        elif state["holder"] is None:
            shown = "free" if len(servers) > 1 else "free by now (released, or its lease ended, since)"
        else:
            shown = f"held by {_who(state['holder'], now)}; {_lease(state['lease_remaining_ms'])}"
        said.append(shown if len(servers) == 1 else f"{server.name}: {shown}")
    return "; ".join(said)


def _holder_of(state: dict[str, Any]) -> dict[str, Any] | None:
    holder: dict[str, Any] | None = state["holder"] if state["kind"] == "lock" else state["writer"]
    return holder


def _quorum_lock(
    key: str, kind: str, per_server: list[tuple[str, dict[str, Any] | CommandError]], needed: int
) -> dict[str, Any]:
    """One lock over a quorum: each server's state (or why it could not be read) and the verdict, held by an owner
    only if that owner holds it on a majority of all the servers (an unreachable one counts as not holding)."""
    counts: Counter[str] = Counter()
    shown = []
    for name, state in per_server:
        if isinstance(state, CommandError):
            shown.append({"server": name, "reachable": False, "error": state.reason, "lock": None})
            continue
        holder = _holder_of(state)
        if holder is not None:
            counts[holder["owner"]] += 1
        shown.append({"server": name, "reachable": True, "error": None, "lock": state})
    total = len(per_server)
    owner, holding = counts.most_common(1)[0] if counts else (None, 0)
    held = owner is not None and holding >= needed
    if held:
        verdict = f"held by {owner} on {holding} of {total} servers"
    elif counts:
        spread = ", ".join(f"{who} on {n}" for who, n in counts.most_common())
        verdict = f"not held (no majority: {spread} of {total} servers; {needed} needed)"
    else:
        verdict = f"free (held on none of the {total} servers)"
    return {
        "key": key,
        "kind": kind,
        "held": held,
        "holder": owner if held else None,
        "holding_servers": holding if held else 0,
        "majority": needed,
        "verdict": verdict,
        "servers": shown,
    }


def _describe_quorum(lock: dict[str, Any], now: float) -> str:
    lines = [f"{lock['key']}  ({lock['kind']}): {lock['verdict']}"]
    for entry in lock["servers"]:
        if not entry["reachable"]:
            lines.append(f"  {entry['server']}: unreachable ({entry['error']})")
            continue
        state = entry["lock"]
        holder = _holder_of(state)
        lease = state["lease_remaining_ms"] if state["kind"] == "lock" else state["writer_lease_remaining_ms"]
        said = f"held by {_who(holder, now)}; {_lease(lease)}" if holder is not None else "free"
        lines.append(f"  {entry['server']}: {said}; fencing counter {_counter(state['fencing_counter'])}")
    return "\n".join(lines)


def _who(owner: dict[str, Any] | None, now: float) -> str:
    if owner is None:
        return "nobody"
    parts = [owner["owner"]]
    if owner.get("host") or owner.get("pid"):
        parts.append(f"on {owner.get('host') or '?'} pid {owner.get('pid') or '?'}")
    if owner.get("thread"):
        parts.append(f"thread {owner['thread']!r}")
    if owner.get("site"):
        parts.append(f"taken at {owner['site']}")
    if owner.get("acquired_at"):
        parts.append(f"since {_when(owner['acquired_at'], now)}")
    if owner.get("kept"):
        parts.append("KEPT: its run-once job has run; kept --at-least-for after the start, so that late hosts skip")
    if owner.get("abandoned"):
        parts.append("ABANDONED: that thread (or task) ended holding it; no longer renewed, it ends with its lease")
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
    if lock["kind"] == "semaphore":
        lines.append(f"  permits: {_permits(lock)}")
        for holder in lock["holders"]:
            lines.append(f"  permit {holder['permit']}: {_who(holder, now)}; {_lease(holder['lease_remaining_ms'])}")
        waiting = lock["waiting"]
    elif lock["kind"] == "lock":
        lines.append(f"  holder:  {_who(lock['holder'], now)}")
        lines.append(f"  lease:   {_lease(lock['lease_remaining_ms'])}")
        waiting = lock["waiting"]
    else:
        lines.append(f"  writer:  {_who(lock['writer'], now)}")
        lines.append(f"  lease:   {_lease(lock['writer_lease_remaining_ms'])}")
        for reader in lock["readers"]:
            lines.append(f"  reader:  {_who(reader, now)}; {_lease(reader['lease_remaining_ms'])}")
        waiting = lock["writers_waiting"]
    lines.append(f"  fencing counter: {_counter(lock['fencing_counter'])}")
    if not waiting:
        lines.append("  waiting: nobody")
    for place, owner in enumerate(waiting, 1):
        lines.append(f"  waiting {place}: {_who(owner, now)}")
    return "\n".join(lines)


def _permits(semaphore: dict[str, Any]) -> str:
    if semaphore["permits"] is None:
        return f"{semaphore['held']} held, no limit stored (unused for a while: the next acquire stores its own)"
    return f"{semaphore['held']} of {semaphore['permits']} held"


def _one_line(lock: dict[str, Any], now: float) -> str:
    if lock["kind"] == "semaphore":
        return f"{lock['key']} [semaphore]: {_permits(lock)}; {len(lock['waiting'])} waiting"
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


def _counter(value: int | None) -> str:
    """A fencing counter for people: one at or above 2^53 - 1 is refused by every acquire (``FencingCounterError``),
    which says so here, where an operator looks."""
    if value is None:
        return "-"
    if value >= MAX_TOKEN:
        return f"{value} (at or above 2**53 - 1: every acquire is refused until it is repaired)"
    return str(value)
