"""A model of quorum locks, checked by Hypothesis: exclusion and fencing-token order survive crashes, restarts
without persistence (under the delayed-restart rule), partitions, clock skew, expiring leases and lost counters
(within the bound of "Lost counters" in ``hybridlock._core.quorum``).

The model is pure code: servers are records, time is an integer count of microseconds, and every message is
delivered (or never delivered: a partition, a crash) by a rule of its own, so Hypothesis interleaves the steps of
several clients' acquires with each other, with releases, renewals, crashes, restarts and the passing of time in
any order. Servers behave as the scripts do (ACQUIRE mints ``max(counter + 1, clock)``, RAISE_FENCE never lowers
a counter, leases expire); clients decide with the library's own pure functions (``hybridlock._core.quorum``:
``tally_acquire``, ``write_back_holds``, ``tally_flags``, ``validity_left``), so the model checks the decisions
the backend takes.

Asserted at every grant (an acquire that returns True): its token is greater than every token granted before,
and no other client holds the lock with its validity still running. A counter may be lost (deleted, evicted) on a
server that stays up, between acquisitions, while the servers that kept the last granted token since it was
stored (its *keepers*) stay more than ``N - majority``: the bound the library claims. The variants at the end
break one piece each (no write-back; a restarted server rejoining before the longest lease has passed; counters
lost beyond the bound) and check that Hypothesis then finds a counterexample, so the model can fail.
(``WRITE_BACK = "everyone"``, counting the write-back on servers that refused us, is wrong too, by the
interleaving in ``hybridlock._core.quorum``'s ``tally_acquire``; it takes about a dozen exact steps, and the
search did not reach it in 200 s, so it is not part of the suite. The library raises the counter there too, but
never counts it.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import pytest
from hypothesis import HealthCheck, Phase, settings, target
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hybridlock._core.config import lease_drift
from hybridlock._core.quorum import QuorumAcquire, majority, tally_acquire, tally_flags, validity_left, write_back_holds
from hybridlock._core.results import AcquireResult

LEASE = 100_000  # µs: the lease every client asks for (0.1 s)
SKEW = 20_000  # µs: how far a server's clock may be from real time, either way, at any reading (2 * SKEW < LEASE)
DRIFT = round(lease_drift(LEASE / 1e6) * 1e6)
CLIENTS = ("a", "b", "c")
#: Which servers a client reaches in one operation: often all, else any subset (a partition).
REACH = st.one_of(st.just([True] * 5), st.lists(st.booleans(), min_size=5, max_size=5))
#: What becomes of each of one operation's requests: delivered at once, later (a step of its own), or never.
FATES = st.one_of(st.just(["now"] * 5), st.lists(st.sampled_from(("now", "later", "never")), min_size=5, max_size=5))


@dataclass
class Server:
    up: bool = True
    counter: int = 0
    holder: str | None = None
    expires: int = 0  # real µs; the key is gone from then on
    down_since: int = 0
    offset: int = 0  # µs its clock is ahead of real time (negative: behind)

    def live_holder(self, now: int) -> str | None:
        return self.holder if self.holder is not None and self.expires > now else None

    def acquire(self, owner: str, now: int, clock: int) -> AcquireResult:
        holder = self.live_holder(now)
        if holder is not None and holder != owner:
            return AcquireResult(False, None, (self.expires - now) / 1e6)
        token = max(self.counter + 1, clock)  # the scripts' mint()
        self.counter = token
        self.holder, self.expires = owner, now + LEASE
        return AcquireResult(True, token)

    def raise_fence(self, token: int) -> None:
        self.counter = max(self.counter, token)  # RAISE_FENCE

    def release(self, owner: str, now: int) -> bool:
        if self.live_holder(now) != owner:
            return False
        self.holder = None
        return True

    def renew(self, owner: str, now: int) -> bool:
        if self.live_holder(now) != owner:
            return False
        self.expires = now + LEASE
        return True


@dataclass
class Client:
    state: Literal["idle", "requesting", "writing", "holding"] = "idle"
    start: int = 0  # when the current attempt's requests were sent
    unsent: set[int] = field(default_factory=set)  # requests (acquire or write-back) not yet delivered
    replies: dict[int, AcquireResult] = field(default_factory=dict)
    decision: QuorumAcquire | None = None
    raised: int = 0  # write-backs confirmed, on the servers that count (``counted``)
    counted: set[int] = field(default_factory=set)
    token: int = 0
    valid_until: int = 0
    holders: tuple[int, ...] = ()  # the servers of the last majority round that granted or renewed the lease


class QuorumModel(RuleBasedStateMachine):
    SERVERS = 3
    #: "granting": raise the counter on the granting servers that minted less, count only those (the library's
    #: rule); "none": no write-back; "everyone": raise it on refusing servers too, and count them.
    WRITE_BACK = "granting"
    DELAYED_RESTART = True
    #: Lose counters only while the last granted token keeps more than N - majority keepers (the claimed bound).
    BOUNDED_LOSS = True

    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000_000_000
        self.servers = [Server() for _ in range(self.SERVERS)]
        self.clients = {name: Client() for name in CLIENTS}
        self.granted_tokens: list[int] = []
        # The servers that stored the last granted token and have not lost their counter since (lost counters are
        # counted even when a later write-back restores them: the bound is cumulative until the next grant).
        self.keepers: set[int] = set()
        # How close the run came to breaking each property (positive: broken), for Hypothesis's targeted search.
        self.closest_token_regression = -float(LEASE)
        self.closest_overlap = -float(LEASE)

    # -- time, crashes, restarts -----------------------------------------------------------------------------------

    @initialize(offsets=st.lists(st.integers(-SKEW, SKEW), min_size=5, max_size=5))
    def set_clocks(self, offsets: list[int]) -> None:
        for server, offset in zip(self.servers, offsets, strict=False):
            server.offset = offset

    @rule(index=st.integers(0, 4), offset=st.integers(-SKEW, SKEW))
    def step_clock(self, index: int, offset: int) -> None:
        """NTP steps a server's clock, backwards or forwards, within the skew bound."""
        self.servers[index % self.SERVERS].offset = offset

    @rule(dt=st.one_of(st.integers(1, 2_000), st.integers(1, 2 * LEASE)))
    def advance(self, dt: int) -> None:
        self.now += dt

    @precondition(lambda self: any(server.up for server in self.servers))
    @rule(index=st.integers(0, 4))
    def crash(self, index: int) -> None:
        server = self.servers[index % self.SERVERS]
        if server.up:
            # Without persistence a crash forgets everything: leases and counters.
            server.up, server.holder, server.counter, server.down_since = False, None, 0, self.now

    @precondition(lambda self: not all(server.up for server in self.servers))
    @rule(index=st.integers(0, 4))
    def restart(self, index: int) -> None:
        server = self.servers[index % self.SERVERS]
        if server.up:
            return
        if self.DELAYED_RESTART and self.now - server.down_since < LEASE:
            return  # the rule: not before the longest lease has passed since it went down
        server.up = True

    @precondition(lambda self: not self._in("requesting") and not self._in("writing"))
    @rule(index=st.integers(0, 4))
    def lose_counter(self, index: int) -> None:
        """A lock user deletes a key's counter on one server, or the server evicts it; the server stays up and
        mints from its clock alone next time. Between acquisitions (no round under way), within the bound."""
        index %= self.SERVERS
        server = self.servers[index]
        if not server.up:
            return
        if self.BOUNDED_LOSS and len(self.keepers - {index}) <= self.SERVERS - majority(self.SERVERS):
            return  # beyond the bound: no majority would be sure to meet a keeper
        server.counter = 0
        self.keepers.discard(index)

    # -- acquire: send, deliver one request at a time, decide, write back, decide ----------------------------------

    def _in(self, state: str) -> list[str]:
        return [name for name in CLIENTS if self.clients[name].state == state]

    @precondition(lambda self: self._in("idle"))
    @rule(data=st.data(), fates=FATES)
    def send_acquire(self, data: st.DataObject, fates: list[str]) -> None:
        """A client sends its acquire to every server; each request is delivered now, later (its own ``deliver``
        step, interleaved with anything else) or never (a partition, a lost packet). With nothing left to wait
        for, the client decides at once."""
        name = data.draw(st.sampled_from(self._in("idle")))
        client = self.clients[name]
        client.state, client.start, client.replies = "requesting", self.now, {}
        client.unsent = {i for i in range(self.SERVERS) if fates[i] == "later"}
        for index in range(self.SERVERS):
            if fates[index] == "now":
                self._deliver(name, index)
        if not client.unsent:
            self._collect(name, fates)

    @precondition(lambda self: any(c.unsent for c in self.clients.values()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from([n for n in CLIENTS if self.clients[n].unsent]))
        index = data.draw(st.sampled_from(sorted(self.clients[name].unsent)))
        self.clients[name].unsent.discard(index)
        self._deliver(name, index)

    def _deliver(self, name: str, index: int) -> None:
        client, server = self.clients[name], self.servers[index]
        if not server.up:
            return  # lost with the crashed server
        if client.state == "requesting":
            client.replies[index] = server.acquire(name, self.now, self.now + server.offset)
        elif client.state == "writing":
            server.raise_fence(client.token)
            if index in client.counted:
                client.raised += 1

    @precondition(lambda self: self._in("requesting"))
    @rule(data=st.data(), fates=FATES)
    def collect_acquire(self, data: st.DataObject, fates: list[str]) -> None:
        """The client stops waiting for replies (the rest timed out) and decides."""
        self._collect(data.draw(st.sampled_from(self._in("requesting"))), fates)

    def _collect(self, name: str, fates: list[str]) -> None:
        """Decide an acquire round; on a majority, send the write-back (each delivered now, later or never), and
        with nothing left to wait for, finish at once."""
        client = self.clients[name]
        replies = [client.replies.get(i) for i in range(self.SERVERS)]
        decision = tally_acquire(replies, LEASE / 1e6, (self.now - client.start) / 1e6)
        if not decision.acquired:
            self._give_back(name, decision.granted)
            return
        assert decision.token is not None
        client.state, client.decision, client.token, client.raised = "writing", decision, decision.token, 0
        if self.WRITE_BACK == "granting":
            # The library's rule: the granting servers that minted less, counted (unless a majority minted the
            # token already), and best effort every other server that answered (the refusers), never counted.
            already = write_back_holds(self.SERVERS, decision.already_at_token, 0)
            client.counted = set() if already else set(decision.write_back)
            targets = set(decision.write_back) | set(decision.also_raise)
        elif self.WRITE_BACK == "everyone":
            targets = {i for i in client.replies if client.replies[i].fencing_token != decision.token}
            client.counted = set(targets)
        else:
            targets = client.counted = set()
        client.unsent = {i for i in targets if fates[i] == "later"}
        for index in sorted(targets):
            if fates[index] == "now":
                self._deliver(name, index)
        if not client.unsent:
            self._finish(name)

    @precondition(lambda self: self._in("writing"))
    @rule(data=st.data())
    def finish_acquire(self, data: st.DataObject) -> None:
        self._finish(data.draw(st.sampled_from(self._in("writing"))))

    def _finish(self, name: str) -> None:
        client = self.clients[name]
        decision = client.decision
        assert decision is not None
        enough = self.WRITE_BACK == "none" or write_back_holds(self.SERVERS, decision.already_at_token, client.raised)
        if not enough or validity_left(LEASE / 1e6, (self.now - client.start) / 1e6) <= 0:
            self._give_back(name, decision.granted)
            return
        # Granted: acquire() returns True now.
        if self.granted_tokens:
            self.closest_token_regression = max(self.closest_token_regression, self.granted_tokens[-1] - client.token)
            assert client.token > self.granted_tokens[-1], f"token order: {client.token} after {self.granted_tokens}"
        self.granted_tokens.append(client.token)
        self.keepers = {i for i, server in enumerate(self.servers) if server.counter >= client.token}
        for other, state in self.clients.items():
            if other != name and state.state == "holding":
                self.closest_overlap = max(self.closest_overlap, state.valid_until - self.now)
                assert state.valid_until <= self.now, f"{name} and {other} both hold the lock at {self.now}"
        client.state, client.unsent, client.valid_until = "holding", set(), client.start + LEASE - DRIFT
        client.holders = decision.granted

    def _give_back(self, name: str, granted: tuple[int, ...]) -> None:
        for index in granted:
            if self.servers[index].up:
                self.servers[index].release(name, self.now)
        self.clients[name] = Client()

    # -- holding: renew, release ----------------------------------------------------------------------------------

    @precondition(lambda self: self._in("holding"))
    @rule(
        data=st.data(),
        reach=REACH,
        elapsed=st.one_of(st.integers(1, 2_000), st.integers(1, LEASE)),
    )
    def renew(self, data: st.DataObject, reach: list[bool], elapsed: int) -> None:
        name = data.draw(st.sampled_from(self._in("holding")))
        client = self.clients[name]
        start = self.now
        flags: list[bool | None] = [
            self.servers[i].renew(name, start) if reach[i] and self.servers[i].up else None for i in range(self.SERVERS)
        ]
        self.now += elapsed
        verdict = tally_flags(flags, client.holders)
        if verdict.held and validity_left(LEASE / 1e6, elapsed / 1e6) > 0:
            client.valid_until = start + LEASE - DRIFT
            client.holders = tuple(i for i, flag in enumerate(flags) if flag)
        elif verdict.covered and self.now < client.valid_until:
            return  # not extended: still ours until the last holders' deadline, as for a failed round
        elif verdict.decided:
            self.clients[name] = Client()  # told it lost the lock
        # else a failed round: the lease keeps running out

    @precondition(lambda self: self._in("holding"))
    @rule(data=st.data(), reach=REACH)
    def release(self, data: st.DataObject, reach: list[bool]) -> None:
        name = data.draw(st.sampled_from(self._in("holding")))
        for index, server in enumerate(self.servers):
            if reach[index] and server.up:
                server.release(name, self.now)
        self.clients[name] = Client()

    def teardown(self) -> None:
        target(self.closest_token_regression, label="token regression")
        target(self.closest_overlap, label="overlap")

    @invariant()
    def at_most_one_valid_holder(self) -> None:
        valid = [n for n, c in self.clients.items() if c.state == "holding" and c.valid_until > self.now]
        assert len(valid) <= 1, f"{valid} both hold the lock at {self.now}"

    @invariant()
    def majority_is_a_majority(self) -> None:
        assert 2 * majority(self.SERVERS) > self.SERVERS


class QuorumModel5(QuorumModel):
    SERVERS = 5


_SETTINGS = settings(max_examples=200, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck))

