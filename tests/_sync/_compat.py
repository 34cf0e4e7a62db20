"""The thread half of the tests' paired helpers (hand-written; ``tests/_async/_compat.py`` is the asyncio half).

Each target runs in a thread of its own where the async side runs a task.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

JOIN = 10.0  # seconds any helper thread may take; far above what a passing run needs

sleep = time.sleep


class Spawned:
    """One target running in a thread of its own (``spawn``)."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self._result: list[Any] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], Any]) -> None:
        try:
            self._result.append(target())
        except BaseException as exc:  # raised in the test's thread by join()
            self._error.append(exc)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = JOIN) -> Any:
        """Wait up to ``timeout`` seconds for the target; return its result or raise its error (a thread still
        running then fails the test: a hang)."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"a thread was still running after {timeout}s: a hang"
        if self._error:
            raise self._error[0]
        return self._result[0]


def spawn(target: Callable[[], Any]) -> Spawned:
    return Spawned(target)


def run_concurrently(targets: list[Callable[[], Any]], timeout: float = JOIN) -> list[Any]:
    """Run every target at once, each in a thread of its own; their results in order. Fails on the first error, or
    when any is still running at ``timeout``."""
    spawned = [Spawned(target) for target in targets]
    deadline = time.monotonic() + timeout
    return [one.join(max(0.0, deadline - time.monotonic())) for one in spawned]
