"""The command line end to end: ``python -m hybridlock run / inspect / list / release`` as subprocesses against the
suite's real server; exit statuses, signals, lease loss, fencing tokens, queue order and force release."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._cli.common import EXIT_FAILED, EXIT_HELD, EXIT_LOST, EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_USAGE
from hybridlock._cli.inspection import glob_matcher
from tests._polling import until

pytestmark = [pytest.mark.server, pytest.mark.timeout(90)]

_PY = sys.executable


def _env(server: Any, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "HYBRIDLOCK_REGISTRY_KEY"}
    return {**env, "HYBRIDLOCK_SERVER_URL": server.url, **extra}


def _cli(server: Any, *args: str, timeout: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    # No terminal for stdin (even when the suite runs in one): the CLI would take a SIGINT for a typed Ctrl-C.
    return subprocess.run(
        [_PY, "-m", "hybridlock", *args],
        env=_env(server, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start(server: Any, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [_PY, "-m", "hybridlock", *args],
        env=_env(server, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def registry(make_registry: Any) -> hybridlock.LockRegistry:
    return make_registry()


@pytest.fixture
def stopper() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started: killed (by pid) if the test left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


# -- run ----------------------------------------------------------------------------------------------------------


def test_run_exits_with_the_commands_status_and_exports_the_token(server, redis_client):
    script = 'echo "$HYBRIDLOCK_FENCING_TOKEN $HYBRIDLOCK_KEY $HYBRIDLOCK_REGISTRY_KEY"; exit 3'
    tokens = []
    for _ in range(3):
        result = _cli(server, "run", "job", "--", "sh", "-c", script)
        assert result.returncode == 3, result.stderr
        token, key, registry_key = result.stdout.split()
        assert (key, registry_key) == ("job", "hybridlock")
        tokens.append(int(token))
    assert tokens == sorted(set(tokens)), "fencing tokens must increase from run to run"
    assert not redis_client.exists("hybridlock:{job}"), "the lock was not released after the command"


def test_run_excludes_a_library_holder_and_the_token_is_the_librarys(server, registry):
    lock = registry.obtain("shared")
    with lock:
        held_token = lock.fencing_token
    result = _cli(server, "run", "shared", "--", "sh", "-c", 'echo "$HYBRIDLOCK_FENCING_TOKEN"')
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > held_token
    with lock:
        assert lock.fencing_token > int(result.stdout)


def test_no_wait_fails_at_once_when_held(server, registry, tmp_path):
    marker = tmp_path / "ran"
    with registry.obtain("busy"):
        start = time.monotonic()
        result = _cli(server, "run", "--no-wait", "busy", "--", "touch", str(marker))
        assert result.returncode == EXIT_HELD, result.stderr
        assert time.monotonic() - start < 15
    assert "held by another owner" in result.stderr
    assert not marker.exists(), "the command ran without the lock"


def test_timeout_gives_its_own_status(server, registry, tmp_path):
    marker = tmp_path / "ran"
    with registry.obtain("slow"):
        start = time.monotonic()
        result = _cli(server, "run", "--timeout", "0.5", "slow", "--", "touch", str(marker))
        elapsed = time.monotonic() - start
    assert result.returncode == EXIT_TIMEOUT, result.stderr
    assert 0.5 <= elapsed < 20
    assert not marker.exists()


@pytest.mark.parametrize("spelt", ["-1", "-1.0", "inf"])
def test_timeout_minus_one_waits_as_long_as_it_takes(server, registry, redis_client, tmp_path, stopper, spelt):
    """Issue 34: ``--timeout -1`` means what ``acquire(timeout=-1)`` and Django's ``--lock-timeout -1`` mean (it was
    refused with status 2)."""
    marker = tmp_path / "ran"
    with registry.obtain("forever"):
        process = _start(server, "run", "--timeout", spelt, "forever", "--", "touch", str(marker))
        stopper.append(process)
        until(
            lambda: process.poll() is not None or redis_client.zcard("hybridlock:{forever}:queue"),
            what="the CLI to queue (or end)",
        )
        assert process.poll() is None, process.communicate(timeout=30)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert marker.exists()


@pytest.mark.parametrize("value", ["-2", "-0.5", "nan", "1e300", "soon"])
def test_a_timeout_no_acquire_takes_is_a_usage_error(server, value):
    result = _cli(server, "run", "--timeout", value, "k", "--", "true")
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "--timeout" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_lock_is_taken_when_the_holder_lets_go(server, registry):
    lock = registry.obtain("turn")
    held = threading.Event()

    def hold_briefly() -> None:
        with lock:
            held.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold_briefly)
    holder.start()
    held.wait(30)
    result = _cli(server, "run", "--timeout", "20", "turn", "--", "true")
    holder.join(30)
    assert result.returncode == 0, result.stderr


def test_a_signalled_command_gives_128_plus_the_signal(server, redis_client):
    result = _cli(server, "run", "k", "--", "sh", "-c", "kill -KILL $$")
    assert result.returncode == 128 + signal.SIGKILL
    assert not redis_client.exists("hybridlock:{k}")


def test_a_missing_command_gives_127(server, redis_client):
    result = _cli(server, "run", "k", "--", "no-such-command-anywhere")
    assert result.returncode == EXIT_NOT_FOUND
    assert "not found" in result.stderr
    assert not redis_client.exists("hybridlock:{k}")


def _trapping_child(tmp_path: Path, trapped: str, status: int) -> tuple[list[str], Path, Path]:
    """A shell command that records its start, and on signal ``trapped`` records it and exits ``status``."""
    started, got = tmp_path / "started", tmp_path / "got"
    script = f'trap \'echo {trapped} > "{got}"; exit {status}\' {trapped}; echo up > "{started}"; '
    script += "while :; do sleep 0.05; done"
    return ["sh", "-c", script], started, got


def test_sigterm_reaches_the_command_and_its_status_is_returned(server, redis_client, tmp_path, stopper):
    command, started, got = _trapping_child(tmp_path, "TERM", 7)
    process = _start(server, "run", "term", "--", *command)
    stopper.append(process)
    until(started.exists, what="the command to start")
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=30)
    assert process.returncode == 7
    assert got.read_text().strip() == "TERM"
    assert not redis_client.exists("hybridlock:{term}")


def test_sigint_is_forwarded_too_when_not_typed_at_a_terminal(server, tmp_path, stopper):
    command, started, got = _trapping_child(tmp_path, "INT", 9)
    process = _start(server, "run", "int", "--", *command)
    stopper.append(process)
    until(started.exists, what="the command to start")
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert process.returncode == 9
    assert got.read_text().strip() == "INT"


@pytest.mark.parametrize("name", ["HUP", "USR1", "USR2"])
def test_hup_and_usr_signals_reach_the_command(server, tmp_path, stopper, name):
    command, started, got = _trapping_child(tmp_path, name, 5)
    process = _start(server, "run", "other-signals", "--", *command)
    stopper.append(process)
    until(started.exists, what="the command to start")
    process.send_signal(signal.Signals[f"SIG{name}"])
    process.communicate(timeout=30)
    assert process.returncode == 5
    assert got.read_text().strip() == name


def test_sighup_while_waiting_ends_the_wait_and_usr1_does_not(server, registry, redis_client, tmp_path, stopper):
    marker = tmp_path / "ran"
    with registry.obtain("hup"):
        process = _start(server, "run", "hup", "--", "touch", str(marker))
        stopper.append(process)
        until(lambda: redis_client.zcard("hybridlock:{hup}:queue"), what="the CLI to queue")
        process.send_signal(signal.SIGUSR1)  # ignored while waiting: nobody to pass it to yet
        time.sleep(0.3)
        assert process.poll() is None
        process.send_signal(signal.SIGHUP)
        process.communicate(timeout=30)
        assert process.returncode == 128 + signal.SIGHUP
        assert redis_client.zcard("hybridlock:{hup}:queue") == 0, "the queue place was left behind"
    assert not marker.exists()


def test_sigterm_while_waiting_ends_the_wait_and_leaves_the_queue(server, registry, redis_client, tmp_path, stopper):
    marker = tmp_path / "ran"
    with registry.obtain("queued"):
        process = _start(server, "run", "queued", "--", "touch", str(marker))
        stopper.append(process)
        until(lambda: redis_client.zcard("hybridlock:{queued}:queue"), what="the CLI to queue")
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        assert process.returncode == 128 + signal.SIGTERM
        assert redis_client.zcard("hybridlock:{queued}:queue") == 0, "the queue place was left behind"
    assert not marker.exists()


@pytest.mark.parametrize("how", ["force-release", "del"])
def test_a_lost_lease_signals_the_command_and_gives_its_own_status(server, redis_client, tmp_path, stopper, how):
    command, started, got = _trapping_child(tmp_path, "USR1", 0)
    process = _start(server, "run", "--expire-after", "0.6", "--lost-signal", "USR1", "lease", "--", *command)
    stopper.append(process)
    until(started.exists, what="the command to start")
    if how == "del":
        assert redis_client.delete("hybridlock:{lease}") == 1
    else:
        released = _cli(server, "release", "--force", "--yes", "lease")
        assert released.returncode == 0, released.stderr
    start = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - start < 15  # the renewal every 0.2 s notices the loss
    assert process.returncode == EXIT_LOST, stderr
    assert got.read_text().strip() == "USR1"
    assert "was lost" in stderr


def test_kill_after_ends_a_command_that_ignores_the_lost_signal(server, redis_client, tmp_path, stopper):
    started = tmp_path / "started"
    script = f'trap "" TERM; echo up > "{started}"; while :; do sleep 0.05; done'
    options = ("--expire-after", "0.6", "--kill-after", "0.5")
    process = _start(server, "run", *options, "stubborn", "--", "sh", "-c", script)
    stopper.append(process)
    until(started.exists, what="the command to start")
    redis_client.delete("hybridlock:{stubborn}")
    process.communicate(timeout=30)
    assert process.returncode == EXIT_LOST


# -- the command dies with its runner ---------------------------------------------------------------------------

_LINUX_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a subreaper and /proc: Linux only")

# A command that starts what commands start, each process appending its pid to the file argv[1]: a shell pipeline,
# a job a shell put in the background, and a daemon (setsid, its parent gone at once). Then it works for ever.
_TREE = """
import os, subprocess, sys, time
pids = sys.argv[1]
def record(pid):
    with open(pids, "a") as out:
        out.write(f"{pid}\\n")