TestQuorumModel3 = QuorumModel.TestCase
TestQuorumModel3.settings = _SETTINGS
TestQuorumModel5 = QuorumModel5.TestCase
TestQuorumModel5.settings = _SETTINGS
TestQuorumModel3.pytestmark = TestQuorumModel5.pytestmark = [
    pytest.mark.slow(reason="runs 200 examples of 40 steps of the state machine")
]


class NoWriteBack(QuorumModel):
    WRITE_BACK = "none"


class EarlyRestart(QuorumModel):
    DELAYED_RESTART = False


class UnboundedLoss(QuorumModel):
    BOUNDED_LOSS = False


@pytest.mark.parametrize(
    ("machine", "broken"),
    [
        (NoWriteBack, "token order"),
        # Found as a token regression: the restarted server's clock floor is below the last token.
        (EarlyRestart, "token order|both hold"),
        # A majority of servers none of which kept the last token mints from clocks behind it.
        (UnboundedLoss, "token order"),
    ],
    ids=["no-write-back", "restart-before-the-longest-lease", "counters-lost-beyond-the-bound"],
)
@pytest.mark.slow(reason="searches a Hypothesis state machine until each broken variant fails")
@pytest.mark.timeout(400)
def test_the_model_catches_a_broken_rule(machine: type[QuorumModel], broken: str) -> None:
    """Each broken variant must fail: the model is able to see the properties go. Derandomized, so the search is
    the same on every run (about 40 s each on a quiet machine); targeted at the closest call so far."""
    try:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=20000,
                stateful_step_count=40,
                derandomize=True,
                phases=(Phase.generate, Phase.target),  # finding one is the point: no shrinking
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
                print_blob=False,
            ),
        )
    except Exception as exc:  # an AssertionError, or a group of them when several distinct failures were found
        found = "\n".join(str(error) for error in _leaves(exc))
        assert re.search(broken, found), found
    else:
        pytest.fail("the broken model passed: the model cannot tell this rule is needed")


def _leaves(error: BaseException) -> list[BaseException]:
    nested = getattr(error, "exceptions", None)
    return [leaf for inner in nested for leaf in _leaves(inner)] if nested else [error]
