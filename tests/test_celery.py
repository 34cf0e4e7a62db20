"""hybridlock.contrib.celery with real Celery workers (a prefork pool and a threads pool) on a broker the module starts.

Both workers run for the whole module on one throw-away server (broker, results and locks), each consuming its own
queue; the tests send tasks to one pool, or to both at once (then the lock excludes across processes and threads).
The invariant is read from the tasks' own bookkeeping: how many runs of a key were running as each run started.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._extras import skip_reason

pytest.importorskip("celery", reason=skip_reason("celery", "celery"))

import redis
from celery.exceptions import TaskRevokedError, TimeLimitExceeded, WorkerLostError

import hybridlock
from hybridlock.contrib.celery import CeleryLocks, TaskBusyError
from hybridlock.errors import InvalidArgumentError, LockLostError
from hybridlock.testing import EmbeddedServer
from tests._examples import checkout_env, run_program
from tests.test_docs import python_blocks

pytestmark = [pytest.mark.server, pytest.mark.skipif(not hasattr(os, "fork"), reason="prefork needs os.fork")]

ROOT = Path(__file__).resolve().parent.parent
EXPIRE_AFTER = 2.0
POOLS = {"prefork": ("prefork", "2"), "threads": ("threads", "4")}
RESULT_TIMEOUT = 30


class Cluster:
    """The module's server, workers and app (imported with the workers' environment)."""

    def __init__(self, server: EmbeddedServer, app_module: object, book: redis.Redis) -> None:
        self.server = server
        self.app_module = app_module
        self.book = book

    def levels(self, name: str) -> list[int]:
        return [int(level) for level in self.book.lrange(f"levels:{name}", 0, -1)]

    def wait_for(self, what: str, predicate: object, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():  # type: ignore[operator]
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)


def _start_worker(queue: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    pool, concurrency = POOLS[queue]
    command = [sys.executable, "-m", "celery", "-A", "tests._celery_app", "worker", "-P", pool, "-c", concurrency]
    command += ["-Q", queue, "-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    command += ["-l", "WARNING"]
    # Its own session, so that teardown can end the worker and its pool children by the worker's pid.
    return subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)


def _stop_worker(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(5)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    server = EmbeddedServer().start()
    workers: list[subprocess.Popen[bytes]] = []
    saved = os.environ.get("HYBRIDLOCK_CELERY_URL")
    try:
        os.environ["HYBRIDLOCK_CELERY_URL"] = server.url
        env = checkout_env(warnings=None, HYBRIDLOCK_CELERY_EXPIRE_AFTER=str(EXPIRE_AFTER))
        workers = [_start_worker(queue, env) for queue in POOLS]
        sys.modules.pop("tests._celery_app", None)
        from tests import _celery_app

        cluster = Cluster(server, _celery_app, _celery_app.book)
        hostname = os.uname().nodename
        for queue in POOLS:
            cluster.wait_for(f"the {queue} worker", lambda q=queue: cluster.book.get(f"ready:{q}@{hostname}"), 30)
        yield cluster
    finally:
        for worker in workers:
            _stop_worker(worker)
        sys.modules.pop("tests._celery_app", None)
        if saved is None:
            os.environ.pop("HYBRIDLOCK_CELERY_URL", None)
        else:
            os.environ["HYBRIDLOCK_CELERY_URL"] = saved
        server.stop()


@pytest.fixture
def probe(cluster: Cluster) -> Iterator[hybridlock.LockRegistry]:
    """A registry of the test's own, to look at the tasks' locks from outside."""
    with hybridlock.LockRegistry(cluster.server.url, expire_after=EXPIRE_AFTER) as registry:
        yield registry


def _name() -> str:
    return uuid.uuid4().hex[:12]


def _holder_thread(cluster: Cluster, key: str) -> str | None:
    """The holding thread's name as ``hybridlock inspect`` shows it, once the holder has described itself (within
    a second or two of taking the lock: see describer.py)."""
    deadline = time.monotonic() + 10
    while True:
        command = [sys.executable, "-m", "hybridlock", "inspect", "--json", "--server", cluster.server.url, key]
        shown = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
        holder = json.loads(shown.stdout)["locks"][0].get("holder") or {}
        if holder.get("thread") or time.monotonic() > deadline:
            return holder.get("thread")
        time.sleep(0.2)


@pytest.mark.parametrize("queue", list(POOLS))
def test_a_second_run_while_one_runs_is_rejected_naming_the_task_and_the_next_runs_after_it(
    cluster: Cluster, queue: str
) -> None:
    tasks, name = cluster.app_module, _name()
    first = tasks.exclusive.apply_async((name, -1), queue=queue)  # runs until told to end
    cluster.wait_for("the first run", lambda: cluster.levels(name))
    seconds = [tasks.exclusive.apply_async((name, 0), queue=queue) for _ in range(3)]
    for second in seconds:
        with pytest.raises(TaskBusyError) as caught:
            second.get(timeout=RESULT_TIMEOUT)
        assert second.id in str(caught.value)
        assert f"exclusive:{name}" in str(caught.value)
        # Who holds it (celery-once #31), in the failed result: the holding run, when it runs in the same process
        # (the threads pool's one process); else (the other prefork child ran the rejected one) where to look.
        if queue == "threads":
            assert f"taken by 'tests._celery_app.exclusive[{first.id}]' (in this process)" in str(caught.value)
        else:
            assert "taken by a run in another process (hybridlock inspect" in str(caught.value)
    # Who holds it (celery-once #31): the holder description names the running task and its id.
    assert _holder_thread(cluster, f"exclusive:{name}") == f"tests._celery_app.exclusive[{first.id}]"
    cluster.book.rpush(f"go:{name}", 1)
    assert first.get(timeout=RESULT_TIMEOUT)
    # Released as it succeeded: the next call runs.
    assert tasks.exclusive.apply_async((name, 0), queue=queue).get(timeout=RESULT_TIMEOUT)
    assert cluster.levels(name) == [1, 1]


@pytest.mark.parametrize("task", ["exclusive_wait", "exclusive_retry"])
def test_runs_queued_on_both_pools_at_once_all_run_one_at_a_time(cluster: Cluster, task: str) -> None:
    tasks, name = cluster.app_module, _name()
    sent = [getattr(tasks, task).apply_async((name, 0.05), queue=queue) for queue in POOLS for _ in range(4)]
    pids = {result.get(timeout=RESULT_TIMEOUT) for result in sent}
    assert cluster.levels(name) == [1] * len(sent)
    assert len(pids) >= 2  # both workers ran some


def test_a_task_that_retries_itself_or_fails_releases_its_lock(
    cluster: Cluster, probe: hybridlock.LockRegistry
) -> None:
    tasks, name = cluster.app_module, _name()
    assert tasks.exclusive_then_retry.apply_async((name,), queue="threads").get(timeout=RESULT_TIMEOUT)
    assert int(cluster.book.get(f"tries:{name}")) == 3  # two retries found the key free again
    failed = tasks.exclusive_fails.apply_async((name,), queue="prefork")
    with pytest.raises(ValueError, match="failed"):
        failed.get(timeout=RESULT_TIMEOUT)
    lock = probe.obtain(f"exclusive:{name}")
    assert lock.acquire(blocking=False)
    lock.release()


@pytest.mark.parametrize("queue", list(POOLS))
def test_a_run_whose_lease_is_lost_fails_with_lock_lost_error_though_its_function_succeeded(
    cluster: Cluster, queue: str
) -> None:
    tasks, name = cluster.app_module, _name()
    run = tasks.exclusive.apply_async((name, -1), queue=queue)
    cluster.wait_for("the run", lambda: cluster.levels(name))
    locks = redis.Redis.from_url(cluster.server.url)
    try:
        assert locks.delete(f"hybridlock:{{exclusive:{name}}}") == 1  # the server loses the key
    finally:
        locks.close()
    cluster.book.rpush(f"go:{name}", 1)
    with pytest.raises(LockLostError):
        run.get(timeout=RESULT_TIMEOUT)
    assert cluster.book.get(f"ran:{name}") == b"1"  # the function did finish


def _kill_and_time_the_release(cluster: Cluster, probe: hybridlock.LockRegistry, name: str, kill: object) -> float:
    cluster.wait_for("the run", lambda: cluster.levels(name))
    lock = probe.obtain(f"exclusive:{name}")
    assert not lock.acquire(blocking=False)  # held by the run
    killed = time.monotonic()
    kill()  # type: ignore[operator]
    assert lock.acquire(timeout=EXPIRE_AFTER + 5)
    freed = time.monotonic() - killed
    lock.release()
    return freed


def test_a_worker_child_killed_mid_task_leaves_a_lock_that_ends_with_its_lease(
    cluster: Cluster, probe: hybridlock.LockRegistry
) -> None:
    tasks, name = cluster.app_module, _name()
    stuck = tasks.exclusive.apply_async((name, 60), queue="prefork")
    pid = []
    freed = _kill_and_time_the_release(
        cluster, probe, name, lambda: (pid.append(int(cluster.book.get(f"pid:{name}"))), os.kill(pid[0], 9))
    )
    assert freed <= EXPIRE_AFTER + 1.0, freed
    with pytest.raises(WorkerLostError):
        stuck.get(timeout=RESULT_TIMEOUT)
    assert tasks.exclusive.apply_async((name, 0), queue="prefork").get(timeout=RESULT_TIMEOUT) != pid[0]


def test_a_task_past_its_hard_time_limit_leaves_a_lock_that_ends_with_its_lease(
    cluster: Cluster, probe: hybridlock.LockRegistry
) -> None:
    # celery-singleton #40, celery-once #130: at time_limit=1 the pool sends the child SIGTERM, then SIGKILL 0.1 s
    # later; whichever ends it, the lock is free within the lease.
    tasks, name = cluster.app_module, _name()
    limited = tasks.hard_limited.apply_async((name,), queue="prefork")
    freed = _kill_and_time_the_release(cluster, probe, name, lambda: None)
    assert freed <= 1 + EXPIRE_AFTER + 1.0, freed
    with pytest.raises(TimeLimitExceeded):
        limited.get(timeout=RESULT_TIMEOUT)


def test_a_running_task_revoked_with_terminate_releases_its_lock(
    cluster: Cluster, probe: hybridlock.LockRegistry
) -> None:
    tasks, name = cluster.app_module, _name()
    stuck = tasks.exclusive.apply_async((name, 60), queue="prefork")
    freed = _kill_and_time_the_release(cluster, probe, name, lambda: tasks.app.control.revoke(stuck.id, terminate=True))
    assert freed <= EXPIRE_AFTER + 1.0, freed
    with pytest.raises(TaskRevokedError):
        stuck.get(timeout=RESULT_TIMEOUT)


def test_an_occurrence_sent_by_several_beat_replicas_runs_once(cluster: Cluster) -> None:
    tasks, day = cluster.app_module, _name()
    sent = [tasks.nightly.apply_async((day, 0.1), queue=queue) for queue in POOLS for _ in range(3)]
    outcomes = [result.get(timeout=RESULT_TIMEOUT) for result in sent]
    assert sorted(outcome["ran"] for outcome in outcomes) == [False] * 5 + [True]
    assert [o["result"] for o in outcomes if o["ran"]] == [int(cluster.book.get(f"pid:nightly:{day}"))]
    assert cluster.levels(f"nightly:{day}") == [1]


def _start_beat(run: str, queue: str, directory: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    directory.mkdir()
    command = [sys.executable, "-m", "celery", "-A", "tests._celery_app", "beat", "-l", "WARNING"]
    command += ["-s", str(directory / "schedule"), "--pidfile", str(directory / "beat.pid")]
    with open(directory / "output", "wb") as output:  # (the child keeps its own descriptor)
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env={**env, "HYBRIDLOCK_CELERY_BEAT": f"{run}:{queue}"},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_two_real_beat_replicas_send_every_occurrence_and_each_runs_once(cluster: Cluster, tmp_path: Path) -> None:
    # Two `celery beat` processes with the same schedule (every 3 s of the wall clock, as a crontab is every
    # minute), each with its own schedule file, each sending its copies to one of the pools.
    tasks, run = cluster.app_module, _name()
    env = checkout_env(warnings=None, HYBRIDLOCK_CELERY_URL=cluster.server.url)
    beats = [_start_beat(run, queue, tmp_path / queue, env) for queue in POOLS]

    def occurrences() -> dict[int, list[tuple[str, str]]]:
        sent: dict[int, list[tuple[str, str]]] = {}
        for copy in cluster.book.lrange(f"sent:{run}", 0, -1):
            task_id, occurrence, queue = json.loads(copy)
            sent.setdefault(occurrence, []).append((task_id, queue))
        return sent

    def sent_by_both() -> int:
        return sum(len(copies) == 2 for copies in occurrences().values())

    try:
        cluster.wait_for("two occurrences sent by both beats", lambda: sent_by_both() >= 2, 25)
    finally:
        for beat in beats:
            _stop_worker(beat)
    sent = occurrences()
    for occurrence, copies in sorted(sent.items()):
        assert len(copies) <= 2, (occurrence, copies)  # one copy per beat and occurrence
        outcomes = [tasks.app.AsyncResult(task_id).get(timeout=RESULT_TIMEOUT) for task_id, _ in copies]
        ran = [queue for (_, queue), outcome in zip(copies, outcomes, strict=True) if outcome["ran"]]
        if len(copies) == 2:
            assert len(ran) == 1, (occurrence, copies, outcomes)
        else:  # the first or last occurrence, sent before the other beat started or after it stopped
            assert len(ran) <= 1, (occurrence, copies, outcomes)
    assert {queue for copies in sent.values() for _, queue in copies} == set(POOLS)
    assert cluster.levels(f"beat:{run}") == [1] * int(cluster.book.get(f"ran:beat:{run}"))


def test_a_limited_task_runs_at_most_permits_at_once_across_the_cluster(cluster: Cluster) -> None:
    tasks, name = cluster.app_module, _name()
    sent = [tasks.limited.apply_async((name, 0.2), queue=queue) for queue in POOLS for _ in range(4)]
    for result in sent:
        result.get(timeout=RESULT_TIMEOUT)
    levels = cluster.levels(name)
    assert len(levels) == len(sent)
    assert max(levels) <= 2, levels
    assert max(levels) == 2  # the limit is not a lock: two did run at once


def test_a_forked_child_builds_its_own_registry_and_closes_only_that_one(cluster: Cluster) -> None:
    from celery import Celery

    app = Celery("fork", broker="memory://", set_as_current=False)
    locks = CeleryLocks(app, cluster.server.url, expire_after=EXPIRE_AFTER)
    parents = locks.registry
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a process with threads is the point
        pid = os.fork()
    if pid == 0:  # the child: reports, never asserts, always leaves through os._exit
        code = 1
        try:
            child = locks.registry
            with child.obtain("fork-check"):
                pass
            locks.close()
            facts = [
                child is not parents,
                child.client_id != parents.client_id,
                child.closed,
                locks.registry is not child,
            ]
            os.write(write, json.dumps(facts).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 20)
        assert ready, "the child did not report"
        assert json.loads(os.read(read, 1000)) == [True, True, True, True]
    finally:
        os.close(read)
        assert os.waitpid(pid, 0)[1] == 0
    assert locks.registry is parents
    assert not parents.closed  # the child's close() closed its own registry only
    with parents.obtain("fork-check"):
        pass
    locks.close()
    assert parents.closed


def test_a_task_called_as_a_function_holds_the_lock_too(cluster: Cluster, probe: hybridlock.LockRegistry) -> None:
    tasks, name = cluster.app_module, _name()
    try:
        before = threading.current_thread().name
        assert tasks.exclusive(name, 0) == os.getpid()  # in this process, with this process's registry
        assert threading.current_thread().name == before  # not renamed outside a task
        with probe.obtain(f"exclusive:{name}"), pytest.raises(TaskBusyError, match="a call did not run") as caught:
            tasks.exclusive(name, 0)
        assert "taken by a run in another process" in str(caught.value)  # (the probe is another owner)
        taken, done = threading.Event(), threading.Event()

        def hold() -> None:  # another thread of this process holds the key meanwhile
            with tasks.locks.registry.obtain(f"exclusive:{name}"):
                taken.set()
                done.wait(30)

        holder = threading.Thread(target=hold, name="the holder")
        holder.start()
        try:
            assert taken.wait(30)
            with pytest.raises(TaskBusyError, match=r"taken by 'the holder' \(in this process\)"):
                tasks.exclusive(name, 0)
        finally:
            done.set()
            holder.join(30)
        assert cluster.levels(name) == [1]
    finally:
        tasks.locks.close()


def test_without_celery_hybridlock_imports_and_hybridlock_celery_says_which_extra_to_install() -> None:
    program = (
        "import sys\n"
        "sys.modules['celery'] = None  # as if not installed\n"
        "import hybridlock\n"
        "try:\n"
        "    import hybridlock.contrib.celery\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    stdout = run_program(program, checkout_env(warnings=None), timeout=60)
    assert "pip install 'hybridlock[celery]'" in stdout


@pytest.mark.parametrize("signal_name", ["worker_process_shutdown", "worker_shutdown"])
def test_the_worker_shutdown_signals_close_this_processs_registry(cluster: Cluster, signal_name: str) -> None:
    from celery import Celery, signals

    app = Celery("shutdown", broker="memory://", set_as_current=False)
    locks = CeleryLocks(app, cluster.server.url, expire_after=EXPIRE_AFTER)
    registry = locks.registry
    getattr(signals, signal_name).send(sender=None, pid=os.getpid(), exitcode=0)
    assert registry.closed
    assert locks.registry is not registry  # the next use builds another
    locks.close()


def test_bad_decorations_are_refused_when_decorating() -> None:
    from celery import Celery

    app = Celery("bad", broker="memory://", set_as_current=False)
    locks = CeleryLocks(app, "redis://127.0.0.1:1/0")
    with pytest.raises(InvalidArgumentError, match="on_busy"):
        locks.single_instance("k", on_busy="queue")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="timeout is for on_busy='wait'"):
        locks.single_instance("k", timeout=3)
    with pytest.raises(InvalidArgumentError, match="names missing"):

        @locks.single_instance("k:{missing}")
        def f(present: int) -> None: ...

    with pytest.raises(InvalidArgumentError, match="async function"):

        @locks.single_instance("k")
        async def g() -> None: ...

    with pytest.raises(InvalidArgumentError, match=r"under @app\.task"):

        @locks.single_instance("k")
        @app.task
        def h() -> None: ...

    with pytest.raises(InvalidArgumentError, match="at_least_for"):
        locks.runs_once("k", at_least_for=-1)
    with pytest.raises(InvalidArgumentError, match="permits"):
        locks.limit("k", permits=0)
    # Issue 34: values every run would fail with, refused when decorating.
    with pytest.raises(InvalidArgumentError, match="permits must be from 1 to 1024, not 2000"):
        locks.limit("k", permits=2000)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        locks.limit("k", permits=2, timeout=1e300)
    with pytest.raises(InvalidArgumentError, match="timeout"):
        locks.single_instance("k", on_busy="wait", timeout=1e300)
    with pytest.raises(InvalidArgumentError, match="must not start with"):

        @locks.single_instance("}}k")
        def i() -> None: ...

    locks.limit("k", permits=1024, timeout=9e9)  # the largest a run can use


def test_the_celery_pages_example_runs(cluster: Cluster) -> None:
    blocks = python_blocks(ROOT / "docs" / "celery.md")
    assert len(blocks) == 1
    env = checkout_env(REDIS_URL=cluster.server.url)
    stdout = run_program(blocks[0], env, timeout=60)
    assert "did not run: single_instance key taken by a run in another process" in stdout


def test_a_limited_task_that_calls_itself_is_refused_and_runs_once_takes_any_parameter_name(
    server: EmbeddedServer,
) -> None:
    import celery

    app = celery.Celery("direct-calls", broker="memory://", backend="cache+memory://")
    locks = CeleryLocks(app, server.url)
    try:

        @app.task
        @locks.limit("self:{n}", permits=1, timeout=30)
        def recursive(n: int, depth: int = 0) -> int:
            return depth if depth else recursive(n, depth + 1)

        start = time.monotonic()
        with pytest.raises(TaskBusyError):  # not a wait for its own permit (here: 30 s)
            recursive(1)
        assert time.monotonic() - start < 10

        @app.task
        @locks.single_instance("self-lock:{n}")
        def reentrant(n: int, depth: int = 0) -> int:
            return depth if depth else reentrant(n, depth + 1)

        with pytest.raises(TaskBusyError, match=r"taken by this very run \(the task called itself\)"):
            reentrant(1)

        @app.task
        @locks.runs_once("job:{key}", at_least_for=1)
        def job(key: str, function: str = "f", at_least_for: int = 0) -> list[object]:
            return [key, function, at_least_for]

        assert job("k", function="g", at_least_for=5) == {"ran": True, "result": ["k", "g", 5]}
    finally:
        locks.close()


def test_a_run_refused_by_a_run_of_this_process_that_has_just_ended_names_it_not_another_process(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: in a threads-pool worker, a run refused while another run of the process held the key, which let go
    before the refused run looked for its holder, said "taken by a run in another process"; nothing overlapped.
    Here deterministically: the holder is told to end between the refusal and the look."""
    import celery

    app = celery.Celery("threads", broker="memory://", backend="cache+memory://")
    locks = CeleryLocks(app, server.url, expire_after=EXPIRE_AFTER)
    name = _name()
    entered, go = threading.Event(), threading.Event()
    try:

        @app.task
        @locks.single_instance("race:{n}")
        def task(n: str, hold: bool) -> None:
            if hold:
                entered.set()
                assert go.wait(RESULT_TIMEOUT)

        first: list[Any] = []
        holder = threading.Thread(target=lambda: first.append(task.apply((name, True))))
        holder.start()
        assert entered.wait(RESULT_TIMEOUT)
        acquire = hybridlock.HybridLock.acquire

        def refused_then_the_holder_ends(self: hybridlock.HybridLock, *args: Any, **kwargs: Any) -> bool:
            got = acquire(self, *args, **kwargs)
            assert not got
            go.set()
            holder.join(RESULT_TIMEOUT)
            return got

        monkeypatch.setattr(hybridlock.HybridLock, "acquire", refused_then_the_holder_ends)
        second = task.apply((name, False))
        monkeypatch.setattr(hybridlock.HybridLock, "acquire", acquire)
        assert first[0].successful()
        assert isinstance(second.result, TaskBusyError)
        message = str(second.result)
        assert f"taken by '{task.name}[{first[0].id}]' (in this process, which has just ended)" in message
        assert "another process" not in message
        # A holder that is another owner (another process's registry) is still named as such.
        with hybridlock.LockRegistry(server.url, expire_after=EXPIRE_AFTER) as other, other.obtain(f"race:{name}"):
            third = task.apply((name, False))
        assert isinstance(third.result, TaskBusyError)
        assert "taken by a run in another process (hybridlock inspect KEY names it)" in str(third.result)
    finally:
        go.set()
        locks.close()


