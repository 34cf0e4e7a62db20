"""The thread half of the paired shims: what generated code needs and cannot spell the same way on both sides.

Hand-written, never generated; the partner of ``hybridlock/_async/_compat.py`` (read its docstring). Same names
after ``scripts/unasync.py``'s renames, same signatures with ``async``/``await`` taken out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar, final

from .._local import FifoMutex

__all__ = ["FifoMutex", "Worker", "current_owner", "monotonic", "shielded", "sleep"]

T = TypeVar("T")

monotonic = time.monotonic
sleep = time.sleep


def current_owner() -> object:
    """Who is running: the current thread's ident (the current task on the async side). Compare with ``==``.

    An ident can be reused once its thread has ended, as with ``threading.RLock``."""
    return threading.get_ident()


def shielded(value: T) -> T:
    """Return ``value``: a thread cannot be cancelled, and the work was done when the argument was evaluated.

    Exists so that ``await shielded(cleanup())`` in async source becomes ``shielded(cleanup())`` here."""
    return value


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
            self._wakeup.wait(max(0.0, delay))
            self._wakeup.clear()