record(os.getpid())
both = f"sh -c 'echo $$ >> {pids}; exec sleep 600' | sh -c 'echo $$ >> {pids}; exec sleep 600'"
record(subprocess.Popen(["sh", "-c", both]).pid)
record(subprocess.Popen(["sh", "-c", f"sleep 600 & echo $! >> {pids}; wait"]).pid)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        record(os.getpid())
        time.sleep(600)
    os._exit(0)
time.sleep(600)
"""
_TREE_SIZE = 7  # the script, the pipeline's shell and its two ends, the background shell and its job, the daemon

# Run as the second holder's command: prints every process of argv[1]'s "pid start-time" lines still alive.
_STILL_ALIVE = """
import sys
for line in open(sys.argv[1]):
    pid, started = line.split()
    try:
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    except OSError:
        continue
    if fields[19] == started and fields[0] not in "ZX":
        print(pid)
"""


def _started_at(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, from /proc), which tells it from a later one given the same
    pid; None once it has ended (a zombie has ended)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields[19]


def _kill_leftovers(stamps: dict[int, str]) -> None:
    for pid, started in stamps.items():
        if _started_at(pid) == started:
            os.kill(pid, signal.SIGKILL)


@_LINUX_ONLY
def test_a_killed_runner_takes_its_command_and_all_it_started_along(server, redis_client, tmp_path, stopper):
    """SIGKILL of `hybridlock run` (no chance to clean up): by the time another runner holds the lock, no process
    of the first command's is alive, however it was started."""
    tree, pids, stamps_file = tmp_path / "tree.py", tmp_path / "pids", tmp_path / "stamps"
    tree.write_text(_TREE)
    first = _start(server, "run", "--expire-after", "2", "work", "--", _PY, str(tree), str(pids))
    stopper.append(first)
    stamps: dict[int, str] = {}
    try:
        until(
            lambda: pids.exists() and len(pids.read_text().split()) == _TREE_SIZE,
            what="the command to start its processes",
        )
        for pid in map(int, pids.read_text().split()):
            started = _started_at(pid)
            assert started is not None, f"process {pid} of the command ended by itself"
            stamps[pid] = started
        stamps_file.write_text("".join(f"{pid} {started}\n" for pid, started in stamps.items()))
        assert redis_client.exists("hybridlock:{work}")
        first.kill()
        first.wait(timeout=30)  # (not communicate: a process left running would hold its output pipes open)
        (tmp_path / "check.py").write_text(_STILL_ALIVE)
        second = _cli(server, "run", "--timeout", "30", "work", "--", _PY, str(tmp_path / "check.py"), str(stamps_file))
        assert second.returncode == 0, second.stderr
        assert second.stdout.split() == [], "processes of the first command ran on while another runner held the lock"
    finally:
        _kill_leftovers(stamps)


