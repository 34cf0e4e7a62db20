"""Quorum locks on N = 3 and N = 5 real servers started by the test: exclusion with an overlap marker and an exact
counter, a server killed, a minority partitioned, a restart without persistence under the delayed-restart rule,
fencing tokens that increase throughout, and a clear error when fewer than a majority answer.

Written for asyncio (owners are tasks); ``tests/_sync/test_quorum.py`` is generated from it (owners are threads).
``tests/test_quorum_processes.py`` adds processes; ``tests/test_quorum_model.py`` checks the argument by model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._async._compat import AsyncEvent
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from ._compat import run_concurrently, sleep, spawn

pytestmark = [pytest.mark.server, pytest.mark.timeout(90)]

# A short socket timeout, so that a server cut off by the proxy (a black hole, not a reset) costs little.
FAST = "?socket_timeout=0.3&socket_connect_timeout=0.3"


def urls(servers: list[EmbeddedServer]) -> list[str]:
    return [server.url + FAST for server in servers]


class Section:
    """A critical section that notices two holders at once (an overlap marker) and counts non-atomically."""

    def __init__(self) -> None:
        self.inside: str | None = None
        self.counter = 0
        self.tokens: list[int] = []
        self.overlaps: list[str] = []

    async def enter(self, who: str, lock: hybridlock.AsyncHybridLock) -> None:
        if self.inside is not None:
            self.overlaps.append(f"{who} entered while {self.inside} was inside")
        self.inside = who
        token = lock.fencing_token
        assert token is not None
        self.tokens.append(token)
        value = self.counter
        await sleep(0.0005)  # widen the window between the read and the write
        self.counter = value + 1
        if self.inside != who:
            self.overlaps.append(f"{who} found {self.inside} inside")
        self.inside = None

    def check(self, expected: int) -> None:
        assert not self.overlaps, self.overlaps
        assert self.counter == expected
        # A hand-off streak shares one tenancy (one token); every new tenancy has a greater one.
        assert self.tokens == sorted(self.tokens), "fencing tokens went back"


async def test_exclusion_across_owners_with_an_exact_count(quorum_servers: list[EmbeddedServer]) -> None:
    owners = [hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=5) for _ in range(3)]
    section = Section()
    rounds = 8

    def worker(registry: hybridlock.AsyncQuorumLockRegistry, name: str) -> Callable[[], Any]:
        async def run() -> None:
            lock = registry.obtain("counted")
            for _ in range(rounds):
                assert await lock.acquire(timeout=30)
                try:
                    await section.enter(name, lock)
                finally:
                    await lock.release()

        return run

    try:
        await run_concurrently(
            [worker(registry, f"{o}/{t}") for o, registry in enumerate(owners) for t in range(2)], timeout=60
        )
        section.check(len(owners) * 2 * rounds)
        assert len(set(section.tokens)) >= 3  # each owner had at least one tenancy of its own
    finally:
        for registry in owners:
            await registry.aclose()


async def test_a_killed_server_leaves_the_lock_working(quorum_servers: list[EmbeddedServer]) -> None:
    n = len(quorum_servers)
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=2) as first,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=2) as second,
    ):
        lock, rival = first.obtain("k"), second.obtain("k")
        assert await lock.acquire(timeout=5)
        before = lock.fencing_token
        assert before is not None
        for server in quorum_servers[: (n - 1) // 2]:  # a minority: one of 3, two of 5
            server.kill()
        await lock.renew()  # the lease is renewed on the majority left
        assert not await rival.acquire(blocking=False)
        await lock.release()
        assert await rival.acquire(timeout=5)
        assert (rival.fencing_token or 0) > before
        assert not lock.lost
        assert not rival.lost
        await rival.release()


async def _hold_on_a_bare_majority(
    quorum_servers: list[EmbeddedServer], blocker: hybridlock.AsyncQuorumLockRegistry, lock: hybridlock.AsyncHybridLock
) -> None:
    """Leave ``lock`` held on exactly a majority of the servers (a blocker held the rest while it was granted)."""
    held = blocker.obtain("k")
    assert await held.acquire(timeout=5)
    assert await lock.acquire(timeout=5)
    await held.release()


async def test_a_bare_majority_that_loses_a_server_keeps_the_lease_until_its_deadline(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """Granted by exactly a majority, then one of those servers is killed: nobody else can assemble a majority
    before the lease's deadline (the dead server grants nobody), so the lease is still ours, not extended, and a
    release then reports nothing lost."""
    cut = (len(quorum_servers) - 1) // 2
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers[:cut]), expire_after=5) as blocker,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=5) as first,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=5) as second,
    ):
        lock, rival = first.obtain("k"), second.obtain("k")
        await _hold_on_a_bare_majority(quorum_servers, blocker, lock)
        quorum_servers[cut].kill()  # one of the majority that holds our lease
        assert not await rival.acquire(blocking=False)
        with pytest.raises(hybridlock.BackendUnavailableError):
            await lock.renew()  # not renewed by a majority: not extended, but not lost
        assert not lock.lost
        await lock.release()  # no LockLostError: the lease was ours throughout
        assert await rival.acquire(timeout=5)
        await rival.release()


async def test_a_bare_majority_that_loses_a_server_is_lost_at_its_deadline(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """As above, but held on: with no majority left to renew it, the holder is told it lost the lock once the
    last majority's deadline has passed, and then the others can take it."""
    cut = (len(quorum_servers) - 1) // 2
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers[:cut]), expire_after=1) as blocker,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=1) as first,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=1) as second,
    ):
        lock, rival = first.obtain("k"), second.obtain("k")
        await _hold_on_a_bare_majority(quorum_servers, blocker, lock)
        quorum_servers[cut].kill()
        deadline = time.monotonic() + 10
        while not lock.lost:
            assert time.monotonic() < deadline, "the holder was never told"
            await sleep(0.05)
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
        assert await rival.acquire(timeout=5)
        await rival.release()


