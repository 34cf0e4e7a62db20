"""The thread half of the paired shims: what generated code needs and cannot spell the same way on both sides.

Hand-written, never generated; the partner of ``hybridlock/_async/_compat.py`` (read its docstring). Same names
after ``scripts/unasync.py``'s renames, same signatures with ``async``/``await`` taken out.
"""

from __future__ import annotations

import atexit
import dis
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, suppress
from functools import partial
from types import FrameType
from typing import Any, TypeAlias, TypeVar, cast, final

from ..errors import EventLoopBlockedError, LockTimeoutError

__all__ = [
    "Alarm",
    "Condition",
    "Event",
    "FanOut",
    "FifoMutex",
    "IS_ASYNC",
    "OTHER_API_REGISTRY",
    "OWNER_ENDED",
    "OWNER_KIND",
    "LateHandler",
    "LoopBinding",
    "LossCanceller",
    "ThreadOwner",
    "Thunk",
    "Worker",
    "at_exit",
    "cancel_requests",
    "current_owner",
    "cut_connection",
    "monotonic",
    "describe_owner",
    "in_task",
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
IS_ASYNC = False

#: How a message names the other API's registry: generated code cannot spell it, since the renames would make any
#: name it writes this side's. Here, the asyncio API's.
OTHER_API_REGISTRY = "AsyncLockRegistry"
#: What an owner is on this side, and what it does when it stops running, for messages.
OWNER_KIND = "thread"
OWNER_ENDED = "ended"

#: A call with no arguments: ``Thunk[int]`` is ``Callable[[], int]`` here and ``Callable[[], Awaitable[int]]`` on
#: the async side (callbacks handed to shared code).
Thunk: TypeAlias = Callable[[], T]

#: What a fan-out hands a straggler's outcome to, with its lane (``FanOut.run``'s ``late``).
LateHandler: TypeAlias = Callable[[Any, Any], None]

monotonic = time.monotonic
sleep = time.sleep

_LONGEST_SLEEP = threading.TIMEOUT_MAX / 2  # the longest a Worker sleeps in one go (see Worker._run)


def at_exit(callback: Thunk[None]) -> None:
    """Run ``callback`` at interpreter exit (``atexit``); the async side's twin does nothing."""
    atexit.register(callback)


# -- owners -------------------------------------------------------------------------------------------------------
# A lock's holder in this process is a token made once per thread and kept in a threading.local, not the thread's
# ident: the system hands an ended thread's ident to the next thread it starts (on Linux, usually the very next
# one), which would then "hold" the ended thread's locks, re-enter them and release them. Nor is it the
# ``threading.Thread`` object: ``threading.current_thread()`` in a thread not started by ``threading`` makes a
# ``_DummyThread`` that is never forgotten (CPython's own lock tests count them).


class _Life:
    """Referenced only by its thread's ``threading.local``, which Python clears when the thread ends."""

    __slots__ = ("__weakref__",)


@final
class ThreadOwner:
    """Who holds a lock: one thread, from its first use of hybridlock to its end (compared by identity).

    ``alive`` turns False once the thread has ended (its ``threading.local`` is cleared then: right after the thread's
    function returns, before ``join()`` does). ``thread`` is the ``threading.Thread`` (None for a thread started by
    other means, such as ``_thread.start_new_thread`` or a C library)."""

    __slots__ = ("_life", "ident", "thread")

    def __init__(self, life: _Life) -> None:
        self._life = weakref.ref(life)
        self.ident = threading.get_ident()
        # threading.current_thread() would make a _DummyThread here for a thread threading did not start.
        self.thread: threading.Thread | None = threading._active.get(self.ident)  # type: ignore[attr-defined]

    @property
    def alive(self) -> bool:
        return self._life() is not None

    def __repr__(self) -> str:
        name = self.thread.name if self.thread is not None else "a thread not started by threading"
        return f"<ThreadOwner {name!r} ident={self.ident}{'' if self.alive else ' ended'}>"


_owners = threading.local()


def current_owner() -> object:
    """Who is running: the current thread's ``ThreadOwner`` (the current task on the async side). Compare with
    ``==``; the same object for the thread's whole life, and never another thread's, even one with the same ident."""
    try:
        return _owners.owner
    except AttributeError:
        return _new_owner()


def _new_owner() -> ThreadOwner:
    life = _Life()
    owner = ThreadOwner(life)
    _owners.life = life  # the only reference: see _Life
    _owners.owner = owner
    return owner


def asking_owner() -> object | None:
    """Who is asking about its own hold: the thread's owner (the async twin: None outside any task, which holds
    nothing)."""
    return current_owner()


def in_task() -> bool:
    """True: every thread is an owner (the async twin says whether the caller runs in an asyncio task)."""
    return True


def outside_the_loop(call: str, what: str) -> str:
    """Never needed: every thread is an owner (``in_task()`` is always true); the async twin words the error for a
    thread calling an asyncio lock's check."""
    return f"{call} of a {what} called by no owner"


def owner_alive(owner: object) -> bool:
    """Whether ``owner`` (from ``current_owner()``) may still run: its thread has not ended (the async twin: the task
    is not done). The main thread counts as alive until the interpreter is torn down, atexit handlers included."""
    return not isinstance(owner, ThreadOwner) or owner.alive


def owner_ident(owner: object) -> object:
    """What ``statistics().owner_thread`` shows of an owner: the thread's ident, as ``threading.RLock`` would."""
    return owner.ident if isinstance(owner, ThreadOwner) else owner


def describe_owner(owner: object) -> str:
    """How a repr shows an owner: the thread ident, as ``threading.RLock``'s repr does."""
    return str(owner_ident(owner))


def owner_name(owner: object) -> str | None:
    """The name of an owner, for holder descriptions: its thread's name (None for a thread threading did not
    start)."""
    thread = owner.thread if isinstance(owner, ThreadOwner) else None
    return None if thread is None else thread.name


# -- `with lock.acquire(timeout=1):` --------------------------------------------------------------------------------
# A mistake that filelock and portalocker users make, since theirs works: `acquire()` returns True, and the `with`
# statement then fails on the bool (TypeError) with the lock held by a thread that goes on. So acquire() looks at
# the one instruction its caller runs next: the start of a `with` statement gets a context manager instead.

_WITH_OPCODES = frozenset(dis.opmap[name] for name in ("BEFORE_WITH", "SETUP_WITH") if name in dis.opmap)
_CACHE = dis.opmap.get("CACHE", -1)  # inline cache entries after a call (3.11+): not instructions


@final
class _Hold:
    """What ``acquire()`` returns to ``with lock.acquire(...):``: the lock, held, released when the block ends."""

    __slots__ = ("lock",)

    def __init__(self, lock: Any) -> None:
        self.lock = lock

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> Any:
        return self.lock

    def __exit__(self, *exc_info: object) -> None:
        self.lock.release()

    def __repr__(self) -> str:
        return f"<held {self.lock!r}>"


def returned_to_with(lock: Any, acquired: bool, caller: FrameType | None) -> bool:
    """What an ``acquire``-like call made from the frame ``caller`` returns: ``acquired``, unless ``caller`` goes on
    to enter the result as a context manager (``with lock.acquire(timeout=1):``, as filelock allows): then an object
    whose ``__enter__`` gives the lock and whose ``__exit__`` releases it, or, when the lock was not acquired,
    ``LockTimeoutError`` (the block must not run without it). The async twin returns ``acquired``: ``async with
    lock.acquire()`` fails on the coroutine before anything is taken."""
    if caller is None:
        return acquired
    # The instruction after the call (f_lasti is the call's, or on 3.11 its last inline cache's: skip the others).
    code = caller.f_code.co_code
    at = caller.f_lasti + 2
    op = code[at]  # (a call is never a code object's last instruction)
    while op == _CACHE:
        at += 2
        op = code[at]
    if op not in _WITH_OPCODES:
        return acquired
    if not acquired:
        raise LockTimeoutError(
            "the lock was not acquired (the timeout passed, or blocking=False and it was busy): the with-block "
            "did not run",
            key=getattr(lock, "key", None) or lock.keys[0],  # (a multi-key lock names its first key)
            server=lock._context.server,
        )
    return cast(bool, _Hold(lock))


def refuse_a_task_of_its_own(what: str, key: str, context: Any) -> None:
    """Nothing to refuse: a thread is its own caller (the async twin refuses an acquire run as an asyncio task of its
    own, whose hold would belong to nobody once it returns)."""


def refuse_in_event_loop(key: str, server: str) -> None:
    """Raise ``EventLoopBlockedError`` when called from a thread running an asyncio event loop.

    A thread lock there would stall the loop while it waits, and every task of the loop would share the thread's
    ownership (so one ``with lock:`` would admit them all). Costs a dictionary lookup when asyncio is not in use."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and asyncio._get_running_loop() is not None:
        raise EventLoopBlockedError(
            "a thread lock was called from a running asyncio event loop, where it would stall the loop and let "
            "every task of the loop in as its one owner: use hybridlock.AsyncLockRegistry in async code",
            key=key,
            server=server,
        )


def cancel_requests() -> int:
    """0: a thread cannot be cancelled (the async twin counts the task's cancellation requests)."""
    return 0


def raise_swallowed_cancel(before: int) -> None:
    """Nothing to raise: a thread cannot be cancelled (the async twin restores a cancellation Python 3.11's
    ``asyncio.wait_for`` lost)."""


def shielded(call: Thunk[T]) -> T:
    """Return ``call()``: a thread cannot be cancelled, so there is nothing to shield it from. Exists so that
    ``await shielded(cleanup)`` in async source becomes ``shielded(cleanup)`` here."""
    return call()


@final
class LoopBinding:
    """Nothing to bind: a thread registry belongs to no event loop (the async side's twin binds an asyncio registry
    to the loop it is first used in)."""

    __slots__ = ()

    def check(self, context: Any, key: str | None) -> None:
        """Nothing to check."""


@final
class LossCanceller:
    """The thread half of an ``until_lost()`` scope's cancellation (``AsyncLossCanceller`` on the asyncio side): a
    thread cannot be interrupted from outside, so it cancels nothing; the scope's body watches ``lost_event`` or
    calls ``ensure_held()``, and the scope raises ``LockLostError`` at its exit."""

    __slots__ = ()

    def fire(self) -> None:
        """Nothing to cancel."""

    def close(self, error: BaseException | None) -> bool:
        """No exception is ever this canceller's."""
        return False


#: ``threading.Event``; the async side's ``AsyncEvent`` has the same interface with ``await wait(timeout)``.
Event = threading.Event


def cut_connection(pubsub: Any) -> None:
    """Break the connection of a redis-py/valkey-py ``PubSub`` under the thread reading it, which then fails at once
    instead of at the end of its read timeout (the asyncio twin does the same to a task). Never raises.

    Only the socket is closed, not the ``PubSub``: closing that would hand its connection back to the pool while the
    reader still uses it."""
    connection = getattr(pubsub, "connection", None)
    if connection is not None:
        with suppress(Exception):
            connection.disconnect()


def new_guard() -> AbstractContextManager[object]:
    """A guard for a few lines of state change shared with other threads: a ``threading.Lock`` (nothing on the
    async side, where no task switch can happen without an ``await``; so shared code never awaits inside one)."""
    return threading.Lock()


class Condition(threading.Condition):
    """``threading.Condition`` over a plain (non-reentrant) lock: the partner of ``AsyncCondition``."""

    def __init__(self) -> None:
        super().__init__(threading.Lock())


@final
class Worker:
    """A daemon thread that calls ``step()`` until stopped: the thread twin of ``AsyncWorker``.

    The worker sleeps for the number of seconds ``step`` returned (``None``: it is done, the worker ends).
    ``wake()`` cuts the sleep short (run the step now); ``stop()`` asks the worker to end after the step in progress
    and waits for it. The step must handle its own errors: one that escapes ends the worker and is kept in
    ``error``.
    """

    __slots__ = ("_stop_requested", "_thread", "_wakeup", "error", "name", "step")

    def __init__(self, step: Callable[[], float | None], name: str) -> None:
        self.step = step
        self.name = name
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stop_requested = False
        self._wakeup = threading.Event()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {'running' if self.running else 'idle'}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (once)."""
        if self._thread is not None:
            raise RuntimeError(f"{self!r} was already started")
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run the next step now instead of at the end of the current sleep."""
        self._wakeup.set()

    def stop(self, timeout: float | None = None) -> bool:
        """Ask the worker to end and wait up to ``timeout`` seconds for it; True if it has ended (or never ran)."""
        self._stop_requested = True
        self.wake()
        thread = self._thread
        if thread is None or not thread.is_alive() or thread is threading.current_thread():
            return thread is None or not thread.is_alive()
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        while not self._stop_requested:
            try:
                delay = self.step()
            except Exception as exc:
                self.error = exc
                return
            if delay is None or self._stop_requested:
                return
            # Capped: a longer wait would overflow (a huge lease's renewal period); the step then just runs early.
            self._wakeup.wait(min(max(0.0, delay), _LONGEST_SLEEP))
            self._wakeup.clear()


@final
class Alarm:
    """Calls ``ring()`` once a deadline has passed, whatever its owner's thread is doing meanwhile (blocked in I/O,
    say): the thread twin of ``AsyncAlarm``, whose docstring has the contract.

    A daemon thread of its own waits for the deadline; it starts at the first ``ring_by`` and runs the rings, and
    ends at ``cancel()`` or ``stop()`` (a later ``ring_by`` starts another). Thread-safe."""

    __slots__ = ("_cond", "_thread", "_threads", "_when", "error", "name", "ring")

    def __init__(self, ring: Callable[[], float | None], name: str) -> None:
        self.ring = ring
        self.name = name
        self.error: BaseException | None = None
        self._cond = threading.Condition(threading.Lock())
        self._when: float | None = None  # armed for this monotonic() time; None: not armed
        self._thread: threading.Thread | None = None  # the thread that serves the alarm now
        self._threads: list[threading.Thread] = []  # those started and maybe still running (for stop)

    def __repr__(self) -> str:
        state = "unarmed" if self._when is None else f"armed for {self._when:.3f}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    @property
    def armed_for(self) -> float | None:
        """The time it will ring at (``monotonic()``), None when unarmed."""
        return self._when

    def ring_by(self, when: float) -> None:
        with self._cond:
            if self._when is not None and self._when <= when:
                return
            self._when = when
            if self._thread is None:
                self._thread = thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._threads = [t for t in self._threads if t.is_alive()]
                self._threads.append(thread)
                thread.start()
            else:
                self._cond.notify()

    def cancel(self) -> None:
        with self._cond:
            self._when = None
            self._thread = None  # the thread that served it sees it is no longer wanted, and ends
            self._cond.notify_all()

    def stop(self, timeout: float | None = None) -> bool:
        """Cancel, and wait up to ``timeout`` seconds for a ring in progress; True if no thread is left running."""
        self.cancel()
        with self._cond:
            threads = [t for t in self._threads if t is not threading.current_thread()]
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while True:
                    if self._thread is not me:
                        return
                    when = self._when
                    if when is None:
                        self._cond.wait()
                        continue
                    left = when - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(min(left, _LONGEST_SLEEP))
                self._when = None
            try:
                later = self.ring()
            except Exception as exc:
                self.error = exc
                later = None
            if later is not None:
                with self._cond:
                    if self._thread is me and (self._when is None or later < self._when):
                        self._when = later


# -- FifoMutex --------------------------------------------------------------------------------------------
# The per-key local mutex: first come, first served among the threads of one process.
#
# ``threading.Lock`` lets a releasing thread take the lock straight back (barging), so under contention one thread
# can wait for seconds while others cycle. Here ``release()`` hands the mutex directly to the longest-waiting thread,
# so a thread's wait is bounded by the critical sections queued before it.
#
# Strict hand-off has a price: the mutex belongs to a sleeping thread until the operating system runs it, tens of
# microseconds in which nobody is inside. ``pass_on()``, used when the server lease stays with this process (a
# hand-off streak), may instead leave the mutex free for a short *barge window*: the longest-waiting thread is woken
# and takes it if it is still free when it runs, but a thread already running (typically the releasing one, coming
# straight back) may take it first. Once the waiting thread has been passed over for ``barge_window`` seconds, the
# next release hands the mutex to it directly. Waiting threads are always served in arrival order; only a thread
# that is running, not waiting, can go ahead of them, and only within the window.


class _Ticket:
    """One waiting thread: it sleeps on ``wakeup`` (acquired at creation) until a release wakes it."""

    __slots__ = ("granted", "wakeup")

    def __init__(self) -> None:
        self.wakeup = threading.Lock()
        self.wakeup.acquire()
        self.granted = False  # the mutex was handed to this thread; set under the mutex's guard


class FifoMutex:
    """A non-reentrant mutex with FIFO hand-off; ``acquire(blocking, timeout)`` as ``threading.Lock``."""

    __slots__ = ("_barge_window", "_guard", "_head_passed_over_since", "_locked", "_waiters", "_woken")

    def __init__(self, barge_window: float = 0.0) -> None:
        self._guard = threading.Lock()
        self._locked = False
        self._waiters: deque[_Ticket] = deque()
        # The thread woken by pass_on() to take the free mutex, until it has looked (it is no longer in _waiters).
        self._woken: _Ticket | None = None
        self._barge_window = barge_window
        # When pass_on() first let a running thread go ahead of the current longest waiter (None: it has not).
        self._head_passed_over_since: float | None = None

    @property
    def waiting(self) -> int:
        """How many threads are waiting (queued, or woken and about to look)."""
        return len(self._waiters) + (self._woken is not None)

    def locked(self) -> bool:
        return self._locked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        guard = self._guard
        # `took` is set in the same statement that locks the mutex for us (no call in between, so no signal handler
        # can run there): an interruption at any later point, the guard's exit included, knows to pass it on.
        took = False
        ticket: _Ticket | None = None
        try:
            with guard:
                if not self._locked:
                    self._locked = took = True
                    return True
                if not blocking:
                    return False
                ticket = _Ticket()
                self._waiters.append(ticket)
            deadline = None if timeout < 0 else time.monotonic() + timeout
            while True:
                woke = ticket.wakeup.acquire(True, -1 if deadline is None else max(0.0, deadline - time.monotonic()))
                with guard:
                    if ticket.granted:
                        return True
                    if self._woken is ticket:
                        # pass_on() left the mutex free for us. We were chosen, so if it is still free it is ours
                        # even if our timeout ran out meanwhile (a hair late, as with a hand-off): the releasing
                        # thread counted on someone taking it.
                        self._woken = None
                        if not self._locked:
                            self._locked = took = True
                            self._head_passed_over_since = None
                            return True
                        # A running thread took it first; wait again, still first in line. (Our wake-up consumed
                        # the release, so the ticket is armed again as it is.)
                        if not woke or (deadline is not None and time.monotonic() >= deadline):
                            return False
                        self._waiters.appendleft(ticket)
                        continue
                    # Timed out while still queued.
                    self._waiters.remove(ticket)
                    return False
        except BaseException:
            # Interrupted (KeyboardInterrupt, say): leave the queue, or pass on what was handed to us.
            with guard:
                owned = took
                if ticket is None or owned:
                    pass
                elif ticket.granted or (self._woken is ticket and not self._locked):
                    if self._woken is ticket:
                        self._woken = None
                    self._locked = True
                    owned = True
                elif self._woken is ticket:
                    self._woken = None
                elif ticket in self._waiters:
                    self._waiters.remove(ticket)
                # Otherwise we had already left the queue (timed out, or found the mutex taken after a wake-up and
                # not yet queued again): nothing of ours to undo.
            if owned:
                self.release()
            raise

    def _grant_next(self) -> bool:
        """Hand the (locked) mutex to the longest-waiting thread; False when nobody waits. Call under the guard."""
        woken = self._woken
        if woken is not None:
            # Already awake (or waking): it will find the grant when it looks.
            self._woken = None
            woken.granted = True
        elif self._waiters:
            ticket = self._waiters.popleft()
            ticket.granted = True
            ticket.wakeup.release()
        else:
            return False
        self._head_passed_over_since = None
        return True

    def pass_on(self) -> bool:
        """Release to a waiting thread, if there is one (True); else keep the mutex locked (False).

        Within the barge window the mutex is left free with the longest waiter woken (see the module docstring);
        after it, or with a window of 0, the mutex is handed to that waiter directly."""
        with self._guard:
            if self._woken is None and not self._waiters:
                self._head_passed_over_since = None
                return False
            if self._barge_window > 0:
                now = time.monotonic()
                since = self._head_passed_over_since
                if since is None:
                    self._head_passed_over_since = since = now
                if now - since < self._barge_window:
                    self._locked = False
                    if self._woken is None:
                        ticket = self._waiters.popleft()
                        self._woken = ticket
                        ticket.wakeup.release()
                    return True
            return self._grant_next()

    def release(self) -> None:
        """Release, handing the mutex straight to the longest-waiting thread if there is one."""
        with self._guard:
            if not self._locked:
                raise RuntimeError("release of an unlocked FifoMutex")
            if not self._grant_next():
                self._locked = False
                self._head_passed_over_since = None


@final
class FanOut:
    """Runs several calls at once, each in its *lane*. The thread twin of ``AsyncFanOut`` (read its docstring): same
    outcomes, in order, an ``Exception`` in place of a result, and the same ``enough``, ``patience``, ``late``,
    ``lanes`` and ``queue``, one call at a time per lane. A round interrupted in the calling thread (by
    ``KeyboardInterrupt``) leaves its calls to finish in their lanes, their outcomes going to ``late``.

    Without ``enough`` the first call runs in the calling thread and the others in a small shared pool. With it,
    every call runs in a pool thread (the calling thread only waits, so a hung server never holds it), and a
    straggler's ``late`` handler runs in that thread once its call is done, before the lane takes another call; a
    call waiting for its lane (``queue``) runs in the thread of the call ahead, once that is done (no thread waits
    for a lane). ``close`` ends the pools' threads once they are idle (calls already handed over still run) and
    makes later runs call in the calling thread; ``after_fork_in_child`` forgets the parent's pools (their threads
    do not exist in the child), and the next ``run`` starts new ones."""

    __slots__ = ("_busy", "_closed", "_guard", "_lanes_pool", "_pool", "_waiting", "_width", "name")

    #: Threads for calls with ``enough``, started as needed. A hung server holds one per lane (one per key over a
    #: quorum) until its socket timeout; more calls than this at once wait for a thread.
    LANE_THREADS = 256

    def __init__(self, name: str) -> None:
        self.name = name
        self._guard = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._width = 0
        self._lanes_pool: ThreadPoolExecutor | None = None
        self._busy: set[Hashable] = set()  # lanes with a call (or its late handler) still running (under _guard)
        # Lane -> the call waiting for it (its round, index and call), run next in the lane's thread (under _guard).
        self._waiting: dict[Hashable, tuple[_Round, int, Thunk[Any]]] = {}
        self._closed = False  # then calls run one after another in the caller's thread: no pool to leak

    def run(
        self,
        calls: Sequence[Thunk[T]],
        *,
        enough: int | None = None,
        patience: float = 0.0,
        late: LateHandler | None = None,
        lanes: Sequence[Hashable] | None = None,
        queue: bool = False,
    ) -> list[T | Exception]:
        if enough is None or self._closed:
            if len(calls) <= 1 or self._closed:
                return [_outcome(call) for call in calls]
            pool = self._executor(len(calls) - 1)
            if pool is None:  # closed meanwhile
                return [_outcome(call) for call in calls]
            futures = [pool.submit(_outcome, call) for call in calls[1:]]
            first = _outcome(calls[0])
            return [first, *(future.result() for future in futures)]
        fan = _Round(len(calls), enough, late)
        try:
            return self._run_round(fan, calls, enough, patience, lanes, queue)
        finally:
            # Whatever ends the round (a KeyboardInterrupt too): calls still out are late from now on, so a grant
            # that comes after is handed to ``late`` instead of being recorded for a caller who is gone.
            with fan.changed:
                fan.settled = True

    def _run_round(
        self,
        fan: _Round,
        calls: Sequence[Thunk[T]],
        enough: int,
        patience: float,
        lanes: Sequence[Hashable] | None,
        queue: bool,
    ) -> list[T | Exception]:
        lane_of = list(range(len(calls)) if lanes is None else lanes)
        start = time.monotonic()
        for index, call in enumerate(calls):
            lane = lane_of[index]
            inline = refused = False
            with self._guard:
                if self._closed:
                    refused = True
                elif lane in self._busy:
                    if queue and lane not in self._waiting:
                        self._waiting[lane] = (fan, index, call)  # the call ahead's thread runs it next
                    else:
                        refused = True
                else:
                    self._busy.add(lane)
                    try:
                        self._lane_executor().submit(self._in_lane, fan, index, lane, call)
                    except RuntimeError:  # no thread to be had (interpreter exit, "can't start new thread")
                        self._busy.discard(lane)
                        inline = True
            if inline:
                fan.finish(index, _outcome(call))
            elif refused:
                fan.finish(index, TimeoutError("an earlier call to this server is still unanswered"))
        with fan.changed:
            deadline: float | None = None
            while fan.finished < len(calls):
                if deadline is None and fan.succeeded >= enough:
                    now = time.monotonic()
                    deadline = now + max(patience, now - start)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                fan.changed.wait(remaining)
            fan.settled = True
            waited = (time.monotonic() - start) * 1000
            for index, outcome in enumerate(fan.outcomes):
                if outcome is _PENDING:
                    fan.outcomes[index] = TimeoutError(f"no answer in {waited:.0f} ms, when enough others had answered")
            return list(fan.outcomes)  # every slot is filled by now

    def _lane_executor(self) -> ThreadPoolExecutor:
        """The pool for calls with ``enough`` (call under ``_guard``)."""
        if self._lanes_pool is None:
            self._lanes_pool = ThreadPoolExecutor(max_workers=self.LANE_THREADS, thread_name_prefix=self.name)
        return self._lanes_pool

    def busy(self, lane: Hashable) -> bool:
        """Whether ``lane`` still carries a call (or its late handler, or a call waiting for it): what that call
        does has not happened yet, or has not been seen."""
        with self._guard:
            return lane in self._busy

    def _in_lane(self, fan: _Round, index: int, lane: Hashable, call: Thunk[Any]) -> None:
        """Run ``call`` in ``lane``, then the call waiting for the lane, if any, and so on; then free the lane."""
        current: tuple[_Round, int, Thunk[Any]] | None = (fan, index, call)
        while current is not None:
            fan, index, call = current
            handed: tuple[_Round, int, Thunk[Any]] | None = None  # the waiting call the lane was passed to
            freed = heard = False

            def free() -> None:
                nonlocal freed, handed
                with self._guard:
                    handed = self._waiting.pop(lane, None)
                    if handed is None:
                        self._busy.discard(lane)
                freed = True

            try:
                outcome = _outcome(call)
                # In time: the lane is passed on before the caller hears (its next call on the lane must find it
                # free, or busy with a call made before).
                in_time = fan.finish(index, outcome, before=free)
                heard = True
                if not in_time and fan.late is not None:
                    # Still holding the lane: whatever the handler sends reaches the server before its next call.
                    _outcome(partial(fan.late, lane, outcome))
                if not freed:
                    free()
            except BaseException:
                # Not the call's own error (those are outcomes): this thread is going down. Every round still
                # waiting to hear from this lane hears a failure (or it would wait for ever), and the lane frees.
                with self._guard:
                    stranded = [] if heard else [(fan, index)]
                    if not freed or handed is not None:  # the lane is still ours (else another call may hold it)
                        for waiting in (handed, self._waiting.pop(lane, None)):
                            if waiting is not None:
                                stranded.append((waiting[0], waiting[1]))
                        self._busy.discard(lane)
                for round_, at in stranded:
                    round_.finish(at, TimeoutError("the thread carrying this call was interrupted"))
                raise
            current = handed

    def _executor(self, width: int) -> ThreadPoolExecutor | None:
        """The shared pool, at least ``width`` wide (None once closed)."""
        with self._guard:
            if self._closed:
                return None
            pool = self._pool
            if pool is None or self._width < width:
                if pool is not None:
                    pool.shutdown(wait=False)
                pool = self._pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix=self.name)
                self._width = width
            return pool

    def close(self) -> None:
        with self._guard:
            self._closed = True
            pools = [self._pool, self._lanes_pool]
            self._pool = self._lanes_pool = None
        for pool in pools:
            if pool is not None:
                # Calls queued but not started still run (cancelling them would leave their round waiting for
                # ever, and their lanes busy); each is bounded by its socket timeout.
                pool.shutdown(wait=False)

    def after_fork_in_child(self) -> None:
        self._guard = threading.Lock()
        self._pool = None
        self._lanes_pool = None
        self._closed = False
        self._busy = set()
        self._waiting = {}


_PENDING: Any = object()  # an outcome not in yet (a call may well return None)


class _Round:
    """One ``FanOut.run`` with ``enough``: the outcomes so far, shared with the lane threads."""

    __slots__ = ("changed", "enough", "finished", "late", "outcomes", "settled", "succeeded")

    def __init__(self, calls: int, enough: int, late: LateHandler | None) -> None:
        self.changed = threading.Condition(threading.Lock())
        self.outcomes: list[Any] = [_PENDING] * calls
        self.enough = enough
        self.finished = 0
        self.succeeded = 0
        self.settled = False  # the caller has its answer: whatever finishes now is late
        self.late = late

    def finish(self, index: int, outcome: Any, before: Callable[[], None] | None = None) -> bool:
        """Record call ``index``'s outcome, calling ``before()`` first when it is in time; False if the round has
        settled without it (the outcome is late, and ``before`` is not called)."""
        with self.changed:
            if self.settled:
                return False
            if before is not None:
                before()
            self.outcomes[index] = outcome
            self.finished += 1
            if not isinstance(outcome, Exception):
                self.succeeded += 1
            if self.succeeded >= self.enough or self.finished == len(self.outcomes):
                self.changed.notify()  # before that, the caller has nothing to decide: let it sleep
            return True


def _outcome(call: Thunk[T]) -> T | Exception:
    try:
        return call()
    except Exception as exc:
        return exc
