"""Interrupting a test's main thread from outside, as Ctrl-C would (for tests of what an interrupt leaves)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def interrupt_after(seconds: float) -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` in the main thread (this test's) ``seconds`` from now, as Ctrl-C would, if the
    block is still running then. (SIGUSR1 with a handler of our own: a stray SIGINT would end the test session.)"""
    armed = True

    def handler(signum: int, frame: object) -> None:
        if armed:
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
    timer.start()
    try:
        yield
    finally:
        armed = False
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGUSR1, previous)
