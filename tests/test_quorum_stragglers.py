"""Quorum rounds that give up on a straggling server, against in-memory fakes of the servers (no real server: the
interleavings are forced with events). The real-server side (SIGSTOP) is in ``tests/_async/test_quorum.py``.

The hazard: the owner id is the registry's, the same in every round, and a server hands a key that already holds
our own id back to us. So a late reply of an abandoned round, and the give-back it triggers, must never reach a
server after a later round of ours was granted there, or the give-back would delete a grant that round counts on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from hybridlock._async.backends.quorum import AsyncQuorumBackend
from hybridlock._async.backends.redis import AsyncRedisBackend
from hybridlock._core.names import lock_names
from hybridlock._core.results import AcquireResult

pytestmark = pytest.mark.timeout(30)


class FakeServer(AsyncRedisBackend):
    """One server's lock keys in memory, with a gate that stalls every call while it is closed."""

    def __init__(self, name: str) -> None:  # no client: nothing here talks to a server
        self.address = name
        self.holders: dict[str, str] = {}
        self.counter = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def try_acquire(self, names: Any, owner: str, lease_ms: int | None, queue: bool) -> AcquireResult:
        await self.gate.wait()
        if self.holders.get(names.lock) in (None, owner):  # free, or ours already: taken (over), as ACQUIRE does
            self.holders[names.lock] = owner
            self.counter = max(self.counter + 1, int(time.time() * 1e6))
            return AcquireResult(True, self.counter, None)
        return AcquireResult(False, None, 1.0)

    async def release(self, names: Any, owner: str, notify: bool) -> bool:
        await self.gate.wait()
        if self.holders.get(names.lock) == owner:
            del self.holders[names.lock]
            return True
        return False

    async def raise_fence(self, names: Any, token: int) -> None:
        self.counter = max(self.counter, token)

    async def renew(self, names: Sequence[Any], owner: str, lease_ms: int) -> list[bool | None]:
        await self.gate.wait()
        return [self.holders.get(n.lock) == owner for n in names]

    def after_fork_in_child(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def test_a_late_grant_never_deletes_a_later_grant_of_the_same_owner() -> None:
    async def scenario() -> None:
        a, b, c = FakeServer("a"), FakeServer("b"), FakeServer("c")
        quorum = AsyncQuorumBackend([a, b, c])
        names = lock_names("hybridlock", "k")
        b.holders[names.lock] = "P"  # another owner holds b
        c.gate.clear()  # c stalls
        first = await quorum.try_acquire(names, "O", 10_000, False)
        assert not first.acquired  # a granted, b refused, c silent: given back
        second = asyncio.ensure_future(quorum.try_acquire(names, "O", 10_000, False))
        await asyncio.sleep(0.005)
        c.gate.set()  # c answers the first round (late) and whatever the second round sent it
        second_result = await second
        await asyncio.sleep(0.1)  # the late grant's give-back, if any, is done by now
        del b.holders[names.lock]  # P lets b go and tries for the lock
        rival = await quorum.try_acquire(names, "P", 10_000, False)
        assert not (second_result.acquired and rival.acquired), (
            f"both owners hold a majority: a={a.holders} b={b.holders} c={c.holders}"
        )
        if second_result.acquired:
            assert sum(1 for server in (a, b, c) if server.holders.get(names.lock) == "O") >= 2
        await quorum.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_a_server_down_at_once_does_not_cut_short_the_wait_for_a_slower_one() -> None:
    """Failures do not count toward the majority's answers: with one server refusing at once and one slower than
    the straggler patience, the slower one's grant is still waited for and the lock taken."""

    class Refusing(FakeServer):
        async def try_acquire(self, names: Any, owner: str, lease_ms: int | None, queue: bool) -> AcquireResult:
            raise ConnectionRefusedError("down")

    class Slow(FakeServer):
        async def try_acquire(self, names: Any, owner: str, lease_ms: int | None, queue: bool) -> AcquireResult:
            await asyncio.sleep(0.2)
            return await super().try_acquire(names, owner, lease_ms, queue)

    async def scenario() -> None:
        quorum = AsyncQuorumBackend([Refusing("down"), FakeServer("fast"), Slow("slow")])
        result = await quorum.try_acquire(lock_names("hybridlock", "k"), "O", 10_000, False)
        assert result.acquired
        await quorum.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 10))
