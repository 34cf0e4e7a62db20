"""Lease deadlines on real servers: ``valid_until`` is never later than the shortest lease any server may hold, and
loss is a deadline, not a reply.

Written for asyncio (owners are tasks); ``tests/_sync/test_deadlines.py`` is generated from it (owners are threads,
and the renewer is a thread blocked in I/O: the case the deadline watch exists for).

* A renewal by hand with a shorter lease lowers ``valid_until`` before it is sent, so one that fails after the
  server ran it (a quorum holder silent, a replica that does not confirm, a reply lost on the way back) leaves the
  deadline the shorter lease gives, and a renewer round answered after it counts the shorter lease. A longer lease
  is sent as asked but counts the registry's at most.
* A holder cut off from its server (or a quorum's majority) is told it lost the lock as its ``valid_until`` passes,
  not when the renewal round in flight gives up at its socket timeout; a reply that comes after that changes
  nothing: the lease stays lost.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._async._compat import AsyncEvent, monotonic
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from ._compat import JOIN, sleep
from .helpers import Backend, Kind, in_other, kinds, take_and_give_back

# How late after its valid_until a holder may be told, on a machine shared with other test runs. The defects this
# file guards against were seconds late (a socket timeout) or never.
SLACK = 0.4

FAST = "?socket_timeout=0.5&socket_connect_timeout=0.5"
# Far longer than the leases below: a renewal round in flight to a server that went silent blocks this long.
SLOW = "?socket_timeout=4&socket_connect_timeout=4"


async def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        await sleep(0.005)


async def _told_by_its_deadline(lock: Any) -> None:
    """``lock``'s valid_until has passed (or is about to): it is marked lost by then, give or take ``SLACK``."""
    until = lock.valid_until
    assert until is not None
    await _until(lambda: lock.lost, max(0.0, until + SLACK - time.monotonic()), "not told as valid_until passed")
    assert lock.valid_until is not None
    assert not time.monotonic() < lock.valid_until


def _parts(lock: Any) -> list[Any]:
    """The leases of a lock: its own, or one per key of a multi-key lock."""
    return lock.locks if isinstance(lock, hybridlock.AsyncMultiLock) else [lock]


class HeldReplies:
    """Wraps ``registry.backend.renew``: a renewal with the registry's own lease (a renewer round) runs in the
    server, and then, while ``holding``, its reply waits until ``gate`` is set. ``held`` is set once one waits."""

    def __init__(self, registry: Any, lease_ms: int) -> None:
        self._renew = registry.backend.renew
        self._lease_ms = lease_ms
        self.holding = True
        self.gate = AsyncEvent()
        self.held = AsyncEvent()
        registry.backend.renew = self

    async def __call__(self, names: Any, owner: str, lease_ms: int) -> Any:
        flags = await self._renew(names, owner, lease_ms)
        if self.holding and lease_ms == self._lease_ms:
            self.held.set()
            await self.gate.wait(JOIN)
        return flags

    def answer(self) -> None:
        self.holding = False
        self.gate.set()


# -- loss is a deadline, not a reply ----------------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("topology", ["one server", "quorum of 3, 2 cut off"])
async def test_a_holder_cut_off_is_told_as_its_valid_until_passes(topology: str) -> None:
    """Partitioned by a black-hole proxy (nothing is reset: only a socket timeout ends a call), with a socket
    timeout longer than the lease: the renewal round in flight is stuck, and the holder is told anyway, as its
    valid_until passes; then release raises ``LockLostError``."""
    quorum = topology != "one server"
    servers = [EmbeddedServer().start() for _ in range(3 if quorum else 1)]
    proxies = [FaultProxy(server.port) for server in servers]
    holder: Any
    if quorum:
        holder = hybridlock.AsyncQuorumLockRegistry([proxy.url + SLOW for proxy in proxies], expire_after=1.2)
    else:
        holder = hybridlock.AsyncLockRegistry(proxies[0].url + SLOW, expire_after=1.2)
    try:
        lock = holder.obtain("cut")
        told: list[float] = []
        lock.on_lost(lambda _lock: told.append(time.monotonic()))
        assert await lock.acquire(timeout=5)
        await sleep(0.5)  # a renewal round or so: the renewer is under way
        for proxy in proxies[1:] if quorum else proxies:
            proxy.partition()
        cut_at = time.monotonic()
        seen: float | None = None  # the last valid_until before the report
        while not told:
            assert time.monotonic() - cut_at < 3.5, "the cut-off holder was not told within the socket timeout"
            seen = lock.valid_until if lock.valid_until is not None else seen
            await sleep(0.005)
        assert seen is not None
        assert told[0] - seen < SLACK, f"told {told[0] - seen:.2f} s after its valid_until"
        assert lock.lost
        assert lock.valid_until is not None
        assert not time.monotonic() < lock.valid_until
        for proxy in proxies:
            proxy.heal()  # the stuck round fails now, and changes nothing
        await sleep(0.2)
        assert lock.lost
        assert told == [told[0]]
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
    finally:
        await holder.aclose()
        for proxy in proxies:
            proxy.close()
        for server in servers:
            server.stop()


