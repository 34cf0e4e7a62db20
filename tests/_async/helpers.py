"""What the behavioural suite shares: the backends, the lock kinds, and a holder in another task.

Written once for asyncio; ``tests/_sync/helpers.py`` is generated from it (another thread where this says task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import hybridlock
from hybridlock._async._compat import AsyncEvent
from hybridlock.backends import AsyncMemoryBackend

from ._compat import JOIN, spawn

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("local", id="local"),
    pytest.param("redis", id="redis", marks=pytest.mark.server),
    # The master of a Sentinel-managed service, through a redis+sentinel:// URL, with every acquire and renewal
    # confirmed by both replicas (the plain Sentinel client, without confirmation, is in tests/test_sentinel.py).
    pytest.param("sentinel-confirmed", id="sentinel-confirmed", marks=[pytest.mark.server, pytest.mark.sentinel]),
    pytest.param("cluster", id="cluster", marks=[pytest.mark.server, pytest.mark.cluster]),
    # A majority of 3 independent servers (read-write locks are refused there: those cases are skipped, and
    # tests/_async/test_quorum.py checks the refusal).
    pytest.param("quorum", id="quorum", marks=[pytest.mark.server, pytest.mark.quorum]),
]


class Backend:
    """Makes registries over one store, and closes them all at the end of ``async with backend:``.

    ``shared``: two registries it makes are two owners of the same keys (as two processes are); an
    ``AsyncLocalLockRegistry`` shares nothing, so there the other owner is another task of the same registry."""

    def __init__(self, name: str, url: str | list[str] | None = None, **options: Any) -> None:
        self.name = name
        self.url = url
        self.options = options  # given to every registry on ``url``
        self.shared = name != "local"
        self.made: list[hybridlock.AsyncLockRegistry] = []
        self._store: AsyncMemoryBackend | None = None

    def registry(self, **options: Any) -> hybridlock.AsyncLockRegistry:
        registry: hybridlock.AsyncLockRegistry
        if self.name == "memory":
            if self._store is None:
                self._store = AsyncMemoryBackend()
            registry = hybridlock.AsyncLockRegistry(self._store, **options)
        elif self.name == "local":
            registry = hybridlock.AsyncLocalLockRegistry()
        elif self.name == "quorum":
            registry = hybridlock.AsyncQuorumLockRegistry(self.url, **self.options, **options)
        else:
            registry = hybridlock.AsyncLockRegistry(self.url, **self.options, **options)
        self.made.append(registry)
        return registry

    def other_owner(self, registry: hybridlock.AsyncLockRegistry) -> hybridlock.AsyncLockRegistry:
        """Another owner of ``registry``'s keys where the backend has one; else ``registry`` itself (whose locks
        another task then holds)."""
        return self.registry() if self.shared else registry

    def owners(self) -> list[hybridlock.AsyncLockRegistry]:
        """Two owners where the backend has them, else one."""
        return [self.registry(), self.registry()] if self.shared else [self.registry()]

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for registry in self.made:
            await registry.aclose()


def _multi_keys(key: str) -> list[str]:
    return [key, f"{key}:second"]


@dataclass(frozen=True)
class Kind:
    """One lock kind. ``rival`` cannot be held while this one is held by another task or owner: the same kind for
    the exclusive ones, the write lock for the read lock, a plain lock on one of its keys for the multi-key lock."""

    name: str
    make: Callable[[hybridlock.AsyncLockRegistry, str], Any]
    rival: Callable[[hybridlock.AsyncLockRegistry, str], Any]
    keys: Callable[[str], list[str]]


KINDS = {
    "plain": Kind("plain", lambda r, k: r.obtain(k), lambda r, k: r.obtain(k), lambda k: [k]),
    "write": Kind(
        "write",
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda k: [k],
    ),
    "read": Kind(
        "read",
        lambda r, k: r.obtain_read_write(k).read_lock(),
        lambda r, k: r.obtain_read_write(k).write_lock(),
        lambda k: [k],
    ),
    "multi": Kind(
        "multi",
        lambda r, k: r.obtain_many(_multi_keys(k)),
        lambda r, k: r.obtain(_multi_keys(k)[-1]),  # all or nothing: one busy key keeps it out
        _multi_keys,
    ),
}
EXCLUSIVE = ("plain", "write", "multi")
SINGLE = ("plain", "write", "read")  # the kinds with hold_count and lost (a multi-key lock has neither)


def kinds(*names: str) -> pytest.MarkDecorator:
    """Parametrize ``kind`` over ``names`` (every kind when none)."""
    return pytest.mark.parametrize("kind", [pytest.param(KINDS[name], id=name) for name in names or tuple(KINDS)])


async def in_other(target: Callable[[], Any]) -> Any:
    """``target()``'s result, computed in another task."""
    return await spawn(target).join()


async def take_and_give_back(lock: Any, timeout: float = JOIN) -> bool:
    got = await lock.acquire(timeout=timeout)
    if got:
        await lock.release()
    return bool(got)


class Holder:
    """Holds ``lock`` (``depth`` levels) in another task for the body of ``async with Holder(lock): ...``."""

    def __init__(self, lock: Any, depth: int = 1) -> None:
        self.lock = lock
        self.depth = depth
        self.held = AsyncEvent()
        self.go = AsyncEvent()
        self.error: BaseException | None = None

    async def _run(self) -> None:
        try:
            for _ in range(self.depth):
                assert await self.lock.acquire(timeout=JOIN)
            self.held.set()
            await self.go.wait(JOIN)
            for _ in range(self.depth):
                await self.lock.release()
        except BaseException as exc:
            self.error = exc
            self.held.set()

    async def __aenter__(self) -> Holder:
        self.spawned = spawn(self._run)
        assert await self.held.wait(JOIN), "the holder never got the lock"
        assert self.error is None, self.error
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.go.set()
        await self.spawned.join()
        if self.error is not None:
            raise self.error