def test_a_run_refused_while_a_run_of_this_process_takes_the_key_names_that_run(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the threads-pool case the report saw (5 concurrent sends to one threads worker, 3 of 4 rejections
    blaming "a run in another process"): a run refused while another run of the process is still taking the key
    (it has the key's local half and waits for the server's answer, so it is not yet the holder). The refused run
    waits for that answer (``SETTLE_SECONDS``, raised here so that a loaded machine cannot make the test flaky) and
    names the run that got the key. Here deterministically: the first run's request is held back until the second
    run has been refused."""
    import celery

    from hybridlock.contrib import celery as contrib

    monkeypatch.setattr(contrib, "SETTLE_SECONDS", RESULT_TIMEOUT)
    app = celery.Celery("threads", broker="memory://", backend="cache+memory://")
    locks = CeleryLocks(app, server.url, expire_after=EXPIRE_AFTER)
    name = _name()
    entered, done, asking, refused = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    try:

        @app.task
        @locks.single_instance("taking:{n}")
        def task(n: str, hold: bool) -> None:
            if hold:
                entered.set()
                assert done.wait(RESULT_TIMEOUT)

        backend = locks.registry._context.backend
        try_acquire = backend.try_acquire
        first: list[Any] = []

        def held_back(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is taker:
                asking.set()
                assert refused.wait(RESULT_TIMEOUT)  # the second run was refused meanwhile
            return try_acquire(*args, **kwargs)

        monkeypatch.setattr(backend, "try_acquire", held_back)
        acquire = hybridlock.HybridLock.acquire

        def noting_the_refusal(self: hybridlock.HybridLock, *args: Any, **kwargs: Any) -> bool:
            got = acquire(self, *args, **kwargs)
            if threading.current_thread() is not taker and not got:
                refused.set()
            return got

        monkeypatch.setattr(hybridlock.HybridLock, "acquire", noting_the_refusal)
        taker = threading.Thread(target=lambda: first.append(task.apply((name, True))))
        taker.start()
        assert asking.wait(RESULT_TIMEOUT)
        second = task.apply((name, False))
        assert entered.wait(RESULT_TIMEOUT)
        done.set()
        taker.join(RESULT_TIMEOUT)
        assert first[0].successful()
        assert isinstance(second.result, TaskBusyError)
        message = str(second.result)
        assert f"taken by '{task.name}[{first[0].id}]' (in this process)" in message
        assert "another process" not in message
    finally:
        refused.set()
        done.set()
        locks.close()


@pytest.mark.parametrize("decorator", ["single_instance", "limit"])
def test_a_soft_time_limit_raised_just_after_the_acquire_still_releases(
    server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, decorator: str
) -> None:
    # In a prefork child Celery raises SoftTimeLimitExceeded from a signal handler, at whatever line the task's
    # thread is on: here, deterministically, as the acquire returns (a hook standing in for the signal), before
    # any code of the run's could release what it took.
    import celery
    from celery.exceptions import SoftTimeLimitExceeded

    kind = hybridlock.HybridLock if decorator == "single_instance" else hybridlock.Semaphore
    acquire = kind.acquire

    def acquire_then_interrupted(self: object, *args: object, **kwargs: object) -> bool:
        assert acquire(self, *args, **kwargs)  # type: ignore[arg-type]
        raise SoftTimeLimitExceeded("arrived just after the acquire")

    app = celery.Celery("interrupted", broker="memory://", backend="cache+memory://")
    locks = CeleryLocks(app, server.url, expire_after=EXPIRE_AFTER)
    name = _name()
    try:
        if decorator == "single_instance":

            @app.task
            @locks.single_instance("interrupted:{n}")
            def task(n: str) -> None: ...

        else:

            @app.task
            @locks.limit("interrupted:{n}", permits=1)
            def task(n: str) -> None: ...

        monkeypatch.setattr(kind, "acquire", acquire_then_interrupted)
        with pytest.raises(SoftTimeLimitExceeded):
            task(name)
        monkeypatch.setattr(kind, "acquire", acquire)
        assert locks.registry.held_locks() == []  # nothing left held here ...
        with hybridlock.LockRegistry(server.url, expire_after=EXPIRE_AFTER) as other:  # ... nor in the server
            held = other.obtain(f"interrupted:{name}") if decorator == "single_instance" else None
            if held is None:
                held = other.obtain_semaphore(f"interrupted:{name}", 1)
            assert held.acquire(blocking=False)
            held.release()
    finally:
        locks.close()