@_LINUX_ONLY
def test_the_command_dies_with_the_process_that_keeps_it(server, redis_client, tmp_path, stopper):
    """The command's parent is a small keeper process (the runner's child); if it is killed, so is the command
    (PR_SET_PDEATHSIG), and the runner reports the command killed and releases the lock."""
    started = tmp_path / "started"
    script = f'echo "$$ $PPID" > "{started}.tmp"; mv "{started}.tmp" "{started}"; while :; do sleep 0.05; done'
    process = _start(server, "run", "kept", "--", "sh", "-c", script)
    stopper.append(process)
    until(started.exists, what="the command to start")
    pid, parent = map(int, started.read_text().split())
    stamp = _started_at(pid)
    try:
        assert parent != process.pid, "the command's parent is the runner itself"
        os.kill(parent, signal.SIGKILL)
        until(lambda: _started_at(pid) is None, what="the command to die with its keeper", timeout=10)
        process.communicate(timeout=30)
        assert process.returncode == 128 + signal.SIGKILL
        assert not redis_client.exists("hybridlock:{kept}")
    finally:
        _kill_leftovers({pid: stamp} if stamp else {})


@_LINUX_ONLY
def test_ctrl_c_at_a_terminal_reaches_the_command_once(server, tmp_path):
    """On a terminal, Ctrl-C's SIGINT goes to the whole foreground process group: the command gets it once (the
    runner does not pass it on again), and the keeper between them lives on to report the command's status."""
    import pty

    command, started, got = _trapping_child(tmp_path, "INT", 9)
    command[-1] = command[-1].replace(f'> "{got}"', f'>> "{got}"')  # a second SIGINT would add a line
    # A session of its own with the pseudo-terminal as its controlling terminal, the runner in its foreground.
    own_terminal = (
        "import os, sys; os.setsid(); os.close(os.open(os.ttyname(0), os.O_RDWR)); os.execvp(sys.argv[1], sys.argv[1:])"
    )
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [_PY, "-c", own_terminal, _PY, "-m", "hybridlock", "run", "tty", "--", *command],
            env=_env(server),
            stdin=terminal,
            stdout=terminal,
            stderr=terminal,
        )
        try:
            until(started.exists, what="the command to start")
            os.write(controller, b"\x03")
            assert process.wait(timeout=30) == 9
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
    finally:
        os.close(terminal)
        os.close(controller)
    assert got.read_text().split() == ["INT"]


