"""Quorum locks across processes on N = 3 and N = 5 real servers: exclusion (an overlap marker), an exact
non-atomic counter, and fencing tokens that never go back, with one server killed half-way."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import redis

from hybridlock.testing import EmbeddedServer
from tests import _quorum_workers

pytestmark = [
    pytest.mark.server,
    pytest.mark.slow(reason="spawned processes on quorums of their own, through server faults"),
    pytest.mark.timeout(120),
]

CTX = multiprocessing.get_context("spawn")
FAST = "?socket_timeout=0.5&socket_connect_timeout=0.5"


def test_processes_exclude_each_other_through_a_server_failure(quorum_servers: list[EmbeddedServer]) -> None:
    processes, threads, iterations = 3, 2, 12
    with EmbeddedServer() as data_server:
        data = redis.Redis.from_url(data_server.url)
        prefix = "quorum-processes"
        children = [
            CTX.Process(
                target=_quorum_workers.count_under_quorum_lock,
                args=([s.url + FAST for s in quorum_servers], data_server.url, prefix, threads, iterations),
            )
            for _ in range(processes)
        ]
        try:
            for child in children:
                child.start()
            # Kill one server once the workers are under way: the rest is a majority, and the lock goes on.
            deadline = time.monotonic() + 60
            while int(data.get(f"{prefix}:counter") or 0) < processes * threads * iterations // 3:
                assert time.monotonic() < deadline, "the workers made no progress"
                time.sleep(0.05)
            quorum_servers[0].kill()
            for child in children:
                child.join(90)
            assert [child.exitcode for child in children] == [0] * processes, data.lrange(f"{prefix}:errors", 0, 5)
            assert data.lrange(f"{prefix}:violations", 0, -1) == []
            assert int(data.get(f"{prefix}:counter") or 0) == processes * threads * iterations
            tokens = [int(t) for t in data.lrange(f"{prefix}:tokens", 0, -1)]
            assert tokens == sorted(tokens)  # a hand-off streak shares one token; a new tenancy's is higher
            assert len(set(tokens)) >= processes
        finally:
            for child in children:
                if child.is_alive():
                    child.kill()
                child.join(10)
            data.close()
