"""What issue 21 asked of the command line, as subprocesses of ``python -m hybridlock`` against the suite's real
server: ``run --no-wait`` (and ``--timeout``) saying who holds the lock."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hybridlock._cli.run import EXIT_HELD, EXIT_TIMEOUT
from tests._polling import until

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

_PY = sys.executable
_CLOSED = "redis://127.0.0.1:1/0"  # nothing listens on port 1: refused at once


def _env(**extra: str) -> dict[str, str]:
    # No server from the environment: each test says where the server is, so --server is what is tested.
    env = {k: v for k, v in os.environ.items() if k not in ("HYBRIDLOCK_SERVER_URL", "HYBRIDLOCK_REGISTRY_KEY")}
    return {**env, **extra}


def _cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_PY, "-m", "hybridlock", *args],
        env=_env(**env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [_PY, "-m", "hybridlock", *args],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started: killed (by pid) if the test left them running."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


@pytest.fixture
def black_hole() -> Iterator[tuple[socket.socket, str]]:
    """A loopback port that takes connections and never answers: a command asking it waits (its socket timeout)."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        yield listener, f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    finally:
        listener.close()


def _described(server: Any, key: str) -> dict[str, Any]:
    """The holder of ``key`` once its registry has described it (host, pid, since when)."""

    def holder() -> dict[str, Any] | None:
        done = _cli("inspect", key, "--json", "--server", server.url)
        assert done.returncode == 0, done
        found: dict[str, Any] | None = json.loads(done.stdout)["locks"][0]["holder"]
        return found if found and found.get("pid") and found.get("acquired_at") else None

    return until(holder, f"the holder of {key!r} described")


# -- run --no-wait says who holds the lock -------------------------------------------------------------------------


def test_no_wait_refused_says_who_holds_the_lock(server, make_registry):
    """Issue 21: `--no-wait` refused said only "held by another owner"; now who (host, pid, since when), as
    `inspect` says it; --timeout too."""
    registry = make_registry(expire_after=3.0)  # renewed, and so described, every second
    with registry.obtain("whose"):
        holder = _described(server, "whose")
        for wait in (("--no-wait",), ("--timeout", "0.2")):
            done = _cli("run", *wait, "--server", server.url, "whose", "--", "true")
            assert done.returncode in (EXIT_HELD, EXIT_TIMEOUT), done
            said = done.stderr
            assert f"held by {holder['owner']}, on {holder['host']} pid {holder['pid']}" in said, said
            assert "thread 'MainThread'" in said
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(holder["acquired_at"]))
            assert f"since {stamp} UTC" in said, said
            assert " s left" in said


def test_no_wait_refused_over_a_quorum_says_each_servers_holder(server, own_server, make_registry):
    urls = [server.url, own_server.url, _CLOSED]
    registry = make_registry(expire_after=3.0)
    with registry.obtain("spread"):
        holder = _described(server, "spread")
        done = _cli("run", "--no-wait", *(f"--server={url}" for url in urls), "spread", "--", "true")
    assert done.returncode == EXIT_HELD, done
    assert "'spread' could not be taken on a majority of the servers" in done.stderr
    assert f"{server.url}: held by {holder['owner']}, on {holder['host']} pid {holder['pid']}" in done.stderr
    assert f"{own_server.url}: free" in done.stderr
    assert f"{_CLOSED}: who holds it could not be read (Error 111" in done.stderr