@pytest.mark.server
async def test_a_holder_cut_off_before_its_first_renewal_round_is_told_as_its_valid_until_passes(
    own_server: EmbeddedServer,
) -> None:
    """With a renewal period over a second, a new renewer describes the holder to the server before its first round:
    cut off then, that description is what blocks until the socket timeout, and the holder is told all the same."""
    proxy = FaultProxy(own_server.port)
    try:
        async with hybridlock.AsyncLockRegistry(proxy.url + SLOW, expire_after=3.3) as holder:  # period 1.1 s
            lock = holder.obtain("cut")
            told: list[float] = []
            lock.on_lost(lambda _lock: told.append(time.monotonic()))
            assert await lock.acquire(timeout=5)
            proxy.partition()
            deadline = lock.valid_until
            assert deadline is not None
            await _until(lambda: told, 5.0, "the cut-off holder was never told")
            assert deadline <= told[0] < deadline + SLACK, f"told {told[0] - deadline:.2f} s after its valid_until"
            proxy.heal()
            with pytest.raises(hybridlock.LockLostError):
                await lock.release()
    finally:
        proxy.close()


@kinds()
async def test_a_renewal_answered_after_valid_until_leaves_the_lease_lost(backend: Backend, kind: Kind) -> None:
    """A renewal round runs in the server, but its reply comes back only after the lease's valid_until: the holder
    is told as valid_until passes, and the late yes changes nothing (a lease marked lost stays lost, its valid_until
    past, its callbacks run once)."""
    if backend.name == "local":
        pytest.skip("a LocalLockRegistry's leases never end")
    async with backend:
        registry = backend.registry(expire_after=0.9)  # renewal period 0.3 s
        replies = HeldReplies(registry, 900)
        lock = kind.make(registry, "late")
        told: list[Any] = []
        for part in _parts(lock):
            part.on_lost(told.append)
        assert await lock.acquire(timeout=5)
        assert await replies.held.wait(JOIN), "no renewal round ran"
        await _until(lambda: len(told) == len(_parts(lock)), 2.0, "not told while the round's reply was held")
        told_at = time.monotonic()
        for part in _parts(lock):
            assert part.lost
            assert part.valid_until is not None
            assert part.valid_until <= told_at < part.valid_until + SLACK
        renewer = registry._context.renewer
        rounds = renewer.rounds
        replies.answer()  # the server had renewed the lease: the reply says yes, too late
        await _until(lambda: renewer.rounds > rounds, 2.0, "the held round never finished")
        await sleep(0.1)
        assert lock.lost
        for part in _parts(lock):
            assert part.valid_until is not None
            assert not time.monotonic() < part.valid_until
        assert told == _parts(lock)  # once each
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


@kinds("plain", "multi")
async def test_a_renewal_answered_after_the_loss_was_told_gives_the_lease_back(backend: Backend, kind: Kind) -> None:
    """The late yes of the test above renewed the lease in the server for a holder already told it lost the lock:
    the lease is given back as the reply comes (if the key still holds that tenancy and no tenancy of it was taken
    since), not left held by nobody for the lease the renewal gave it (issue 33: after a failover, a renewal in
    flight renewed the key at the new master to a full 8 s for a holder told at its valid_until)."""
    if backend.name in ("local", "memory", "quorum"):
        pytest.skip(f"{backend.name}: nothing answers late, or a late-renewed lease ends with its lease (documented)")
    async with backend:
        registry = backend.registry(expire_after=3.0)  # a round a second after the acquire renews it to 4 s
        replies = HeldReplies(registry, 3000)
        lock = kind.make(registry, "given-back")
        rival = kind.make(backend.other_owner(registry), "given-back")
        assert await lock.acquire(timeout=5)
        assert await replies.held.wait(JOIN), "no renewal round ran"
        await _until(lambda: lock.lost, 5.0, "not told while the round's reply was held")
        assert not await in_other(lambda: take_and_give_back(rival, timeout=0))  # (the server renewed it)
        renewer = registry._context.renewer
        rounds = renewer.rounds
        replies.answer()
        await _until(lambda: renewer.rounds > rounds, 2.0, "the held round never finished")
        deadline = time.monotonic() + 0.5  # (the renewal left it held for about a second more)
        while not await in_other(lambda: take_and_give_back(rival, timeout=0)):
            assert time.monotonic() < deadline, "a lease renewed after its loss was told stayed held by nobody"
            await sleep(0.01)
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


