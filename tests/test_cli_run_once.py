"""``hybridlock run --at-least-for S [--at-most-for M] KEY -- CMD``: ``registry.run_once`` for cron on many hosts,
end to end as subprocesses against the suite's real server: the first runs CMD, every other skips at once saying who
ran it, the key is kept ``--at-least-for`` after the start, ``--at-most-for`` ends the hold and signals CMD."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridlock._cli.common import EXIT_FAILED, EXIT_HELD, EXIT_LOST, EXIT_USAGE
from tests._polling import until
from tests.test_cli import _cli, _start, stopper  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def _serverless(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line with no server in its environment."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HYBRIDLOCK_")}
    return subprocess.run(
        [sys.executable, "-m", "hybridlock", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_first_runs_the_command_and_the_key_is_kept_after_it(server, redis_client):
    ran = _cli(
        server, "run", "--at-least-for", "30", "nightly", "--", "sh", "-c", 'echo "$HYBRIDLOCK_FENCING_TOKEN"; exit 3'
    )
    assert ran.returncode == 3, ran.stderr  # the command's own status
    assert int(ran.stdout) > 0  # it held the lock, with its fencing token

    # The command is over, the key is kept: another host (and this one again) skips at once, told who ran it.
    value = redis_client.get("hybridlock:{nightly}")
    assert value is not None
    assert value.endswith(b":ran")
    assert 0 < redis_client.pttl("hybridlock:{nightly}") <= 30_000
    start = time.monotonic()
    skipped = _cli(server, "run", "--at-least-for", "30", "nightly", "--", "sh", "-c", "echo ran-again")
    assert time.monotonic() - start < 15  # no waiting (the bound is the subprocess start-up on a loaded machine)
    assert skipped.returncode == EXIT_HELD, skipped.stderr
    assert "ran-again" not in skipped.stdout
    owner = value.decode()[: -len(":ran")]
    assert "skipped 'nightly'" in skipped.stderr
    assert owner in skipped.stderr
    assert "KEPT" in skipped.stderr
    assert ":ran" not in skipped.stderr

    # inspect shows the owner that ran it, kept rather than holding.
    shown = _cli(server, "inspect", "--json", "nightly")
    assert shown.returncode == 0, shown.stderr
    holder = json.loads(shown.stdout)["locks"][0]["holder"]
    assert holder["owner"] == owner
    assert holder["kept"] is True
    assert "KEPT" in _cli(server, "inspect", "nightly").stdout


def test_the_key_is_free_again_once_at_least_for_has_passed(server):
    first = _cli(server, "run", "--at-least-for", "0.5", "often", "--", "true")
    assert first.returncode == 0, first.stderr
    start = time.monotonic()
    # Skipped until half a second after the first run's start, then run (polled: the start-up of each try varies).
    until(lambda: _cli(server, "run", "--at-least-for", "0.5", "often", "--", "true").returncode == 0, timeout=20)
    assert time.monotonic() - start < 15


def test_a_run_under_way_makes_the_others_skip(server, tmp_path, stopper):  # noqa: F811 (the fixture)
    started, finish = tmp_path / "started", tmp_path / "finish"
    script = f'echo up > "{started}"; while [ ! -e "{finish}" ]; do sleep 0.05; done'
    first = _start(server, "run", "--at-least-for", "0.2", "job", "--", "sh", "-c", script)
    stopper.append(first)
    until(started.exists, what="the first command to start")
    second = _cli(server, "run", "--at-least-for", "0.2", "job", "--", "sh", "-c", "echo second")
    assert second.returncode == EXIT_HELD, second.stderr
    assert "second" not in second.stdout
    assert "skipped 'job'" in second.stderr
    assert "held by" in second.stderr
    assert "KEPT" not in second.stderr  # it is running, not over
    Path(finish).touch()
    _, stderr = first.communicate(timeout=30)
    assert first.returncode == 0, stderr


def test_at_most_for_ends_the_hold_and_signals_the_command(server, redis_client, tmp_path, stopper):  # noqa: F811
    started, got = tmp_path / "started", tmp_path / "got"
    script = f'trap \'echo TERM > "{got}"; exit 0\' TERM; echo up > "{started}"; while :; do sleep 0.05; done'
    options = ("--at-least-for", "0.5", "--at-most-for", "1.5", "--expire-after", "10")
    process = _start(server, "run", *options, "stuck", "--", "sh", "-c", script)
    stopper.append(process)
    until(started.exists, what="the command to start")
    start = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == EXIT_LOST, stderr
    assert got.read_text().strip() == "TERM"  # told, by --lost-signal
    assert time.monotonic() - start < 10  # at the bound, not at the 10 s lease
    assert "at_most_for" in stderr
    assert redis_client.get("hybridlock:{stuck}") is None  # the hold ended with it


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--at-most-for", "5"), "--at-most-for goes with --at-least-for"),
        (("--at-least-for", "5", "--at-most-for", "1"), "--at-most-for (1 s) must not be shorter"),
        (("--at-least-for", "0"), "--at-least-for must be a positive"),
        (("--at-least-for", "5", "--timeout", "1"), "not allowed with argument"),
        (("--at-least-for", "5", "--no-wait"), "not allowed with argument"),
    ],
)
def test_bad_bounds_are_usage_errors_told_before_any_server_is_asked(args, said):
    # No server is given at all: the bounds are refused first.
    refused = _serverless("run", *args, "k", "--", "true")
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert said in refused.stderr


def test_an_unreachable_server_gives_125_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    failed = _serverless(
        "run", "--server", "redis://127.0.0.1:1", "--at-least-for", "5", "k", "--", "touch", str(marker)
    )
    assert failed.returncode == EXIT_FAILED, failed.stderr
    assert not marker.exists()


def test_release_force_frees_a_key_kept_after_a_run(server, redis_client):
    # The operator's way out works on a kept key too: inspect shows it as its owner's, release deletes what it holds.
    ran = _cli(server, "run", "--at-least-for", "60", "kept", "--", "true")
    assert ran.returncode == 0, ran.stderr
    assert redis_client.get("hybridlock:{kept}").endswith(b":ran")
    released = _cli(server, "release", "--force", "--yes", "kept")
    assert released.returncode == 0, released.stderr
    assert redis_client.get("hybridlock:{kept}") is None
    assert _cli(server, "run", "--at-least-for", "60", "kept", "--", "true").returncode == 0
