"""The asyncio half of the paired shims: what generated code needs and cannot spell the same way on both sides.

Hand-written, never generated. ``hybridlock/_sync/_compat.py`` holds the thread half under the partner names that
``scripts/unasync.py`` renames to (``AsyncFifoMutex`` -> ``FifoMutex``, ``AsyncWorker`` -> ``Worker``); names that
mean the same on both sides are spelled the same (``current_owner``, ``monotonic``, ``sleep``, ``shielded``). Both
halves keep the same signatures, so code written against one runs against the other once ``async``/``await`` are
taken out.

Cancellation is the one thing threads do not have. ``AsyncFifoMutex.acquire`` is cancellation-safe (a waiter
cancelled after the mutex was handed to it hands it on), and ``shielded()`` lets cleanup I/O finish even when the
task awaiting it is cancelled.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from functools import partial
from types import FrameType
from typing import Any, TypeAlias, TypeVar, final

from ..errors import EventLoopMismatchError, LockNotOwnedError

__all__ = [
    "AsyncAlarm",
    "AsyncCondition",
    "AsyncEvent",
    "AsyncFanOut",
    "AsyncFifoMutex",
    "AsyncLossCanceller",
    "AsyncWorker",
    "IS_ASYNC",
    "OTHER_API_REGISTRY",
    "OWNER_ENDED",
    "OWNER_KIND",
    "LateHandler",
    "LoopBinding",
    "Thunk",
    "at_exit",
    "cancel_requests",
    "current_owner",
    "cut_connection",
    "describe_owner",
    "in_task",
    "monotonic",
    "new_guard",
    "owner_alive",
    "owner_ident",
    "outside_the_loop",
    "owner_name",
    "raise_swallowed_cancel",
    "refuse_in_event_loop",
    "returned_to_with",
    "shielded",
    "sleep",
]

T = TypeVar("T")

#: Which side this is, for the few checks that must tell (a decorator accepts only functions it can call).
IS_ASYNC = True

#: How a message names the other API's registry: generated code cannot spell it, since the renames would make any
#: name it writes this side's. Here, the thread API's.
OTHER_API_REGISTRY = "LockRegistry"
#: What an owner is on this side, and what it does when it stops running, for messages.
OWNER_KIND = "task"
OWNER_ENDED = "finished"

#: A call with no arguments whose result is awaited: ``Thunk[int]`` is ``Callable[[], Awaitable[int]]`` here and
#: ``Callable[[], int]`` on the sync side (callbacks handed to shared code).
Thunk: TypeAlias = Callable[[], Awaitable[T]]

#: What a fan-out hands a straggler's outcome to, with its lane (``AsyncFanOut.run``'s ``late``).
LateHandler: TypeAlias = Callable[[Any, Any], Awaitable[None]]

monotonic = time.monotonic  # the same clock on both sides, so deadlines computed in shared code compare
sleep = asyncio.sleep


def at_exit(callback: Thunk[None]) -> None:
    """Nothing: at interpreter exit there is no event loop left to run an async cleanup on (an asyncio registry
    is closed by ``async with`` or ``await aclose()``). The thread side registers the callback with ``atexit``."""


def current_owner() -> object:
    """Who is running: the current asyncio task (the thread's ``ThreadOwner`` on the sync side). Compare with ``==``.

    Raises ``RuntimeError`` outside a task. The task object itself is returned (not its ``id()``, which a later task
    could reuse), so whoever stores it keeps the task alive until it lets go."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("current_owner() called outside an asyncio task")
    return task


def asking_owner() -> object | None:
    """Who is asking about its own hold (``hold_count``, ``is_held_by_current_task()``, a repr): the current task,
    or None from outside any task (a thread), which holds nothing (the sync twin: the thread's owner, always)."""
    return asyncio.current_task() if asyncio._get_running_loop() is not None else None


def in_task() -> bool:
    """Whether the caller runs in an asyncio task of a running loop (where ``current_owner()`` answers), not in a
    thread of its own (the sync twin: always)."""
    return asyncio._get_running_loop() is not None and asyncio.current_task() is not None


def outside_the_loop(call: str, what: str) -> str:
    """The message for an asyncio lock's own-hold check (``ensure_held()``) called outside its event loop: from a
    thread, which the asyncio API cannot know as an owner (the sync twin's is never needed)."""
    return (
        f"{call} of an asyncio {what} was called outside its event loop (from a thread?): it checks the calling "
        f"task's hold, so call it from the task that holds the {what}; a thread may read lost and valid_until"
    )


def owner_alive(owner: object) -> bool:
    """Whether ``owner`` (from ``current_owner()``) may still run: the task is not done (the sync twin: the thread
    has not ended)."""
    return not isinstance(owner, asyncio.Task) or not owner.done()


def owner_ident(owner: object) -> object:
    """What ``statistics().owner_thread`` shows of an owner: the task itself."""
    return owner


def describe_owner(owner: object) -> str:
    """How a repr shows an owner: the task's name."""
    return owner.get_name() if isinstance(owner, asyncio.Task) else str(owner)


def owner_name(owner: object) -> str | None:
    """The name of an owner, for holder descriptions: the task's name (None if ``owner`` is not a task)."""
    return owner.get_name() if isinstance(owner, asyncio.Task) else None


def returned_to_with(lock: Any, acquired: bool, caller: FrameType | None) -> bool:
    """``acquired``: ``async with lock.acquire()`` fails on the coroutine (not an asynchronous context manager)
    before anything is taken, so there is nothing to look for here (the sync twin lets ``with lock.acquire(...):``
    work)."""
    return acquired


def cancel_requests() -> int:
    """How many cancellation requests the current task has pending (``Task.cancelling()``), for
    ``raise_swallowed_cancel``."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


def raise_swallowed_cancel(before: int) -> None:
    """Raise ``CancelledError`` if the current task was asked to cancel since ``cancel_requests()`` gave ``before``
    without the error reaching us. Python 3.11's ``asyncio.wait_for``, which redis-py waits in, loses a cancellation
    that lands as the call it wraps completes (fixed in 3.12): the request is counted, the error never comes, and
    the task would go on waiting for, or into, a lock its canceller gave up on. Called after each server call of a
    wait; a request that was delivered and handled (``uncancel()``, as ``asyncio.timeout`` does) is not counted."""
    if cancel_requests() > before:
        raise asyncio.CancelledError


def refuse_a_task_of_its_own(what: str, key: str, context: Any) -> None:
    """Raise ``LockNotOwnedError`` when the public call that reached the caller (an ``_acquire_from``: two frames up)
    is itself the coroutine of the current task: ``asyncio.wait_for(lock.acquire(), t)`` before Python 3.12,
    ``create_task(lock.acquire())``, ``gather(...)``. That task ends as the call returns, so the hold would belong to
    nobody (and the caller, handed True, would not hold it). Called on the first acquire only, before anything is
    taken (a reentrant one is by a task that already holds, so it cannot be such a task). The sync twin: nothing (a
    thread is its own caller). A registry closed, or called from another loop, says so first (``check_open``).

    Only that exact shape is caught: a task whose coroutine merely awaits the acquire and returns (a one-line
    wrapper, anyio's ``start_soon(lock.acquire)``, which wraps it) ends holding the lock all the same, and that hold
    is found abandoned and ended as any other (``owners.py``). ``what`` names what is held ("lock", "permit of this
    semaphore")."""
    task = asyncio.current_task()
    if task is not None and getattr(task.get_coro(), "cr_frame", None) is sys._getframe(2):
        call = sys._getframe(2).f_code.co_name
        context.check_open(key)
        raise LockNotOwnedError(
            f"{call}() ran as an asyncio task of its own (asyncio.wait_for() before Python 3.12, create_task(), "
            f"gather()): the {what} would belong to that task, which ends as {call}() returns, and nobody could "
            f"release it. Await it in the task that will hold the {what}; for a deadline use acquire(timeout=...) "
            f"or wrap the await in `async with asyncio.timeout(...)` (Python 3.11+)",
            key=key,
            server=context.server,
        )


def refuse_in_event_loop(key: str, server: str) -> None:
    """Nothing to refuse: the asyncio locks are the ones meant for the event loop (the thread side's twin raises
    ``EventLoopBlockedError`` there)."""


async def shielded(call: Thunk[T]) -> T:
    """Run ``call()`` and await it to its end even if the calling task is cancelled meanwhile; then re-raise the
    cancellation.

    For cleanup I/O that must not be cut in half (a release sent to the server). ``asyncio.shield`` alone is not
    enough: it lets the cancelled caller go on at once while the work still runs, so the caller's next step would
    race its own cleanup. Here the caller waits for the work, then sees its ``CancelledError``. The work runs in a
    task of its own, so inside it ``current_owner()`` is that task, not the caller: read the owner before. The
    caller waits as long as the work takes, so bound the work itself (a socket timeout, ``asyncio.wait_for``).
    (The sync twin just returns ``call()``: a thread cannot be cancelled.) It takes the call, not a coroutine, so
    that ``await shielded(self._cleanup)`` reads the same on both sides."""
    task = asyncio.ensure_future(call())
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            # asyncio.wait never cancels what it waits for, unlike wait_for or awaiting the task directly.
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        if not task.cancelled() and task.exception() is not None:
            # Keep the cleanup's own failure visible, but the cancellation is what the caller must see.
            cancelled.__context__ = task.exception()
        raise cancelled
    return task.result()


async def cut_connection(pubsub: Any) -> None:
    """Break the connection of a redis-py/valkey-py ``PubSub`` under the task reading it, which then fails at once
    instead of at the end of its read timeout (the sync twin does the same to a thread). Never raises.

    ``nowait``: the reader still holds the stream, so waiting for it to close could wait for the reader (redis-py
    closes its own asyncio PubSub the same way)."""
    connection = getattr(pubsub, "connection", None)
    if connection is not None:
        with suppress(Exception):
            await connection.disconnect(nowait=True)


def new_guard() -> AbstractContextManager[object]:
    """A guard for a few lines of state change: a ``threading.Lock`` on the sync side, nothing here.

    Tasks of one loop only switch at an ``await``, so a block with no ``await`` inside is already atomic. Shared
    code must therefore never ``await`` inside ``with guard:`` (the sync side would hold a lock across I/O)."""
    return nullcontext()


@final
class LoopBinding:
    """The event loop an asyncio registry belongs to: the first one it is used in (the thread side's twin binds
    to nothing).

    Its connections, background tasks and waits live in that loop, and ``asyncio.run()`` makes (and closes) a new
    loop each time; used from another loop they would fail deep inside the client (``Event loop is closed``, or
    a future attached to a different loop). ``check`` says so first, naming the registry."""

    __slots__ = ("_loop",)

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None

    def check(self, context: Any, key: str | None) -> None:
        """Bind to the running loop on first use; raise ``EventLoopMismatchError`` from any other loop, naming
        ``context``'s registry. Call it from a coroutine."""
        loop = asyncio.get_running_loop()
        bound = self._loop
        if bound is loop:
            return
        if bound is None:
            self._loop = loop
            return
        state = "closed now" if bound.is_closed() else "still open"
        registry = f"{type(context.registry).__name__} {context.config.registry_key!r}"
        raise EventLoopMismatchError(
            f"{registry} belongs to the event loop it was first used in ({state}), not to this one: its connections "
            "and background tasks live in that loop. Make one registry per event loop: create it inside the "
            "coroutine that asyncio.run() runs (async with AsyncLockRegistry(...) as registry:), not at import time "
            "or in an earlier asyncio.run()",
            key=key,
            server=context.server,
        )


@final
class AsyncEvent:
    """``threading.Event``'s interface for tasks: ``set``, ``clear``, ``is_set`` and ``await wait(timeout)``, which
    returns whether the event is set (False when ``timeout`` seconds passed first), as the thread event's does."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        return await _wait_event(self._event, timeout)


_ARMED, _CANCELLED, _CLOSED = 0, 1, 2
_LOSS_MESSAGE = "hybridlock: the lease was lost"


@final
class AsyncLossCanceller:
    """The asyncio half of an ``until_lost()`` scope's cancellation (``scope.py``): made in the task that enters the
    scope, it cancels that task when ``fire()`` is called, and tells at the scope's exit whether the exception
    leaving it is that cancellation (the scope then raises ``LockLostError`` in its place) or one from outside
    (which must go on as ``CancelledError``).

    The rules are ``asyncio.timeout``'s: the task's count of cancellation requests (``cancelling()``) is read at
    entry, and ours is taken back (``uncancel()``) at exit; the error is ours only if it is a ``CancelledError`` and
    no other request is left. (Python 3.10 has no such count: there, ours is told by its message, which a later
    ``cancel()`` from outside replaces.) The thread half (``LossCanceller``) cancels nothing: a thread cannot be
    interrupted, so its scope's body watches ``lost_event`` or calls ``ensure_held()``."""

    __slots__ = ("_cancelling", "_loop", "_state", "_task")

    def __init__(self) -> None:
        task = asyncio.current_task()
        if task is None:  # (only a coroutine driven by something other than asyncio could get here)
            raise RuntimeError("until_lost() must be entered in an asyncio task")
        self._task = task
        self._loop = asyncio.get_running_loop()
        self._cancelling = task.cancelling() if hasattr(task, "cancelling") else 0
        self._state = _ARMED

    def fire(self) -> None:
        """Cancel the task, soon: from any thread, and never within the call (the loss may be found by the task
        itself, in a renewal by hand, which then raises ``LockLostError`` on its own: a cancellation left pending
        by a direct ``cancel()`` would then hit its first ``await`` after the scope)."""
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:
            pass  # the loop is closed: nothing runs in it any more, and nothing is left to cancel

    def _cancel(self) -> None:
        if self._state == _ARMED:  # (not once the scope has exited: the task is elsewhere by then)
            self._state = _CANCELLED
            if hasattr(self._task, "uncancel"):
                self._task.cancel()
            else:
                self._task.cancel(_LOSS_MESSAGE)

    def close(self, error: BaseException | None) -> bool:
        """The scope exits with ``error`` (None: normally): stop cancelling, take back our cancellation request if
        one was made, and return whether ``error`` is that cancellation."""
        cancelled = self._state == _CANCELLED
        self._state = _CLOSED
        if not cancelled:
            return False
        if hasattr(self._task, "uncancel"):
            return self._task.uncancel() <= self._cancelling and isinstance(error, asyncio.CancelledError)
        return isinstance(error, asyncio.CancelledError) and error.args[:1] == (_LOSS_MESSAGE,)


async def _wait_event(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds pass; returns whether it is set.

    NOTE: not ``asyncio.wait_for``. Before Python 3.12 it returns normally, losing the cancellation, when the event
    is set in the same loop iteration as the waiting task is cancelled (the task would then go on, say, to take a
    lock its caller gave up on). ``asyncio.wait`` never swallows a cancellation."""
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((waiting,), timeout=timeout)
    finally:
        waiting.cancel()  # (a no-op once it has finished)
    return event.is_set()


@final
class AsyncCondition:
    """``threading.Condition``'s interface for the tasks of one loop: ``with cond:`` (which holds nothing: see
    ``new_guard``), ``await cond.wait_for(predicate, timeout)`` and ``cond.notify_all()``.

    ``wait_for`` returns the predicate's last value, False when ``timeout`` seconds passed first. A waiter that is
    cancelled simply leaves: nothing was handed to it."""

    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def __enter__(self) -> AsyncCondition:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        result = predicate()
        if result:
            return result
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not result:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return result
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait((waiter,), timeout=remaining)
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                if not waiter.done():
                    waiter.cancel()
            result = predicate()
        return result

    def notify_all(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


class _Ticket:
    """One waiting task: it awaits ``wakeup`` until a release (or its deadline) sets it."""

    __slots__ = ("granted", "wakeup")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.wakeup: asyncio.Future[None] = loop.create_future()
        self.granted = False  # the mutex was handed to this task

    def wake(self) -> None:
        if not self.wakeup.done():
            self.wakeup.set_result(None)


@final
class AsyncFifoMutex:
    """A non-reentrant mutex for the tasks of one event loop, with FIFO hand-off: the thread side's ``FifoMutex``
    for asyncio, with the same methods (only ``acquire`` is a coroutine).

    ``release()`` hands the mutex straight to the longest-waiting task; ``pass_on()`` may instead leave it free for
    a barge window, exactly as the thread version does (read that module's docstring). It does not know who holds
    it (any task may release it): the lock above it tracks its owner with ``current_owner()``.

    Cancellation-safe: a task cancelled while queued leaves the queue; a task cancelled after the mutex was already
    handed to it (the hand-off and the cancel raced) hands it on to the next waiter, so a cancelled ``acquire()``
    never leaves the mutex held by nobody. An uncontended ``acquire()`` returns without yielding to the loop.
    Not thread-safe: use it from its loop's thread only.
    """

    __slots__ = ("_barge_window", "_head_passed_over_since", "_locked", "_waiters", "_woken")

    def __init__(self, barge_window: float = 0.0) -> None:
        self._locked = False
        self._waiters: deque[_Ticket] = deque()
        # The task woken by pass_on() to take the free mutex, until it has looked (it is no longer in _waiters).
        self._woken: _Ticket | None = None
        self._barge_window = barge_window
        # When pass_on() first let a running task go ahead of the current longest waiter (None: it has not).
        self._head_passed_over_since: float | None = None

    def __repr__(self) -> str:
        state = "locked" if self._locked else "unlocked"
        return f"<{state} {type(self).__name__} at {id(self):#x} with {self.waiting} waiting>"

    @property
    def waiting(self) -> int:
        """How many tasks are waiting (queued, or woken and about to look)."""
        return len(self._waiters) + (self._woken is not None)

    def locked(self) -> bool:
        return self._locked

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """Take the mutex; with ``timeout >= 0`` give up after that many seconds (False). As ``FifoMutex.acquire``."""
        if not self._locked:
            self._locked = True
            return True
        if not blocking:
            return False
        loop = asyncio.get_running_loop()
        ticket = _Ticket(loop)
        self._waiters.append(ticket)
        deadline = None if timeout < 0 else loop.time() + timeout
        try:
            while True:
                timer = None if deadline is None else loop.call_at(deadline, ticket.wake)
                try:
                    await ticket.wakeup
                finally:
                    if timer is not None:
                        timer.cancel()
                # NOTE: from here to the return nothing awaits, so no other task runs and no cancellation lands.
                if ticket.granted:
                    return True
                if self._woken is ticket:
                    # pass_on() left the mutex free for us; if it still is, it is ours even if the deadline passed
                    # meanwhile (the releasing task counted on someone taking it).
                    self._woken = None
                    if not self._locked:
                        self._locked = True
                        self._head_passed_over_since = None
                        return True
                    # A running task took it first: wait again, still first in line.
                    if deadline is not None and loop.time() >= deadline:
                        return False
                    ticket.wakeup = loop.create_future()
                    self._waiters.appendleft(ticket)
                    continue
                # The deadline woke us while still queued.
                self._waiters.remove(ticket)
                return False
        except BaseException:
            self._abandon(ticket)
            raise

    def _abandon(self, ticket: _Ticket) -> None:
        """Undo a wait cut short (cancelled): leave the queue, or pass on what was already handed to us."""
        if ticket.granted:
            self.release()  # hands it to the next waiter, or unlocks
        elif self._woken is ticket:
            self._woken = None
            if not self._locked:
                # We were the one chosen to take the free mutex: take it and release it, waking the next in line.
                self._locked = True
                self.release()
        elif ticket in self._waiters:
            self._waiters.remove(ticket)
        # Otherwise the ticket was already dropped (its wake-up future was cancelled): nothing to undo.

    def _next_live(self) -> _Ticket | None:
        """Pop the longest waiter whose task is still waiting (a cancelled wake-up means its task is leaving)."""
        while self._waiters:
            ticket = self._waiters.popleft()
            if not ticket.wakeup.cancelled():
                return ticket
        return None

    def _grant_next(self) -> bool:
        """Hand the (locked) mutex to the longest-waiting task; False when nobody waits."""
        woken = self._woken
        if woken is not None:
            # Already awake (or waking): it will find the grant when it runs.
            self._woken = None
            woken.granted = True
        else:
            ticket = self._next_live()
            if ticket is None:
                return False
            ticket.granted = True
            ticket.wake()
        self._head_passed_over_since = None
        return True

    def pass_on(self) -> bool:
        """Release to a waiting task, if there is one (True); else keep the mutex locked (False).

        Within the barge window the mutex is left free with the longest waiter woken; after it, or with a window
        of 0, the mutex is handed to that waiter directly."""
        while self._waiters and self._waiters[0].wakeup.cancelled():
            self._waiters.popleft()
        if self._woken is None and not self._waiters:
            self._head_passed_over_since = None
            return False
        if self._barge_window > 0:
            now = monotonic()
            since = self._head_passed_over_since
            if since is None:
                self._head_passed_over_since = since = now
            if now - since < self._barge_window:
                self._locked = False
                if self._woken is None:
                    ticket = self._waiters.popleft()  # live: cancelled heads were dropped above
                    self._woken = ticket
                    ticket.wake()
                return True
        return self._grant_next()

    def release(self) -> None:
        """Release, handing the mutex straight to the longest-waiting task if there is one."""
        if not self._locked:
            raise RuntimeError("release of an unlocked AsyncFifoMutex")
        if not self._grant_next():
            self._locked = False
            self._head_passed_over_since = None


@final
class AsyncWorker:
    """A background task that calls ``step()`` until stopped: the asyncio twin of the thread ``Worker``.

    ``step`` is awaited, then the worker sleeps for the number of seconds it returned (``None``: it is done, the
    worker ends). ``wake()`` cuts the sleep short (run the step now); ``stop()`` asks the worker to end after the
    step in progress and waits for it. The step must handle its own errors: one that escapes ends the worker and
    is kept in ``error``. Stopping is cooperative, as with threads: a step in progress is not cancelled.
    """

    __slots__ = ("_stop_requested", "_task", "_wakeup", "error", "name", "step")

    def __init__(self, step: Callable[[], Awaitable[float | None]], name: str) -> None:
        self.step = step
        self.name = name
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_requested = False
        self._wakeup: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {'running' if self.running else 'idle'}>"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task on the running loop (once)."""
        if self._task is not None:
            raise RuntimeError(f"{self!r} was already started")
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    def wake(self) -> None:
        """Run the next step now instead of at the end of the current sleep."""
        if self._wakeup is not None:
            self._wakeup.set()

    async def stop(self, timeout: float | None = None) -> bool:
        """Ask the worker to end and wait up to ``timeout`` seconds for it; True if it has ended (or never ran)."""
        self._stop_requested = True
        self.wake()
        task = self._task
        if task is None or task.done() or task is asyncio.current_task():
            return task is None or task.done()
        done, _ = await asyncio.wait((task,), timeout=timeout)
        return bool(done)

    async def _run(self) -> None:
        wakeup = self._wakeup
        assert wakeup is not None
        while not self._stop_requested:
            try:
                delay = await self.step()
            except Exception as exc:
                self.error = exc
                return
            if delay is None or self._stop_requested:
                return
            await _wait_event(wakeup, max(0.0, delay))
            wakeup.clear()


@final
class AsyncAlarm:
    """Calls ``ring()`` once a deadline has passed, whatever its owner is awaiting meanwhile: a timer of the running
    loop here, a daemon thread on the sync side (``Alarm``: a thread blocked in I/O cannot watch the clock).

    ``ring_by(when)`` arms it for ``when`` (a ``monotonic()`` time), unless it is armed for no later already.
    Once that time has passed, ``ring()`` runs (in a task of its own here) and returns the next time to ring, or
    None to stay unarmed until the next ``ring_by``; rings never overlap. ``cancel()`` disarms it (a ring in
    progress finishes, and arms nothing); ``stop(timeout)`` cancels and waits up to ``timeout`` seconds for a ring
    in progress. ``ring_by`` arms it again after either. The ring must handle its own errors: one that escapes
    leaves the alarm unarmed and is kept in ``error``. Use it from the loop's thread only."""

    __slots__ = ("_generation", "_handle", "_ringing", "_when", "error", "name", "ring")

    def __init__(self, ring: Callable[[], Awaitable[float | None]], name: str) -> None:
        self.ring = ring
        self.name = name
        self.error: BaseException | None = None
        self._when: float | None = None  # armed for this monotonic() time; None: not armed
        self._handle: asyncio.TimerHandle | None = None
        self._ringing: asyncio.Task[None] | None = None
        self._generation = 0  # moved by cancel(): a ring that began before it arms nothing

    def __repr__(self) -> str:
        state = "unarmed" if self._when is None else f"armed for {self._when:.3f}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    @property
    def armed_for(self) -> float | None:
        """The time it will ring at (``monotonic()``), None when unarmed."""
        return self._when

    def ring_by(self, when: float) -> None:
        if self._when is not None and self._when <= when:
            return
        self._when = when
        if self._handle is not None:
            self._handle.cancel()
        # call_later, not call_at: the loop's clock need not be time.monotonic() (uvloop keeps its own).
        self._handle = asyncio.get_running_loop().call_later(max(0.0, when - monotonic()), self._fire)

    def cancel(self) -> None:
        self._generation += 1
        self._when = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    async def stop(self, timeout: float | None = None) -> bool:
        """Cancel, and wait up to ``timeout`` seconds for a ring in progress; True if none is left running."""
        self.cancel()
        ringing = self._ringing
        if ringing is None or ringing.done() or ringing is asyncio.current_task():
            return ringing is None or ringing.done()
        done, _ = await asyncio.wait((ringing,), timeout=timeout)
        return bool(done)

    def _fire(self) -> None:
        self._handle = None
        when, self._when = self._when, None
        ringing = self._ringing
        if ringing is not None and not ringing.done():
            # The last ring is still running (a slow callback): it looks again as soon as it is done.
            self._when = when
            return
        self._ringing = asyncio.get_running_loop().create_task(self._ring(self._generation), name=self.name)

    async def _ring(self, generation: int) -> None:
        try:
            later = await self.ring()
        except Exception as exc:
            self.error = exc
            return
        if generation != self._generation:
            return  # cancelled meanwhile
        pending, self._when = self._when, None  # armed while ringing: the timer left that to us (see _fire)
        for when in (pending, later):
            if when is not None:
                self.ring_by(when)


@final
class AsyncFanOut:
    """Runs several calls at once, each in its *lane* (a server, or a server and a key): one task each here, threads
    on the sync side (``FanOut``). For a quorum, which asks N independent servers the same thing.

    ``await run(calls)`` returns one outcome per call, in order: its result, or the ``Exception`` it raised. Each
    call must bound its own time (a socket timeout).

    With ``enough``, a hung server costs less than its socket timeout: once ``enough`` calls have *succeeded* (a
    failure does not count: the others may still be needed), the others get as long again as that took, and at
    least ``patience`` seconds; a call still running then is a *straggler*, reported as a ``TimeoutError``
    outcome, and left to finish. ``late(lane, outcome)`` then receives its outcome (a quorum gives back a grant that
    came too late to count). ``lanes[i]`` is call ``i``'s lane (any hashable; by default ``i``).

    A lane carries one call at a time, so calls of one lane reach the server in the order they were made, a late
    handler's own calls included: nothing sent later can overtake a straggler (a quorum relies on that: a give-back
    must not land after the same owner's next grant). A call whose lane is still busy (a straggler, or its ``late``
    handler, has not finished) is not sent, and its outcome is a ``TimeoutError`` at once, so a hung server gathers
    no backlog; with ``queue``, it waits instead, and is sent once the lane is free (the calls ahead of it bound
    its wait: each bounds its own time). A lane holds one waiting call at most: a call that would wait behind
    another waiting one is refused (a quorum queues only its releases, and the one waiting covers the next).

    A round whose caller is cancelled (or, on threads, interrupted) leaves its calls already sent to finish in
    their lanes, as stragglers: their outcomes go to ``late``, and the lane stays busy until then. Cutting them
    off would not unsend them: the server would still run what it received, after whatever the caller sends
    next on another connection.

    ``aclose`` cancels the stragglers still running; ``after_fork_in_child`` forgets them."""

    __slots__ = ("_busy", "_stragglers", "_waiting", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._busy: set[Hashable] = set()  # lanes with a call (or its late handler) still running
        self._waiting: dict[Hashable, asyncio.Future[None]] = {}  # lane -> its waiting call's turn (set: its go)
        self._stragglers: set[asyncio.Task[Any]] = set()

    async def run(
        self,
        calls: Sequence[Thunk[T]],
        *,
        enough: int | None = None,
        patience: float = 0.0,
        late: LateHandler | None = None,
        lanes: Sequence[Hashable] | None = None,
        queue: bool = False,
    ) -> list[T | Exception]:
        if enough is None:
            return list(await asyncio.gather(*(_outcome(call) for call in calls)))
        outcomes: list[T | Exception | None] = [None] * len(calls)
        lane_of = list(range(len(calls)) if lanes is None else lanes)
        running: dict[asyncio.Task[Any], int] = {}
        abandoned: dict[int, bool] = {}  # call index -> its round gave up on it (shared with its lane's task)
        start = time.monotonic()
        loop = asyncio.get_running_loop()
        for index, call in enumerate(calls):
            lane = lane_of[index]
            turn: asyncio.Future[None] | None = None
            if lane in self._busy:
                if not queue or lane in self._waiting:
                    outcomes[index] = TimeoutError("an earlier call to this server is still unanswered")
                    continue
                turn = self._waiting[lane] = loop.create_future()  # before any await: the lane's next call
            else:
                self._busy.add(lane)  # taken here, before any await: no other run can slip in
            task = asyncio.ensure_future(self._in_lane(lane, call, late, abandoned, index, turn))
            running[task] = index
        pending = set(running)
        succeeded = sum(1 for outcome in outcomes if outcome is not None and not isinstance(outcome, Exception))
        try:
            deadline: float | None = None
            while pending:
                if deadline is None and succeeded >= enough:
                    now = time.monotonic()
                    deadline = now + max(patience, now - start)
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    break  # the stragglers' time is up
                for task in done:
                    outcome = task.result()
                    outcomes[running[task]] = outcome
                    if not isinstance(outcome, Exception):
                        succeeded += 1
        except BaseException:
            # Cancelled: what was sent is on the wire already; let it finish in its lane, its outcome going to
            # ``late`` (a grant is given back), and let the caller's cleanup queue behind it.
            self._abandon(pending, running, abandoned)
            raise
        waited = (time.monotonic() - start) * 1000
        self._abandon(pending, running, abandoned)
        for task in pending:
            outcomes[running[task]] = TimeoutError(f"no answer in {waited:.0f} ms, when enough others had answered")
        return outcomes  # type: ignore[return-value]  # every slot is filled by now

    def _abandon(
        self, pending: set[asyncio.Task[Any]], running: dict[asyncio.Task[Any], int], abandoned: dict[int, bool]
    ) -> None:
        """Make the calls of ``pending`` stragglers: their outcomes go to the late handler."""
        for task in pending:
            abandoned[running[task]] = True
            self._stragglers.add(task)  # a reference, so the task is not collected mid-way
            task.add_done_callback(self._stragglers.discard)

    def busy(self, lane: Hashable) -> bool:
        """Whether ``lane`` still carries a call (or its late handler, or a call waiting for it): what that call
        does has not happened yet, or has not been seen."""
        return lane in self._busy

    async def _in_lane(
        self,
        lane: Hashable,
        call: Thunk[T],
        late: LateHandler | None,
        abandoned: dict[int, bool],
        index: int,
        turn: asyncio.Future[None] | None,
    ) -> T | Exception:
        if turn is not None:
            try:
                await turn  # the lane is handed over by the call ahead (_free), still busy
            except BaseException:
                if self._waiting.get(lane) is turn:
                    del self._waiting[lane]  # never had the lane
                elif turn.done() and not turn.cancelled():
                    self._free(lane)  # handed the lane as we were cancelled (aclose): pass it on
                raise
        try:
            outcome = await _outcome(call)
            if abandoned.get(index) and late is not None:
                # Still holding the lane: whatever the handler sends reaches the server before the lane's next call.
                await _outcome(partial(late, lane, outcome))
            return outcome
        finally:
            self._free(lane)

    def _free(self, lane: Hashable) -> None:
        """The lane's call is done: hand the lane to the call waiting for it, if any, else free it."""
        turn = self._waiting.pop(lane, None)
        if turn is not None and not turn.done():
            turn.set_result(None)
        else:
            self._busy.discard(lane)

    async def aclose(self) -> None:
        stragglers, self._stragglers = self._stragglers, set()
        for task in stragglers:
            task.cancel()
        if stragglers:
            await asyncio.wait(stragglers)

    def after_fork_in_child(self) -> None:
        self._stragglers = set()
        self._busy = set()
        self._waiting = {}


async def _outcome(call: Thunk[T]) -> T | Exception:
    try:
        return await call()
    except Exception as exc:
        return exc