async def test_a_hung_minority_costs_neither_the_socket_timeout_nor_the_lease(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """A minority of servers frozen (SIGSTOP: connections stay open, nothing answers) under a 5 s socket timeout:
    acquire, renewals and release go on with the majority well within that timeout, a 1 s lease held across many
    renewal periods is never lost, another owner is still kept out, and once the frozen servers wake, what they
    were sent meanwhile leaves no key of ours behind there."""
    n = len(quorum_servers)
    frozen = quorum_servers[: (n - 1) // 2]
    slow = [server.url + "?socket_timeout=5&socket_connect_timeout=5" for server in quorum_servers]
    async with (
        hybridlock.AsyncQuorumLockRegistry(slow, expire_after=1) as first,
        hybridlock.AsyncQuorumLockRegistry(slow, expire_after=1) as second,
        hybridlock.AsyncQuorumLockRegistry(slow, expire_after=30) as third,
    ):
        lock, rival, long_lease = first.obtain("k"), second.obtain("k"), third.obtain("k2")
        assert not await lock.locked()  # connections made before the freeze
        for server in frozen:
            server.pause()
        try:
            started = time.monotonic()
            assert await lock.acquire(timeout=2)
            assert time.monotonic() - started < 2
            await sleep(3.5)  # three and a half leases: renewed every third of one, never by the frozen servers
            assert not lock.lost
            started = time.monotonic()
            assert not await rival.acquire(timeout=0.5)
            assert time.monotonic() - started < 2
            started = time.monotonic()
            await lock.release()
            assert await rival.acquire(timeout=2)
            assert time.monotonic() - started < 2
            await rival.release()
            assert await long_lease.acquire(timeout=2)  # its grants on the frozen servers arrive late
            await long_lease.release()
        finally:
            for server in frozen:
                server.resume()
        deadline = time.monotonic() + 10
        for server in frozen:
            with redis.Redis.from_url(server.url) as client:  # the lock key is "<registry>:{k2}"
                while client.keys("*{k2}"):
                    assert time.monotonic() < deadline, f"a 30 s lease stayed behind on {server.url}"
                    time.sleep(0.05)


async def test_a_partitioned_minority_is_tolerated(quorum_servers: list[EmbeddedServer]) -> None:
    n = len(quorum_servers)
    cut = (n - 1) // 2
    proxies = [FaultProxy(server.port) for server in quorum_servers[:cut]]
    via_proxy = [p.url + FAST for p in proxies] + urls(quorum_servers[cut:])
    try:
        async with (
            hybridlock.AsyncQuorumLockRegistry(via_proxy, expire_after=2) as partitioned,
            hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=2) as other,
        ):
            lock, rival = partitioned.obtain("k"), other.obtain("k")
            assert await rival.acquire(timeout=5)
            first = rival.fencing_token or 0
            await rival.release()
            for proxy in proxies:
                proxy.partition()  # the first owner no longer reaches a minority of the servers
            started = time.monotonic()
            assert await lock.acquire(timeout=10)
            assert time.monotonic() - started < 5  # each cut-off server costs its socket timeout, not more
            assert (lock.fencing_token or 0) > first
            assert not await rival.acquire(blocking=False)  # still exclusive: the majority holds it
            await lock.renew()
            await lock.release()
            assert await rival.acquire(timeout=5)
            assert (rival.fencing_token or 0) > (lock.fencing_token or first)
            await rival.release()
    finally:
        for proxy in proxies:
            proxy.close()


async def test_restart_without_persistence_after_the_longest_lease(quorum_servers: list[EmbeddedServer]) -> None:
    lease = 1.0
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=lease) as first,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=lease) as second,
    ):
        lock, rival = first.obtain("k"), second.obtain("k")
        tokens = []
        for restarted in quorum_servers[: len(quorum_servers) // 2 + 1]:  # every server of a majority in turn
            assert await lock.acquire(timeout=5)
            tokens.append(lock.fencing_token or 0)
            port = restarted.port
            restarted.kill()
            restarted.stop()
            down_at = time.monotonic()
            # The delayed-restart rule: the server stays out until the longest lease has passed since it went
            # down. Meanwhile the holder keeps its lease on the others.
            await sleep(lease + 0.2)
            assert not lock.lost
            restarted.start(port=port)  # empty: no persistence
            assert time.monotonic() - down_at >= lease
            await lock.release()
            # The restarted server has no counter and no lease: the next owner gets the lock and a greater token.
            assert await rival.acquire(timeout=5)
            tokens.append(rival.fencing_token or 0)
            await rival.release()
        assert tokens == sorted(tokens), tokens
        assert len(set(tokens)) == len(tokens), tokens


async def test_fewer_than_a_majority_is_a_clear_error(quorum_servers: list[EmbeddedServer]) -> None:
    n = len(quorum_servers)
    async with hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=1) as registry:
        lock = registry.obtain("orders:42")
        lost: list[object] = []
        lock.on_lost(lost.append)
        assert await lock.acquire(timeout=5)
        down = quorum_servers[: n // 2 + 1]
        for server in down:
            server.kill()
        # The holder cannot renew on a majority: it is told it lost the lock once its validity has passed. (The
        # renewer marks the loss, then calls the callbacks: wait for both, or a loaded machine sees one alone.)
        deadline = time.monotonic() + 5
        while not (lock.lost and lost) and time.monotonic() < deadline:
            await sleep(0.05)
        assert lock.lost
        assert lost == [lock]
        # Released locally whatever the servers say; the loss, already known, is what is reported (the servers
        # being out of reach is its cause).
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
        assert not lock.is_held_by_current_task()
        started = time.monotonic()
        with pytest.raises(hybridlock.BackendUnavailableError) as caught:
            await lock.acquire(timeout=2)
        assert time.monotonic() - started < 5
        error = caught.value
        assert error.key == "orders:42"
        for server in quorum_servers:
            assert f"127.0.0.1:{server.port}" in str(error.server)
        for server in down:
            assert f"127.0.0.1:{server.port}" in str(error)  # each failed server is named with its failure
        assert not lock.is_held_by_current_task()


async def test_read_write_locks_are_refused(quorum_servers: list[EmbeddedServer]) -> None:
    async with hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers)) as registry:
        with pytest.raises(hybridlock.InvalidArgumentError, match="read-write locks are not available"):
            registry.obtain_read_write("catalog")
        async with registry.obtain_many(["a", "b"]) as both:  # several keys: one by one, in a global order
            assert both.is_held_by_current_task()


