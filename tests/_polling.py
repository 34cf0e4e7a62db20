"""Waiting in tests for something another thread, process or server does: poll until it is so, or fail saying what
never happened. For conditions with no event to wait on (a key appearing on a server, a renewal round counted)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T], what: str = "the condition", timeout: float = 20.0) -> T:
    """Call ``condition()`` every 50 ms until it returns a true value, and return that value; fail the test
    (``AssertionError`` naming ``what``) once ``timeout`` seconds have passed without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)
