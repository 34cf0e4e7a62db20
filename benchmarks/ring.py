"""How fast a fair cross-process lock can be on this machine, and where hybridlock's client time goes against it.

    python -m benchmarks.ring                        # 8 processes x 1 thread, 3 rounds of 4 s
    python -m benchmarks.ring --processes 16 --rounds 5 --seconds 6
    python -m benchmarks.ring --asyncio              # the same, one task per process, with the asyncio clients

Workload 15 (N single-threaded processes take turns on one key; the critical section is a non-atomic GET + SET of a
Redis counter, which must come out exact), run in one session on one server for three contenders:

* **redis-py** ``Lock``: a barging lock (the releasing process often takes it again at once);
* **ring**: the floor of a fair hand-off through Redis, with no lock semantics at all: process i waits with
  ``BLPOP`` on a list of its own and, after its critical section, ``LPUSH``es the next process's list (one command
  per hand-off, no scripts, no lease, no queue, no fencing). Nothing can be fairer or cheaper per hand-off, so a fair
  lock's throughput is bounded by it;
* **hybridlock**'s ``LockRegistry`` (the direct grants of issue 20).

With ``--asyncio``, each process runs one task in an event loop instead, with the asyncio twins: redis.asyncio's
``Lock``, the ring over ``redis.asyncio`` and ``AsyncLockRegistry``.

Each process measures its own CPU time (``getrusage``: user + system, all its threads) over its cycles, and its main
thread's CPU split into acquire, GET, SET and release (``time.thread_time`` around each). Reported per contender:
cycles/s (median over rounds, and each round's ratio to redis-py's), the client CPU per cycle summed over the
processes, the server's main-thread CPU per cycle (``INFO cpu``), and the split per cycle of the process that held
the lock, and the critical path split in two: the hand-off (a holder's release call to the next holder's acquire
return, medians over the round, one clock for every process) and the holder's body (its acquire return to its
release call: the GET and SET, and whatever else runs on the two cores meanwhile). Rounds interleave the
contenders, so round i of each ran under the same load. Its own module, not part of ``benchmarks.run``.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import queue
import resource
import statistics
import time
from typing import Any

import redis

CONTENDERS = ("redis-py", "ring", "hybridlock")
ASYNC_CONTENDERS = ("redis.asyncio", "ring (asyncio)", "hybridlock (asyncio)")


class _Ring:
    """The fair floor: wait on our own list, hand over by pushing to the next process's."""

    def __init__(self, client: redis.Redis, me: int, processes: int) -> None:
        self._client = client
        self._mine = f"ring:{me}"
        self._next = f"ring:{(me + 1) % processes}"

    def acquire(self) -> bool:
        return self._client.blpop([self._mine], timeout=5) is not None

    def release(self) -> None:
        self._client.lpush(self._next, 1)


class _Tally:
    """One process's measures over its cycles, as ``_round`` reads them from the queue: the cycles, the process's CPU
    time (``getrusage``, every thread), the main thread's CPU split into acquire, GET, SET and release, and each
    cycle's (acquire returned, release called) stamps (monotonic: one clock for every process)."""

    def __init__(self) -> None:
        self.cycles = 0
        self._split = [0.0, 0.0, 0.0, 0.0]
        self._stamps: list[tuple[float, float]] = []
        self._before = resource.getrusage(resource.RUSAGE_SELF)

    def add(self, marks: tuple[float, float, float, float, float], got: float, released: float) -> None:
        """One cycle: ``marks`` are the thread's CPU clock before the acquire and after it, the GET, the SET and the
        release; ``got`` and ``released`` its monotonic stamps."""
        for i in range(4):
            self._split[i] += marks[i + 1] - marks[i]
        self._stamps.append((got, released))
        self.cycles += 1

    def report(self) -> tuple[int, float, list[float], list[tuple[float, float]]]:
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime - self._before.ru_utime + after.ru_stime - self._before.ru_stime
        return self.cycles, cpu, self._split, self._stamps


class _AsyncRing:
    """The fair floor over redis.asyncio: as ``_Ring``."""

    def __init__(self, client: Any, me: int, processes: int) -> None:
        self._client = client
        self._mine = f"ring:{me}"
        self._next = f"ring:{(me + 1) % processes}"

    async def acquire(self) -> bool:
        return await self._client.blpop([self._mine], timeout=5) is not None

    async def release(self) -> None:
        await self._client.lpush(self._next, 1)


def _async_worker(kind: str, url: str, me: int, processes: int, start: float, seconds: float, out: Any) -> None:
    import asyncio

    asyncio.run(_async_cycles(kind, url, me, processes, start, seconds, out))


async def _async_cycles(kind: str, url: str, me: int, processes: int, start: float, seconds: float, out: Any) -> None:
    """``_worker``'s loop in an event loop: one task, awaiting every call."""
    import asyncio

    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    registry = None
    if kind == "hybridlock (asyncio)":
        import hybridlock

        registry = hybridlock.AsyncLockRegistry(url)
        lock: Any = registry.obtain("bench-ring")
    elif kind == "redis.asyncio":
        lock = client.lock("bench-ring-rp", timeout=10)
    else:
        lock = _AsyncRing(client, me, processes)
    if kind != "ring (asyncio)":
        for _ in range(3):
            await lock.acquire()
            await lock.release()
    while time.time() < start:
        await asyncio.sleep(0.001)
    clock = time.thread_time
    tally = _Tally()
    end = start + seconds - (0.05 if kind == "ring (asyncio)" else 0.0)
    while time.time() < end:
        t0 = clock()
        if not await lock.acquire():
            break
        t1 = clock()
        got = time.monotonic()
        value = int(await client.get("bench-ring-counter") or 0)
        t2 = clock()
        await client.set("bench-ring-counter", value + 1)
        t3 = clock()
        released = time.monotonic()
        await lock.release()
        tally.add((t0, t1, t2, t3, clock()), got, released)
    out.put(tally.report())
    if registry is not None:
        await registry.aclose()
    await client.aclose()


