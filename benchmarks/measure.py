"""What every workload measures with: the shared counter, server command counts, percentiles, round medians.

Nothing here knows a lock library; ``contenders.py`` holds those.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

__all__ = [
    "AsyncCounter",
    "CommandCounts",
    "Counter",
    "KeyedCounter",
    "LocalCounter",
    "Metric",
    "command_delta",
    "command_snapshot",
    "jain_index",
    "median_of_rounds",
    "percentile",
]

# Commands the harness or a new connection sends, never a lock operation: left out of every count.
_HARNESS_COMMANDS = frozenset({"info", "hello", "client|setinfo", "client|setname", "client", "select"})


class Counter:
    """The shared counter every critical section increments, kept in Redis and updated non-atomically (GET, then
    SET): if two holders ever overlap, increments are lost and the final count comes out short."""

    def __init__(self, url: str, key: str, *, reset: bool = True) -> None:
        self.client = redis.Redis.from_url(url)
        self.key = key
        self.increments = 0  # by this object, so commandstats deltas can subtract their GET and SET
        if reset:
            self.client.delete(key)

    def increment(self) -> None:
        value = self.client.get(self.key)
        self.client.set(self.key, int(value or 0) + 1)
        self.increments += 1  # only the thread holding the lock runs this: no race in a correct lock

    #: Whether ``increment`` sends commands to the server (two: GET and SET), which command counts must subtract.
    in_server = True

    def read(self) -> bytes | None:
        """What a reader's critical section does: one GET of the counter (not counted as an increment)."""
        return self.client.get(self.key)  # type: ignore[no-any-return]

    def value(self) -> int:
        return int(self.client.get(self.key) or 0)

    def close(self) -> None:
        self.client.close()


class KeyedCounter:
    """One ``Counter`` per lock key, for workloads spread over many keys: the holder of key k's lock increments k's
    counter (GET, then SET), so a lock that lets two holders of one key in loses increments there. ``value`` is the
    sum over all keys, checked against the cycles run."""

    in_server = True

    def __init__(self, url: str, prefix: str, keys: int) -> None:
        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self.keys = keys
        self.increments = 0
        self._guard = threading.Lock()  # many threads count here at once, each under a different key's lock
        self.client.delete(*(self._name(k) for k in range(keys)))

    def _name(self, key: int) -> str:
        return f"{self.prefix}:{key}"

    def increment(self, key: int) -> None:
        name = self._name(key)
        value = self.client.get(name)
        self.client.set(name, int(value or 0) + 1)
        with self._guard:
            self.increments += 1

    def value(self) -> int:
        values = self.client.mget([self._name(k) for k in range(self.keys)])
        return sum(int(v or 0) for v in values)

    def close(self) -> None:
        self.client.close()


class AsyncCounter:
    """``Counter`` for the tasks of an event loop: the same key, ``GET`` then ``SET`` awaited one after the other
    through an asyncio client of its own (not counted), so two holders at once lose increments. Made inside the
    loop that uses it."""

    in_server = True

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.asyncio.Redis.from_url(url)
        self.key = key
        self.increments = 0

    async def increment(self) -> None:
        value = await self.client.get(self.key)
        await self.client.set(self.key, int(value or 0) + 1)
        self.increments += 1

    async def close(self) -> None:
        await self.client.aclose()


class LocalCounter:
    """The in-process critical section: read a Python int, yield with ``time.sleep(0)`` (which lets every other
    thread run), write it back plus one. Two holders inside at once lose increments, as with ``Counter``."""

    in_server = False

    def __init__(self) -> None:
        self.count = 0
        self.increments = 0

    def increment(self) -> None:
        value = self.count
        time.sleep(0)
        self.count = value + 1
        self.increments += 1

    def value(self) -> int:
        return self.count

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class CommandCounts:
    """The change in ``INFO commandstats`` between two snapshots: calls and server microseconds per command.

    ``commandstats`` counts the commands a Lua script runs inside the server as well as the ones clients send, so
    ``total`` is the server's work, not the round trips (those are counted on the client, see contenders.py)."""

    calls: Mapping[str, int]
    usec: Mapping[str, int]

    def total(self, *, counter_increments: int = 0, counter_reads: int = 0) -> int:
        """Lock commands executed: the calls of every command in the window, those a client sent (a script's EVAL or
        EVALSHA once per call) and those a script ran inside the server (each also counted under its own name),
        but the harness's own (``INFO``, connection handshakes), less the counter's: a GET and a SET per increment,
        a GET per read."""
        calls = sum(n for name, n in self.calls.items() if name not in _HARNESS_COMMANDS)
        return calls - 2 * counter_increments - counter_reads

    def scripts(self) -> int:
        """Script invocations (EVAL, EVALSHA and their read-only forms, FCALL): each is one client command."""
        return sum(n for name, n in self.calls.items() if name.startswith(("eval", "fcall")))

    def lease_resets(self) -> int:
        """Keys whose expiry was set by (P)EXPIRE(AT), sent by a client or run inside a script."""
        return sum(self.calls.get(name, 0) for name in ("pexpire", "expire", "pexpireat", "expireat"))

    def script_usec(self) -> int:
        return sum(n for name, n in self.usec.items() if name.startswith(("eval", "fcall")))

    def total_usec(self) -> int:
        return sum(n for name, n in self.usec.items() if name not in _HARNESS_COMMANDS)


def command_snapshot(client: redis.Redis) -> dict[str, tuple[int, int]]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"])) for name, v in stats.items()}


def command_delta(before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]]) -> CommandCounts:
    calls: dict[str, int] = {}
    usec: dict[str, int] = {}
    for name, (n, us) in after.items():
        n0, us0 = before.get(name, (0, 0))
        if n != n0:
            calls[name] = n - n0
            usec[name] = us - us0
    return CommandCounts(calls, usec)


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (``fraction`` in 0..1); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1]


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2): 1 when all shares are equal, 1/n when one takes all;
    NaN for no values or all zero."""
    square_sum = sum(x * x for x in values)
    if not values or square_sum == 0:
        return math.nan
    return sum(values) ** 2 / (len(values) * square_sum)


@dataclass(frozen=True)
class Metric:
    """One column of a workload's table."""

    key: str
    label: str
    #: "lower" or "higher": which way is better (the ratio's reading depends on it).
    better: str
    digits: int = 2
    #: Whether hybridlock's value divided by a peer's means anything (not for a setting-like column).
    ratio: bool = True


def median_of_rounds(rounds: Iterable[Mapping[str, Any]], metrics: Sequence[Metric]) -> dict[str, float | None]:
    """Each metric's median over the rounds that measured it (None when none did)."""
    rounds = list(rounds)
    result: dict[str, float | None] = {}
    for metric in metrics:
        values = [r[metric.key] for r in rounds if r.get(metric.key) is not None and not math.isnan(r[metric.key])]
        result[metric.key] = statistics.median(values) if values else None
    return result
