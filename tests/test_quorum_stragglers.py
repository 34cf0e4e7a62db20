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


class ExpiringServer(FakeServer):
    """A fake server whose leases run out, and whose calls of one kind by one owner can be held back or fail."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.leases: dict[str, tuple[str, float]] = {}  # lock -> (owner, expiry)
        self.held_back: dict[tuple[str, str], asyncio.Event] = {}  # (operation, owner) -> released when set
        self.failing: set[tuple[str, str]] = set()  # (operation, owner) -> raises, as a socket timeout would

    async def _gate_for(self, operation: str, owner: str) -> None:
        if (operation, owner) in self.failing:
            raise TimeoutError("socket timeout")
        gate = self.held_back.get((operation, owner))
        if gate is not None:
            await gate.wait()

    def holder(self, lock: str) -> str | None:
        lease = self.leases.get(lock)
        if lease is not None and lease[1] <= time.monotonic():
            del self.leases[lock]
            return None
        return lease[0] if lease else None

    async def try_acquire(self, names: Any, owner: str, lease_ms: int | None, queue: bool) -> AcquireResult:
        await self._gate_for("acquire", owner)
        if self.holder(names.lock) in (None, owner):
            self.leases[names.lock] = (owner, time.monotonic() + (lease_ms or 0) / 1000)
            self.counter = max(self.counter + 1, int(time.time() * 1e6))
            return AcquireResult(True, self.counter, None)
        return AcquireResult(False, None, 0.1)

    async def release(self, names: Any, owner: str, notify: bool) -> bool:
        await self._gate_for("release", owner)
        if self.holder(names.lock) == owner:
            del self.leases[names.lock]
            return True
        return False

    async def renew(self, names: Sequence[Any], owner: str, lease_ms: int) -> list[bool | None]:
        await self._gate_for("renew", owner)
        renewed: list[bool | None] = []
        for lock in names:
            if self.holder(lock.lock) == owner:
                self.leases[lock.lock] = (owner, time.monotonic() + lease_ms / 1000)
                renewed.append(True)
            else:
                renewed.append(False)
        return renewed


def test_a_renewal_does_not_count_a_server_our_own_give_back_is_about_to_empty() -> None:
    """Found in review: renewals are not held back by a give-back still on its way to a server, so they could
    count that server's stale grant as a renewed holder; the give-back then deleted it, and with one more server
    lost a rival could take a majority while we still believed the lease ours."""

    async def scenario() -> None:
        servers = [ExpiringServer(f"s{i}") for i in range(3)]
        mine, rivals = AsyncQuorumBackend(servers), AsyncQuorumBackend(servers)
        names = lock_names("hybridlock", "k")
        lease_ms = 300
        for server in servers[:2]:
            server.leases[names.lock] = ("P", time.monotonic() + 10)
        slow_give_back = asyncio.Event()
        servers[2].held_back["release", "O"] = slow_give_back
        assert not (await mine.try_acquire(names, "O", lease_ms, False)).acquired  # s2's grant given back, slowly
        for server in servers[:2]:
            del server.leases[names.lock]  # the rival lets go
        assert (await mine.try_acquire(names, "O", lease_ms, False)).acquired  # on s0 and s1 (s2 still busy)
        servers[0].failing.add(("renew", "O"))  # cut off from s0 from now on
        await mine.renew([names], "O", lease_ms)  # s1 says yes, s2 says yes from the grant about to go
        assert 2 not in mine._holders[names.lock, "O"].servers
        slow_give_back.set()
        await asyncio.sleep(0.01)
        servers[2].failing.add(("renew", "O"))
        believed_until = mine._holders[names.lock, "O"].until
        while time.monotonic() < believed_until - 0.02:  # our lease on s0 ends meanwhile: nobody renews it there
            await asyncio.sleep(0.01)
        rival = await rivals.try_acquire(names, "P", lease_ms, False)
        assert not (rival.acquired and time.monotonic() < mine._holders[names.lock, "O"].until), (
            "the rival holds a majority while we still believe the lease ours"
        )
        await mine.aclose()
        await rivals.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 10))