def test_a_command_is_not_started_once_its_runner_is_gone(tmp_path):
    """The keeper finds the runner's end of the pipe closed before it starts the command: it never starts it."""
    from hybridlock._cli import keeper

    read, write = os.pipe()
    os.close(write)
    marker = tmp_path / "ran"
    try:
        result = subprocess.run(
            [_PY, "-I", "-S", keeper.__file__, str(read), "--", "touch", str(marker)], pass_fds=(read,), timeout=30
        )
    finally:
        os.close(read)
    assert result.returncode == 128 + signal.SIGKILL
    assert not marker.exists()


@_LINUX_ONLY
def test_kill_after_ends_what_the_command_started_too(server, redis_client, tmp_path, stopper):
    started = tmp_path / "started"
    script = f'trap "" TERM; sleep 600 & echo $! > "{started}.tmp"; mv "{started}.tmp" "{started}"; wait'
    options = ("--expire-after", "0.6", "--kill-after", "0.5")
    process = _start(server, "run", *options, "stubborn-tree", "--", "sh", "-c", script)
    stopper.append(process)
    until(started.exists, what="the command to start")
    job = int(started.read_text())
    stamp = _started_at(job)
    try:
        redis_client.delete("hybridlock:{stubborn-tree}")
        process.wait(timeout=30)  # (not communicate: a job left running would hold the output pipes open)
        assert process.returncode == EXIT_LOST
        assert _started_at(job) is None, "the command's background job outlived --kill-after"
    finally:
        _kill_leftovers({job: stamp} if stamp else {})