def _worker(kind: str, url: str, me: int, processes: int, start: float, seconds: float, out: Any) -> None:
    client = redis.Redis.from_url(url)
    registry = None
    if kind == "hybridlock":
        import hybridlock

        registry = hybridlock.LockRegistry(url)
        lock: Any = registry.obtain("bench-ring")
    elif kind == "redis-py":
        lock = client.lock("bench-ring-rp", timeout=10)
    else:
        lock = _Ring(client, me, processes)
    if kind != "ring":
        for _ in range(3):  # connections made, scripts loaded
            lock.acquire()
            lock.release()
    while time.time() < start:
        time.sleep(0.001)
    clock = time.thread_time
    tally = _Tally()
    # The ring's last holder must not keep the token past the end (the others would wait for it): stop a little early.
    end = start + seconds - (0.05 if kind == "ring" else 0.0)
    while time.time() < end:
        t0 = clock()
        if not lock.acquire():
            break
        t1 = clock()
        got = time.monotonic()
        value = int(client.get("bench-ring-counter") or 0)
        t2 = clock()
        client.set("bench-ring-counter", value + 1)
        t3 = clock()
        released = time.monotonic()
        lock.release()
        tally.add((t0, t1, t2, t3, clock()), got, released)
    out.put(tally.report())
    if registry is not None:
        registry.close()


def _round(kind: str, url: str, processes: int, seconds: float) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    client.set("bench-ring-counter", 0)
    if kind.startswith("ring"):
        client.delete(*[f"ring:{i}" for i in range(processes)])
        client.lpush("ring:0", 1)
    cpu_before = client.info("cpu")
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start = time.time() + 1.5
    target = _async_worker if kind in ASYNC_CONTENDERS else _worker
    workers = [
        context.Process(target=target, args=(kind, url, i, processes, start, seconds, out)) for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    results = []
    for _ in workers:
        try:
            results.append(out.get(timeout=seconds + 60))
        except queue.Empty:
            for worker in workers:
                worker.kill()
            raise RuntimeError(f"{kind}: {len(results)} of {processes} processes finished their round") from None
    for worker in workers:
        worker.join(30)
    cpu_after = client.info("cpu")
    cycles = sum(r[0] for r in results)
    if int(client.get("bench-ring-counter") or 0) != cycles:
        raise AssertionError(f"{kind}: the counter is not the number of cycles: the lock let two holders in")
    server = sum(
        cpu_after[f"used_cpu_{part}_main_thread"] - cpu_before[f"used_cpu_{part}_main_thread"]
        for part in ("user", "sys")
    )
    split = [sum(r[2][i] for r in results) / cycles * 1e6 for i in range(4)]
    # The critical path, from every process's stamps in one order: a cycle is the hand-off (one holder's release
    # call to the next holder's acquire return) plus the next holder's body (its acquire return to its release call).
    stamps = sorted(stamp for r in results for stamp in r[3])
    handoffs = [later[0] - earlier[1] for earlier, later in itertools.pairwise(stamps)]
    bodies = [released - got for got, released in stamps]
    return {
        "cycles_per_s": cycles / seconds,
        "client_cpu_us": sum(r[1] for r in results) / cycles * 1e6,
        # (includes the 1.5 s of start-up before the round, when nothing runs)
        "server_cpu_us": server / cycles * 1e6,
        "split_us": split,
        "handoff_us": statistics.median(handoffs) * 1e6 if handoffs else 0.0,
        "body_us": statistics.median(bodies) * 1e6 if bodies else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--asyncio", action="store_true", help="one task per process, with the asyncio clients")
    args = parser.parse_args()
    contenders = ASYNC_CONTENDERS if args.asyncio else CONTENDERS
    from hybridlock.testing.server import EmbeddedServer

    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in contenders}
    with EmbeddedServer() as server:
        for _ in range(args.rounds):
            for kind in contenders:
                rows[kind].append(_round(kind, server.url, args.processes, args.seconds))
    each = "task" if args.asyncio else "thread"
    print(f"{args.processes} processes x 1 {each}, one key, {args.rounds} rounds of {args.seconds:g} s (medians)")
    print(
        f"| contender | cycles/s | ÷ {contenders[0]}, round by round | client CPU µs/cycle | server CPU µs/cycle | "
        "holder's acquire / GET / SET / release CPU µs | hand-off / body µs (p50) |"
    )
    print("|---|---:|---|---:|---:|---|---|")
    baseline = rows[contenders[0]]
    for kind in contenders:
        rounds = rows[kind]
        ratios = ", ".join(
            f"{r['cycles_per_s'] / b['cycles_per_s']:.2f}" for r, b in zip(rounds, baseline, strict=True)
        )
        split = " / ".join(f"{statistics.median(r['split_us'][i] for r in rounds):.0f}" for i in range(4))
        print(
            f"| {kind} | {statistics.median(r['cycles_per_s'] for r in rounds):,.0f} | {ratios} | "
            f"{statistics.median(r['client_cpu_us'] for r in rounds):,.0f} | "
            f"{statistics.median(r['server_cpu_us'] for r in rounds):,.0f} | {split} | "
            f"{statistics.median(r['handoff_us'] for r in rounds):,.0f} / "
            f"{statistics.median(r['body_us'] for r in rounds):,.0f} |"
        )


if __name__ == "__main__":
    main()
