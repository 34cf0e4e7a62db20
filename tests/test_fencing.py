"""Fencing tokens: strictly increasing per key across owners, processes, crashes and counter expiry; the
resource-side helpers reject a stale holder's write."""

from __future__ import annotations

import multiprocessing
import sqlite3
import time

import pytest
import redis

import hybridlock
from hybridlock.fencing import fenced_set
from hybridlock.testing.server import EmbeddedServer
from tests import _wake_workers

CTX = multiprocessing.get_context("spawn")


def test_tokens_increase_with_every_fresh_acquisition(any_registry_factory):
    first, second = any_registry_factory(), any_registry_factory()
    tokens = []
    for registry in (first, second, first, second):
        lock = registry.obtain("res")
        with lock:
            tokens.append(lock.fencing_token)
            with lock:  # reentrant: the same tenancy, the same token
                assert lock.fencing_token == tokens[-1]
        assert lock.fencing_token is None
    assert tokens == sorted(set(tokens))


@pytest.mark.server
def test_tokens_increase_across_processes_and_a_crashed_holder(server, make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("crashy")
    with lock:
        before = lock.fencing_token
    ready, crashed_token = CTX.Event(), CTX.Value("q", 0)
    crasher = CTX.Process(target=_wake_workers.hold_and_die, args=(server.url, "crashy", 0.5, ready, crashed_token))
    crasher.start()
    assert ready.wait(20)
    crasher.join(20)
    assert lock.acquire(timeout=10)  # after the crashed holder's lease ran out
    after = lock.fencing_token
    lock.release()
    assert before < crashed_token.value < after


@pytest.mark.server
def test_tokens_stay_monotonic_when_the_counter_expired(make_registry, redis_client):
    registry = make_registry()
    lock = registry.obtain("idle")
    with lock:
        first = lock.fencing_token
    redis_client.delete("hybridlock:{idle}:fence")  # what a week without acquisitions does
    with lock:
        assert lock.fencing_token > first
    assert 0 < redis_client.pttl("hybridlock:{idle}:fence") <= 7 * 24 * 3600 * 1000


@pytest.mark.server
def test_fenced_set_rejects_a_stale_holders_write(make_registry, redis_client):
    stale_registry = make_registry(expire_after=0.3, auto_renew=False)
    fresh_registry = make_registry()
    stale = stale_registry.obtain("account")
    stale.acquire()
    stale_token = stale.fencing_token
    time.sleep(0.5)  # the stale holder is paused past its lease...
    fresh = fresh_registry.obtain("account")
    assert fresh.acquire(timeout=5)
    assert fenced_set(redis_client, "{account}:balance", "100", fresh.fencing_token)
    fresh.release()
    # ...and wakes up to write with its old token: refused, and the newer value stays.
    assert not fenced_set(redis_client, "{account}:balance", "999", stale_token)
    assert redis_client.get("{account}:balance") == b"100"
    with pytest.raises(hybridlock.LockLostError):
        stale.release()


@pytest.mark.server
def test_fenced_set_accepts_repeated_writes_of_one_holder_and_sets_ttl(redis_client):
    assert fenced_set(redis_client, "doc", "a", 5, expire_after=10)
    assert fenced_set(redis_client, "doc", "b", 5)
    assert redis_client.get("doc") == b"b"
    assert fenced_set(redis_client, "doc", "c", 6, expire_after=10)
    assert 0 < redis_client.pttl("doc:fence") <= 10_000


@pytest.mark.server
def test_fenced_set_rejects_bad_input(redis_client):
    with pytest.raises(hybridlock.InvalidArgumentError):
        fenced_set(redis_client, "", "v", 1)
    with pytest.raises(hybridlock.InvalidArgumentError):
        fenced_set(redis_client, "k", "v", -1)
    with pytest.raises(hybridlock.InvalidArgumentError):
        fenced_set(redis_client, "k", "v", 1, expire_after=0)


def test_sql_pattern_rejects_a_stale_holders_update():
    """The documented pattern: ``UPDATE ... WHERE fence_token <= :token``."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER, fence_token INTEGER)")
    db.execute("INSERT INTO accounts VALUES (1, 0, 0)")
    update = "UPDATE accounts SET balance = :balance, fence_token = :token WHERE id = 1 AND fence_token <= :token"
    registry = hybridlock.LocalLockRegistry()
    lock = registry.obtain("account:1")
    with lock:
        old_token = lock.fencing_token
    with lock:
        new_token = lock.fencing_token
    assert db.execute(update, {"balance": 100, "token": new_token}).rowcount == 1
    assert db.execute(update, {"balance": 999, "token": old_token}).rowcount == 0  # fenced off
    assert db.execute("SELECT balance FROM accounts").fetchone() == (100,)


@pytest.mark.server
def test_tokens_from_a_promoted_replica_exceed_every_token_the_lost_master_minted():
    """A replica that missed the master's last acquisitions is promoted: its counter is behind, its clock is not."""
    with (
        EmbeddedServer() as master,
        EmbeddedServer(extra_args=("--replicaof", "127.0.0.1", str(master.port))) as replica,
    ):
        on_master = hybridlock.LockRegistry(master.url)
        replica_client = redis.Redis.from_url(replica.url)
        try:
            lock = on_master.obtain("failover")
            with lock:
                minted = [lock.fencing_token]
            deadline = time.monotonic() + 20
            while replica_client.get("hybridlock:{failover}:fence") is None:
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.05)
            replica_client.replicaof("NO", "ONE")  # detached: it misses everything from here on
            for _ in range(50):
                with lock:
                    minted.append(lock.fencing_token)
            assert minted == sorted(set(minted))
            with hybridlock.LockRegistry(replica.url) as on_promoted:
                promoted = on_promoted.obtain("failover")
                with promoted:
                    assert promoted.fencing_token > max(minted)
        finally:
            on_master.close()
            replica_client.close()


