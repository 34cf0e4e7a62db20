"""Semaphores (``registry.obtain_semaphore``), written once: here tasks, in ``tests/_sync`` threads.

Over every backend that has them (memory, local, one server, Sentinel with confirmation, Cluster); a quorum
refuses them. ``tests/test_semaphore_processes.py`` has what needs processes: the overlap counter over processes x
threads and a SIGKILLed holder.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from hybridlock._cli.common import open_server
from hybridlock._cli.inspection import read_locks
from hybridlock.backends import AsyncMemoryBackend
from hybridlock.errors import (
    InvalidArgumentError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
)

from ._compat import JOIN, run_concurrently, sleep, spawn
from .helpers import BACKENDS, Backend, in_other, take_and_give_back

LEASE = 1.0  # seconds: renewed every third of it
# A permit whose holder is gone comes back once its lease has run out: within a lease and a renewal period. The rest
# is room for a loaded machine.
WITHIN = LEASE + LEASE / 3 + 2.5

HAVE_SEMAPHORES = [param for param in BACKENDS if param.values[0] != "quorum"]
QUORUM = [param for param in BACKENDS if param.values[0] == "quorum"]
SHARED = [param for param in HAVE_SEMAPHORES if param.values[0] != "local"]  # (two owners of one permit)
ON_ONE_SERVER_AND_A_CLUSTER = [param for param in BACKENDS if param.values[0] in ("redis", "cluster")]

pytestmark = pytest.mark.timeout(90)


async def delete_permit(registry: Any, semaphore: Any, slot: int) -> None:
    """Delete permit slot ``slot`` behind its holder's back (what an operator's DEL or an eviction does)."""
    names = semaphore._names.permit(slot)
    backend = registry.backend
    if isinstance(backend, AsyncMemoryBackend):
        backend.delete(names)
    else:
        await backend.client.delete(names.lock)


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_never_more_than_n_inside(backend: Backend) -> None:
    # Tasks of two owners (one, where the backend has one store per registry) take and give back permits of one
    # semaphore; none ever sees more than N inside.
    permits, workers, rounds = 3, 8, 6
    async with backend:
        owners = backend.owners()
        inside = 0
        most = 0

        async def worker(index: int) -> None:
            nonlocal inside, most
            semaphore = owners[index % len(owners)].obtain_semaphore("pool", permits)
            for _ in range(rounds):
                assert await semaphore.acquire(timeout=JOIN)
                inside += 1
                most = max(most, inside)
                assert inside <= permits, f"{inside} holders inside a semaphore of {permits}"
                await sleep(0.005)
                inside -= 1
                await semaphore.release()

        await run_concurrently([lambda i=i: worker(i) for i in range(workers)], timeout=60)
        assert most <= permits
        assert most >= 2, "the permits were never held together: the test did not test anything"


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_acquire_release_and_timeouts(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        other = backend.other_owner(registry)
        semaphore = registry.obtain_semaphore("calls", 2)
        assert registry.obtain_semaphore("calls", 2) is semaphore
        assert await semaphore.acquire() is True
        first = semaphore.fencing_token
        assert await semaphore.acquire(blocking=False) is True  # a task may hold several
        assert semaphore.fencing_token > first
        assert semaphore.hold_count == 2
        assert semaphore.held_here == 2
        rival = other.obtain_semaphore("calls", 2)

        async def refused() -> tuple[bool, bool, bool, float]:
            start = time.monotonic()
            timed = await rival.acquire(timeout=0.3)
            waited = time.monotonic() - start
            return await rival.acquire(blocking=False), await rival.try_acquire(), timed, waited

        now, java, timed, waited = await in_other(refused)
        assert (now, java, timed) == (False, False, False)
        assert 0.25 <= waited < 5.0

        async def timed_hold() -> str:
            hold = rival(timeout=0.2)
            with pytest.raises(LockTimeoutError) as caught:
                await hold.__aenter__()  # (the with-block's entry, which must refuse: the block would not run)
            return str(caught.value)

        message = await in_other(timed_hold)
        assert "semaphore 'calls'" in message
        assert "not run" in message

        await semaphore.release()
        await semaphore.release()
        with pytest.raises(LockNotOwnedError):
            await semaphore.release()  # released more often than acquired
        assert semaphore.hold_count == 0
        assert semaphore.fencing_token is None
        assert semaphore.valid_until is None

        async def take_both() -> bool:
            async with rival(timeout=JOIN):
                got = await rival.try_acquire(1.0)
                if got:
                    await rival.release()
                return got

        assert await in_other(take_both)


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_a_release_wakes_a_waiter(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        semaphore = registry.obtain_semaphore("wake", 1)
        rival = backend.other_owner(registry).obtain_semaphore("wake", 1)
        assert await semaphore.acquire()

        async def wait() -> float:
            assert await rival.acquire(timeout=JOIN)
            took = time.monotonic()
            await rival.release()
            return took

        waiter = spawn(wait)
        await sleep(0.3)
        assert not waiter.done()
        released = time.monotonic()
        await semaphore.release()
        assert await waiter.join() - released < 2.0


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_waiters_are_served_in_arrival_order(backend: Backend) -> None:
    # One permit: the waiters get it in the order they queued, and a newcomer that does not wait (its attempt comes
    # right after the release, before any waiter has woken) finds it owed to the queue.
    names = ["first", "second", "third", "fourth"]
    async with backend:
        owners = [backend.registry() for _ in range(6)] if backend.shared else [backend.registry()] * 6
        holder, newcomer, *queued = (owner.obtain_semaphore("fair", 1) for owner in owners)
        assert await holder.acquire()
        order: list[str] = []

        async def wait(semaphore: Any, name: str) -> None:
            assert await semaphore.acquire(timeout=JOIN)
            order.append(name)
            await sleep(0.02)
            await semaphore.release()

        waiters = []
        for semaphore, name in zip(queued, names, strict=True):
            waiters.append(spawn(lambda semaphore=semaphore, name=name: wait(semaphore, name)))
            await sleep(0.2)  # (queued before the next one arrives)
        await holder.release()
        barged = await take_and_give_back(newcomer, timeout=0)
        for waiter in waiters:
            await waiter.join()
        assert not barged, "a newcomer took the permit owed to the waiters"
        assert order == names


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_a_waiter_that_gives_up_leaves_the_queue(backend: Backend) -> None:
    # Out of time, the waiter leaves its place at once: the permit is not kept owed to it until the place lapses.
    async with backend:
        owners = [backend.registry() for _ in range(3)] if backend.shared else [backend.registry()] * 3
        holder, waiter, newcomer = (owner.obtain_semaphore("gave-up", 1) for owner in owners)
        assert await holder.acquire()
        assert not await in_other(lambda: waiter.acquire(timeout=0.3))
        await holder.release()
        assert await take_and_give_back(newcomer, timeout=0), "the permit stayed owed to a waiter that gave up"


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_a_permit_deleted_under_its_holder_is_reported_lost(backend: Backend) -> None:
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        semaphore = registry.obtain_semaphore("deleted", 1)
        told: list[Any] = []
        semaphore.on_lost(told.append)
        assert await semaphore.acquire()
        await delete_permit(registry, semaphore, 0)
        deadline = time.monotonic() + WITHIN
        while not (semaphore.lost and told) and time.monotonic() < deadline:  # (the loss is marked, then told)
            await sleep(0.02)
        if backend.name == "local":
            # A registry without leases renews nothing: the loss is found at the release.
            assert not semaphore.lost
        else:
            assert semaphore.lost, "a permit deleted under its holder was never reported lost"
            assert told == [semaphore]
            assert semaphore.valid_until is not None
            assert semaphore.valid_until <= time.monotonic()
        if backend.shared:
            # Another owner may take the permit meanwhile: it was free in the server.
            rival = backend.other_owner(registry).obtain_semaphore("deleted", 1)
            assert await in_other(lambda: take_and_give_back(rival, timeout=0))
        with pytest.raises(LockLostError):
            await semaphore.release()
        assert semaphore.hold_count == 0


@pytest.mark.parametrize("backend", SHARED, indirect=True)
async def test_a_late_release_never_ends_the_next_grant_of_its_slot_to_another_task(backend: Backend) -> None:
    # A permit whose lease ended is released; its release leaves the holder's table before its request reaches the
    # server, and in that gap another task of the same registry (the same client_id) is granted the same slot. The
    # release must not end that grant: it acts on its own tenancy only (../shared/repros/x1). Before, it compared the
    # client_id alone and deleted the other task's permit, and another owner then took the one permit too.
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        semaphore = registry.obtain_semaphore("regranted", 1)
        rival = backend.other_owner(registry).obtain_semaphore("regranted", 1)
        store = registry.backend
        real_release = store.release_permit
        state = {"second holds": False, "checked": False}

        async def second_holder() -> bool:
            assert await semaphore.acquire(blocking=False), "the slot the first lease left was not granted"
            state["second holds"] = True
            deadline = time.monotonic() + JOIN
            while not state["checked"] and time.monotonic() < deadline:
                await sleep(0.01)
            await semaphore.release()  # (LockLostError: its permit was ended by the other task's release)
            return True

        second: list[Any] = []

        async def release_after_a_grant_in_the_gap(*args: Any) -> bool:
            store.release_permit = real_release
            second.append(spawn(second_holder))
            deadline = time.monotonic() + JOIN
            while not state["second holds"] and time.monotonic() < deadline:
                await sleep(0.01)
            return await real_release(*args)

        assert await semaphore.acquire()
        await delete_permit(registry, semaphore, 0)  # (its lease ends, as at its expiry)
        store.release_permit = release_after_a_grant_in_the_gap
        with pytest.raises(LockLostError):
            await semaphore.release()
        assert second
        assert state["second holds"]
        try:
            assert not await in_other(lambda: take_and_give_back(rival, timeout=0)), (
                "another owner took the one permit while a task of the first owner held it"
            )
        finally:
            state["checked"] = True
        assert await second[0].join()


@pytest.mark.parametrize("backend", SHARED, indirect=True)
async def test_release_transfer_and_renewal_act_on_their_own_tenancy_only(backend: Backend) -> None:
    # The backend's side of the test above, for each call that ends or extends a permit: a slot granted again to
    # another acquire of the same owner is that acquire's (a tenancy is its acquire's tag, not the client_id).
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        semaphore = registry.obtain_semaphore("tenancies", 1)
        store, names, me = registry.backend, semaphore._names, registry.client_id
        first, second, waiter = f"{me}|t-first", f"{me}|t-second", f"{me}|t-waiter"
        granted = await store.try_acquire_permit(names, me, 10_000, 1, [], None, first)
        assert granted.acquired
        assert granted.slot == 0
        await delete_permit(registry, semaphore, 0)  # (the first tenancy's lease ends)
        again = await store.try_acquire_permit(names, me, 10_000, 1, [], None, second)
        assert again.acquired
        assert again.slot == 0
        assert await store.renew([names.permit(0, first)], me, 10_000) == [False]
        assert await store.release_permit(names, 0, first) is False
        transferred = await store.transfer_permit(names, 0, first, 10_000, 1, [], [(waiter, waiter)])
        assert transferred[0] is False
        assert not transferred[1].acquired
        assert await store.give_back_attempt(names, me, first, 10_000) is False
        # The second tenancy still holds the one permit, and is renewed and released as its own.
        rival = backend.other_owner(registry).obtain_semaphore("tenancies", 1)
        assert not await in_other(lambda: take_and_give_back(rival, timeout=0))
        assert await store.renew([names.permit(0, second)], me, 10_000) == [True]
        assert await store.release_permit(names, 0, second) is True
        assert await in_other(lambda: take_and_give_back(rival, timeout=0))


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_a_gone_holders_permit_comes_back(backend: Backend) -> None:
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        semaphore = registry.obtain_semaphore("gone", 1)
        rival = backend.other_owner(registry).obtain_semaphore("gone", 1)
        start = time.monotonic()
        assert await in_other(lambda: semaphore.acquire(timeout=JOIN))  # a task that ends holding its permit
        assert not await rival.acquire(blocking=False)
        assert await rival.acquire(timeout=WITHIN), "a permit whose holder is gone never came back"
        if backend.name != "local":
            # Not given back at once: its lease ran out (counted from before the holder's acquire was sent).
            assert time.monotonic() - start >= LEASE * 0.9
        await rival.release()
        assert semaphore.held_here == 0


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES, indirect=True)
async def test_set_permits_drains_and_never_revokes(backend: Backend) -> None:
    async with backend:
        registry = backend.registry(expire_after=LEASE)
        semaphore = registry.obtain_semaphore("resize", 3)
        rival = backend.other_owner(registry).obtain_semaphore("resize", 3)
        for _ in range(3):
            assert await semaphore.acquire(blocking=False)
        assert await semaphore.set_permits(1) == 3
        assert semaphore.permits == 1
        await sleep(LEASE * 1.5)  # renewals go on: none of the three is revoked
        assert not semaphore.lost
        assert not await in_other(lambda: rival.acquire(blocking=False))
        await semaphore.release()
        await semaphore.release()
        assert not await in_other(lambda: rival.acquire(blocking=False)), "admitted while the old holders drain"

        async def wait() -> bool:
            got = await rival.acquire(timeout=JOIN)
            if got:
                await rival.release()
            return got

        waiter = spawn(wait)
        await sleep(0.2)
        await semaphore.set_permits(2)  # raising the limit lets the waiter in while the last old permit is held
        assert await waiter.join()
        await semaphore.release()
        assert semaphore.held_here == 0


@pytest.mark.parametrize("backend", ON_ONE_SERVER_AND_A_CLUSTER, indirect=True)
async def test_the_limit_set_outlives_fence_retention_while_a_permit_is_renewed(backend: Backend) -> None:
    # The config (limit, span) is kept fence_retention after the last acquire attempt, set_permits or renewal of a
    # permit: a semaphore whose permits are held and renewed for longer than that, with no attempt meanwhile, still
    # has the limit set_permits gave it. (It used to lapse: the next attempt stored its own permits, over the limit
    # set, and inspect showed no limit.) The next grant's token is above the held permit's.
    async with backend:
        retention = 0.9  # (the least fence_retention is the lease: renewed every 0.3 s)
        options = {"expire_after": retention, "fence_retention": retention}
        registry = backend.registry(**options)
        semaphore = registry.obtain_semaphore("kept", 3)
        rival = backend.registry(**options).obtain_semaphore("kept", 3)
        assert await semaphore.acquire(blocking=False)
        held_token = semaphore.fencing_token
        assert held_token is not None
        assert await semaphore.set_permits(1) == 3
        await sleep(retention * 1.6)  # renewed meanwhile; no attempt, no set_permits
        assert not semaphore.lost
        server = open_server(backend.url, 2, 3)  # (what `hybridlock inspect --semaphore kept` reads)
        try:
            (shown,) = read_locks(server.client, "hybridlock", [("kept", "semaphore")])
        finally:
            server.close()
        assert (shown["permits"], shown["held"]) == (1, 1), f"the limit set was forgotten: {shown}"

        async def take() -> int | None:
            if not await rival.acquire(blocking=False):
                return None
            token = rival.fencing_token
            await rival.release()
            return token

        assert await in_other(take) is None, "a second holder was let in past the limit set (1)"
        await semaphore.release()
        next_token = await in_other(take)
        assert next_token is not None
        assert next_token > held_token


@pytest.mark.parametrize("backend", [param for param in HAVE_SEMAPHORES if param.values[0] == "redis"], indirect=True)
async def test_keys_of_another_type_or_missing_are_no_script_error(backend: Backend) -> None:
    # Every key a semaphore's scripts touch may be evicted, deleted or overwritten by something else: they read such
    # a key as missing (the limit is stored again from the caller's permits), never fail on it.
    async with backend:
        registry = backend.registry()
        semaphore = registry.obtain_semaphore("odd", 2)
        names = semaphore._names
        client = registry.backend.client
        await client.set(names.config, "not a hash")
        await client.set(names.queue, "not a zset")
        await client.lpush(names.queue_until, "not a zset")
        await client.hset(names.slot(0), "not", "a string")
        assert await semaphore.acquire(blocking=False)
        assert await semaphore.acquire(blocking=False)
        assert not await in_other(lambda: take_and_give_back(semaphore, timeout=0.1))  # the stored limit is 2
        await client.delete(names.config, names.queue_until)
        await semaphore.release()  # (a release that finds the config and the queue gone wakes everyone)
        await client.set(names.config, "not a hash")
        assert await semaphore.set_permits(3) == 0
        assert await in_other(lambda: take_and_give_back(semaphore, timeout=0))
        await semaphore.release()
        assert semaphore.held_here == 0


@pytest.mark.parametrize("backend", HAVE_SEMAPHORES[:1], indirect=True)
async def test_bad_arguments(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        for permits in (0, -1, True, 1.5, "2", None, 1025):
            with pytest.raises(InvalidArgumentError):
                registry.obtain_semaphore("bad", permits)
        with pytest.raises(InvalidArgumentError):
            registry.obtain_semaphore("", 1)
        semaphore = registry.obtain_semaphore("bad", 2)
        with pytest.raises(InvalidArgumentError, match="set_permits"):
            registry.obtain_semaphore("bad", 3)
        with pytest.raises(InvalidArgumentError):
            await semaphore.acquire(blocking=False, timeout=1)
        with pytest.raises(InvalidArgumentError):
            await semaphore.acquire(timeout=-2)
        with pytest.raises(InvalidArgumentError):
            await semaphore.try_acquire("1")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError):
            await semaphore.try_acquire(float("nan"))
        with pytest.raises(InvalidArgumentError):
            semaphore(timeout=-3)
        with pytest.raises(InvalidArgumentError):
            await semaphore.set_permits(0)
        with pytest.raises(InvalidArgumentError):
            semaphore.on_lost("not callable")  # type: ignore[arg-type]
        assert semaphore.held_here == 0


@pytest.mark.parametrize("backend", QUORUM, indirect=True)
async def test_a_quorum_refuses_semaphores(backend: Backend) -> None:
    async with backend:
        registry = backend.registry()
        with pytest.raises(InvalidArgumentError, match="quorum"):
            registry.obtain_semaphore("refused", 2)