async def test_a_lock_granted_after_a_wait_longer_than_its_lease_has_a_whole_lease(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """The lease counts from the round that granted it, not from the start of acquire: after waiting longer than the
    lease, ``valid_until`` is about a lease from the grant and renewal keeps the lock. For a plain lock, and for the
    last key of a multi-key lock (taken key by key over a quorum, the first one held meanwhile)."""
    lease = 1.0
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=lease) as holder,
        hybridlock.AsyncQuorumLockRegistry(urls(quorum_servers), expire_after=lease) as waiter,
    ):
        plain, both = waiter.obtain("b"), waiter.obtain_many(["a", "b"])  # "b" is taken last: after the wait
        for lock, last in ((plain, plain), (both, both.locks[-1])):
            assert last.key == "b"
            blocker = holder.obtain("b")
            assert await blocker.acquire(timeout=5)

            async def take(lock: Any = lock, last: Any = last) -> tuple[float, float, float | None, bool]:
                started = time.monotonic()
                assert await lock.acquire(timeout=10)
                granted = time.monotonic()
                valid_until = last.valid_until
                await sleep(lease + 0.2)  # past the lease as first granted: only renewal keeps it
                lost = lock.lost
                await lock.release()
                return started, granted, valid_until, lost

            waiting = spawn(take)
            await sleep(1.8)
            await blocker.release()
            started, granted, valid_until, lost = await waiting.join()
            assert granted - started > 1.2, "the wait must outlast the lease for this test to mean anything"
            assert valid_until is not None
            assert granted + 0.5 < valid_until <= granted + lease, (valid_until - granted, "counts the wait")
            assert not lost


