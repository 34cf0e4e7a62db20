"""Celery integration (``pip install hybridlock[celery]``): single-instance tasks, beat jobs that run once across
replicas, and a cluster-wide concurrency limit per task, each over a lock registry built lazily in every worker
process.

``CeleryLocks(app, url_or_factory)`` owns one ``LockRegistry`` per process: built at the first task that needs it
(never in a prefork worker's parent, whose children each build their own after the fork, so no registry, client id
or connection is shared across a fork), closed at ``worker_process_shutdown`` (a prefork child) and
``worker_shutdown`` (the worker's own process: threads and solo pools). Its decorators go under ``@app.task``:

* ``@locks.single_instance("import:{account_id}", on_busy=...)``: at most one run of the task per key at a time,
  across every worker, process and thread. The lock is taken **in the worker, when the task starts**, and released
  when the task's function returns or raises (success, failure, ``self.retry()``, a soft time limit); a worker child
  killed mid-task (SIGKILL, a hard time limit, the OOM killer, ``revoke(terminate=True)``) leaves a lease nobody
  renews, which ends within the registry's ``expire_after``. A call that finds the key taken is rejected
  (``TaskBusyError``, naming the run holding it when that runs in the same process), waits, or is retried later:
  ``on_busy``. While a run holds its key, its thread is named ``task name[task id]``, so ``hybridlock inspect KEY``
  names the task holding it.
* ``@locks.runs_once("report:{day}", at_least_for=..., at_most_for=...)``: ``registry.run_once`` for a task that
  several beat replicas (or a beat with several workers) send for the same occurrence: one runs it, the others
  skip at once. The task returns ``{"ran": bool, "result": ...}`` (JSON-friendly, unlike ``RunOnceResult``).
* ``@locks.limit("api:{tenant}", permits=N, on_busy=...)``: at most N runs per key at once across the cluster
  (Celery's ``rate_limit`` is per worker), each run holding one of the semaphore's permits.

Why the lock is not taken when the task is sent (as celery-once and celery-singleton do): a hybridlock lease
belongs to a live registry that renews it, and ends when that process dies. The publisher (a web request, beat)
neither lives as long as the queued task nor can hand its lease to the worker that picks the task up; a key set
at publish time with a fixed TTL is exactly what outlives killed workers for hours (celery-once #147, celery-singleton
#40). So a duplicate is detected when it starts, not when it is sent.

Key templates are ``synchronized``'s: filled from the task function's bound arguments (``self`` too, with
``bind=True``: ``"{self.name}:{account_id}"``), checked against its signature when decorating.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, cast

try:
    import celery  # type: ignore[import-untyped,unused-ignore]
    from celery import signals  # type: ignore[import-untyped,unused-ignore]
except ImportError as exc:
    raise ImportError(f"hybridlock.contrib.celery needs Celery: pip install 'hybridlock[celery]' ({exc})") from exc

from hybridlock import LockRegistry

from ..errors import InvalidArgumentError, LockTimeoutError

# The registry's own template and bounds checks, public for this: a task's key template and bounds are checked when
# decorating, as the registry's decorators check them, although the registry is built later, in each worker process.
from ..templates import acquire_timeout, keyed, run_once_bounds, semaphore_permits

__all__ = ["CeleryLocks", "OnBusy", "TaskBusyError"]

logger = logging.getLogger("hybridlock.celery")

F = TypeVar("F", bound=Callable[..., Any])

#: What a task does when its key is taken: raise ``TaskBusyError`` at once ("reject"), wait up to ``timeout``
#: seconds and then raise it ("wait"), or ``retry`` itself ``retry_after`` seconds later ("retry").
OnBusy = Literal["reject", "wait", "retry"]
_ON_BUSY = ("reject", "wait", "retry")


class TaskBusyError(LockTimeoutError):
    """A single-instance or limited task did not run: its key was taken (by a run elsewhere) and ``on_busy`` did not
    let it wait long enough, or its retries ran out. The message names the task and its id, and who holds the key
    (for ``single_instance``: the holding thread, ``name[task id]`` for a run, when it is a thread of this process;
    else "a run in another process"); ``key`` and ``server`` are set. A ``TimeoutError``, as ``LockTimeoutError`` is."""


class CeleryLocks:
    """The locks of one Celery app: a lazily built registry per worker process, and the task decorators.

    ``registry`` is a ``redis://`` URL (with ``options`` for ``LockRegistry``: ``expire_after=...``) or a callable
    that returns a new ``LockRegistry`` (called once in each process that needs one; Sentinel, Cluster or a quorum
    go this way). ``expire_after`` is how long a lock outlives a worker killed while it ran the task.
    """

    def __init__(self, app: celery.Celery, registry: str | Callable[[], LockRegistry], **options: Any) -> None:
        if isinstance(registry, str):
            url = registry

            def factory() -> LockRegistry:
                return LockRegistry(url, **options)

        elif callable(registry):
            if options:
                raise InvalidArgumentError(
                    f"CeleryLocks takes registry options ({', '.join(options)}) with a URL only: pass them to the "
                    "registry your factory builds"
                )
            factory = registry
        else:
            raise InvalidArgumentError(
                "CeleryLocks needs a redis:// URL or a callable returning a LockRegistry, "
                f"not {type(registry).__name__}"
            )
        self.app = app
        self._factory = factory
        self._registry: LockRegistry | None = None
        self._pid = 0
        self._guard = threading.Lock()
        self._runs_here = _RunsHere()
        self_ref = weakref.ref(self)

        def after_fork_in_child() -> None:
            # The parent's guard may have been held by another thread at the fork: never by anyone in the child.
            # Nor are the parent's runs the child's.
            locks = self_ref()
            if locks is not None:
                locks._guard = threading.Lock()
                locks._runs_here = _RunsHere()

        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=after_fork_in_child)
        # weak=False: the receivers are closures over this object, which lives as long as the app's module.
        signals.worker_process_shutdown.connect(self._on_shutdown, weak=False)
        signals.worker_shutdown.connect(self._on_shutdown, weak=False)

    # -- the registry of this process --------------------------------------------------------------------------------

    @property
    def registry(self) -> LockRegistry:
        """This process's registry, built at first use. A child forked after the parent built one gets its own
        (the parent's, reset by the fork, is left alone: the parent still uses it)."""
        pid = os.getpid()
        registry = self._registry
        if registry is not None and self._pid == pid:
            return registry
        with self._guard:
            if self._registry is None or self._pid != pid:
                built = self._factory()
                if not isinstance(built, LockRegistry):  # (QuorumLockRegistry and LocalLockRegistry are ones)
                    raise InvalidArgumentError(
                        f"the CeleryLocks factory returned a {type(built).__name__}, not a LockRegistry"
                    )
                self._registry, self._pid = built, pid
            return self._registry

    @property
    def server(self) -> str:
        """The registry's server, for messages (builds the registry)."""
        return self.registry.server

    def close(self) -> None:
        """Close this process's registry, if it built one (the worker signals call this); the next use builds a
        new one."""
        with self._guard:
            registry, self._registry = self._registry, None
            if registry is not None and self._pid == os.getpid():
                registry.close()

    def _on_shutdown(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.close()
        except Exception:  # a worker shutting down has nobody to raise to
            logger.warning("hybridlock: could not close the lock registry at worker shutdown", exc_info=True)

    # -- decorators -------------------------------------------------------------------------------------------------

    def single_instance(
        self,
        template: str,
        *,
        on_busy: OnBusy = "reject",
        timeout: float | None = None,
        retry_after: float = 1.0,
        max_retries: int | None = None,
    ) -> Callable[[F], F]:
        """Decorator (under ``@app.task``): the task runs holding the lock ``template`` names, so at most one run per
        key at a time, in the whole cluster. See the module docstring; ``on_busy``: ``OnBusy``; ``timeout`` (wait
        only): seconds, None for no bound; ``retry_after``/``max_retries`` (retry only): the ``self.retry``
        countdown, and its limit (None: the task's ``max_retries``)."""
        _check_busy_options(on_busy, timeout, retry_after, max_retries)

        def run(key: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            label = _running_task()
            lock = self.registry.obtain(key)
            # This thread holds it already (the task called itself, say): reentrancy would run two at once.
            reentered = lock.hold_count > 0
            # Among this process's runs of the key from before the acquire to after the release: a refusal names
            # the run of this process that caused it, if one did (see _holder).
            with self._runs_here.running(key, label or _task_label()) as me:
                try:
                    # The acquire inside the try, and the release decided by what this thread holds, not by what the
                    # acquire returned: Celery raises a soft time limit (SoftTimeLimitExceeded, from a signal
                    # handler) at whatever line the thread is on, the one just after a successful acquire included.
                    # The thread is named before the acquire, so that a holder is named from the moment it holds
                    # the key.
                    with _thread_named(label):
                        if reentered:
                            taken = False
                        else:
                            with self._runs_here.asking(me):
                                if on_busy == "wait":
                                    taken = lock.acquire(timeout=-1 if timeout is None else timeout)
                                else:
                                    taken = lock.acquire(blocking=False)
                        me.held = taken
                        if not taken:
                            holder = _holder(lock, me, self._runs_here)
                            self._busy(key, "single_instance", on_busy, timeout, retry_after, max_retries, holder)
                        return wrapped(*args, **kwargs)
                finally:
                    if not reentered and lock.hold_count:
                        lock.release()

        return self._decorator(template, "single_instance", run)

    def limit(
        self,
        template: str,
        permits: int,
        *,
        on_busy: OnBusy = "wait",
        timeout: float | None = None,
        retry_after: float = 1.0,
        max_retries: int | None = None,
    ) -> Callable[[F], F]:
        """Decorator (under ``@app.task``): each run holds one of ``permits`` permits of the semaphore ``template``
        names, so at most ``permits`` runs per key at once across the cluster (the limit stored in the server by
        the semaphore's first user: a different ``permits`` later does not change it; ``set_permits`` does).
        ``on_busy`` and the rest as for ``single_instance`` (here "wait" by default: waiters are served in arrival
        order)."""
        _check_busy_options(on_busy, timeout, retry_after, max_retries)
        semaphore_permits(permits)  # 1 to 1024, as obtain_semaphore takes it: refused now, not at every run

        def run(key: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            label = _running_task()
            semaphore = self.registry.obtain_semaphore(key, permits)
            # This thread holds a permit already (the task called itself, say): waiting for another could wait for
            # its own, for ever with one permit.
            reentered = semaphore.is_held_by_current_thread()
            try:  # (the acquire inside it, as in single_instance: a soft time limit may interrupt any line)
                if reentered:
                    taken = False
                elif on_busy == "wait":
                    taken = semaphore.acquire(timeout=timeout)
                else:
                    taken = semaphore.acquire(blocking=False)
                if not taken:
                    self._busy(key, "limit", on_busy, timeout, retry_after, max_retries, "other runs")
                with _thread_named(label):
                    return wrapped(*args, **kwargs)
            finally:
                if not reentered and semaphore.is_held_by_current_thread():
                    semaphore.release()

        return self._decorator(template, "limit", run)

    def runs_once(self, template: str, *, at_least_for: float, at_most_for: float | None = None) -> Callable[[F], F]:
        """Decorator (under ``@app.task``): each run is ``registry.run_once(key, ...)``: the first worker to take the
        key runs the task, every other run of the same occurrence skips at once, within ``at_least_for`` of the
        first's start (see docs/run-once.md). The task returns ``{"ran": True, "result": ...}`` or
        ``{"ran": False, "result": None}``."""
        at_least_for, at_most_for = run_once_bounds(at_least_for, at_most_for)

        def run(key: str, wrapped: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            # (A closure, so that a task parameter named key, function, at_least_for, ... is the task's.)
            outcome = self.registry.run_once(
                key, lambda: wrapped(*args, **kwargs), at_least_for=at_least_for, at_most_for=at_most_for
            )
            if not outcome.ran:
                logger.info("hybridlock: %s skipped: another run holds %r", _task_label(), key)
            return {"ran": outcome.ran, "result": outcome.result}

        return self._decorator(template, "runs_once", run)

    def _decorator(self, template: str, name: str, run: Callable[..., Any]) -> Callable[[F], F]:
        # keyed asks its registry for the server only (for messages, at a call): this object's builds the registry.
        decorate = keyed(cast(Any, self), template, name, run)

        def checked(function: F) -> F:
            if isinstance(function, celery.Task):
                raise InvalidArgumentError(
                    f"@CeleryLocks.{name} goes under @app.task (it decorates the task's function), not above it"
                )
            raw = function.__func__ if isinstance(function, (classmethod, staticmethod)) else function
            if inspect.iscoroutinefunction(raw):
                raise InvalidArgumentError(f"{raw.__qualname__} is an async function, which a Celery task cannot be")
            return decorate(function)

        return checked

    def _busy(
        self,
        key: str,
        name: str,
        on_busy: OnBusy,
        timeout: float | None,
        retry_after: float,
        max_retries: int | None,
        holder: str,
    ) -> None:
        """Raise what a busy key means for this run: ``TaskBusyError``, or ``Retry`` from ``task.retry``; ``holder``
        says who holds the key, for the message."""
        label = _task_label()
        if on_busy == "wait":
            why = f"{label} did not run: {name} key still taken after waiting {timeout} s, by {holder}"
        else:
            why = f"{label} did not run: {name} key taken by {holder}"
        error = TaskBusyError(why, key=key, server=self.registry.server)
        task = celery.current_task
        if on_busy == "retry" and task is not None and not task.request.called_directly:
            logger.info("hybridlock: %s retried in %g s: %r is taken", label, retry_after, key)
            # Raises Retry (sent again after the countdown), or the error once max_retries are used up.
            raise task.retry(countdown=retry_after, max_retries=max_retries, exc=error)
        raise error


def _check_busy_options(on_busy: object, timeout: object, retry_after: object, max_retries: object) -> None:
    if on_busy not in _ON_BUSY:
        raise InvalidArgumentError(f"on_busy must be one of {', '.join(map(repr, _ON_BUSY))}, not {on_busy!r}")
    if timeout is not None:
        if on_busy != "wait":
            raise InvalidArgumentError(f"timeout is for on_busy='wait' only, not {on_busy!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < float("inf"):
            raise InvalidArgumentError(f"timeout must be None or a non-negative number of seconds, not {timeout!r}")
        acquire_timeout(timeout)  # (above threading.TIMEOUT_MAX: every acquire would refuse it)
    if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or not 0 <= retry_after < 1e9:
        raise InvalidArgumentError(f"retry_after must be a non-negative number of seconds, not {retry_after!r}")
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0
    ):
        raise InvalidArgumentError(f"max_retries must be None or a non-negative whole number, not {max_retries!r}")


@contextlib.contextmanager
def _thread_named(name: str | None) -> Iterator[None]:
    """Name the current thread ``name`` (a task's label; None: left alone, outside a task) while a run holds its key:
    the holder description that ``hybridlock inspect`` shows names the holding thread, so it names the task and its
    id (celery-once #31). Restored after."""
    if name is None:
        yield
        return
    thread = threading.current_thread()
    before = thread.name
    thread.name = name
    try:
        yield
    finally:
        thread.name = before


#: How long a refused run waits for the other runs of its process that are taking the key at that moment to be
#: told whether they got it, so that its message can name the one that did (a non-blocking take is one round trip).
SETTLE_SECONDS = 0.5


class _Run:
    """A run of a keyed task in this process, from before its acquire to after its release."""

    __slots__ = ("asking", "ended_meanwhile", "held", "label")

    def __init__(self, label: str) -> None:
        self.label = label
        self.asking = False  # inside its acquire now
        self.held = False  # it took the key
        self.ended_meanwhile: list[str] = []  # this process's runs of the key that held it and ended during this one


class _RunsHere:
    """This process's runs of each key, for a refused run to tell whether a run of this process refused it.

    A refusal is not always seen with its holder: the lock's local half refuses a run while another thread of the
    process is taking the key (asking the server, before it is the holder), holds it or gives it back, and that
    thread may have let go by the time the refused run looks (``statistics()`` then shows no holder here). A run of
    this process that held the key and ended during the refused attempt, or gives it back, or takes it, is the
    cause; with none, the holder is another process."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._runs: dict[str, list[_Run]] = {}

    @contextlib.contextmanager
    def running(self, key: str, label: str) -> Iterator[_Run]:
        me = _Run(label)
        with self._changed:
            self._runs.setdefault(key, []).append(me)
        try:
            yield me
        finally:
            with self._changed:
                runs = self._runs[key]
                runs.remove(me)
                if me.held:
                    for other in runs:
                        other.ended_meanwhile.append(label)
                if not runs:
                    del self._runs[key]
                self._changed.notify_all()

    @contextlib.contextmanager
    def asking(self, me: _Run) -> Iterator[None]:
        """``me`` is inside its acquire while this lasts."""
        with self._changed:
            me.asking = True
        try:
            yield
        finally:
            with self._changed:
                me.asking = False
                self._changed.notify_all()

    def others(self, key: str, me: _Run) -> list[_Run]:
        """This process's other runs of ``key`` under way now, in the order they started."""
        with self._changed:
            return [run for run in self._runs.get(key, ()) if run is not me]

    def settle(self, key: str, me: _Run, within: float) -> None:
        """Wait, at most ``within`` seconds, until no other run of ``key`` here is inside its acquire."""
        with self._changed:
            self._changed.wait_for(
                lambda: not any(run.asking for run in self._runs.get(key, ()) if run is not me), timeout=within
            )


def _holder(lock: Any, me: _Run | None = None, runs: _RunsHere | None = None) -> str:
    """Who holds ``lock``, for a busy run's message (celery-once #31): the holding thread's name when it is a thread of
    this process (a run's thread is named ``task name[task id]``: two runs in one threads-pool worker, say), else
    where to look. (What another process wrote about itself is for ``hybridlock inspect``: reading it here would
    cost a round trip and the server's key layout.)"""
    held = lock.statistics()
    if held.owner_thread == threading.get_ident():
        return "this very run (the task called itself)"
    if held.owner_thread is None and me is not None and runs is not None:
        # Another run of this process may be taking the key now (it has the key's local half, and asks the server):
        # once it is told, it holds the key or not, and the message can say which.
        runs.settle(lock.key, me, SETTLE_SECONDS)
        held = lock.statistics()
    if held.owner_thread is not None:
        return f"{held.owner_name!r} (in this process)"
    if me is not None and runs is not None:
        # No holder here now; but a run of this process may have held the key during the refused attempt and let
        # go since, or be giving it back, or still be taking it (the threads pool): that run refused this one, not
        # another process.
        if me.ended_meanwhile:
            return f"{me.ended_meanwhile[-1]!r} (in this process, which has just ended)"
        others = runs.others(lock.key, me)
        releasing = [run.label for run in others if run.held]
        if releasing:
            return f"{releasing[0]!r} (in this process, giving it back)"
        taking = [run.label for run in others if run.asking]
        if taking:
            # (Still waiting for the server's answer: for a run in another process, perhaps.)
            return (
                f"{taking[0]!r} (in this process, still taking it), or a run in another process (hybridlock "
                "inspect KEY names it)"
            )
    return "a run in another process (hybridlock inspect KEY names it)"


def _running_task() -> str | None:
    """``name[id]`` of the task running in this thread, or None outside a task."""
    task = celery.current_task
    if task is None or task.request.id is None:
        return None
    return f"{task.name}[{task.request.id}]"


def _task_label() -> str:
    """``name[id]`` of the task running in this thread, for messages (``a call`` outside a task)."""
    return _running_task() or "a call"
