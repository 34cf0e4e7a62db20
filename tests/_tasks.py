"""Running a lock call as a task a test can cancel."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def awaited(call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()`` in the task that runs this coroutine, so that ``create_task(awaited(lock.acquire))`` is a
    task a test can cancel at any step: a task whose own coroutine is the acquire itself is refused
    (``LockNotOwnedError``), as its hold would belong to nobody once the acquire returned. (The call is made in the
    task, so a task cancelled before it starts leaves no coroutine never awaited.)"""
    return await call()
