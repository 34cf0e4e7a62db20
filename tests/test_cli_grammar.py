"""One grammar and one exit-status table for every subcommand of ``python -m hybridlock``, as subprocesses against
the suite's real server: options anywhere before ``--``, ``run``'s CMD only after it, each row of
``EXIT_STATUSES`` given by every subcommand it names, and ``run --no-wait`` saying who holds the lock (the demo's
``--server`` and ``--no-lock`` control: test_demo.py; ``server``'s own rows: test_cli_server.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hybridlock._cli.common import (
    EXIT_CANNOT_RUN,
    EXIT_FAILED,
    EXIT_HELD,
    EXIT_NOT_DONE,
    EXIT_NOT_FOUND,
    EXIT_SIGNALLED,
    EXIT_STATUSES,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from tests._polling import until

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

_PY = sys.executable
_SUBCOMMANDS = ("run", "inspect", "list", "release", "demo")
_DOCS = Path(__file__).resolve().parent.parent / "docs" / "command-line.md"
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


# -- one grammar ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("run", "{key}", "--server", "{url}", "--", "sh", "-c", "echo ran $HYBRIDLOCK_KEY"),
        ("run", "--server", "{url}", "{key}", "--", "sh", "-c", "echo ran $HYBRIDLOCK_KEY"),
        ("run", "{key}", "--timeout", "5", "--server", "{url}", "--expire-after", "20", "--", "sh", "-c", "echo ran"),
    ],
    ids=["after-key", "before-key", "mixed"],
)
def test_run_takes_its_options_anywhere_before_the_dashes(server, redis_client, args):
    """Issue 21: `run KEY --server URL -- cmd` took --server for part of the command and said "no server given"."""
    done = _cli(*(arg.format(key="anywhere", url=server.url) for arg in args))
    assert done.returncode == 0, done
    assert done.stdout.startswith("ran"), done
    assert not redis_client.exists("hybridlock:{anywhere}")


def test_what_follows_the_dashes_is_the_commands_however_it_looks(server):
    done = _cli("run", "k", "--server", server.url, "--", "sh", "-c", 'echo "$@"', "sh", "--timeout", "5", "--")
    assert done.returncode == 0, done
    assert done.stdout == "--timeout 5 --\n"


def test_the_other_subcommands_take_their_options_anywhere(server, make_registry):
    registry = make_registry()
    with registry.obtain("a"), registry.obtain("b"):
        shown = _cli("inspect", "a", "--server", server.url, "b", "--json")
        assert shown.returncode == 0, shown
        assert [lock["key"] for lock in json.loads(shown.stdout)["locks"]] == ["a", "b"]
        listed = _cli("list", "a*", "--server", server.url, "--json")
        assert listed.returncode == 0, listed
        assert [lock["key"] for lock in json.loads(listed.stdout)["locks"]] == ["a"]
    free = _cli("release", "a", "--server", server.url, "--force", "--yes")
    assert free.returncode == EXIT_NOT_DONE, free
    assert "is not held" in free.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("run", "k", "touch", "{marker}"), "CMD goes after --: hybridlock run [options] k -- touch ..."),
        (("run", "k", "touch", "--server", "{url}"), "CMD goes after --: hybridlock run [options] k -- touch ..."),
        (("run", "k", "touch", "--", "touch", "{marker}"), "unexpected before --: touch"),
    ],
    ids=["plain", "an-option-after-it", "a-word-before-the-dashes"],
)
def test_a_command_not_after_the_dashes_is_refused_with_the_way_to_say_it(server, tmp_path, args, said):
    """`run KEY cmd` without `--` used to run cmd; with options allowed after KEY it would be ambiguous
    (`run KEY cmd --timeout 5`): refused before any lock or command, saying how to write it."""
    marker = tmp_path / "ran"
    done = _cli(*(arg.format(marker=marker, url=server.url) for arg in args), HYBRIDLOCK_SERVER_URL=server.url)
    assert done.returncode == EXIT_USAGE, done
    assert said in done.stderr
    assert not marker.exists()


# -- one exit-status table -----------------------------------------------------------------------------------------


def _statuses_of(subcommand: str) -> set[str]:
    return {status for status, _, where in EXIT_STATUSES if subcommand in where}


@pytest.mark.parametrize("subcommand", [*_SUBCOMMANDS, "server"])
def test_each_subcommands_help_shows_its_rows_of_the_table(subcommand):
    done = _cli(subcommand, "--help")
    assert done.returncode == 0, done
    shown = set(re.findall(r"^  (\d+(?:\+N)?) ", done.stdout.split("exit status:\n", 1)[1], re.MULTILINE))
    assert shown == _statuses_of(subcommand)


def test_the_docs_table_is_the_codes_table():
    text = _DOCS.read_text()
    section = text.split("## Exit statuses\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("status", "---:"):
            rows[cells[0]] = {name.strip("` ") for name in cells[2].split(",")}
    assert rows == {status: set(where) for status, _, where in EXIT_STATUSES}


_USAGE_ERROR = {
    "run": ("run", "k", "--bogus", "--", "true"),
    "inspect": ("inspect", "k", "--bogus"),
    "list": ("list", "--bogus"),
    "release": ("release", "--force", "k", "--bogus"),
    "demo": ("demo", "--bogus"),
}
_SERVER_NEEDED = {
    "run": ("run", "k", "--", "true"),
    "inspect": ("inspect", "k"),
    "list": ("list",),
    "release": ("release", "--force", "--yes", "k"),
}


def test_every_row_is_in_the_test():
    rows = {status for status, _, _ in EXIT_STATUSES}
    assert rows == {"0", "1", "2", "75", "122", "124", "125", "126", "127", "128+N"}  # each tested below


@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_a_usage_error_gives_2_from_every_subcommand(subcommand):
    done = _cli(*_USAGE_ERROR[subcommand])
    assert done.returncode == EXIT_USAGE, done
    assert "--bogus" in done.stderr


@pytest.mark.parametrize("subcommand", sorted(_SERVER_NEEDED))
def test_no_server_given_is_a_usage_error_from_every_subcommand(subcommand):
    """Issue 21: it was 125 from run and 2 from list."""
    done = _cli(*_SERVER_NEEDED[subcommand])
    assert done.returncode == EXIT_USAGE, done
    assert "no server given: use --server URL or set HYBRIDLOCK_SERVER_URL" in done.stderr


@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_an_unreachable_server_gives_125_from_every_subcommand(subcommand):
    args = ("demo", "--cycles", "1") if subcommand == "demo" else _SERVER_NEEDED[subcommand]
    done = _cli(args[0], "--server", _CLOSED, *args[1:])
    assert done.returncode == EXIT_FAILED, done
    assert "127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", ["redis//nope", "http://x:1", "redis://h:notaport"])
@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_a_malformed_server_url_is_a_usage_error_from_every_subcommand(subcommand, url):
    """Issue 34: run said 125 (unreachable) for a URL no server could have, the others 2."""
    args = ("demo", "--cycles", "1") if subcommand == "demo" else _SERVER_NEEDED[subcommand]
    done = _cli(args[0], "--server", url, *args[1:])
    assert done.returncode == EXIT_USAGE, done
    assert url in done.stderr
    assert "Traceback" not in done.stderr


def test_run_with_a_key_no_lock_can_have_is_a_usage_error():
    """Issue 34: an empty KEY ended run with a traceback and status 1."""
    done = _cli("run", "--server", _CLOSED, "--", "", "--", "true")
    assert done.returncode == EXIT_USAGE, done
    assert "lock key must not be empty" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_plain_no_gives_1(server):
    done = _cli("release", "--force", "--yes", "free-key", "--server", server.url)
    assert done.returncode == EXIT_NOT_DONE, done
    # The demo's: test_demo_control_without_the_lock_comes_out_wrong (test_demo.py).


def test_runs_own_rows(server, make_registry, tmp_path):
    ok = _cli("run", "own", "--server", server.url, "--", "sh", "-c", "exit 3")
    assert ok.returncode == 3, ok  # CMD's own status
    killed = _cli("run", "own", "--server", server.url, "--", "sh", "-c", "kill -TERM $$")
    assert killed.returncode == EXIT_SIGNALLED + signal.SIGTERM, killed
    assert _cli("run", "own", "--server", server.url, "--", "/nonexistent/x").returncode == EXIT_NOT_FOUND
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    assert _cli("run", "own", "--server", server.url, "--", str(script)).returncode == EXIT_CANNOT_RUN
    with make_registry().obtain("own"):
        held = _cli("run", "own", "--no-wait", "--server", server.url, "--", "true")
        assert held.returncode == EXIT_HELD, held
        waited = _cli("run", "own", "--timeout", "0.2", "--server", server.url, "--", "true")
        assert waited.returncode == EXIT_TIMEOUT, waited
    # 122, the lease lost while CMD ran: test_a_lost_lease_signals_the_command_and_gives_its_own_status (test_cli.py)


@pytest.mark.parametrize("subcommand", _SUBCOMMANDS)
def test_sigterm_before_the_end_gives_128_plus_it_from_every_subcommand(
    subcommand, server, make_registry, black_hole, started, redis_client
):
    """Every subcommand ends on SIGTERM through its clean-up with 143, an exit of its own (not a death by the
    signal, nor a traceback): the demo stops its workers and deletes its counter."""
    listener, hole = black_hole
    holder = None
    accepted = None
    if subcommand == "run":  # waiting for a lock held here
        holder = make_registry().obtain("sig")
        holder.acquire()
        process = _start("run", "sig", "--server", server.url, "--", "true")
        until(lambda: redis_client.zcard("hybridlock:{sig}:queue"), "the runner queued")
    elif subcommand == "demo":
        process = _start("demo", "--server", server.url, "--seconds", "60", "--key", "sig", "--threads", "1")
        assert process.stderr is not None
        process.stderr.readline()  # a progress line: the workers run
    else:
        process = _start(_SERVER_NEEDED[subcommand][0], "--server", hole, *_SERVER_NEEDED[subcommand][1:])
        listener.settimeout(30)
        accepted, _ = listener.accept()  # connected, and waiting for an answer that never comes
    started.append(process)
    time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    if holder is not None:
        holder.release()
    if accepted is not None:
        accepted.close()
    assert process.returncode == EXIT_SIGNALLED + signal.SIGTERM, (out, err)
    assert "Traceback" not in err
    if subcommand == "demo":
        assert not redis_client.exists("hybridlock-demo-counter:{sig}")
    if subcommand == "run":
        assert not redis_client.zcard("hybridlock:{sig}:queue")


# -- run --no-wait says who holds the lock -------------------------------------------------------------------------


def test_no_wait_refused_says_who_holds_the_lock(server, make_registry):
    """Issue 21: `--no-wait` refused said only "held by another owner"; now who (host, pid, since when), as
    `inspect` says it; --timeout too."""
    registry = make_registry(expire_after=3.0)  # renewed, and so described, every second
    with registry.obtain("whose"):
        holder = _described(server, "whose")
        for wait in (("--no-wait",), ("--timeout", "0.2")):
            done = _cli("run", "whose", *wait, "--server", server.url, "--", "true")
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
        done = _cli("run", "spread", "--no-wait", *(f"--server={url}" for url in urls), "--", "true")
    assert done.returncode == EXIT_HELD, done
    assert "'spread' could not be taken on a majority of the servers" in done.stderr
    assert f"{server.url}: held by {holder['owner']}, on {holder['host']} pid {holder['pid']}" in done.stderr
    assert f"{own_server.url}: free" in done.stderr
    assert f"{_CLOSED}: who holds it could not be read (Error 111" in done.stderr


@pytest.mark.parametrize(
    ("argv", "key", "command", "server"),
    [
        (["inspect", "--server", "redis://h/0", "--", "-k"], ["-k"], None, "redis://h/0"),
        (["inspect", "--", "-k", "--server"], ["-k", "--server"], None, None),
        (["release", "--force", "--server", "redis://h/0", "--", "-k"], "-k", None, "redis://h/0"),
        (["list", "--server", "redis://h/0", "--", "-*"], "-*", None, "redis://h/0"),
        (["run", "--server", "redis://h/0", "--", "-k", "--", "cmd", "--x"], "-k", ["cmd", "--x"], "redis://h/0"),
        (["run", "--", "-k", "--", "cmd"], "-k", ["cmd"], None),
        (["run", "k", "--server", "redis://h/0", "--", "cmd", "--", "x"], "k", ["cmd", "--", "x"], "redis://h/0"),
    ],
    ids=["inspect", "inspect-option-like-keys", "release", "list", "run", "run-bare", "run-plain-key"],
)
def test_a_key_that_starts_with_a_dash_goes_after_the_dashes(argv, key, command, server):
    """Found by review: with options anywhere, `inspect -- -k` said "KEY required" (argparse's intermixed parsing
    forgets what `--` means on Python 3.11), and `run` had no way to take such a key."""
    from hybridlock.__main__ import build_parser, parse_command_line

    args = parse_command_line(build_parser(), argv)
    assert key in (getattr(args, "keys", None), getattr(args, "key", None), getattr(args, "pattern", None))
    if command is not None:
        assert args.command == command
    assert args.server == ([server] if server else None)  # (a list: --server again for each quorum server)


def test_two_words_between_the_dashes_of_run_are_refused():
    done = _cli("run", "--", "-k", "extra", "--", "true")
    assert done.returncode == EXIT_USAGE, done
    assert "exactly one KEY" in done.stderr


def test_a_hang_up_ignored_as_nohup_ignores_it_stays_ignored(black_hole, started):
    """Found by review: SIGHUP ended every subcommand even under `nohup`, which starts it with SIGHUP ignored."""
    listener, hole = black_hole
    process = subprocess.Popen(
        ["nohup", _PY, "-m", "hybridlock", "inspect", "k", "--server", hole],
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    listener.settimeout(30)
    accepted, _ = listener.accept()  # connected, and waiting for an answer that never comes
    try:
        time.sleep(0.2)
        process.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        assert process.poll() is None, "SIGHUP ended the command under nohup"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == EXIT_SIGNALLED + signal.SIGTERM, (out, err)
    finally:
        accepted.close()
