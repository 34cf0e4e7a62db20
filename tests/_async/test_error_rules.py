"""Which error a failure raises, on real servers, for every lock kind: written once for asyncio (owners are tasks)
and generated into ``tests/_sync`` (owners are threads).

The rule for ``release()``: a lease already known lost raises ``LockLostError`` whatever the server says (the loss
is what the caller must hear: someone else may have held the lock meanwhile); the server's failure to take the
lease back is its ``__cause__``. ``BackendUnavailableError`` only when the lease was not known lost. Either way the
lock is released here.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock.backends import AsyncMemoryBackend
from hybridlock.testing import EmbeddedServer

from ._compat import sleep
from .helpers import Holder, Kind, in_other, kinds

pytestmark = [pytest.mark.server, pytest.mark.timeout(90)]

# A short socket timeout, so that a paused server costs little.
FAST = "?socket_timeout=0.5&socket_connect_timeout=0.5"


async def _wait_until_lost(lock: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not lock.lost and time.monotonic() < deadline:
        await sleep(0.02)
    assert lock.lost, f"the lease was not reported lost within {within}s"


def _delete_leases(servers: list[EmbeddedServer], keys: list[str]) -> None:
    """What an operator's DEL or an eviction does: the lease keys are gone (every key of the lock's name)."""
    for server in servers:
        with redis.Redis.from_url(server.url) as client:
            for key in keys:
                names = client.keys(f"*{{{key}}}*")
                if names:
                    client.delete(*names)


def _assert_names(error: BaseException, keys: list[str], servers: list[EmbeddedServer]) -> None:
    assert isinstance(error, hybridlock.HybridLockError)
    assert error.key in keys
    assert error.server is not None
    assert any(str(server.port) in error.server for server in servers), error.server


# -- release of a lease known lost while the server is down ------------------------------------------------------------


@kinds()
@pytest.mark.parametrize("how", ["deleted, then killed", "deleted, then paused", "killed, lost at its deadline"])
async def test_release_of_a_lease_known_lost_raises_lock_lost_while_the_server_is_down(
    own_server: EmbeddedServer, kind: Kind, how: str
) -> None:
    async with hybridlock.AsyncLockRegistry(own_server.url + FAST, expire_after=1.5) as registry:
        lock = kind.make(registry, "k")
        assert await lock.acquire(timeout=5)
        if how.startswith("deleted"):
            _delete_leases([own_server], kind.keys("k"))  # found lost at the next renewal
            await _wait_until_lost(lock)
        if how.endswith("paused"):
            own_server.pause()
        else:
            own_server.kill()
        if how.endswith("deadline"):
            await _wait_until_lost(lock)  # reported lost once valid_until passes without a renewal
        try:
            with pytest.raises(hybridlock.LockLostError) as caught:
                await lock.release()
        finally:
            if how.endswith("paused"):
                own_server.resume()
        _assert_names(caught.value, kind.keys("k"), [own_server])
        # The server's failure is kept as the cause, so nothing is hidden.
        assert isinstance(caught.value.__cause__, hybridlock.BackendUnavailableError), repr(caught.value.__cause__)
        assert not lock.is_held_by_current_task()
        with pytest.raises(hybridlock.LockNotOwnedError):
            await lock.release()


async def test_a_multi_key_release_reports_a_lost_part_before_an_unreachable_one(own_server: EmbeddedServer) -> None:
    """One key lost, the other not: the server down fails both releases, and the loss is what is raised, whichever
    key is released first."""
    async with hybridlock.AsyncLockRegistry(own_server.url + FAST, expire_after=1.5) as registry:
        for lost_key in ("a", "b"):
            lock = registry.obtain_many(["a", "b"])
            assert await lock.acquire(timeout=5)
            _delete_leases([own_server], [lost_key])
            part = next(p for p in lock.locks if p.key == lost_key)
            await _wait_until_lost(part)
            own_server.pause()
            try:
                with pytest.raises(hybridlock.LockLostError) as caught:
                    await lock.release()
            finally:
                own_server.resume()
            assert caught.value.key == lost_key
            assert not lock.is_held_by_current_task()


@kinds()
async def test_release_of_a_sound_lease_while_the_server_is_down_raises_backend_unavailable(
    own_server: EmbeddedServer, kind: Kind
) -> None:
    async with hybridlock.AsyncLockRegistry(own_server.url + FAST) as registry:
        lock = kind.make(registry, "k")
        assert await lock.acquire(timeout=5)
        own_server.kill()
        with pytest.raises(hybridlock.BackendUnavailableError) as caught:
            await lock.release()
        assert not isinstance(caught.value, hybridlock.LockLostError)
        _assert_names(caught.value, kind.keys("k"), [own_server])
        assert not lock.is_held_by_current_task()


@kinds("plain", "multi")
@pytest.mark.parametrize("how", ["deleted, then a majority killed", "a majority killed, lost at its deadline"])
async def test_quorum_release_of_a_lease_known_lost_raises_lock_lost_while_a_majority_is_down(
    kind: Kind, how: str
) -> None:
    servers = [EmbeddedServer().start() for _ in range(3)]
    try:
        urls = [server.url + FAST for server in servers]
        async with hybridlock.AsyncQuorumLockRegistry(urls, expire_after=1.5) as registry:
            lock = kind.make(registry, "k")
            assert await lock.acquire(timeout=5)
            if how.startswith("deleted"):
                _delete_leases(servers, kind.keys("k"))
                await _wait_until_lost(lock)
            for server in servers[:2]:
                server.kill()
            if how.endswith("deadline"):
                await _wait_until_lost(lock)
            with pytest.raises(hybridlock.LockLostError) as caught:
                await lock.release()
            _assert_names(caught.value, kind.keys("k"), servers)
            if how.endswith("deadline"):
                # The live server still holds the lease; the dead majority leaves the release undecided.
                assert isinstance(caught.value.__cause__, hybridlock.BackendUnavailableError), repr(
                    caught.value.__cause__
                )
            assert not lock.is_held_by_current_task()
    finally:
        for server in servers:
            server.stop()


# -- @synchronized templates -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "named"),
    [
        ("order:{n!z}", "!z"),  # no such conversion
        ("order:{n:{width!z}}", "!z"),  # nor in a nested field
        ("order:{n!r:d}", "Unknown format code 'd'"),  # a repr is a str, which no 'd' spec suits
        ("order:{n:{width}}", "width"),  # a nested field naming no parameter
        ("order:{n:{n:{n}}}", "recursion"),  # nested too deep for str.format
    ],
)
async def test_a_template_that_can_never_format_fails_when_decorating(template: str, named: str) -> None:
    async with hybridlock.AsyncLocalLockRegistry() as registry:
        with pytest.raises(hybridlock.InvalidArgumentError) as caught:

            @registry.synchronized(template)
            async def f(n: int) -> int:
                return n

        assert template in str(caught.value)
        assert named in str(caught.value)


class _Unformattable:
    def __format__(self, spec: str) -> str:
        raise RuntimeError("no key for you")


@dataclass
class _Order:
    id: int


@pytest.mark.parametrize(
    ("template", "good", "value", "cause"),
    [
        ("order:{n:d}", 7, "abc", ValueError),  # a spec that does not suit the value
        ("order:{n.id}", _Order(7), 42, AttributeError),
        ("order:{n[0]}", [7], 42, TypeError),
        ("order:{n}", 7, _Unformattable(), RuntimeError),  # whatever the value's __format__ raises
    ],
)
async def test_arguments_that_cannot_fill_the_template_raise_invalid_argument_naming_it(
    template: str, good: Any, value: Any, cause: type[BaseException]
) -> None:
    async with hybridlock.AsyncLocalLockRegistry() as registry:

        @registry.synchronized(template)
        async def place_order(n: Any) -> Any:
            return n

        assert await place_order(good) is good
        with pytest.raises(hybridlock.InvalidArgumentError) as caught:
            await place_order(value)
        message = str(caught.value)
        assert template in message
        assert "place_order" in message
        assert "{n" in message  # the field,
        assert type(value).__name__ in message  # and what its argument is
        assert isinstance(caught.value.__cause__, cause)
        assert caught.value.server == registry.server
        assert registry.held_locks() == []


# -- messages name this side's owner (a task here; a thread in the generated twin) -------------------------------------


@kinds()
async def test_releasing_a_lock_held_elsewhere_says_this_task_does_not_hold_it(kind: Kind) -> None:
    async with hybridlock.AsyncLocalLockRegistry() as registry:
        lock = kind.make(registry, "k")
        with pytest.raises(hybridlock.LockNotOwnedError) as caught:
            await lock.release()
        assert "this task does not hold" in str(caught.value)
        async with Holder(lock):  # held by another task: still not ours to release
            with pytest.raises(hybridlock.LockNotOwnedError) as caught:
                await lock.release()
            assert "this task does not hold" in str(caught.value)
            assert not lock.is_held_by_current_task()
        async with lock:
            assert lock.is_held_by_current_task()
            assert await in_other(lock.is_held_by_current_task) is False


async def test_an_upgrade_and_a_reentry_into_a_lost_lease_say_this_task() -> None:
    async with hybridlock.AsyncLocalLockRegistry() as registry:
        rw = registry.obtain_read_write("k")
        assert await rw.read_lock().acquire()
        with pytest.raises(hybridlock.LockUpgradeError) as upgrade:
            await rw.write_lock().acquire()
        await rw.read_lock().release()
        assert "this task holds the read lock" in str(upgrade.value)
        multi = registry.obtain_many(["a", "b"])
        async with multi:
            assert "held by this task" in repr(multi)
        assert "not held by this task" in repr(multi)

    backend = AsyncMemoryBackend()
    async with hybridlock.AsyncLockRegistry(backend, expire_after=1) as registry:
        lock = registry.obtain("k")
        assert await lock.acquire()
        await backend.release(lock._names, registry.client_id, notify=False)  # the key taken away
        with pytest.raises(hybridlock.LockLostError):
            await lock.renew()
        with pytest.raises(hybridlock.LockLostError) as reentry:
            await lock.acquire()
        assert "while this task held it" in str(reentry.value)
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


# -- closing a registry whose locks are still held ---------------------------------------------------------------------


async def test_closing_with_locks_held_warns_naming_them_and_leaves_them_to_their_holders(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    registry = hybridlock.AsyncLockRegistry(server.url, expire_after=5)
    other = hybridlock.AsyncLockRegistry(server.url)
    try:
        plain = registry.obtain("plain")
        write = registry.obtain_read_write("catalog").write_lock()
        multi = registry.obtain_many(["a", "b"])
        for lock in (plain, write, multi):
            assert await lock.acquire(timeout=5)
        with pytest.warns(hybridlock.LocksHeldAtCloseWarning) as caught:
            await registry.aclose()
        assert len(caught) == 1
        assert caught[0].filename == __file__, "the warning should point at the caller of close"
        message = str(caught[0].message)
        for shown in ("'plain'", "'catalog (write)'", "'a'", "'b'", "4 lock(s)"):
            assert shown in message
        assert "does not release them" in message
        assert "within 5 s" in message
        assert "async with lock: inside async with registry:" in message
        # Still held, here and in the server: another owner cannot get in while the holder works on.
        assert plain.is_held_by_current_task()
        assert not await other.obtain("plain").acquire(blocking=False)
        # The holder's release still reaches the server: the next owner gets the lock at once.
        await plain.release()
        await write.release()
        await multi.release()
        for key in ("plain", "a"):
            theirs = other.obtain(key)
            assert await theirs.acquire(blocking=False)
            await theirs.release()
        assert await other.obtain_read_write("catalog").write_lock().acquire(blocking=False)
        await other.obtain_read_write("catalog").write_lock().release()
    finally:
        await other.aclose()


async def test_closing_with_nothing_held_or_a_lease_only_retained_does_not_warn(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    registry = hybridlock.AsyncLockRegistry(server.url, retain_for=30)
    async with registry.obtain("k"):
        pass  # its lease is kept idle now (retained), which close gives back: nothing held to warn about
    async with registry:  # (the suite turns any warning into an error)
        pass
    async with hybridlock.AsyncLockRegistry(server.url) as fresh:
        assert await fresh.obtain("k").acquire(blocking=False), "close did not give the retained lease back"
        await fresh.obtain("k").release()


async def test_closing_a_local_registry_with_a_lock_held_warns_too() -> None:
    registry = hybridlock.AsyncLocalLockRegistry()
    lock = registry.obtain("k")
    assert await lock.acquire()
    with pytest.warns(hybridlock.LocksHeldAtCloseWarning, match="'k'.*stay held until their holders release them"):
        await registry.__aexit__(None, None, None)  # what `async with registry:` does at its end
    await lock.release()


# -- an expire_after that looks like milliseconds ----------------------------------------------------------------------


async def test_an_expire_after_that_looks_like_milliseconds_warns(
    server: EmbeddedServer, quorum_urls: list[str]
) -> None:
    with pytest.warns(hybridlock.LongLeaseWarning, match=r"expire_after is in seconds: 30000 s is 8\.3 h") as caught:
        registry = hybridlock.AsyncLockRegistry(server.url, expire_after=30000)
    assert caught[0].filename == __file__, "the warning should point at the registry's caller"
    assert "did you mean 30 s?" in str(caught[0].message)
    assert "filterwarnings" in str(caught[0].message)  # how to silence it
    async with registry:
        assert registry.expire_after == 30000  # a warning, not a refusal: the lease is what was asked for
    with pytest.warns(hybridlock.LongLeaseWarning, match=r"1000 s is 16\.7 min"):
        await hybridlock.AsyncQuorumLockRegistry(quorum_urls, expire_after=1000).aclose()
    # Below the threshold, and a lease that long on purpose with the warning silenced: nothing said.
    await hybridlock.AsyncLockRegistry(server.url, expire_after=999).aclose()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=hybridlock.LongLeaseWarning)
        await hybridlock.AsyncLockRegistry(server.url, expire_after=3600).aclose()