def test_no_server_given_fails_with_its_own_status(server):
    env = {key: value for key, value in os.environ.items() if key != "HYBRIDLOCK_SERVER_URL"}
    result = subprocess.run(
        [_PY, "-m", "hybridlock", "run", "k", "--", "true"], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == EXIT_USAGE
    assert "HYBRIDLOCK_SERVER_URL" in result.stderr


def test_passwords_are_never_printed(server):
    url = "redis://:sekrit-password@127.0.0.1:1/0"  # nothing listens on port 1: refused at once
    run = _cli(server, "run", "--server", url, "k", "--", "true")
    assert run.returncode == EXIT_FAILED
    inspect = _cli(server, "inspect", "k", HYBRIDLOCK_SERVER_URL=url)
    assert inspect.returncode == EXIT_FAILED
    for result in (run, inspect):
        assert "sekrit" not in result.stdout + result.stderr
        assert "127.0.0.1:1" in result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("userinfo", "what"), [("", "no password was given"), (":sekrit-wrong@", "the password given was refused")]
)
def test_a_refused_login_is_told_as_such_by_every_command(own_server, userinfo, what):
    with redis.Redis.from_url(own_server.url) as admin:
        admin.config_set("requirepass", "sekrit-right")
    url = f"redis://{userinfo}127.0.0.1:{own_server.port}/0"
    for args, status in (
        (("run", "k", "--", "true"), EXIT_FAILED),
        (("inspect", "k"), EXIT_FAILED),
        (("list",), EXIT_FAILED),
        (("release", "--force", "--yes", "k"), EXIT_FAILED),
    ):
        result = _cli(own_server, *args, HYBRIDLOCK_SERVER_URL=url)
        assert result.returncode == status, result
        assert "authentication failed" in result.stderr, result.stderr
        assert "for user 'default'" in result.stderr
        assert what in result.stderr
        assert "redis://user:password@host:port/db" in result.stderr
        assert f"127.0.0.1:{own_server.port}" in result.stderr
        assert "sekrit" not in result.stdout + result.stderr
        assert "unreachable" not in result.stderr
        assert "Traceback" not in result.stderr


def test_an_expire_after_that_looks_like_milliseconds_is_pointed_out(server, redis_client):
    result = _cli(server, "run", "--expire-after", "30000", "ms-job", "--", "true")
    assert result.returncode == 0, result.stderr  # a warning: the command still runs, with the lease asked for
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr  # said once, in the command's own words
    assert lines[0].startswith("hybridlock run: warning: --expire-after is in seconds: 30000 s is 8.3 h"), lines
    assert "did you mean 30 s?" in lines[0]
    quiet = _cli(server, "run", "--expire-after", "30", "ms-job", "--", "true")
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_the_help_documents_every_exit_status(server):
    result = _cli(server, "run", "--help")
    for status in (EXIT_HELD, EXIT_LOST, EXIT_TIMEOUT, EXIT_FAILED, 126, EXIT_NOT_FOUND):
        assert f"  {status} " in result.stdout
    assert "HYBRIDLOCK_FENCING_TOKEN" in result.stdout


# -- inspect and list ------------------------------------------------------------------------------------------------


def _inspect(server: Any, *keys: str) -> list[dict[str, Any]]:
    result = _cli(server, "inspect", "--json", *keys)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["server"] == server.url
    locks: list[dict[str, Any]] = document["locks"]
    return locks


def test_inspect_shows_a_fencing_counter_out_of_range_as_refused(server, redis_client):
    """A counter a lock user set at or above 2^53 - 1 makes every acquire raise FencingCounterError: inspect shows
    the number (also when written as ``1e19``, which the scripts read as a number too) and says so."""
    redis_client.set("hybridlock:{huge}:fence", str(2**53 + 1))
    redis_client.set("hybridlock:{exponent}:fence", "1e19")
    redis_client.set("hybridlock:{fine}:fence", "12345")
    counters = {state["key"]: state["fencing_counter"] for state in _inspect(server, "huge", "exponent", "fine")}
    assert counters == {"huge": 2**53 + 1, "exponent": 10**19, "fine": 12345}
    text = _cli(server, "inspect", "huge", "fine")
    assert text.returncode == 0, text.stderr
    assert f"fencing counter: {2**53 + 1} (at or above 2**53 - 1: every acquire is refused" in text.stdout
    assert "fencing counter: 12345\n" in text.stdout


