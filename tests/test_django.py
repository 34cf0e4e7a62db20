"""hybridlock.contrib.django: the registry from ``settings.HYBRIDLOCK`` (one per process, across forks, closed at
exit) and ``LockedCommand`` (a management command that never runs twice at once), with Django's own test tools
(``override_settings``, ``call_command``) against a real server.

Two processes run the guarded command as ``manage.py`` does (``tests/_django_workers.py``): their exit statuses and
messages are what cron would see.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._extras import skip_reason

django = pytest.importorskip("django", reason=skip_reason("django", "django"))

from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import BaseCommand, CommandError  # noqa: E402
from django.test import SimpleTestCase, override_settings  # noqa: E402

import hybridlock  # noqa: E402
from hybridlock.contrib.django import (  # noqa: E402
    EXIT_FAILED,
    EXIT_HELD,
    EXIT_LOST,
    EXIT_TIMEOUT,
    LockedCommand,
    close_registry,
    get_registry,
    registry_from_settings,
)
from hybridlock.testing.server import EmbeddedServer  # noqa: E402
from tests._examples import checkout_env  # noqa: E402

if not settings.configured:
    settings.configure()  # no HYBRIDLOCK: each test gives its own with override_settings
    django.setup()

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def registry_key() -> str:
    return f"django-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def configured(server: EmbeddedServer, redis_client: object, registry_key: str) -> Iterator[dict[str, Any]]:
    """``settings.HYBRIDLOCK`` for this test: the session's server, a registry key of its own."""
    value = {"URL": server.url, "OPTIONS": {"registry_key": registry_key}}
    with override_settings(HYBRIDLOCK=value):
        yield value


class Nightly(LockedCommand, BaseCommand):
    """A command that records its runs; ``behaviour`` (a callable given the command) is its work."""

    lock_key = "nightly"

    def __init__(self, behaviour: Any = None) -> None:
        super().__init__()
        self.behaviour = behaviour
        self.ran = 0

    def handle(self, *args: Any, **options: Any) -> None:
        self.ran += 1
        assert self.command_lock is not None
        assert self.command_lock.is_held_by_current_thread()
        if self.behaviour is not None:
            self.behaviour(self)


# -- the registry --------------------------------------------------------------------------------------------------


@pytest.mark.server
def test_the_registry_is_built_once_from_the_settings(configured: dict[str, Any], registry_key: str) -> None:
    got: list[hybridlock.LockRegistry] = []
    start = threading.Barrier(8)

    def first_use() -> None:
        start.wait(10)
        got.append(get_registry())

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(15)
    assert len(got) == 8
    assert all(registry is got[0] for registry in got)
    registry = got[0]
    assert type(registry) is hybridlock.LockRegistry
    assert registry.registry_key == registry_key
    with registry.obtain("orders:42") as lock:
        assert lock.fencing_token is not None


@pytest.mark.server
def test_a_changed_setting_builds_a_new_registry_and_closes_the_old(
    configured: dict[str, Any], server: EmbeddedServer
) -> None:
    first = get_registry()
    with override_settings(HYBRIDLOCK={"URL": server.url, "OPTIONS": {"registry_key": "other"}}):
        second = get_registry()
        assert first.closed
        assert second is not first
        assert second.registry_key == "other"
    assert second.closed
    third = get_registry()
    assert third is not first
    assert not third.closed
    close_registry()
    assert third.closed
    assert get_registry() is not third


@pytest.mark.server
def test_options_reach_the_registry_and_a_sentinel_url_is_passed_on() -> None:
    with override_settings(
        HYBRIDLOCK={
            "URL": "redis+sentinel://:s3cret-master@127.0.0.1:1/locks",
            "OPTIONS": {"registry_key": "app", "expire_after": 12.5, "retain_for": 0.5},
        }
    ):
        registry = get_registry()  # (a Sentinel client connects at its first command)
        assert registry.expire_after == 12.5
        assert registry.registry_key == "app"
        assert "sentinel" in registry.server
        assert "s3cret-master" not in registry.server


