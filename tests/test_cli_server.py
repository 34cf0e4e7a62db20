"""``hybridlock server``, the README's throw-away server: it prints the export line first, serves a server the
library and the other subcommands use, and stops it (its port refused, its files gone) on Ctrl-C, SIGTERM or
SIGHUP, exiting 0; its usage errors give 2, a server that cannot be started 125 (the README's own set-up steps run
in tests/test_docs.py)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import hybridlock
from hybridlock._cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE

pytestmark = [pytest.mark.server, pytest.mark.timeout(90)]

_EXPORT = re.compile(r"export REDIS_URL=(redis://127\.0\.0\.1:(\d+)/0) HYBRIDLOCK_SERVER_URL=\1")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HYBRIDLOCK_SERVER_URL", "REDIS_URL")}
    return {**env, **extra}


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """The servers a test started: killed (by pid) if the test left them running."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return True
    return False


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_it_prints_the_export_line_serves_and_stops_on_each_signal(started, stop):
    process = subprocess.Popen(
        [sys.executable, "-m", "hybridlock", "server"],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    found = _EXPORT.fullmatch(line)
    assert found, line
    url, port = found[1], int(found[2])
    # The line works as written: the library and the command line use the server it exports.
    with hybridlock.LockRegistry(url) as registry, registry.obtain("first-try") as lock:
        assert lock.fencing_token is not None
    env = _env()
    done = subprocess.run(
        ["bash", "-e", "-c", f"{line}\n{sys.executable} -m hybridlock run first-try -- sh -c 'echo ran'"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    assert done.stdout == "ran\n"
    process.send_signal(stop)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == EXIT_OK, stderr
    assert "stopped; its files are removed" in stderr
    assert "Traceback" not in stderr
    deadline = time.monotonic() + 10
    while not _refuses(port):
        assert time.monotonic() < deadline, "the server outlived the command"
        time.sleep(0.05)


@pytest.mark.parametrize("args", [("--port", "0"), ("--port", "x"), ("--bogus",)], ids=["port-0", "port-x", "bogus"])
def test_a_usage_error_gives_2(args: tuple[str, ...]):
    done = subprocess.run(
        [sys.executable, "-m", "hybridlock", "server", *args],
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_USAGE, done
    assert done.stdout == ""


def test_a_server_that_cannot_be_started_gives_125(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "hybridlock", "server"],
        env=_env(HYBRIDLOCK_REDIS_SERVER=str(tmp_path / "no-such-server")),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == EXIT_FAILED, done
    assert "no server could be started" in done.stderr
    assert "HYBRIDLOCK_REDIS_SERVER" in done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
