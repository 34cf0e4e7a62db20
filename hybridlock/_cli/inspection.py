"""Reading a lock's state from the server, for ``hybridlock inspect`` and ``hybridlock list``: read only.

What a lock looks like from outside (see ``hybridlock._core.names`` for the key layout): its holder (the owner's
``client_id``, and what the owner wrote about itself in ``R:owner:<client_id>``: host, pid, the holding thread or
task, where it took the lock, when it was granted, and whether that thread or task has ended without releasing it:
``abandoned``, its lease no longer renewed), the remaining lease, the owners waiting in queue order, and the
fencing counter; for a read-write lock, its writer, readers and waiting writers.

Everything is read in two pipelined round trips per batch of keys (the lock keys, then the owners' descriptions),
with plain read commands (``GET``, ``PTTL``, ``ZRANGE``, ``HGETALL``, ``TIME``; ``SCAN`` to list, never ``KEYS``).
The reads are not one atomic snapshot: a lock may change hands between two of them, which a human (or script)
looking again sees at once.

On a cluster (``read_locks`` and ``scan_keys`` given a ``RedisCluster``), every name of one lock shares its hash
slot, so each lock is read at the master serving that slot, with that master's clock, in one pipelined round trip
per master; the owners' descriptions (which live in slots of their own) are read through the cluster client, and
``list`` scans every master.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from .._core.config import QUEUE_PLACE_KEEP_MS
from .._core.names import lock_names, owner_key, read_write_names, semaphore_names
from .._core.runonce import ran_by
from .._protocol.grants import owner_of_place
from .._protocol.scripts import MAX_PERMITS, MAX_TOKEN

__all__ = ["glob_matcher", "inspect_locks", "read_locks", "scan_keys"]

# Endings of a lock's server names (after "R:{key"), and which kind of lock each belongs to. No ending is the end of
# another (see names.py), so a name's ending, and with it its key, is found unambiguously.
_ENDINGS = {
    "}": "lock",
    "}:queue": "lock",
    "}:queue-until": "lock",
    "}:writer": "read-write",
    "}:readers": "read-write",
    "}:writers": "read-write",
    "}:permits": "semaphore",
    "}:sem-queue": "semaphore",
    "}:sem-queue-until": "semaphore",
}
_SCAN_COUNT = 1000
_BATCH = 200  # keys read per pair of round trips
# A fencing token at least this large was taken from the server clock (microseconds since 1970, past 2001).
_CLOCK_TOKEN = 10**15


def glob_matcher(pattern: str) -> re.Pattern[str]:
    """A regular expression matching what Redis's glob ``pattern`` (as in ``SCAN MATCH``) matches: ``*``, ``?``,
    ``[abc]``, ``[^a-z]`` and ``\\`` escapes."""
    out = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                negate = body.startswith("^")
                body = body[1:] if negate else body
                parts = []
                j = 0
                while j < len(body):
                    if j + 2 < len(body) and body[j + 1] == "-":
                        low, high = sorted((body[j], body[j + 2]))
                        parts.append(f"{re.escape(low)}-{re.escape(high)}")
                        j += 3
                    else:
                        parts.append(re.escape(body[j]))
                        j += 1
                out.append(f"[{'^' if negate else ''}{''.join(parts)}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def _glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def _is_cluster(client: Any) -> bool:
    return isinstance(client, redis.cluster.RedisCluster)


def scan_keys(client: Any, registry_key: str, pattern: str = "*") -> list[tuple[str, str]]:
    """``(key, kind)`` of every lock of ``registry_key`` whose key matches the glob ``pattern`` and that is held or
    waited for ("lock" or "read-write"; a key may be both), sorted. Uses ``SCAN``, never ``KEYS``; on a cluster,
    on every master."""
    prefix = f"{registry_key}:{{"
    matcher = glob_matcher(pattern)
    found: set[tuple[str, str]] = set()
    scanned = (
        [client.get_redis_connection(node) for node in client.get_primaries()] if _is_cluster(client) else [client]
    )
    for node_client in scanned:
        for name in node_client.scan_iter(match=f"{_glob_escape(prefix)}{pattern}}}*", count=_SCAN_COUNT):
            parsed = _parse(name, prefix)
            if parsed is not None and matcher.fullmatch(parsed[0]):
                found.add(parsed)
    return sorted(found)


def _parse(name: str, prefix: str) -> tuple[str, str] | None:
    if not name.startswith(prefix):
        return None
    for ending, kind in _ENDINGS.items():
        if name.endswith(ending) and len(name) > len(prefix) + len(ending):
            return name[len(prefix) : len(name) - len(ending)], kind
    return None


def read_locks(client: Any, registry_key: str, keys: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    """The state of each ``(key, kind)`` lock, in the order given, read in batches of ``_BATCH`` keys; on a cluster
    (``client`` a ``RedisCluster``), each at the master serving its slot."""
    keys = list(keys)
    if not _is_cluster(client):
        return [lock for batch in chunks(keys, _BATCH) for lock in inspect_locks(client, registry_key, batch)]
    by_node: dict[str, list[int]] = {}
    nodes: dict[str, Any] = {}
    for index, (key, kind) in enumerate(keys):
        name = _main_name(registry_key, key, kind)
        node = client.get_node_from_key(name)
        nodes[node.name] = node
        by_node.setdefault(node.name, []).append(index)
    states: list[dict[str, Any] | None] = [None] * len(keys)
    for node_name, indexes in by_node.items():
        node_client = client.get_redis_connection(nodes[node_name])
        for batch in chunks(indexes, _BATCH):
            read = inspect_locks(node_client, registry_key, [keys[i] for i in batch], describer=client)
            for index, state in zip(batch, read, strict=True):
                states[index] = state
    return [state for state in states if state is not None]


def _main_name(registry_key: str, key: str, kind: str) -> str:
    """The server name a lock of ``kind`` is routed by (every name of one lock shares its cluster slot)."""
    if kind == "lock":
        return lock_names(registry_key, key).lock
    if kind == "semaphore":
        return semaphore_names(registry_key, key).config
    return read_write_names(registry_key, key).writer


def inspect_locks(
    client: redis.Redis, registry_key: str, keys: Iterable[tuple[str, str]], describer: Any = None
) -> list[dict[str, Any]]:
    """The state of each ``(key, kind)`` lock (kind "lock" or "read-write"), as JSON-ready dicts, read from
    ``client`` (one server, or the cluster node serving every key's slot); the owners' descriptions from
    ``describer`` (default: ``client``; on a cluster, the cluster client, which routes each by its slot)."""
    keys = list(keys)
    if any(kind == "semaphore" for _key, kind in keys):
        # Read apart (their slots are known only from their config), then put back in the order given.
        states: dict[int, dict[str, Any]] = {}
        others = [(i, k) for i, k in enumerate(keys) if k[1] != "semaphore"]
        semaphores = [(i, k) for i, k in enumerate(keys) if k[1] == "semaphore"]
        if others:
            read = inspect_locks(client, registry_key, [k for _i, k in others], describer)
            states.update(zip([i for i, _k in others], read, strict=True))
        read = _semaphores(client, registry_key, [key for _i, (key, _kind) in semaphores], describer)
        states.update(zip([i for i, _k in semaphores], read, strict=True))
        return [states[i] for i in range(len(keys))]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for key, kind in keys:
        if kind == "lock":
            n = lock_names(registry_key, key)
            pipe.get(n.lock)
            pipe.pttl(n.lock)
            pipe.get(n.fence)
            pipe.zrange(n.queue, 0, -1, withscores=True)
            pipe.zrange(n.queue_until, 0, -1, withscores=True)
        else:
            rw = read_write_names(registry_key, key)
            pipe.get(rw.writer)
            pipe.pttl(rw.writer)
            pipe.get(rw.fence)
            pipe.zrange(rw.readers, 0, -1, withscores=True)
            pipe.zrange(rw.writers_waiting, 0, -1, withscores=True)
    replies = pipe.execute(raise_on_error=False)
    now_ms, per_key = _per_key(replies, 5)

    owners: set[str] = set()
    for value, _pttl, _fence, first, second in per_key:
        if isinstance(value, str):
            owners.add(ran_by(value) or owner_of_place(value))  # (a granted lock holds "<owner>|<token>")
        # (a place in a plain lock's queue is named after its owner and its wait: described under the owner)
        owners.update(owner_of_place(member) for member, _score in first or ())
        owners.update(owner_of_place(member) for member, _score in second or ())
    descriptions = _descriptions(describer if describer is not None else client, registry_key, sorted(owners))

    result = []
    for (key, kind), (value, pttl, fence, first, second) in zip(keys, per_key, strict=True):
        if kind == "lock":
            result.append(_plain(registry_key, key, value, pttl, fence, first, second, now_ms, descriptions))
        else:
            result.append(_read_write(registry_key, key, value, pttl, fence, first, second, now_ms, descriptions))
    return result


def _per_key(replies: list[Any], size: int) -> tuple[int, list[list[Any]]]:
    """A pipeline's replies, ``TIME`` first and then ``size`` per key: the server's clock in ms, and each key's
    replies (cleaned)."""
    seconds, micros = replies[0]
    raw = [_clean(reply) for reply in replies[1:]]
    return seconds * 1000 + micros // 1000, [raw[i : i + size] for i in range(0, len(raw), size)]


def _clean(reply: Any) -> Any:
    # A key of an unexpected type (not written by hybridlock) answers WRONGTYPE: read it as missing, as scripts do.
    # Any other error (a slot moved meanwhile, a command the ACL refuses) means the lock could not be read: raised,
    # never shown as a free lock.
    if isinstance(reply, Exception):
        if str(reply).startswith("WRONGTYPE"):
            return None
        raise reply
    return reply


def _descriptions(client: Any, registry_key: str, owners: list[str]) -> dict[str, dict[str, str]]:
    if not owners:
        return {}
    pipe = client.pipeline(transaction=False)
    for owner in owners:
        pipe.hgetall(owner_key(registry_key, owner))
    replies = pipe.execute(raise_on_error=False)
    return {owner: reply if isinstance(reply, dict) else {} for owner, reply in zip(owners, replies, strict=True)}


def _owner(
    owner: str, descriptions: dict[str, dict[str, str]], lease_name: str | None = None, token: int | None = None
) -> dict[str, Any]:
    """An owner as shown: its id and self-description, and what it said about holding ``lease_name`` (only if that
    speaks of the current tenancy: same fencing token, where there is one)."""
    described = descriptions.get(owner, {})
    shown: dict[str, Any] = {"owner": owner, "host": described.get("host"), "pid": _int(described.get("pid"))}
    started = _float(described.get("started_at"))
    shown["owner_started_at"] = started
    if lease_name is not None:
        shown["thread"] = None
        shown["site"] = None
        shown["acquired_at"] = None
        shown["abandoned"] = False
        about = _json(described.get(lease_name))
        if about is not None and (token is None or about.get("token") in (None, token)):
            shown["thread"] = about.get("thread")
            shown["site"] = about.get("site")
            shown["acquired_at"] = about.get("acquired_at")
            # The holding thread (task) ended without releasing it: no longer renewed, it ends with its lease.
            shown["abandoned"] = about.get("abandoned") is True
        if shown["acquired_at"] is None and token is not None and _CLOCK_TOKEN <= token <= MAX_TOKEN:
            # The token of a fresh acquisition is the server's clock in microseconds (see scripts.py): a fair
            # "since" even for a holder that has not described itself (yet).
            shown["acquired_at"] = token / 1e6
    return shown


def _holder(value: str, descriptions: dict[str, dict[str, str]], lease_name: str, token: int | None) -> dict[str, Any]:
    """A plain lock's holder as shown; a key kept after a run-once job's run (``at_least_for``) is shown as its
    owner's, with ``kept`` true (nobody holds it: it is kept until its lease ends so that late replicas skip)."""
    owner = ran_by(value)
    if owner is None:
        # (A lock granted by a release holds "<owner>|<token>": see scripts.grant.)
        owner = owner_of_place(value)
        shown = _owner(owner, descriptions, lease_name, token)
        shown["kept"] = False
        if owner != value:
            shown["value"] = value  # (what the key holds, which release --force compares and deletes)
        return shown
    shown = _owner(owner, descriptions)
    # ("value": what the key holds, which release --force compares and deletes)
    shown.update(thread=None, site=None, acquired_at=None, abandoned=False, kept=True, value=value)
    return shown


def _plain(
    registry_key: str,
    key: str,
    holder: Any,
    pttl: Any,
    fence: Any,
    queue: Any,
    lapses: Any,
    now_ms: int,
    descriptions: dict[str, dict[str, str]],
) -> dict[str, Any]:
    n = lock_names(registry_key, key)
    token = _counter(fence)
    held = isinstance(holder, str)
    return {
        "key": key,
        "kind": "lock",
        "name": n.lock,
        "held": held,
        "holder": _holder(holder, descriptions, n.lock, token) if held else None,
        "lease_remaining_ms": _int(pttl) if held else None,
        "fencing_counter": token,
        "waiting": _waiting(queue, lapses, now_ms, descriptions),
    }


def _waiting(queue: Any, lapses: Any, now_ms: int, descriptions: dict[str, dict[str, str]]) -> list[dict[str, Any]]:
    """The live places of a queue (a plain lock's or a semaphore's), in order, each as its owner."""
    lapse_of = dict(lapses or ())
    waiting = []
    for member, arrived in queue or ():
        # A place lives PLACE_KEEP_MS past its arrival or its last refresh, whichever is later (see scripts.py).
        lapse = max(arrived + QUEUE_PLACE_KEEP_MS, lapse_of.get(member, 0))
        if lapse <= now_ms:
            continue  # lapsed: the scripts drop it at their next look
        entry = _owner(owner_of_place(member), descriptions)  # (a place is named after its owner and its wait)
        entry["queued_at"] = arrived / 1000.0
        entry["place_lapses_in_ms"] = int(lapse - now_ms)
        waiting.append(entry)
    return waiting


def _semaphores(client: Any, registry_key: str, keys: list[str], describer: Any = None) -> list[dict[str, Any]]:
    """The state of each semaphore: its limit, each permit held (slot, holder, lease left), the fencing counter and
    the queue. Two pipelined round trips (the config, counter and queue; then the slots its config spans) and the
    owners' descriptions."""
    names = [semaphore_names(registry_key, key) for key in keys]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for n in names:
        pipe.hgetall(n.config)
        pipe.get(n.fence)
        pipe.zrange(n.queue, 0, -1, withscores=True)
        pipe.zrange(n.queue_until, 0, -1, withscores=True)
    replies = pipe.execute(raise_on_error=False)
    now_ms, per_key = _per_key(replies, 4)
    limits, spans = [], []
    for config, *_rest in per_key:
        config = config if isinstance(config, dict) else {}
        limit = _int(config.get("limit"))
        limits.append(limit)
        # Slots at or past a lowered limit may still be held (they drain): the span says how far to look.
        spans.append(min(max(_int(config.get("span")) or 0, limit or 0), MAX_PERMITS))
    pipe = client.pipeline(transaction=False)
    for n, span in zip(names, spans, strict=True):
        for index in range(span):
            pipe.get(n.slot(index))
            pipe.pttl(n.slot(index))
    slots = [_clean(reply) for reply in pipe.execute(raise_on_error=False)] if any(spans) else []

    held_by: list[list[tuple[int, str, Any]]] = []
    owners: set[str] = set()
    at = 0
    for span, (_config, _fence, queue, _lapses) in zip(spans, per_key, strict=True):
        held = []
        for index in range(span):
            value, pttl = slots[at], slots[at + 1]
            at += 2
            if isinstance(value, str):
                owner = owner_of_place(value)  # (a slot holds its tenancy, "<client_id>|<wait id>")
                held.append((index, owner, pttl))
                owners.add(owner)
        held_by.append(held)
        owners.update(owner_of_place(member) for member, _score in queue or ())
    descriptions = _descriptions(describer if describer is not None else client, registry_key, sorted(owners))

    result = []
    for n, limit, held, (_config, fence, queue, lapses) in zip(names, limits, held_by, per_key, strict=True):
        holders = []
        for index, owner, pttl in held:
            shown = _owner(owner, descriptions, n.slot(index))
            shown["permit"] = index
            shown["lease_remaining_ms"] = _int(pttl)
            holders.append(shown)
        result.append(
            {
                "key": n.key,
                "kind": "semaphore",
                "name": n.config,
                "permits": limit,
                "held": len(holders),
                "holders": holders,
                "fencing_counter": _counter(fence),
                "waiting": _waiting(queue, lapses, now_ms, descriptions),
            }
        )
    return result


def _read_write(
    registry_key: str,
    key: str,
    writer: Any,
    pttl: Any,
    fence: Any,
    readers: Any,
    writers_waiting: Any,
    now_ms: int,
    descriptions: dict[str, dict[str, str]],
) -> dict[str, Any]:
    rw = read_write_names(registry_key, key)
    token = _counter(fence)
    written = isinstance(writer, str)
    shown_readers = []
    for member, expiry in readers or ():
        if expiry > now_ms:
            entry = _owner(member, descriptions, rw.readers)
            entry["lease_remaining_ms"] = int(expiry - now_ms)
            shown_readers.append(entry)
    waiting = []
    for member, lapse in writers_waiting or ():
        if lapse > now_ms:
            entry = _owner(member, descriptions)
            entry["place_lapses_in_ms"] = int(lapse - now_ms)
            waiting.append(entry)
    return {
        "key": key,
        "kind": "read-write",
        "name": rw.writer,
        "held": written or bool(shown_readers),
        "writer": _owner(writer, descriptions, rw.writer, token) if written else None,
        "writer_lease_remaining_ms": _int(pttl) if written else None,
        "readers": shown_readers,
        "fencing_counter": token,
        "writers_waiting": waiting,
    }


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _counter(value: Any) -> int | None:
    """A fencing counter as the scripts read it (Lua's ``tonumber``, which takes ``1e19`` too), so that one a lock
    user set out of range shows as the number it is; None when missing or not a whole number."""
    number = _int(value)
    if number is None:
        as_float = _float(value)
        if as_float is not None and math.isfinite(as_float) and as_float == int(as_float):
            number = int(as_float)
    return number


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _json(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