def test_inspect_shows_holder_queue_in_order_and_fencing_counter(server, make_registry):
    holder = make_registry(expire_after=3.0)  # renewed every second: described by then
    waiters = [make_registry(), make_registry()]
    lock = holder.obtain("q")
    ready = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with lock:
            ready.set()
            release.wait(60)

    holding = threading.Thread(target=hold, name="holding-thread")
    holding.start()
    ready.wait(30)
    threads = []

    def take_and_give_back(waiter: hybridlock.LockRegistry) -> None:
        waiting_lock = waiter.obtain("q")
        if waiting_lock.acquire(timeout=60):
            waiting_lock.release()

    try:
        for waiter in waiters:
            thread = threading.Thread(target=take_and_give_back, args=(waiter,))
            thread.start()
            threads.append(thread)
            expected = len(threads)
            until(lambda n=expected: len(_inspect(server, "q")[0]["waiting"]) == n, what="the waiter to queue")

        def described() -> dict[str, Any] | None:
            # The holder by its renewer, the waiters by their wait keepers (after a second of waiting).
            (state,) = _inspect(server, "q")
            everyone = [state["holder"], *state["waiting"]]
            return state if state["holder"]["thread"] and all(o["pid"] for o in everyone) else None

        state = until(described, what="the holder's description")
        assert state["held"] is True
        assert state["holder"]["owner"] == holder.client_id
        assert state["holder"]["pid"] == os.getpid()
        assert state["holder"]["host"]
        assert state["holder"]["thread"] == "holding-thread"
        assert abs(state["holder"]["acquired_at"] - time.time()) < 60
        assert state["fencing_counter"] == lock.statistics().fencing_token
        assert 0 < state["lease_remaining_ms"] <= 3000
        assert [w["owner"] for w in state["waiting"]] == [w.client_id for w in waiters]
        assert [w["pid"] for w in state["waiting"]] == [os.getpid()] * 2

        text = _cli(server, "inspect", "q")
        assert text.returncode == 0
        assert holder.client_id in text.stdout
        assert "holding-thread" in text.stdout
        assert text.stdout.index(waiters[0].client_id) < text.stdout.index(waiters[1].client_id)
    finally:
        release.set()
        holding.join(30)
        for thread in threads:
            thread.join(60)


def test_inspect_a_free_lock(server, redis_client):
    (state,) = _inspect(server, "nothing-here")
    assert state["held"] is False
    assert state["holder"] is None
    assert state["waiting"] == []


def test_list_finds_held_locks_by_pattern_with_scan(server, registry):
    rw = registry.obtain_read_write("doc:1")
    with registry.obtain("job:1"), registry.obtain("job:2"), registry.obtain("other"), rw.write_lock():
        result = _cli(server, "list", "--json", "job:*")
        assert result.returncode == 0, result.stderr
        keys = [lock["key"] for lock in json.loads(result.stdout)["locks"]]
        assert keys == ["job:1", "job:2"]
        everything = json.loads(_cli(server, "list", "--json").stdout)["locks"]
        assert {(lock["key"], lock["kind"]) for lock in everything} == {
            ("job:1", "lock"),
            ("job:2", "lock"),
            ("other", "lock"),
            ("doc:1", "read-write"),
        }
        (doc,) = [lock for lock in everything if lock["kind"] == "read-write"]
        assert doc["writer"]["owner"] == registry.client_id
        text = _cli(server, "list")
        assert "job:1 [lock]: held by" in text.stdout
    after = json.loads(_cli(server, "list", "--json").stdout)["locks"]
    assert after == []


def test_list_pattern_is_a_redis_glob():
    assert glob_matcher("job:*").fullmatch("job:1")
    assert not glob_matcher("job:?").fullmatch("job:12")
    assert glob_matcher("a[bc]d").fullmatch("acd")
    assert not glob_matcher("a[^bc]d").fullmatch("abd")
    assert glob_matcher(r"a\*").fullmatch("a*")
    assert not glob_matcher(r"a\*").fullmatch("ab")


# -- release --force -------------------------------------------------------------------------------------------------