# -- a shorter lease lowers valid_until before it leaves ------------------------------------------------------------


@pytest.mark.server
async def test_a_shorter_renewal_answered_by_one_holder_of_a_quorum_lowers_valid_until(
    quorum_servers: list[EmbeddedServer],
) -> None:
    """Granted by a bare majority; one of those holders goes silent; ``renew(1.0)``: the other holder runs it (its
    key now ends in 1 s) and the silent one counts as covering. The renewal is reported unreachable, valid_until is
    what the 1 s lease gives, and once the shortened keys expire another owner gets in while the first holder's
    valid_until has passed and it has been told."""
    cut = (len(quorum_servers) - 1) // 2
    all_urls = [server.url + FAST for server in quorum_servers]
    async with (
        hybridlock.AsyncQuorumLockRegistry(all_urls[:cut], expire_after=30) as blocker,
        hybridlock.AsyncQuorumLockRegistry(all_urls, expire_after=30) as first,
        hybridlock.AsyncQuorumLockRegistry(all_urls, expire_after=30) as second,
    ):
        held_elsewhere, lock = blocker.obtain("k"), first.obtain("k")
        assert await held_elsewhere.acquire(timeout=5)
        assert await lock.acquire(timeout=5)  # granted by exactly the other servers: a bare majority
        await held_elsewhere.release()
        quorum_servers[cut].pause()  # one of the holders goes silent
        try:
            started = time.monotonic()
            with pytest.raises(hybridlock.BackendUnavailableError):
                await lock.renew(expire_after=1.0)
            assert lock.valid_until is not None
            assert lock.valid_until <= started + 1.0
            rival = second.obtain("k")
            assert await rival.acquire(timeout=5)  # once the keys it shortened have expired
            assert not time.monotonic() < lock.valid_until  # (checked before a side effect, it says no)
            await _told_by_its_deadline(lock)
            await rival.release()
        finally:
            quorum_servers[cut].resume()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


@pytest.mark.server
async def test_a_shorter_renewal_the_replica_does_not_confirm_lowers_valid_until() -> None:
    """``confirm_replicas=1`` and a replica that stops acknowledging: ``renew(1.0)`` runs on the master (the key now
    ends in 1 s) and raises ``ReplicationNotConfirmedError``; valid_until is what the 1 s lease gives, and once the
    key expires another owner gets in while the first holder's valid_until has passed and it has been told."""
    master = EmbeddedServer().start()
    replica = EmbeddedServer(extra_args=("--replicaof", "127.0.0.1", str(master.port))).start()
    try:
        with redis.Redis(port=replica.port) as plain:
            deadline = time.monotonic() + 10
            while plain.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never synced"
                await sleep(0.05)
        async with (
            hybridlock.AsyncLockRegistry(master.url, expire_after=30, confirm_replicas=1) as first,
            hybridlock.AsyncLockRegistry(master.url, expire_after=30) as second,
        ):
            lock = first.obtain("k")
            assert await lock.acquire(timeout=5)
            replica.pause()
            try:
                started = time.monotonic()
                with pytest.raises(hybridlock.ReplicationNotConfirmedError):
                    await lock.renew(expire_after=1.0)
                with redis.Redis(port=master.port) as plain:
                    assert 0 < plain.pttl("hybridlock:{k}") <= 1000  # the master ran it
                assert lock.valid_until is not None
                assert lock.valid_until <= started + 1.0
                rival = second.obtain("k")
                assert await rival.acquire(timeout=5)  # once the key it shortened has expired
                assert not time.monotonic() < lock.valid_until  # (checked before a side effect, it says no)
                await _told_by_its_deadline(lock)
                await rival.release()
            finally:
                replica.resume()
            with pytest.raises(hybridlock.LockLostError):
                await lock.release()
    finally:
        replica.stop()
        master.stop()


@pytest.mark.server
async def test_a_shorter_renewal_whose_reply_is_lost_lowers_valid_until(own_server: EmbeddedServer) -> None:
    """The request reaches the server and runs; its reply is lost on the way back (the proxy drops what the server
    sends), so the client gives up at its socket timeout: valid_until is what the shorter lease gives, and the
    holder is told as it passes."""
    proxy = FaultProxy(own_server.port)
    try:
        async with (
            hybridlock.AsyncLockRegistry(proxy.url + FAST, expire_after=30) as first,
            hybridlock.AsyncLockRegistry(own_server.url, expire_after=30) as second,
        ):
            lock = first.obtain("k")
            assert await lock.acquire(timeout=5)
            await lock.renew()  # (so that the server knows the script: a NOSCRIPT reply lost would leave it unrun)
            proxy.deafen()
            started = time.monotonic()
            with pytest.raises(hybridlock.BackendUnavailableError):
                await lock.renew(expire_after=1.0)
            with redis.Redis(port=own_server.port) as plain:
                assert 0 < plain.pttl("hybridlock:{k}") <= 1000  # the server ran the renewal
            assert lock.valid_until is not None
            assert lock.valid_until <= started + 1.0
            await _told_by_its_deadline(lock)
            rival = second.obtain("k")
            assert await rival.acquire(timeout=5)  # once the key it shortened has expired
            await rival.release()
            proxy.heal()
            with pytest.raises(hybridlock.LockLostError):
                await lock.release()
    finally:
        proxy.close()