@pytest.mark.server
def test_a_counter_ahead_of_the_clock_still_gives_the_next_token(make_registry, redis_client):
    # The clock stepped back (or the counter was written by a server whose clock ran ahead): the counter term
    # carries the order, so the token is the counter plus one, not the clock.
    registry = make_registry()
    lock = registry.obtain("ahead")
    ahead = int(time.time() * 1_000_000) + 10**12
    redis_client.set("hybridlock:{ahead}:fence", ahead)
    with lock:
        assert lock.fencing_token == ahead + 1
    with lock:
        assert lock.fencing_token == ahead + 2
    assert int(redis_client.get("hybridlock:{ahead}:fence")) == ahead + 2


@pytest.mark.server
@pytest.mark.parametrize("junk", ["not a number", "zset"])
def test_a_counter_that_is_not_a_number_is_replaced_by_the_clock_term(make_registry, redis_client, junk):
    registry = make_registry()
    lock = registry.obtain("junk")
    fence = "hybridlock:{junk}:fence"
    if junk == "zset":
        redis_client.zadd(fence, {"x": 1})
    else:
        redis_client.set(fence, junk)
    before = int(time.time() * 1_000_000)
    with lock:
        token = lock.fencing_token
    assert token >= before - 5_000_000  # the server clock's microseconds, give or take a skew between clocks
    assert int(redis_client.get(fence)) == token
    assert 0 < redis_client.pttl(fence) <= 7 * 24 * 3600 * 1000


@pytest.mark.server
def test_raise_fence_never_lowers_the_counter_and_keeps_its_ttl(redis_client: redis.Redis) -> None:
    # The quorum's write-back: a token below the stored counter leaves the counter alone (and refreshes its TTL).
    from hybridlock._protocol import scripts

    fence = "hybridlock:{k}:fence"
    ttl = str(scripts.FENCE_COUNTER_TTL_MS)
    assert redis_client.eval(scripts.RAISE_FENCE, 1, fence, 100, ttl) == 1
    assert int(redis_client.get(fence)) == 100
    redis_client.pexpire(fence, 5_000)
    assert redis_client.eval(scripts.RAISE_FENCE, 1, fence, 7, ttl) == 1
    assert int(redis_client.get(fence)) == 100
    assert redis_client.pttl(fence) > 60_000


@pytest.mark.server
def test_fenced_set_refuses_tokens_outside_the_exact_range(redis_client: redis.Redis) -> None:
    # The script compares in doubles: above 2^53 - 1, two different tokens could compare equal.
    from hybridlock.fencing import MAX_TOKEN

    assert MAX_TOKEN == 2**53 - 1
    for token in (MAX_TOKEN + 1, 2**63, -1):
        with pytest.raises(hybridlock.InvalidArgumentError, match=r"2\*\*53 - 1"):
            fenced_set(redis_client, "doc", "v", token)
    assert not redis_client.exists("doc")
    assert fenced_set(redis_client, "doc", "last", MAX_TOKEN)
    assert not fenced_set(redis_client, "doc", "stale", MAX_TOKEN - 1)
    assert redis_client.get("doc") == b"last"


@pytest.mark.server
@pytest.mark.parametrize("mark", [str(2**53 + 2), "1e19", "not a number", "nan", "zset"])
def test_fenced_set_refuses_a_highest_token_it_cannot_compare_exactly(redis_client: redis.Redis, mark: str) -> None:
    """A resource's highest token above 2^53 - 1 (left by a lock user, or by a version that minted from a counter
    that large) would let a stale writer through an inexact comparison: nothing is written, and the error names
    the key, the fence key and what it holds (a key of another type, or a value that is not a number, too: no
    script error)."""
    if mark == "zset":
        redis_client.zadd("doc:fence", {"x": 1})
    else:
        redis_client.set("doc:fence", mark)
    with pytest.raises(hybridlock.FencingCounterError) as caught:
        fenced_set(redis_client, "doc", "v", 2**53 - 1)
    error = caught.value
    assert error.key == "doc"
    assert error.counter == "doc:fence"
    assert error.value == ("(a zset)" if mark == "zset" else mark)
    assert "127.0.0.1" in str(error.server) or "localhost" in str(error.server)
    assert not redis_client.exists("doc")


@pytest.mark.server
def test_raise_fence_refuses_a_counter_at_or_above_the_exact_range(redis_client: redis.Redis) -> None:
    from hybridlock._protocol import scripts

    fence = "hybridlock:{k}:fence"
    ttl = str(scripts.FENCE_COUNTER_TTL_MS)
    for stored in (str(2**53 - 1), str(2**53 + 1), "inf"):
        redis_client.set(fence, stored)
        assert redis_client.eval(scripts.RAISE_FENCE, 1, fence, 100, ttl) == [-1, stored.encode()]
        assert redis_client.get(fence) == stored.encode()
    redis_client.set(fence, str(2**53 - 2))  # still counts: its next token is the last exact one
    assert redis_client.eval(scripts.RAISE_FENCE, 1, fence, 100, ttl) == 1