def test_force_release_wakes_the_waiter_and_the_holder_learns_at_renewal(server, make_registry, redis_client):
    holder, rival = make_registry(expire_after=30.0), make_registry()
    lock = holder.obtain("stuck")
    lost = threading.Event()
    lock.on_lost(lambda _lock: lost.set())
    lock.acquire()
    got: list[float] = []

    def wait() -> None:
        rival_lock = rival.obtain("stuck")
        if rival_lock.acquire(timeout=20):
            got.append(time.monotonic())
            rival_lock.release()

    waiter = threading.Thread(target=wait)
    waiter.start()
    until(lambda: redis_client.zcard("hybridlock:{stuck}:queue"), what="the rival to queue")
    start = time.monotonic()
    result = _cli(server, "release", "--force", "--yes", "stuck")
    assert result.returncode == 0, result.stderr
    assert holder.client_id in result.stdout
    waiter.join(30)
    assert got, "the waiter never got the lock"
    assert got[0] - start < 10, "the waiter slept out the 30 s lease instead of being woken"
    # The holder is told at its next renewal (here by hand, instead of waiting 10 s for the renewer).
    with pytest.raises(hybridlock.LockLostError):
        lock.renew()
    assert lock.lost
    assert lost.is_set()
    with pytest.raises(hybridlock.LockLostError):
        lock.release()


def test_force_release_asks_and_refuses_without_a_terminal(server, registry, redis_client):
    with registry.obtain("precious"):
        result = subprocess.run(
            [_PY, "-m", "hybridlock", "release", "--force", "precious"],
            env=_env(server),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 2
        assert "--yes" in result.stderr
        assert redis_client.get("hybridlock:{precious}") == registry.client_id.encode()


def test_force_release_of_a_free_lock_says_so(server, redis_client):
    result = _cli(server, "release", "--force", "--yes", "free")
    assert result.returncode == 1
    assert "not held" in result.stderr


def test_release_needs_force(server):
    assert _cli(server, "release", "k").returncode == 2


def test_force_release_of_a_writer(server, registry, redis_client):
    rw = registry.obtain_read_write("doc")
    rw.write_lock().acquire()
    result = _cli(server, "release", "--force", "--yes", "--read-write", "doc")
    assert result.returncode == 0, result.stderr
    assert not redis_client.exists("hybridlock:{doc}:writer")
    with pytest.raises(hybridlock.LockLostError):
        rw.write_lock().release()


def test_the_registry_key_comes_from_the_environment(server, make_registry):
    other = make_registry(registry_key="elsewhere")
    with other.obtain("k"):
        assert _inspect(server, "k")[0]["held"] is False
        result = _cli(server, "inspect", "--json", "k", HYBRIDLOCK_REGISTRY_KEY="elsewhere")
        assert json.loads(result.stdout)["locks"][0]["holder"]["owner"] == other.client_id
        held = _cli(server, "run", "--no-wait", "--registry-key", "elsewhere", "k", "--", "true")
        assert held.returncode == EXIT_HELD


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("redis+cluster://:hunter2@127.0.0.1:1", "redis+cluster://:***@127.0.0.1:1"),
        ("redis+sentinel://:hunter2@127.0.0.1:1/locks", "sentinel://locks/0"),
    ],
    ids=["cluster", "sentinel"],
)
@pytest.mark.parametrize("command", [["inspect", "k"], ["list"], ["release", "--force", "--yes", "k"]])
def test_an_unreachable_cluster_or_sentinel_service_is_named_without_its_password(server, url, named, command):
    # Nothing listens on port 1: the topology cannot be reached, which is said naming it, without its password.
    done = _cli(server, *command, "--server", url)
    assert done.returncode == EXIT_FAILED, done
    assert named in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


def test_force_release_of_read_holds_releases_every_reader(server, make_registry, redis_client):
    readers = [make_registry().obtain_read_write("shared") for _ in range(2)]
    for rw in readers:
        assert rw.read_lock().acquire(timeout=5)
    writer = make_registry().obtain_read_write("shared").write_lock()
    assert not writer.acquire(blocking=False)
    assert redis_client.zcard("hybridlock:{shared}:readers") == 2
    result = _cli(server, "release", "--force", "--yes", "--read-write", "shared")
    assert result.returncode == 0, result.stderr
    assert "read holds" in result.stdout
    assert redis_client.zcard("hybridlock:{shared}:readers") == 0
    assert writer.acquire(timeout=5)  # no reader left to wait for
    writer.release()
    for rw in readers:
        with pytest.raises(hybridlock.LockLostError):
            rw.read_lock().release()
