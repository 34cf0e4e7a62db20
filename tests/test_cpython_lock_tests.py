"""CPython's own lock tests (``Lib/test/lock_tests.py``) run against HybridLock on a real server.

``RLockTests`` checks it is a drop-in for ``threading.RLock`` (repr, reentrancy, timeouts, ``_recursion_count``,
weak references, no threads left behind), ``ConditionTests`` checks ``threading.Condition`` over it, and
``ConditionAsRLockTests`` checks a ``threading.Condition(lock)`` behaves as an RLock too, as CPython's
``test_threading`` does with its own RLock. Every lock is a fresh one on a fresh key, from one registry per module.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import hybridlock
from hybridlock.testing.server import EmbeddedServer

lock_tests = pytest.importorskip("test.lock_tests", reason="this Python has no test package (Lib/test)")

pytestmark = pytest.mark.server

_registry: hybridlock.LockRegistry | None = None
_keys = itertools.count()
_prefix = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module", autouse=True)
def _module_registry(server: EmbeddedServer) -> Iterator[None]:
    global _registry
    _registry = hybridlock.LockRegistry(server.url, registry_key=f"cpython-{_prefix}")
    # CPython's tests count the threads alive after each test against those before (threading_helper): the
    # registry's own workers (the renewer, its deadline watch) must not start in the middle of one. A lease held
    # for the whole module keeps them running from here on; the watch is armed a second into the renewer's life.
    # (Without this, a test that ended as the renewer armed the watch waited 30 s for that thread, and failed.)
    keeper = _registry.obtain(f"workers-alive:{_prefix}")
    keeper.acquire()
    watch = _registry._context.renewer._watch
    deadline = time.monotonic() + 30
    while watch.armed_for is None:
        assert time.monotonic() < deadline, "the registry's deadline watch was never armed"
        time.sleep(0.01)
    try:
        yield
    finally:
        keeper.release()
        with warnings.catch_warnings():
            # CPython's tests leave locks held by threads that have ended, as a threading.RLock may be left.
            warnings.simplefilter("ignore", hybridlock.LocksHeldAtCloseWarning)
            _registry.close()
        _registry = None


def fresh_lock() -> hybridlock.HybridLock:
    assert _registry is not None, "the module's registry is not open"
    return _registry.obtain(f"lock:{next(_keys)}")


def condition(lock: Any = None) -> threading.Condition:
    # threading.Condition() makes an RLock when given no lock: make it a HybridLock instead.
    return threading.Condition(fresh_lock() if lock is None else lock)


class HybridLockAsRLockTests(lock_tests.RLockTests):  # type: ignore[misc,name-defined]
    locktype = staticmethod(fresh_lock)


class ConditionOverHybridLockTests(lock_tests.ConditionTests):  # type: ignore[misc,name-defined]
    condtype = staticmethod(condition)


class ConditionOverHybridLockAsRLockTests(lock_tests.RLockTests):  # type: ignore[misc,name-defined]
    locktype = staticmethod(condition)

    def test_recursion_count(self) -> None:
        self.skipTest("Condition does not expose _recursion_count() (CPython skips it for its own RLock too)")
