"""Quorum fencing tokens on real servers whose clocks differ: a counter lost on fewer than a majority of the servers
does not send tokens back ("Lost counters" in ``hybridlock._core.quorum``), a counter outside the exact range is
refused by the servers that hold it while the others go on, and the delayed-restart rule's arithmetic: the rejoin
delay is a whole ``expire_after`` whatever ``max_hold`` says, and it keeps tokens higher only while it exceeds
twice the clock skew.

The clocks are skewed by an ``LD_PRELOAD`` shim built with gcc at test time (``tests/_skew.py``; skipped, saying
why, without gcc). Written for asyncio; ``tests/_sync/test_quorum_fencing.py`` is generated from it.
``tests/test_quorum_model.py`` checks the bound on lost counters by model, and that it cannot be widened.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

import hybridlock
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from .._skew import server_clock_us, skewed_server
from ._compat import sleep

pytestmark = [pytest.mark.server, pytest.mark.quorum, pytest.mark.timeout(90)]

FAST = "?socket_timeout=0.5&socket_connect_timeout=0.5"
SKEW = 10.0  # seconds the first server's clock runs ahead: far more than the test takes, far less than a lease
LEASE = 30.0
FENCE = "hybridlock:{k}:fence"


@pytest.fixture(params=[3, 5], ids=["N=3", "N=5"])
def skewed_quorum(request: pytest.FixtureRequest, clock_shim: str) -> Iterator[list[EmbeddedServer]]:
    """N servers; the first one's clock runs ``SKEW`` seconds ahead of the others'. Each stopped at the end."""
    servers = [skewed_server(clock_shim, SKEW)]
    try:
        for _ in range(request.param - 1):
            servers.append(EmbeddedServer().start())
        yield servers
    finally:
        for server in servers:
            server.stop()


def urls(servers: list[EmbeddedServer]) -> list[str]:
    return [server.url + FAST for server in servers]


def counter(server: EmbeddedServer) -> int | None:
    with redis.Redis(port=server.port) as client:
        value = client.get(FENCE)
    return None if value is None else int(value)


async def test_a_lost_counter_on_a_minority_with_a_fast_server_down_does_not_send_tokens_back(
    skewed_quorum: list[EmbeddedServer],
) -> None:
    """The fast server mints the token T1 of an acquire granted by a bare majority (the rest refuse it: another
    owner holds them); the counters of every other server of that majority but one are lost (deleted, as a lock
    user may, or evicted); the fast server goes down. The next majority is the servers that refused plus those
    that lost their counter: none of them minted T1 and the survivors' clocks are 10 s behind it, yet its token
    is higher, because the write-back reached the servers that refused too (they answered)."""
    n = len(skewed_quorum)
    majority = n // 2 + 1
    fast, rest = skewed_quorum[0], skewed_quorum[1:]
    granting, refusing = rest[: majority - 1], rest[majority - 1 :]  # with ``fast``: exactly a majority
    assert server_clock_us(fast) > server_clock_us(rest[0]) + 5_000_000
    async with (
        hybridlock.AsyncQuorumLockRegistry(urls(refusing), expire_after=LEASE) as other,
        hybridlock.AsyncQuorumLockRegistry(urls(skewed_quorum), expire_after=LEASE) as first,
        hybridlock.AsyncQuorumLockRegistry(urls(skewed_quorum), expire_after=LEASE) as second,
    ):
        busy = other.obtain("k")
        assert await busy.acquire(timeout=5)  # the refusing servers are held by another owner
        x = first.obtain("k")
        assert await x.acquire(timeout=5)  # granted by ``fast`` and ``granting`` only
        t1 = x.fencing_token
        assert t1 is not None
        assert t1 >= server_clock_us(rest[0]) + 5_000_000, "the token should come from the fast clock"
        # The refusers' raise is best effort: on a loaded machine it may outlast the fan-out's patience and land
        # a moment after acquire returned, in its lane. Give it that moment (it lands long before Y's round).
        deadline = time.monotonic() + 5
        while any(counter(server) != t1 for server in refusing) and time.monotonic() < deadline:
            await sleep(0.01)
        kept = [counter(server) for server in skewed_quorum]
        await busy.release()
        await x.release()
        lost = granting[: n - majority]  # fewer than a majority lose it: one of 3, two of 5
        for server in lost:
            with redis.Redis(port=server.port) as client:
                assert client.delete(FENCE) == 1
        fast.kill()
        y = second.obtain("k")
        assert await y.acquire(timeout=5)
        t2 = y.fencing_token
        await y.release()
        assert t2 is not None
        assert t2 > t1, f"token went back: {t2} after {t1} ({(t1 - t2) / 1e6:.1f} s)"
        # Because every server that answered X's acquire kept T1: those that granted, and those that refused.
        assert kept == [t1] * n
        # The write-back of Y's acquire restored the lost counters.
        assert all((counter(server) or 0) >= t2 for server in rest)


async def test_a_counter_beyond_the_exact_range_on_a_minority_is_a_failed_server_for_that_key(
    skewed_quorum: list[EmbeddedServer],
) -> None:
    """A minority of servers hold a counter at 2^53 + 1 (written by a lock user): they refuse to mint, so they
    count as failed for that key, and the majority left grants with a token from its own counters. On a majority,
    acquire raises ``FencingCounterError`` naming the key, the quorum, the counter and each server's failure, and
    leaves no lease behind."""
    n = len(skewed_quorum)
    corrupt = str(2**53 + 1)
    async with hybridlock.AsyncQuorumLockRegistry(urls(skewed_quorum), expire_after=LEASE) as registry:
        lock = registry.obtain("k")
        for server in skewed_quorum[1 : 1 + n // 2]:  # a minority, the fast server not among them
            with redis.Redis(port=server.port) as client:
                client.set(FENCE, corrupt)
        assert await lock.acquire(timeout=5)
        token = lock.fencing_token
        assert token is not None
        assert token < 2**53 - 1
        await lock.release()
        with redis.Redis(port=skewed_quorum[0].port) as client:
            client.set(FENCE, corrupt)  # now a majority
        with pytest.raises(hybridlock.FencingCounterError) as caught:
            await lock.acquire(timeout=2)
        error = caught.value
        assert error.key == "k"
        assert error.counter == FENCE
        assert error.value == corrupt
        for server in skewed_quorum:
            assert f"127.0.0.1:{server.port}" in str(error.server)
        assert "2**53 - 1" in str(error)
        assert not lock.is_held_by_current_task()
        for server in skewed_quorum:
            with redis.Redis(port=server.port) as client:
                assert not client.exists("hybridlock:{k}"), "a lease was left behind"


@pytest.mark.parametrize(
    ("skew", "higher"),
    [(0.3, True), (3.0, False)],
    ids=["twice-the-skew-below-the-delay", "twice-the-skew-above-the-delay"],
)
async def test_the_delayed_restart_keeps_tokens_higher_only_while_it_exceeds_twice_the_skew(
    clock_shim: str, skew: float, higher: bool
) -> None:
    """The rule's clock floor alone carries the order: ``X`` acquires on ``{A, B}`` (``A``'s clock ``skew`` ahead;
    ``C`` cut off from ``X``, so it never stores the token), ``B`` is restarted empty under the rule (out for the
    longest lease, 1 s, plus 0.3 s), then ``A`` goes down. No server of the next majority, ``{B, C}``, keeps a
    counter of at least ``T1``; only ``B``'s clock can be above it. ``T1`` is up to one skew ahead of real time and
    ``B``'s clock, read a delay ``D`` later, up to one skew behind, so tokens stay higher when ``D`` exceeds twice
    the skew (here ``B``'s clock is exact, so it takes a skew above ``D`` to send them back): "any skew within the
    lease", as the tables had it, is not enough."""
    lease = 1.0
    a = skewed_server(clock_shim, skew)
    b, c = EmbeddedServer().start(), EmbeddedServer().start()
    proxy = FaultProxy(c.port)
    try:
        cut_off_from_c = [a.url + FAST, b.url + FAST, proxy.url + FAST]
        async with (
            hybridlock.AsyncQuorumLockRegistry(cut_off_from_c, expire_after=lease) as first,
            hybridlock.AsyncQuorumLockRegistry(urls([a, b, c]), expire_after=lease) as second,
        ):
            proxy.partition()
            x = first.obtain("k")
            assert await x.acquire(timeout=5)
            t1 = x.fencing_token
            assert t1 is not None
            await x.release()
            assert counter(c) is None, "C should have missed the token"
            port = b.port
            b.kill()
            b.stop()
            down_at = time.monotonic()
            await sleep(lease + 0.3)  # the delayed-restart rule: out for the longest lease (and a margin)
            b.start(port=port)  # empty: no persistence
            assert time.monotonic() - down_at >= lease
            a.kill()
            y = second.obtain("k")
            assert await y.acquire(timeout=5)
            t2 = y.fencing_token
            await y.release()
        assert t2 is not None
        if higher:
            assert t2 > t1, f"token went back by {(t1 - t2) / 1e6:.2f} s"
        else:
            assert t2 < t1, "the clock floor covered a skew above the rejoin delay: the test shows nothing"
    finally:
        proxy.close()
        for server in (a, b, c):
            server.stop()


async def test_max_hold_does_not_shorten_what_the_servers_hold() -> None:
    """``max_hold`` stops renewing; the lease the servers hold still runs a whole ``expire_after`` from the last
    grant or renewal, so the delayed-restart rule's delay is the longest ``expire_after``, never ``max_hold``."""
    servers = [EmbeddedServer().start() for _ in range(3)]
    try:
        async with hybridlock.AsyncQuorumLockRegistry(urls(servers), expire_after=3, max_hold=0.3) as registry:
            lock = registry.obtain("k")
            assert await lock.acquire(timeout=5)
            await sleep(0.6)  # past max_hold
            for server in servers:
                with redis.Redis(port=server.port) as client:
                    assert client.pttl("hybridlock:{k}") > 1_500, "a server's lease ended with max_hold"
            await lock.release()
    finally:
        for server in servers:
            server.stop()