@pytest.mark.server
def test_a_quorum_setting_builds_a_quorum_registry_and_guards_a_command(quorum_urls: list[str]) -> None:
    with override_settings(HYBRIDLOCK={"QUORUM": quorum_urls, "OPTIONS": {"registry_key": "q"}}):
        registry = get_registry()
        assert isinstance(registry, hybridlock.QuorumLockRegistry)
        command = Nightly()
        call_command(command)
        assert command.ran == 1
        with (
            hybridlock.QuorumLockRegistry(quorum_urls, "q") as other,
            other.obtain("nightly"),
            pytest.raises(CommandError, match="could not be taken on a majority") as refused,
        ):
            call_command(Nightly())
        assert refused.value.returncode == EXIT_HELD


_BAD: list[tuple[Any, str]] = [
    (None, r"settings\.HYBRIDLOCK is not set"),
    ("redis://localhost", r"settings\.HYBRIDLOCK must be a dict, not str"),
    ({"LOCATION": "redis://x"}, r"settings\.HYBRIDLOCK has unknown keys 'LOCATION'"),
    ({"OPTIONS": {}}, r"settings\.HYBRIDLOCK needs exactly one of 'URL' .* and 'QUORUM'"),
    ({"URL": "redis://x", "QUORUM": ["redis://y"]}, r"needs exactly one of 'URL'"),
    ({"URL": ""}, r"settings\.HYBRIDLOCK\['URL'\] must be a non-empty string"),
    ({"QUORUM": "redis://a,redis://b"}, r"settings\.HYBRIDLOCK\['QUORUM'\] must be a list of URLs"),
    ({"URL": "redis://x", "OPTIONS": []}, r"settings\.HYBRIDLOCK\['OPTIONS'\] must be a dict"),
    (
        {"URL": "redis://x", "OPTIONS": {"expire_afer": 3}},
        r"settings\.HYBRIDLOCK\['OPTIONS'\] has unknown options 'expire_afer': LockRegistry takes registry_key, "
        r"expire_after, ",
    ),
    (
        {"QUORUM": ["redis://a", "redis://b", "redis://c"], "OPTIONS": {"lock_type": "spin"}},
        r"unknown options 'lock_type': QuorumLockRegistry takes",
    ),
    (
        {"URL": "redis://:pass-word-1@127.0.0.1:6379/0", "OPTIONS": {"expire_after": -1}},
        r"settings\.HYBRIDLOCK \(redis://:\*\*\*@127\.0\.0\.1:6379/0\) is not a valid LockRegistry setting: "
        ".*expire_after",
    ),
    (
        {"URL": "redis://:pass-word-1@127.0.0.1:port/0"},
        r"settings\.HYBRIDLOCK \(redis://:\*\*\*@127\.0\.0\.1:port/0\) is not a valid LockRegistry setting: "
        "not a valid server URL",
    ),
]


@pytest.mark.parametrize(("value", "message"), _BAD, ids=[str(n) for n in range(len(_BAD))])
def test_a_bad_setting_is_improperly_configured_naming_it_never_the_password(value: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message) as raised:
        registry_from_settings(value)
    assert "pass-word-1" not in str(raised.value)
    assert raised.value.__cause__ is None
    with override_settings(HYBRIDLOCK=value), pytest.raises(ImproperlyConfigured, match=message):
        get_registry()  # the first use is where a project meets it


