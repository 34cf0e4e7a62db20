"""Leader election across processes, on a real server: one leader at a time when the leader is killed (SIGKILL),
paused (SIGSTOP, then SIGCONT after its successor is elected), stopped (SIGTERM: a graceful stop) or cut off from
the server (a black-hole proxy between them).

Three candidates run ``tests/_election_workers.py`` (thread or asyncio side). Each logs its terms and, every few
milliseconds while it leads by its own clock, an *act* with its epoch: what a leader that checks ``epoch`` before
each side effect would do. The interval checker then asks that every act of an earlier epoch came before every
act of a later one (no two leaders act at once, a paused leader included, which resumes past its lease), that
epochs grow with each election, and that a stopped leader's ``on_revoked`` ran before its successor's
``on_elected``. The times to a new leader are bounded: at once for a stop, the lease plus a renewal period for a
death or a pause.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ._proxy import FaultProxy

pytestmark = pytest.mark.server

EXPIRE_AFTER = 1.5
RENEW_PERIOD = EXPIRE_AFTER / 3
# Scheduling slack on a machine shared with other test runs (a process is started, a pop returns, a log is written).
SLACK = 1.0
HANDOVER = 0.5  # a graceful stop: one release that grants the next candidate at once


def _events(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line]


def _wait_for(path: Path, predicate: Any, timeout: float, what: str) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        for event in _events(path):
            if predicate(event):
                return event
        assert time.monotonic() < deadline, f"{what} within {timeout} s; log: {_events(path)[-20:]}"
        time.sleep(0.005)


def _check(events: list[list[str]]) -> None:
    """The interval checker (see the module docstring)."""
    elected = [(float(e[3]), int(e[2]), e[1]) for e in events if e[0] == "elected"]
    elected.sort()
    epochs = [epoch for _, epoch, _ in elected]
    assert epochs == sorted(set(epochs)), f"epochs did not grow with each election: {elected}"
    acts: dict[int, tuple[float, float]] = {}  # epoch -> (latest start of a read, earliest end of a read)
    owners: dict[int, str] = {}
    for event in events:
        if event[0] != "act":
            continue
        pid, epoch, before, after = event[1], int(event[2]), float(event[3]), float(event[4])
        assert owners.setdefault(epoch, pid) == pid, f"two processes acted with epoch {epoch}"
        latest, earliest = acts.get(epoch, (before, after))
        acts[epoch] = (max(latest, before), min(earliest, after))
    assert set(acts) <= set(epochs), f"an act with an epoch nobody was elected with: {sorted(acts)} vs {epochs}"
    ordered = sorted(acts)
    for index, earlier in enumerate(ordered):
        for later in ordered[index + 1 :]:
            assert acts[earlier][0] < acts[later][1], (
                f"the leader of epoch {earlier} acted at {acts[earlier][0]:.3f}, after the leader of epoch {later} "
                f"had begun to act ({acts[later][1]:.3f}): two leaders at once"
            )


@pytest.mark.slow(reason="candidate processes wait out a leader's lease after each fault")
@pytest.mark.parametrize("side", ["sync", "async"])
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP", "SIGTERM"])
def test_one_leader_at_a_time_when_the_leader_dies_pauses_or_stops(
    server: Any, redis_client: Any, tmp_path: Path, side: str, fault: str
) -> None:
    log = tmp_path / "election.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "tests._election_workers", server.url, "jobs", str(log), str(EXPIRE_AFTER), side]
    processes = {}
    try:
        for _ in range(3):
            process = subprocess.Popen(command, env=env)
            processes[str(process.pid)] = process
        first = _wait_for(log, lambda e: e[0] == "elected", 30, "no leader")
        leader = processes[first[1]]
        for pid in processes:
            _wait_for(log, lambda e, pid=pid: e[0] == "started" and e[1] == pid, 30, "a candidate did not start")
        time.sleep(0.3)  # it acts a while
        struck = time.monotonic()
        os.kill(leader.pid, getattr(signal, fault))
        bound = EXPIRE_AFTER + RENEW_PERIOD + SLACK
        successor = _wait_for(log, lambda e: e[0] == "elected" and e[1] != first[1], bound + 5, "no successor")
        took = float(successor[3]) - struck
        if fault == "SIGTERM":
            assert took < HANDOVER, f"a graceful stop took {took:.3f} s to hand over"
            revoked = _wait_for(log, lambda e: e[0] == "revoked" and e[1] == first[1], 5, "the stopped leader")
            assert float(revoked[2]) <= float(successor[3]), "on_revoked ran after the successor was elected"
            assert leader.wait(10) == 0
        else:
            assert took < bound, f"the next leader took {took:.3f} s"
        if fault == "SIGSTOP":
            time.sleep(0.3)  # the successor acts a while, then the old leader resumes, long past its lease
            os.kill(leader.pid, signal.SIGCONT)
            resumed = time.monotonic()
            revoked = _wait_for(log, lambda e: e[0] == "revoked" and e[1] == first[1], 5, "the resumed leader")
            assert float(revoked[2]) - resumed < SLACK, "the resumed leader was slow to step down"
        time.sleep(0.3)
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            if process is not leader or fault != "SIGKILL":
                assert process.wait(10) == 0
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait(10)
    events = _events(log)
    _check(events)
    assert sum(1 for e in events if e[0] == "elected") >= 2


@pytest.mark.slow(reason="candidate processes wait out a partitioned leader's lease")
@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_partitioned_leader_steps_down_before_its_successor_is_elected(
    server: Any, redis_client: Any, tmp_path: Path, side: str
) -> None:
    """The first leader talks to the server through a proxy that then black-holes it (its socket timeout is longer
    than the lease, so no reply tells it anything): it steps down by its own clock, its ``on_revoked`` logged
    before the successor's ``on_elected``, and it never acts beside the successor."""
    log = tmp_path / "election.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path.cwd()), os.environ.get("PYTHONPATH")]))}

    def command(url: str) -> list[str]:
        return [sys.executable, "-m", "tests._election_workers", url, "jobs", str(log), str(EXPIRE_AFTER), side]

    processes = []
    with FaultProxy(server.port) as proxy:
        try:
            cut_off = subprocess.Popen(command(proxy.url + "?socket_timeout=4&socket_connect_timeout=4"), env=env)
            processes.append(cut_off)
            first = _wait_for(log, lambda e: e[0] == "elected", 30, "no leader")
            assert first[1] == str(cut_off.pid)
            for _ in range(2):
                processes.append(subprocess.Popen(command(server.url), env=env))
            for process in processes:
                pid = str(process.pid)
                _wait_for(log, lambda e, pid=pid: e[0] == "started" and e[1] == pid, 30, "a candidate did not start")
            time.sleep(0.3)
            cut_at = time.monotonic()
            proxy.partition()
            bound = EXPIRE_AFTER + RENEW_PERIOD + SLACK
            successor = _wait_for(log, lambda e: e[0] == "elected" and e[1] != first[1], bound + 5, "no successor")
            assert float(successor[3]) - cut_at < bound
            revoked = _wait_for(log, lambda e: e[0] == "revoked" and e[1] == first[1], 5, "the cut-off leader")
            assert float(revoked[2]) < float(successor[3]), "the cut-off leader stepped down after its successor"
            # By its own clock, before its lease's deadline (the last one it saw), not when a reply or the renewer
            # told it the lease was gone.
            deadlines = [float(e[5]) for e in _events(log) if e[0] == "act" and e[1] == first[1]]
            assert float(revoked[2]) <= deadlines[-1], "the cut-off leader stepped down after its valid_until"
            proxy.heal()
            time.sleep(0.3)
            for process in processes:
                process.send_signal(signal.SIGTERM)
            for process in processes:
                assert process.wait(15) == 0
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait(10)
    _check(_events(log))
