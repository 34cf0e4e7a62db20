"""The asyncio half of the tests' paired helpers (hand-written; ``tests/_sync/_compat.py`` is the thread half).

Concurrency is the one thing the two sides spell differently: here each target runs in a task of its own, there in
a thread. A target may return an awaitable (it is awaited) or a plain value.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

JOIN = 10.0  # seconds any helper task may take; far above what a passing run needs

sleep = asyncio.sleep


async def _call(target: Callable[[], Any]) -> Any:
    result = target()
    if inspect.isawaitable(result):
        result = await result
    return result


class Spawned:
    """One target running in a task of its own (``spawn``)."""

    def __init__(self, target: Callable[[], Any]) -> None:
        self._task = asyncio.ensure_future(_call(target))

    def done(self) -> bool:
        return self._task.done()

    async def join(self, timeout: float = JOIN) -> Any:
        """Wait up to ``timeout`` seconds for the target; return its result or raise its error. One still running
        then is cancelled and the test fails: a hang."""
        done, _ = await asyncio.wait((self._task,), timeout=timeout)
        if not done:
            self._task.cancel()
            await asyncio.wait((self._task,))
            raise AssertionError(f"a task was still running after {timeout}s: a hang")
        return self._task.result()


def spawn(target: Callable[[], Any]) -> Spawned:
    return Spawned(target)


async def run_concurrently(targets: list[Callable[[], Any]], timeout: float = JOIN) -> list[Any]:
    """Run every target at once, each in a task of its own; their results in order. Fails on the first error, or
    when any is still running at ``timeout`` (all are then cancelled)."""
    tasks = [asyncio.ensure_future(_call(target)) for target in targets]
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    assert not pending, f"{len(pending)} tasks still running after {timeout}s: a hang"
    return [task.result() for task in tasks]
