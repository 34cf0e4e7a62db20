"""Holds whose holder is gone (``hybridlock/_async/owners.py``), written once: here a task that finishes holding a
lock, in ``tests/_sync`` a thread that ends holding one.

Such a hold is no longer renewed: another owner gets the lock once its lease runs out, threads (tasks) of this
process waiting for it take it afresh then, a warning names the key and where it was taken (once), and
``statistics()`` and the owner description ``hybridlock inspect`` reads say so. Holders that are still there (a
long hold, a lease kept idle by ``retain_for``, a reader among others) are left alone. ``tests/test_owners.py`` has
what only one side has: thread idents reused, ``with lock.acquire(timeout=...)``, ``Condition``, fork.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from hybridlock._cli.inspection import inspect_locks
from hybridlock._cli.show import _describe
from hybridlock.errors import LockNotOwnedError

from ._compat import JOIN, sleep
from .helpers import BACKENDS, Backend, Kind, in_other, kinds, take_and_give_back

LEASE = 1.0  # seconds: renewed (and looked at) every third of it
# Another owner gets a gone holder's lock once its lease has run out: within about a lease and a renewal period of
# the holder's end. The rest is room for a loaded machine.
WITHIN = LEASE + LEASE / 3 + 2.5

# Where each kind is tried: every kind over the backends that have read-write locks and run in any suite, the plain
# lock over every backend. (Each param keeps its backend's marks.)
MAIN = [param for param in BACKENDS if param.values[0] in ("memory", "local", "redis")]
OTHERS = [param for param in BACKENDS if param.values[0] not in ("memory", "local", "redis")]

pytestmark = pytest.mark.timeout(60)


async def take_and_end(lock: Any) -> tuple[int, Any]:
    """Take ``lock`` in another task that then finishes without releasing it; the line it was taken at, and its
    fencing token then (None for kinds without one)."""

    async def take() -> tuple[int, Any]:
        line = sys._getframe().f_lineno + 1
        assert await lock.acquire(timeout=JOIN)
        return line, getattr(lock, "fencing_token", None)

    return await in_other(take)


async def eventually(predicate: Callable[[], Any], what: str, within: float = WITHIN) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {within} s waiting for {what}"
        await sleep(0.02)


def gone_warnings(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if "still holding" in record.getMessage() and f"{key!r}" in record.getMessage()
    ]


async def a_gone_holders_lock_goes_to_another_owner(
    backend: Backend, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        rival = kind.rival(backend.other_owner(registry), "gone")
        start = time.monotonic()
        line, _ = await take_and_end(kind.make(registry, "gone"))
        assert not await rival.acquire(blocking=False), "the lease should still run"
        assert await rival.acquire(timeout=WITHIN), "a hold whose holder is gone kept another owner out"
        took = time.monotonic() - start
        await rival.release()
        if backend.name != "local":
            # Not given back at once: the lease ran out (a registry without leases ends such a hold when it finds it).
            assert took >= LEASE * 0.9
    for key in kind.keys("gone"):
        (warning,) = gone_warnings(caplog, key)  # once, however many rounds looked
        assert f"test_dead_owners.py:{line}" in warning, warning
        assert registry.registry_key in warning


@kinds()
@pytest.mark.parametrize("backend", MAIN, indirect=True)
async def test_a_gone_holders_lock_goes_to_another_owner(
    backend: Backend, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    await a_gone_holders_lock_goes_to_another_owner(backend, kind, caplog)


@kinds("plain")
@pytest.mark.parametrize("backend", OTHERS, indirect=True)
async def test_a_gone_holders_lock_goes_to_another_owner_on_every_backend(
    backend: Backend, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    await a_gone_holders_lock_goes_to_another_owner(backend, kind, caplog)


@kinds()
@pytest.mark.parametrize("backend", MAIN, indirect=True)
async def test_waiters_here_take_a_gone_holders_lock_afresh(backend: Backend, kind: Kind) -> None:
    # Queued on the local lock (or the read-write lock's local state) behind the gone holder: they get it when its
    # lease runs out, as a new tenancy with a new fencing token, not a hand-off of the old one.
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        _, token = await take_and_end(kind.make(registry, "gone"))
        waiter = kind.rival(registry, "gone") if kind.name == "read" else kind.make(registry, "gone")
        assert await waiter.acquire(timeout=WITHIN), "a waiter here stayed behind a holder that is gone"
        if token is not None:
            assert waiter.fencing_token > token
        await waiter.release()
        assert await in_other(lambda: take_and_give_back(kind.make(registry, "gone"), timeout=0)), "left held"


@pytest.mark.parametrize("backend", [param for param in MAIN if param.values[0] == "redis"], indirect=True)
async def test_statistics_and_inspect_show_a_gone_holder(backend: Backend, server: Any) -> None:
    async with backend:
        registry = backend.registry(expire_after=3.0)  # looked at every second; ends 3 s after the grant
        lock = registry.obtain("described")
        line, _ = await take_and_end(lock)
        site = f"test_dead_owners.py:{line}"
        stats = await eventually(lambda: (s := lock.statistics()).abandoned and s, "the hold found abandoned", 2.5)
        assert stats.owner_name is not None
        assert stats.acquired_from.endswith(site)
        assert stats.holds_server_lease
        with pytest.raises(LockNotOwnedError):
            await lock.renew()  # by hand neither: it is left to run out

        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:

            def described() -> Any:
                (state,) = inspect_locks(client, registry.registry_key, [("described", "lock")])
                return state["holder"] and state["holder"]["abandoned"] and state

            state = await eventually(described, "the description to say so", 2.5)
        finally:
            client.close()
        assert state["holder"]["owner"] == registry.client_id
        assert state["holder"]["thread"] == stats.owner_name
        assert state["holder"]["site"].endswith(site)
        text = _describe(state, time.time())
        assert "ABANDONED" in text
        assert site in text

        # Once its lease has run out the hold is gone here too.
        await eventually(lambda: not lock.statistics().holds_server_lease, "the hold to end", 3.0 + 2.5)
        assert lock.statistics().owner_thread is None


@kinds()
@pytest.mark.parametrize("backend", MAIN, indirect=True)
async def test_holders_still_there_are_left_alone(
    backend: Backend, kind: Kind, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        lock = kind.make(registry, "held")
        assert await lock.acquire(timeout=JOIN)
        await sleep(3 * LEASE)  # several looks (a registry without leases: every second)
        rival = kind.rival(backend.other_owner(registry), "held")
        assert not await in_other(lambda: rival.acquire(blocking=False))
        assert not getattr(lock, "lost", False)
        await lock.release()
    assert not [record for record in caplog.records if "still holding" in record.getMessage()]


@pytest.mark.parametrize("backend", MAIN, indirect=True)
async def test_a_lease_kept_idle_by_retain_for_is_not_a_gone_holder(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    # Its last holder released it and finished: nobody holds it, it waits for the next task here.
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    if backend.name == "local":
        pytest.skip("LocalLockRegistry takes no retain_for")
    async with backend:
        registry = backend.registry(expire_after=LEASE, retain_for=10 * LEASE)
        lock = registry.obtain("kept")

        async def take_and_release() -> Any:
            async with lock:
                return lock.fencing_token

        token = await in_other(take_and_release)
        await sleep(3 * LEASE)
        stats = lock.statistics()
        assert stats.retained
        assert not stats.abandoned
        assert not stats.lost
        async with lock:
            assert lock.fencing_token == token  # the same tenancy, renewed all along
    assert not [record for record in caplog.records if "still holding" in record.getMessage()]


@pytest.mark.parametrize("backend", MAIN, indirect=True)
async def test_a_gone_reader_among_readers_is_dropped_and_the_read_hold_goes_on(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hybridlock.lock")
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        read = registry.obtain_read_write("shared").read_lock()
        writer = backend.other_owner(registry).obtain_read_write("shared").write_lock()
        assert await read.acquire(timeout=JOIN)  # a reader that stays
        line, _ = await take_and_end(read)  # and one that does not
        (warning,) = await eventually(lambda: gone_warnings(caplog, "shared"), "the gone reader to be reported")
        assert "the other readers here keep it" in warning
        assert f"test_dead_owners.py:{line}" in warning
        await sleep(2 * LEASE)  # renewed all along for the reader that stays
        assert not await in_other(lambda: writer.acquire(blocking=False))
        assert not read.lost
        await read.release()  # the last reader here: given back at once, not left to run out
        start = time.monotonic()
        assert await in_other(lambda: take_and_give_back(writer, timeout=WITHIN))
        assert time.monotonic() - start < LEASE
