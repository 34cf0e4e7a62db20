"""``python -m hybridlock demo``: against the suite's server, with a server of its own, and with no binary at all."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from hybridlock.__main__ import main
from hybridlock._cli.common import EXIT_FAILED, EXIT_NOT_DONE, EXIT_USAGE
from hybridlock._cli.demo import DemoSettings, _report


@pytest.mark.server
def test_demo_count_is_exact_on_the_session_server(server, capsys):
    status = main(
        ["demo", "--server", server.url, "--processes", "2", "--threads", "3", "--cycles", "20", "--key", "t-demo"]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "expected count: 120\n" in out
    assert "actual count:   120\n" in out
    assert "OK: count is exact" in out


@pytest.mark.server
def test_demo_runs_for_a_duration(server, capsys):
    status = main(["demo", "--server", server.url, "--processes", "2", "--threads", "2", "--seconds", "0.5"])
    captured = capsys.readouterr()
    assert status == 0, captured.out
    assert "cycles/s" in captured.out
    assert "OK: count is exact" in captured.out
    # stderr is not a terminal here: progress comes as whole lines, with no carriage returns.
    assert "\r" not in captured.err
    assert "100%" in captured.err


@pytest.mark.server
def test_demo_starts_and_stops_its_own_server():
    result = subprocess.run(
        [sys.executable, "-m", "hybridlock", "demo", "--processes", "2", "--threads", "2", "--cycles", "50"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Started " in result.stdout
    assert "expected count: 200\n" in result.stdout
    assert "OK: count is exact" in result.stdout


def test_demo_without_a_server_binary_says_so():
    env = {**os.environ, "HYBRIDLOCK_REDIS_SERVER": "/nonexistent/redis-server"}
    result = subprocess.run(
        [sys.executable, "-m", "hybridlock", "demo"], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == EXIT_FAILED
    assert "HYBRIDLOCK_REDIS_SERVER" in result.stderr
    assert "/nonexistent/redis-server" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_reports_an_unreachable_server(capsys):
    # Port 1 on loopback: nothing listens there, so the connection is refused at once.
    assert main(["demo", "--server", "redis://127.0.0.1:1/0", "--cycles", "1"]) == EXIT_FAILED
    assert "cannot use the server at redis://127.0.0.1:1/0" in capsys.readouterr().err


def test_no_subcommand_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--processes", "--threads", "--cycles", "--seconds"])
def test_demo_rejects_non_positive_numbers(flag, capsys):
    with pytest.raises(SystemExit) as exc_info:
        main(["demo", flag, "0"])
    assert exc_info.value.code == 2
    assert "must be greater than 0" in capsys.readouterr().err


@pytest.mark.server
def test_demo_report_fails_on_a_lost_update(redis_client, capsys):
    # What the demo prints when exclusion failed: one increment of 10 went missing.
    settings = DemoSettings("unused", processes=2, threads=1, cycles=5, key="t-lost")
    redis_client.set(settings.counter_key, 9)
    assert _report(settings, redis_client, [5, 5], elapsed=1.0, failures=[]) == 1
    out = capsys.readouterr().out
    assert "FAILED: count is off by -1" in out
    assert "OK" not in out


@pytest.mark.server
def test_demo_takes_server_and_warns_of_redis(server, capsys):
    """Issue 21: the demo took --redis where every other subcommand takes --server; --redis still works, warned."""
    args = ["--processes", "1", "--threads", "2", "--cycles", "10"]
    assert main(["demo", "--server", server.url, *args]) == 0
    captured = capsys.readouterr()
    assert "OK: count is exact" in captured.out
    assert "deprecated" not in captured.err
    assert main(["demo", "--redis", server.url, *args]) == 0
    captured = capsys.readouterr()
    assert "OK: count is exact" in captured.out
    assert "hybridlock demo: warning: --redis is deprecated, use --server URL" in captured.err
    assert main(["demo", "--redis", server.url, "--server", "redis://127.0.0.1:1/0", *args]) == EXIT_USAGE
    assert "--server and --redis name different servers" in capsys.readouterr().err


@pytest.mark.server
def test_demo_control_without_the_lock_comes_out_wrong(server, capsys):
    """Issue 21: the demo showed only that nothing goes wrong. Its control, the same run without the lock, loses
    increments (the GET then SET race the lock prevents) and exits 1. Eight threads of 200 cycles: for none of 1,600
    read-then-write cycles to overlap another is beyond chance."""
    args = ["demo", "--server", server.url, "--processes", "2", "--threads", "4", "--cycles", "200", "--key", "ctl"]
    assert main([*args, "--no-lock"]) == EXIT_NOT_DONE
    out = capsys.readouterr().out
    assert "WITHOUT the lock" in out
    assert "expected count: 1600\n" in out
    actual = int(re.search(r"actual count: +(\d+)", out).group(1))  # type: ignore[union-attr]
    assert actual < 1600
    assert "WRONG, as expected without the lock" in out
    assert main(args) == 0
    assert "actual count:   1600\n" in capsys.readouterr().out