def test_importing_hybridlock_does_not_import_django() -> None:
    run = subprocess.run(
        [sys.executable, "-c", "import sys, hybridlock, hybridlock.backends; print('django' in sys.modules)"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


# -- fork ----------------------------------------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_of_a_fork_builds_its_own_registry(configured: dict[str, Any]) -> None:
    from tests.test_fork import Child

    parent = get_registry()
    held = parent.obtain("fork:held")
    assert held.acquire(blocking=False)

    def body(report: Any, wait_for_parent: Any) -> None:
        inherited = parent  # the parent's object, as the child sees it
        own = get_registry()
        facts = {
            "same_object": own is inherited,
            "inherited_closed": inherited.closed,
            "client_id": own.client_id,
            "takes_the_parents_lock": own.obtain("fork:held").acquire(blocking=False),
        }
        with own.obtain("fork:child") as lock:
            facts["took_its_own"] = lock.fencing_token is not None
        facts["again"] = get_registry() is own
        close_registry()
        facts["closed"] = own.closed
        report(facts)

    child = Child(body)
    facts = child.next_report(timeout=30)
    _, status = os.waitpid(child.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert facts == {
        "same_object": False,
        "inherited_closed": True,
        "client_id": facts["client_id"],
        "takes_the_parents_lock": False,
        "took_its_own": True,
        "again": True,
        "closed": True,
    }
    assert facts["client_id"] != parent.client_id
    # The parent's registry goes on as it was.
    assert get_registry() is parent
    assert not parent.closed
    assert held.is_held_by_current_thread()
    held.release()
    assert not held.locked()


# -- LockedCommand, in this process --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"lock_timeout": 1e300}, "lock_timeout: timeout must be at most"),
        ({"lock_timeout": -2}, "lock_timeout: timeout value must be a non-negative number or -1"),
        ({"lock_timeout": None}, "lock_timeout: timeout must be a number of seconds, not None"),
        ({"lock_key": 42}, "lock_key must be None or a str"),
    ],
)
def test_a_command_every_run_would_refuse_is_refused_when_declared(attributes: dict[str, Any], message: str) -> None:
    """Issue 34: these were accepted when the class was defined, and every run failed."""
    with pytest.raises(hybridlock.InvalidArgumentError, match=message):
        type("Bad", (LockedCommand, BaseCommand), attributes)


def test_the_bounds_a_run_takes_are_accepted_when_declared() -> None:
    for timeout in (0, -1, 2.5, float("inf"), 9e9):
        type("Fine", (LockedCommand, BaseCommand), {"lock_timeout": timeout, "lock_key": "k"})


@pytest.mark.server
def test_a_command_runs_holding_its_lock_and_releases_it(configured: dict[str, Any]) -> None:
    command = Nightly()
    call_command(command)
    call_command(command, lock_key="nightly:eu")
    assert command.ran == 2
    assert command.command_lock is None
    registry = get_registry()
    assert not registry.held_locks()
    with hybridlock.LockRegistry(configured["URL"], configured["OPTIONS"]["registry_key"]) as other:
        for key in ("nightly", "nightly:eu"):
            assert other.obtain(key).acquire(blocking=False)
            other.obtain(key).release()


@pytest.mark.server
def test_a_command_whose_lock_is_held_does_not_run(configured: dict[str, Any]) -> None:
    command = Nightly()
    with (
        hybridlock.LockRegistry(configured["URL"], configured["OPTIONS"]["registry_key"]) as other,
        other.obtain("nightly"),
    ):
        with pytest.raises(CommandError) as refused:
            call_command(command)
        assert refused.value.returncode == EXIT_HELD == 75
        message = str(refused.value)
        assert "did not start" in message
        assert "'nightly'" in message
        assert "held by another run" in message
        assert "--lock-timeout" in message
        assert "hybridlock inspect nightly" in message

        started = time.monotonic()
        with pytest.raises(CommandError, match=r"timed out after 0\.2 s waiting for its lock 'nightly'") as late:
            call_command(command, lock_timeout=0.2)
        assert late.value.returncode == EXIT_TIMEOUT == 124
        assert time.monotonic() - started >= 0.2

        # The lock is per key: another key runs.
        call_command(command, lock_key="nightly:eu")
    assert command.ran == 1


@pytest.mark.server
def test_a_command_given_a_timeout_waits_for_the_run_before_it(configured: dict[str, Any]) -> None:
    other = hybridlock.LockRegistry(configured["URL"], configured["OPTIONS"]["registry_key"])
    taken, finish, released_at = threading.Event(), threading.Event(), []

    def earlier_run() -> None:
        with other.obtain("nightly"):
            taken.set()
            finish.wait(15)
            released_at.append(time.monotonic())

    thread = threading.Thread(target=earlier_run)
    thread.start()
    try:
        assert taken.wait(15)
        started: list[float] = []
        command = Nightly(lambda command: started.append(time.monotonic()))
        threading.Timer(0.2, finish.set).start()
        call_command(command, lock_timeout=15)
        assert command.ran == 1
        assert started[0] >= released_at[0]
    finally:
        finish.set()
        thread.join(15)
        other.close()


@pytest.mark.server
def test_the_lock_is_released_when_the_command_fails(configured: dict[str, Any]) -> None:
    def fail(command: Any) -> None:
        raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        call_command(Nightly(fail))
    with hybridlock.LockRegistry(configured["URL"], configured["OPTIONS"]["registry_key"]) as other:
        assert other.obtain("nightly").acquire(blocking=False)
        other.obtain("nightly").release()


@pytest.mark.server
def test_a_lease_lost_while_the_command_ran_ends_it_with_the_lost_status(
    server: EmbeddedServer, redis_client: Any, registry_key: str
) -> None:
    lost = threading.Event()

    def lose_the_lease(command: Any) -> None:
        get_registry().on_lost(lambda lock: lost.set())
        redis_client.delete(f"{registry_key}:{{nightly}}")  # as a FLUSHALL or a failover would
        assert lost.wait(10), "the renewer never found the lease lost"

    value = {"URL": server.url, "OPTIONS": {"registry_key": registry_key, "expire_after": 0.3}}
    with (
        override_settings(HYBRIDLOCK=value),
        pytest.raises(CommandError, match="the lease of 'nightly' was lost while the command ran") as ended,
    ):
        call_command(Nightly(lose_the_lease))
    assert ended.value.returncode == EXIT_LOST == 122


@pytest.mark.server
def test_a_server_gone_at_the_release_keeps_the_commands_outcome(own_server: EmbeddedServer, registry_key: str) -> None:
    # The work is done; the release cannot reach the server: the run still succeeds (the key ends with its lease),
    # and a failing run's own exception is what its caller hears.
    value = {"URL": own_server.url, "OPTIONS": {"registry_key": registry_key, "expire_after": 1}}
    with override_settings(HYBRIDLOCK=value):
        command = Nightly(lambda command: own_server.kill())
        call_command(command)
        assert command.ran == 1
    port = own_server.port
    own_server.stop()
    own_server.start(port=port)

    def fail(command: Any) -> None:
        own_server.kill()
        raise RuntimeError("the job failed")

    with override_settings(HYBRIDLOCK=value), pytest.raises(RuntimeError, match="the job failed"):
        call_command(Nightly(fail))


def test_a_server_out_of_reach_ends_the_run_with_the_failed_status() -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = Nightly()
    with (
        override_settings(HYBRIDLOCK={"URL": f"redis://:pass-word-1@127.0.0.1:{port}/0"}),
        pytest.raises(CommandError, match=r"test_django: could not take 'nightly': ") as failed,
    ):
        call_command(command)
    assert failed.value.returncode == EXIT_FAILED == 125
    assert "pass-word-1" not in str(failed.value)
    assert command.ran == 0


@pytest.mark.server
class TestInADjangoTestCase(SimpleTestCase):
    """A project's own tests, written with Django's test case: ``self.settings(...)`` and ``call_command``."""

    url = ""

    @pytest.fixture(autouse=True)
    def _server(self, server: EmbeddedServer, redis_client: object) -> None:
        self.url = server.url

    def test_a_guarded_command_and_the_registry(self) -> None:
        with self.settings(HYBRIDLOCK={"URL": self.url, "OPTIONS": {"registry_key": "testcase"}}):
            out = io.StringIO()
            call_command(Nightly(lambda command: command.stdout.write("ran")), stdout=out)
            assert out.getvalue() == "ran\n"
            with get_registry().obtain("nightly"):
                # (The lock is reentrant in its thread: another thread stands for another run.)
                outcome: list[BaseException] = []

                def another_run() -> None:
                    try:
                        call_command(Nightly())
                    except CommandError as exc:
                        outcome.append(exc)

                thread = threading.Thread(target=another_run)
                thread.start()
                thread.join(15)
                assert [getattr(exc, "returncode", None) for exc in outcome] == [EXIT_HELD]
            registry = get_registry()
        assert registry.closed


# -- LockedCommand, two processes as cron starts them --------------------------------------------------------------


def _manage_py(server: EmbeddedServer, registry_key: str, *args: str) -> subprocess.Popen[str]:
    env = checkout_env(REDIS_URL=server.url, REGISTRY_KEY=registry_key)
    return subprocess.Popen(
        [sys.executable, "-m", "tests._django_workers", *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _first_to_exit(processes: list[subprocess.Popen[str]], timeout: float = 30) -> subprocess.Popen[str]:
    deadline = time.monotonic() + timeout
    while True:
        for process in processes:
            if process.poll() is not None:
                return process
        assert time.monotonic() < deadline, "neither run ended"
        time.sleep(0.02)


def _finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    stdout, stderr = process.communicate("\n", timeout=30)
    assert process.returncode == 0, stderr
    return stdout, stderr


@pytest.mark.server
def test_two_runs_at_once_one_runs_the_other_exits_75(
    server: EmbeddedServer, redis_client: Any, registry_key: str
) -> None:
    runs = [_manage_py(server, registry_key), _manage_py(server, registry_key)]
    try:
        refused = _first_to_exit(runs)
        running = runs[1 - runs.index(refused)]
        out, stderr = refused.communicate(timeout=30)
        assert refused.returncode == EXIT_HELD, stderr
        assert stderr.startswith("CommandError: nightly did not start: its lock 'django:command:nightly' on ")
        assert "is held by another run" in stderr
        assert "--lock-timeout" in stderr
        assert not out  # it never ran
        assert running.stdout is not None
        assert running.stdout.readline().startswith("running ")
        assert running.poll() is None
        stdout, stderr = _finish(running)
        assert stdout.startswith("done ")
        assert "registry closed at exit: True" in stderr
    finally:
        for process in runs:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=10)


@pytest.mark.server
def test_a_run_given_a_timeout_waits_for_the_running_one_another_times_out(
    server: EmbeddedServer, redis_client: Any, registry_key: str
) -> None:
    first = _manage_py(server, registry_key)
    runs = [first]
    try:
        assert first.stdout is not None
        assert first.stdout.readline().startswith("running ")
        waiting = _manage_py(server, registry_key, "--lock-timeout", "30")
        impatient = _manage_py(server, registry_key, "--lock-timeout", "0.5")
        runs += [waiting, impatient]
        _, stderr = impatient.communicate(timeout=30)
        assert impatient.returncode == EXIT_TIMEOUT, stderr
        assert "CommandError: nightly did not start: timed out after 0.5 s waiting for its lock" in stderr
        # The waiting run is in the server's queue for the lock before the first one finishes.
        queue = f"{registry_key}:{{django:command:nightly}}:queue"
        deadline = time.monotonic() + 30
        while not redis_client.zcard(queue):
            assert time.monotonic() < deadline, "the run given a timeout never waited"
            assert waiting.poll() is None, waiting.communicate()
            time.sleep(0.02)
        stdout, _ = _finish(first)
        done_at = float(stdout.split()[1])
        assert waiting.stdout is not None
        line = waiting.stdout.readline()
        assert line.startswith("running ")
        assert float(line.split()[1]) >= done_at
        _finish(waiting)
    finally:
        for process in runs:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=10)


def test_the_workers_command_line_has_the_lock_options() -> None:
    parser = Nightly().create_parser("manage.py", "nightly")
    text = parser.format_help()
    assert "--lock-key KEY" in text
    assert "--lock-timeout SECONDS" in text
    assert "'nightly'" in text
    options = parser.parse_args(["--lock-key", "k", "--lock-timeout", "2"])
    assert (options.lock_key, options.lock_timeout) == ("k", 2.0)
