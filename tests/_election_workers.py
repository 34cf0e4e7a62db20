"""A leader-election candidate as a program of its own, for ``tests/test_election_processes.py``.

    python -m tests._election_workers URL NAME LOG EXPIRE_AFTER {sync,async}

It runs for ``NAME`` until SIGTERM (then stops its candidacy gracefully and exits 0) and appends one line per
event to ``LOG`` (O_APPEND, one ``write`` each, so the lines of several processes never mix), with
``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine):

* ``elected PID EPOCH T``, ``revoked PID T``: from the callbacks;
* ``act PID EPOCH T_BEFORE T_AFTER VALID_UNTIL``: every few milliseconds, the candidate reads ``election.epoch``
  (None unless it leads, by its lease's clock) as a leader does before each side effect; when it leads, it records
  the epoch, the interval in which it read it, and its lease's deadline then. The checker asks that every act of an
  earlier epoch came before every act of a later one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import hybridlock

ACT_EVERY = 0.005


class Log:
    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def write(self, *fields: object) -> None:
        os.write(self._fd, (" ".join(map(str, fields)) + "\n").encode())


def run_sync(url: str, name: str, log: Log, expire_after: float) -> None:
    # A flag the handler sets, not a threading.Event: a signal handler runs in the main thread between two
    # bytecodes, maybe while that thread holds the Event's own lock (entering or leaving its wait), and set() would
    # then wait for that lock for ever. (CI saw it: a candidate elected as SIGTERM came never stopped.)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    with hybridlock.LockRegistry(url, expire_after=expire_after) as registry:
        election = registry.leader_election(
            name,
            on_elected=lambda epoch: log.write("elected", log.pid, epoch, time.monotonic()),
            on_revoked=lambda: log.write("revoked", log.pid, time.monotonic()),
        )
        election.start()
        log.write("started", log.pid, time.monotonic())
        while not stopping:
            before = time.monotonic()
            epoch = election.epoch
            after = time.monotonic()
            until = election.valid_until
            if epoch is not None:
                log.write("act", log.pid, epoch, before, after, until)
            time.sleep(ACT_EVERY)
        election.stop()
        log.write("stopped", log.pid, time.monotonic())


async def run_async(url: str, name: str, log: Log, expire_after: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def on_elected(epoch: int | None) -> None:
        log.write("elected", log.pid, epoch, time.monotonic())

    async def on_revoked() -> None:
        log.write("revoked", log.pid, time.monotonic())

    async with hybridlock.AsyncLockRegistry(url, expire_after=expire_after) as registry:
        election = registry.leader_election(name, on_elected=on_elected, on_revoked=on_revoked)
        await election.start()
        log.write("started", log.pid, time.monotonic())
        while not stop.is_set():
            before = time.monotonic()
            epoch = election.epoch
            after = time.monotonic()
            until = election.valid_until
            if epoch is not None:
                log.write("act", log.pid, epoch, before, after, until)
            try:
                await asyncio.wait_for(stop.wait(), ACT_EVERY)
            except TimeoutError:
                pass
        await election.stop()
        log.write("stopped", log.pid, time.monotonic())


def main(argv: list[str]) -> None:
    url, name, path, expire_after, side = argv
    log = Log(path)
    if side == "sync":
        run_sync(url, name, log, float(expire_after))
    else:
        asyncio.run(run_async(url, name, log, float(expire_after)))


if __name__ == "__main__":
    main(sys.argv[1:])