async def test_a_release_right_after_a_straggling_write_back_waits_for_it(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """A server whose fencing write-back straggles (the acquire returns once a majority holds the token) is still
    busy with it when the holder releases: the RELEASE waits for the write-back there and follows it, instead of
    being refused and leaving our lease on that server for the whole lease."""
    clients = [redis.Redis.from_url(server.url) for server in quorum_servers]
    try:
        # The first server mints far above the others (tokens follow the clock, in microseconds: this is a minute
        # ahead), so the acquire writes its token back to all the others.
        ahead = int(time.time() * 1e6) + 60_000_000
        clients[0].set("hybridlock:{k}:fence", ahead)
        patient = [server.url + "?socket_timeout=2&socket_connect_timeout=2" for server in quorum_servers]
        async with hybridlock.AsyncQuorumLockRegistry(patient, expire_after=30) as registry:
            lock = registry.obtain("k")
            slowest = registry.backend.servers[-1]  # type: ignore[attr-defined]
            raise_fence, gate = slowest.raise_fence, AsyncEvent()

            async def held_back(names: Any, token: int) -> None:  # the write-back is slow to reach the last server
                await gate.wait(10)
                await raise_fence(names, token)

            slowest.raise_fence = held_back
            try:
                assert await lock.acquire(timeout=5)
                token = lock.fencing_token
                assert token == ahead + 1
                assert clients[-1].exists("hybridlock:{k}"), "the last server must hold the lease (it was granted)"
                await lock.release()
            finally:
                gate.set()
            deadline = time.monotonic() + 5
            while clients[-1].exists("hybridlock:{k}"):
                assert time.monotonic() < deadline, (
                    f"our lease stayed on the server of the straggling write-back, "
                    f"PTTL {clients[-1].pttl('hybridlock:{k}')} ms"
                )
                await sleep(0.01)
            assert int(clients[-1].get("hybridlock:{k}:fence") or 0) == token  # the write-back went first
    finally:
        for client in clients:
            client.close()
