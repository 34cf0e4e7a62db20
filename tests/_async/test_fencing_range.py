"""Fencing counters at or above 2^53 - 1 (what a lock user may write into ``<registry>:{<key>}:fence``): Lua counts
in doubles, exact only up to 2^53, so such a counter would make every later token repeat the last one (and above
2^63 turn negative). Every script that mints refuses it instead: the acquire raises ``FencingCounterError``
naming the key, the server, the counter and its value, takes nothing in the server, leaves the counter as it was,
and never returns a token that is not greater than every earlier one. Plain locks (with and without a queue),
multi-key locks and write locks, on one real server.

Written for asyncio; ``tests/_sync/test_fencing_range.py`` is generated from it. The quorum's side is in
``test_quorum_fencing.py``; ``fenced_set``'s in ``tests/test_fencing.py``.
"""

from __future__ import annotations

import pytest
import redis

import hybridlock
from hybridlock.fencing import MAX_TOKEN
from hybridlock.testing import EmbeddedServer

from ._compat import sleep, spawn

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]

# What a lock user may have written (2^53 + 1 reads back as 2^53 in a double, so ``+ 1`` is lost), the last
# token a counter can give (exhausted: its next one would be 2^53, the one after that 2^53 again), a counter
# past 2^63 (tokens turned negative) and an infinity.
OUT_OF_RANGE = [str(2**53 + 1), str(MAX_TOKEN), "1e19", "inf"]


def fence(key: str) -> str:
    return f"hybridlock:{{{key}}}:fence"


def check_error(error: hybridlock.FencingCounterError, key: str, value: str, server: EmbeddedServer) -> None:
    assert error.key == key
    assert str(server.port) in str(error.server)
    assert error.counter == fence(key)
    assert error.value == value
    assert isinstance(error, RuntimeError)
    assert value in str(error)
    assert "2**53 - 1" in str(error)


@pytest.mark.parametrize("value", OUT_OF_RANGE)
async def test_an_acquire_refuses_a_counter_at_or_above_the_exact_range(
    server: EmbeddedServer, redis_client: redis.Redis, value: str
) -> None:
    redis_client.set(fence("k"), value)
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=2) as registry:
        lock = registry.obtain("k")
        with pytest.raises(hybridlock.FencingCounterError) as caught:
            await lock.acquire(timeout=2)
        check_error(caught.value, "k", value, server)
        assert not lock.is_held_by_current_task()
        assert not redis_client.exists("hybridlock:{k}"), "a lease was left in the server"
        assert redis_client.get(fence("k")) == value.encode(), "the counter was changed"
        # Repaired by hand (here: deleted, so tokens start again from the server clock), the lock works again.
        redis_client.delete(fence("k"))
        assert await lock.acquire(timeout=2)
        assert 0 < (lock.fencing_token or 0) < MAX_TOKEN
        await lock.release()


async def test_the_last_exact_token_is_minted_once_and_never_repeated(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    """A stale holder paused past its lease and the next holder never share a token: the counter one below the
    last exact token gives exactly that token, and the next acquisition is refused rather than given it again."""
    redis_client.set(fence("k"), str(MAX_TOKEN - 1))
    async with (
        hybridlock.AsyncLockRegistry(server.url, expire_after=0.3, auto_renew=False) as stale_owner,
        hybridlock.AsyncLockRegistry(server.url, expire_after=2) as next_owner,
    ):
        stale = stale_owner.obtain("k")
        assert await stale.acquire(timeout=2)
        assert stale.fencing_token == MAX_TOKEN
        await sleep(0.5)  # paused past its lease
        later = next_owner.obtain("k")
        with pytest.raises(hybridlock.FencingCounterError) as caught:
            await later.acquire(timeout=2)
        check_error(caught.value, "k", str(MAX_TOKEN), server)
        with pytest.raises(hybridlock.LockLostError):
            await stale.release()


async def test_a_queued_waiter_is_refused_too_and_leaves_the_queue(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    """The queued path of the script (another owner waits): the waiter whose turn comes meets the counter, is told,
    and leaves no place in the queue and no lease behind."""
    async with (
        hybridlock.AsyncLockRegistry(server.url, expire_after=2) as holder_registry,
        hybridlock.AsyncLockRegistry(server.url, expire_after=2) as waiter_registry,
    ):
        holder, waiter = holder_registry.obtain("k"), waiter_registry.obtain("k")
        assert await holder.acquire(timeout=2)

        async def wait() -> BaseException | None:
            try:
                await waiter.acquire(timeout=10)
            except hybridlock.FencingCounterError as exc:
                return exc
            return None

        waiting = spawn(wait)
        for _ in range(200):
            if redis_client.zcard("hybridlock:{k}:queue"):
                break
            await sleep(0.01)
        assert redis_client.zcard("hybridlock:{k}:queue") == 1, "the waiter never queued"
        redis_client.set(fence("k"), str(2**53 + 1))
        await holder.release()
        error = await waiting.join()
        assert isinstance(error, hybridlock.FencingCounterError)
        check_error(error, "k", str(2**53 + 1), server)
        assert not waiter.is_held_by_current_task()
        assert not redis_client.exists("hybridlock:{k}")
        assert not redis_client.zcard("hybridlock:{k}:queue")


async def test_a_multi_key_acquire_refuses_and_takes_none_of_its_keys(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    redis_client.set(fence("b"), str(2**53 + 1))
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=2) as registry:
        both = registry.obtain_many(["a", "b", "c"])
        with pytest.raises(hybridlock.FencingCounterError) as caught:
            await both.acquire(timeout=2)
        check_error(caught.value, "b", str(2**53 + 1), server)
        assert not both.is_held_by_current_task()
        for key in "abc":
            assert not redis_client.exists(f"hybridlock:{{{key}}}"), f"{key} was left taken"


async def test_a_write_lock_refuses_and_holds_no_reader_back(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    redis_client.set(fence("rw"), "1e19")
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=2) as registry:
        rw = registry.obtain_read_write("rw")
        with pytest.raises(hybridlock.FencingCounterError) as caught:
            await rw.write_lock().acquire(timeout=2)
        check_error(caught.value, "rw", "1e19", server)
        assert not redis_client.exists("hybridlock:{rw}:writer")
        assert not redis_client.zcard("hybridlock:{rw}:writers")
        assert await rw.read_lock().acquire(timeout=2)  # readers go on: they mint no token
        await rw.read_lock().release()