@kinds("plain")
async def test_a_round_answered_after_a_shorter_renewal_by_hand_counts_the_shorter_lease(
    backend: Backend, kind: Kind
) -> None:
    """A renewer round runs in the server; before its reply is in, ``renew(0.5)`` by hand runs there after it. The
    server now ends the lease 0.5 s after that, so the round's reply must not move valid_until beyond it."""
    if backend.name == "local":
        pytest.skip("a LocalLockRegistry's leases never end")
    async with backend:
        registry = backend.registry(expire_after=3.0)  # renewal period 1 s
        replies = HeldReplies(registry, 3000)
        lock = kind.make(registry, "overtaken")
        assert await lock.acquire(timeout=5)
        assert await replies.held.wait(JOIN), "no renewal round ran"
        renewer = registry._context.renewer
        rounds = renewer.rounds
        started = time.monotonic()
        await lock.renew(expire_after=0.5)  # not held back: only the registry's lease is
        assert lock.valid_until is not None
        assert lock.valid_until <= started + 0.5
        replies.answer()
        await _until(lambda: renewer.rounds > rounds, 2.0, "the held round never finished")
        await sleep(0.05)
        assert lock.valid_until is not None
        assert lock.valid_until <= started + 0.5, "the round's late reply moved valid_until past the shorter lease"
        # The 0.5 s lease runs out before the next round: the holder is told, and its release says so.
        await _until(lambda: lock.lost, 2.0, "the holder was not told as its valid_until passed")
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


@pytest.mark.server
async def test_a_longer_renewal_by_hand_is_sent_as_asked_and_counts_the_registrys_lease(
    own_server: EmbeddedServer,
) -> None:
    """``renew(10)`` on a 2 s registry: the server keeps the key 10 s, but a renewer round (or an acquire attempt)
    of ours still on its way may reset it to 2 s after that, so valid_until counts 2 s. A renewal with the
    registry's own lease is unchanged: one call, valid_until moved forward."""
    async with hybridlock.AsyncLockRegistry(own_server.url, expire_after=2.0, auto_renew=False) as registry:
        lock = registry.obtain("k")
        assert await lock.acquire(timeout=5)
        first = lock.valid_until
        assert first is not None
        started = time.monotonic()
        await lock.renew(expire_after=10)
        with redis.Redis(port=own_server.port) as plain:
            assert plain.pttl("hybridlock:{k}") > 9000
        assert lock.valid_until is not None
        assert first < lock.valid_until <= started + 2.0
        started = time.monotonic()
        await lock.renew()
        assert started + 1.9 < lock.valid_until <= started + 2.0
        await lock.release()


# -- the alarm shim ---------------------------------------------------------------------------------------------------


async def test_the_alarm_rings_once_at_its_earliest_deadline_and_when_its_ring_asks() -> None:
    from hybridlock._async._compat import AsyncAlarm  # (here: the other tests of this file run without it)

    rung: list[float] = []
    again: list[float] = []

    async def ring() -> float | None:
        rung.append(monotonic())
        return again.pop() if again else None

    alarm = AsyncAlarm(ring, "hybridlock-test-alarm")
    start = monotonic()
    alarm.ring_by(start + 0.3)
    alarm.ring_by(start + 0.6)  # later: changes nothing
    alarm.ring_by(start + 0.1)  # earlier: rings then
    assert alarm.armed_for == start + 0.1
    await sleep(0.45)
    assert len(rung) == 1
    assert 0.1 <= rung[0] - start < 0.1 + SLACK
    again.append(monotonic() + 0.1)  # the next ring asks to ring once more
    alarm.ring_by(monotonic())
    await _until(lambda: len(rung) == 3, 2.0, "the alarm did not ring again when its ring asked")
    alarm.ring_by(monotonic() + 0.1)
    alarm.cancel()
    await sleep(0.3)
    assert len(rung) == 3
    assert alarm.armed_for is None
    assert alarm.error is None
    assert await alarm.stop(1.0)
