"""Leader election in one process: candidates are registries (owners) of one store, each with its worker.

Written for asyncio (candidates are tasks); ``tests/_sync/test_election.py`` is generated from it (threads). The
cross-process faults (SIGKILL, SIGSTOP of the leader) are in ``tests/test_election_processes.py``.

Every term is recorded as (candidate, epoch, elected at, revoked at) from the callbacks, with ``time.monotonic()``;
``_check_terms`` is the interval checker: terms never overlap and epochs grow with each term.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from ._compat import sleep
from .helpers import Backend

# How long a graceful hand-over may take on a machine shared with other test runs (it is one release that grants
# the next candidate at once: milliseconds when the machine is idle).
HANDOVER = 0.5


class Terms:
    """The terms of one election, as the candidates' callbacks report them."""

    def __init__(self) -> None:
        self.terms: list[list[Any]] = []  # [candidate, epoch, elected at, revoked at or None]
        self.open: dict[str, list[Any]] = {}

    def callbacks(self, who: str) -> dict[str, Any]:
        async def on_elected(epoch: int | None) -> None:
            assert who not in self.open, f"{who} elected twice without a revocation"
            term = [who, epoch, time.monotonic(), None]
            self.terms.append(term)
            self.open[who] = term

        async def on_revoked() -> None:
            term = self.open.pop(who)
            term[3] = time.monotonic()

        return {"on_elected": on_elected, "on_revoked": on_revoked}

    def leader(self) -> str | None:
        assert len(self.open) <= 1, f"two leaders at once: {self.open}"
        return next(iter(self.open), None)

    async def wait_for_leader(self, other_than: str | None = None, timeout: float = 5.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            leader = self.leader()
            if leader is not None and leader != other_than:
                return leader
            assert time.monotonic() < deadline, f"no new leader within {timeout} s"
            await sleep(0.002)


def _check_terms(terms: list[list[Any]]) -> None:
    """The interval checker: in the order they began, each term ended before the next began, and epochs grew."""
    ordered = sorted(terms, key=lambda term: term[2])
    for earlier, later in itertools.pairwise(ordered):
        assert earlier[3] is not None, f"{earlier[0]}'s term never ended, yet {later[0]} was elected"
        assert earlier[3] <= later[2], f"terms overlap: {earlier} and {later}"
        assert earlier[1] < later[1], f"epochs did not grow: {earlier} then {later}"


def _candidates(backend: Backend, terms: Terms, count: int, **options: Any) -> list[Any]:
    return [
        backend.registry(**options).leader_election("scheduler", **terms.callbacks(f"c{index}"))
        for index in range(count)
    ]


async def test_one_leader_at_a_time_and_a_stop_hands_over_at_once(backend: Backend) -> None:
    if not backend.shared:
        pytest.skip("one registry is one candidate: this backend has no second owner")
    terms = Terms()
    async with backend:
        candidates = _candidates(backend, terms, 3, expire_after=2.0)
        by_name = {f"c{index}": candidate for index, candidate in enumerate(candidates)}
        for candidate in candidates:
            await candidate.start()
        leader = await terms.wait_for_leader()
        await sleep(0.2)
        assert terms.leader() == leader
        assert [c.is_leader for c in candidates].count(True) == 1
        assert by_name[leader].epoch == terms.open[leader][1] is not None
        assert all(c.epoch is None for name, c in by_name.items() if name != leader)
        for _ in range(2):
            stopped_at = time.monotonic()
            await by_name[leader].stop()
            assert not by_name[leader].is_leader
            assert by_name[leader].epoch is None
            successor = await terms.wait_for_leader(other_than=leader, timeout=HANDOVER + 1)
            assert terms.open[successor][2] - stopped_at < HANDOVER, "the hand-over was not at once"
            leader = successor
        await by_name[leader].stop()
        assert terms.leader() is None
    assert len(terms.terms) == 3
    _check_terms(terms.terms)


async def test_yield_hands_over_and_sits_out(backend: Backend) -> None:
    if not backend.shared:
        pytest.skip("one registry is one candidate: this backend has no second owner")
    terms = Terms()
    async with backend:
        candidates = _candidates(backend, terms, 2, expire_after=2.0)
        by_name = {f"c{index}": candidate for index, candidate in enumerate(candidates)}
        for candidate in candidates:
            await candidate.start()
        first = await terms.wait_for_leader()
        yielded_at = time.monotonic()
        await by_name[first].yield_leadership(pause=1.0)
        assert not by_name[first].is_leader
        second = await terms.wait_for_leader(other_than=first, timeout=HANDOVER + 1)
        assert terms.open[second][2] - yielded_at < HANDOVER
        # The one that yielded sits out its pause, then queues again: it leads once the other stops.
        await by_name[second].stop()
        back = await terms.wait_for_leader(timeout=3.0)
        assert back == first
        assert terms.open[first][2] - yielded_at >= 1.0
        await by_name[first].stop()
    _check_terms(terms.terms)


async def test_a_candidate_handed_the_lock_under_the_default_lease_stays_leader(backend: Backend) -> None:
    # With the default expire_after (30 s), the candidate a yield hands the lock to keeps it: one term, not a term
    # ended at its first look ("not renewed in time": its lease was the grant's provisional one, at most 3 s, shorter
    # than its margin of expire_after / 6) and another after it (../shared/repros/x2).
    if not backend.shared:
        pytest.skip("one registry is one candidate: this backend has no second owner")
    terms = Terms()
    async with backend:
        candidates = _candidates(backend, terms, 3)
        by_name = {f"c{index}": candidate for index, candidate in enumerate(candidates)}
        for candidate in candidates:
            await candidate.start()
        first = await terms.wait_for_leader()
        await sleep(0.3)  # (the others queue behind it)
        await by_name[first].yield_leadership(pause=5.0)
        second = await terms.wait_for_leader(other_than=first, timeout=HANDOVER + 1)
        await sleep(0.5)  # (its first looks as leader)
        assert terms.leader() == second
        assert [term[0] for term in terms.terms] == [first, second], f"spurious terms after the yield: {terms.terms}"
        for candidate in candidates:
            await candidate.stop()
    _check_terms(terms.terms)


async def test_a_lone_candidate_leads_and_its_stop_releases_the_lock(backend: Backend) -> None:
    terms = Terms()
    async with backend:
        registry = backend.registry()
        async with registry.leader_election("solo", **terms.callbacks("solo")) as election:
            assert election.key == "election:solo"
            await terms.wait_for_leader()
            assert election.is_leader
            assert election.epoch is not None
            assert election.valid_until is not None
        assert not election.is_leader
        assert terms.terms[0][3] is not None
        # Released: the lock is free for anyone now.
        lock = registry.obtain("election:solo")
        assert await lock.acquire(blocking=False)
        await lock.release()


async def test_an_on_elected_that_raises_ends_the_term_and_hands_over(backend: Backend) -> None:
    if not backend.shared:
        pytest.skip("one registry is one candidate: this backend has no second owner")
    calls: list[str] = []

    async def failing_elected(epoch: int | None) -> None:
        calls.append("elected")
        raise ValueError("setup failed")

    async def revoked() -> None:
        calls.append("revoked")
        raise ValueError("teardown failed too")  # logged and ignored: the term is over

    terms = Terms()
    async with backend:
        failing = backend.registry(expire_after=2.0).leader_election(
            "scheduler", on_elected=failing_elected, on_revoked=revoked
        )
        await failing.start()
        deadline = time.monotonic() + 5
        while calls != ["elected", "revoked"]:
            assert time.monotonic() < deadline, calls
            await sleep(0.005)
        healthy = backend.registry(expire_after=2.0).leader_election("scheduler", **terms.callbacks("healthy"))
        await healthy.start()
        # The failing one sits out a renewal period after its failed term: the healthy one is elected meanwhile.
        assert await terms.wait_for_leader(timeout=3.0) == "healthy"
        assert not failing.is_leader
        await healthy.stop()
        await failing.stop()


async def test_a_second_candidate_of_one_name_in_one_registry_is_refused(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        first = registry.leader_election("only")
        second = registry.leader_election("only")
        await first.start()
        try:
            with pytest.raises(hybridlock.InvalidArgumentError, match="already running"):
                await second.start()
        finally:
            await first.stop()
        await second.start()  # once the first has stopped
        await second.stop()


async def test_an_election_needs_a_registry_that_renews() -> None:
    registry = hybridlock.AsyncLockRegistry(hybridlock.backends.AsyncMemoryBackend(), auto_renew=False)
    try:
        with pytest.raises(hybridlock.InvalidArgumentError, match="auto_renew"):
            registry.leader_election("x")
    finally:
        await registry.aclose()


@pytest.mark.server
async def test_a_partitioned_leader_steps_down_before_another_is_elected(own_server: EmbeddedServer) -> None:
    """The leader is cut off from its server by a black-hole proxy (its renewals go unanswered): it steps down by
    its own clock, and on_revoked has run before the rival is elected, and before the leader's valid_until."""
    terms = Terms()
    proxy = FaultProxy(own_server.port)
    # A socket timeout longer than the lease: the renewal in flight is stuck, so only the clock can tell.
    cut_off = hybridlock.AsyncLockRegistry(proxy.url + "?socket_timeout=4&socket_connect_timeout=4", expire_after=1.5)
    rival = hybridlock.AsyncLockRegistry(own_server.url, expire_after=1.5)
    try:
        leader = cut_off.leader_election("scheduler", **terms.callbacks("cut-off"))
        await leader.start()
        assert await terms.wait_for_leader() == "cut-off"
        other = rival.leader_election("scheduler", **terms.callbacks("rival"))
        await other.start()
        await sleep(0.6)  # a renewal round or so
        proxy.partition()
        last_valid_until = leader.valid_until
        assert last_valid_until is not None
        while True:
            until = leader.valid_until
            if until is None:
                break
            last_valid_until = until
            await sleep(0.002)
        await terms.wait_for_leader(other_than="cut-off", timeout=6.0)
        revoked_at = terms.terms[0][3]
        assert revoked_at is not None
        assert revoked_at <= last_valid_until, "on_revoked ran after the leader's own lease deadline"
        assert not leader.is_leader
        _check_terms(terms.terms)
        proxy.heal()
        await other.stop()
        await leader.stop()
    finally:
        proxy.heal()
        await cut_off.aclose()
        await rival.aclose()
        proxy.close()


@pytest.mark.server
async def test_a_leader_whose_key_is_deleted_steps_down_at_its_next_renewal(own_server: EmbeddedServer) -> None:
    """The server loses the lease (here: the key is deleted, as a failover to a replica that never had it would):
    the leader's next renewal is refused, and it steps down then, within a renewal period."""
    terms = Terms()
    registry = hybridlock.AsyncLockRegistry(own_server.url, expire_after=1.5)
    client = redis.Redis.from_url(own_server.url)
    try:
        election = registry.leader_election("scheduler", **terms.callbacks("leader"))
        await election.start()
        await terms.wait_for_leader()
        lock_keys = [
            key
            for key in client.scan_iter()
            if client.type(key) == b"string" and client.get(key) == registry.client_id.encode()
        ]
        assert lock_keys, "the leader's lock key was not found"
        deleted_at = time.monotonic()
        client.delete(*lock_keys)
        while terms.terms[0][3] is None:
            assert time.monotonic() - deleted_at < 0.5 + 1.0, "the leader did not step down at its next renewal"
            await sleep(0.005)
        # The key is free now: it runs again at once, and its next term has a higher epoch.
        await terms.wait_for_leader()
        epoch = election.epoch
        assert epoch is not None
        assert epoch > terms.terms[0][1]
        await election.stop()
        _check_terms(terms.terms)
    finally:
        client.close()
        await registry.aclose()


async def test_a_stop_from_a_callback_ends_the_candidacy_once_it_returns(backend: Backend) -> None:
    """``stop()`` (and ``yield_leadership()``) called on the worker itself cannot wait for the worker: it asks, and
    the term ends once the callback returns; the election may then start again."""
    terms = Terms()
    recorded = terms.callbacks("self-stopping")
    elections: list[Any] = []

    async def on_elected(epoch: int | None) -> None:
        await recorded["on_elected"](epoch)
        await elections[0].yield_leadership()  # returns at once: the worker is busy here
        await elections[0].stop()

    async with backend:
        registry = backend.registry()
        election = registry.leader_election("selfish", on_elected=on_elected, on_revoked=recorded["on_revoked"])
        elections.append(election)
        await election.start()
        deadline = time.monotonic() + 5
        while election.running:
            assert time.monotonic() < deadline, "the candidacy did not end"
            await sleep(0.005)
        assert terms.terms[0][3] is not None  # on_revoked ran
        assert not election.is_leader
        lock = registry.obtain("election:selfish")
        assert await lock.acquire(blocking=False)  # released
        await lock.release()
        await election.stop()  # cleans up; idempotent
        another = registry.leader_election("selfish")
        await another.start()
        await another.stop()
