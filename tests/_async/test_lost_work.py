"""Work that stops when the lease is lost (``lock.until_lost()``, ``lock.ensure_held()``), on real servers, for every
lock kind that holds a lease.

Written for asyncio (the work is a task, cancelled by the scope); ``tests/_sync/test_lost_work.py`` is generated from
it (the work is a thread, which cannot be cancelled: it waits on ``scope.lost_event``, and the scope raises at its
exit). What only asyncio has (a cancellation from outside, nested scopes) is in ``tests/test_async_lost_work.py``.

* The key deleted under the holder: the renewer finds it gone at its next round, and the scope ends the work
  within about a renewal period, with ``LockLostError`` naming the key.
* The holder cut off from its server (a black-hole proxy, a socket timeout longer than the lease): the scope ends
  the work as ``valid_until`` passes, not when the renewal round in flight gives up.
* ``ensure_held()`` passes while the lease is held and valid, and raises once it is lost or its ``valid_until`` has
  passed; both calls refuse a lock this task does not hold.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._async._compat import IS_ASYNC
from hybridlock.testing import EmbeddedServer

from .._proxy import FaultProxy
from ._compat import JOIN, sleep
from .helpers import Backend, Kind, in_other, kinds

# How late after the loss is found (or after valid_until) the work may stop, on a machine shared with other test runs.
SLACK = 0.5
LEASE = 0.9  # seconds: a renewal round every 0.3 s
# Far longer than the lease: a renewal round in flight to a server that went silent blocks this long.
SLOW = "?socket_timeout=4&socket_connect_timeout=4"


def _parts(lock: Any) -> list[Any]:
    """The leases of a lock: its own, or one per key of a multi-key lock."""
    return lock.locks if isinstance(lock, hybridlock.AsyncMultiLock) else [lock]


async def _wait_for_loss(scope: Any, reached: list[str]) -> None:
    """The scope's work: wait for the loss (asyncio: cancelled there; threads: the event is set, the wait returns)."""
    told = await scope.lost_event.wait(JOIN)
    reached.append(f"told={told}")


async def _enter(lock: Any) -> None:
    """Enter and leave ``lock.until_lost()``; the body must not run."""
    async with lock.until_lost():
        pytest.fail("the body ran")


@pytest.mark.server
@kinds()
async def test_a_key_deleted_under_the_holder_stops_the_work_with_lock_lost_error(
    server: EmbeddedServer, redis_client: redis.Redis, kind: Kind
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = kind.make(registry, "deleted")
        assert await lock.acquire(timeout=JOIN)
        lock.ensure_held()  # held and valid: passes
        reached: list[str] = []
        victim = _parts(lock)[-1]
        scope = lock.until_lost()
        deleted_at: list[float] = []

        async def work() -> None:
            async with scope:
                assert not scope.lost
                redis_client.delete(victim._names.lock)
                deleted_at.append(time.monotonic())
                await _wait_for_loss(scope, reached)

        with pytest.raises(hybridlock.LockLostError) as caught:
            await work()
        stopped_after = time.monotonic() - deleted_at[0]
        # Found at the next renewal round (a third of the lease), then the work stops at once.
        assert stopped_after < LEASE / 3 + SLACK, f"the work stopped {stopped_after:.2f} s after the key was deleted"
        assert reached == ([] if IS_ASYNC else ["told=True"])  # asyncio: cancelled inside the wait
        assert scope.lost
        assert caught.value.key == victim.key
        assert lock.lost
        with pytest.raises(hybridlock.LockLostError):
            lock.ensure_held()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()
        assert not lock.is_held_by_current_task()


@pytest.mark.server
@kinds()
async def test_a_partitioned_holder_stops_its_work_as_valid_until_passes(
    own_server: EmbeddedServer, kind: Kind
) -> None:
    """A black-hole proxy between the holder and its server, and a socket timeout longer than the lease: the renewal
    round in flight is stuck, and the work stops as ``valid_until`` passes all the same (the renewer's deadline
    watch), well before the round gives up."""
    proxy = FaultProxy(own_server.port)
    try:
        async with hybridlock.AsyncLockRegistry(proxy.url + SLOW, expire_after=1.2) as registry:
            lock = kind.make(registry, "cut")
            assert await lock.acquire(timeout=JOIN)
            reached: list[str] = []
            last_valid: list[float] = []

            cut_at: list[float] = []

            async def work() -> None:
                async with lock.until_lost() as scope:
                    await sleep(0.45)  # a renewal round or so: the renewer is under way
                    proxy.partition()
                    cut_at.append(time.monotonic())
                    for part in _parts(lock):
                        until = part.valid_until
                        assert until is not None
                        last_valid.append(until)
                    await _wait_for_loss(scope, reached)

            with pytest.raises(hybridlock.LockLostError):
                await work()
            stopped_at = time.monotonic()
            assert reached == ([] if IS_ASYNC else ["told=True"])
            # Not before the earliest lease could have ended (renewals only move valid_until later), and soon after
            # the latest valid_until seen before the cut: not at the socket timeout, 4 s on.
            assert stopped_at >= min(last_valid)
            took = stopped_at - cut_at[0]
            assert took < 1.2 + SLACK, f"the work stopped {took:.2f} s after the cut"
            assert lock.lost
            with pytest.raises(hybridlock.LockLostError):
                lock.ensure_held()
            proxy.heal()
            with pytest.raises(hybridlock.LockLostError):
                await lock.release()
    finally:
        proxy.close()


@pytest.mark.server
@kinds()
async def test_a_scope_whose_lease_is_not_lost_ends_as_its_body_does(server: EmbeddedServer, kind: Kind) -> None:
    """Across several renewals the work runs to its end; the scope adds nothing to the body's outcome, and a loss
    after it has ended concerns it no more."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = kind.make(registry, "kept")
        assert await lock.acquire(timeout=JOIN)
        async with lock.until_lost() as scope:
            for _ in range(5):
                await sleep(0.2)  # a second: three renewal rounds
                lock.ensure_held()
        assert not scope.lost

        async def failing_work() -> None:
            async with lock.until_lost():
                raise ValueError("the body's own")

        with pytest.raises(ValueError, match="the body's own"):
            await failing_work()
        await lock.release()
        with pytest.raises(hybridlock.LockNotOwnedError):
            lock.ensure_held()


@pytest.mark.server
@kinds()
async def test_both_calls_refuse_a_lock_this_task_does_not_hold(server: EmbeddedServer, kind: Kind) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = kind.make(registry, "not-held")
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"until_lost\(\) needs the .* held by this task"):
            await _enter(lock)
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"ensure_held\(\) needs"):
            lock.ensure_held()
        assert await lock.acquire(timeout=JOIN)
        try:

            async def elsewhere() -> type[BaseException] | None:
                try:
                    async with lock.until_lost():
                        pass
                except hybridlock.LockNotOwnedError as exc:
                    return type(exc)
                return None

            # Held by this task, not by another (a read lock is held by each reader for itself).
            assert await in_other(elsewhere) is hybridlock.LockNotOwnedError
        finally:
            await lock.release()


@pytest.mark.server
@kinds()
async def test_a_scope_entered_on_a_lost_lease_raises_at_once(
    server: EmbeddedServer, redis_client: redis.Redis, kind: Kind
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = kind.make(registry, "lost-before")
        lost: list[Any] = []
        for part in _parts(lock):
            part.on_lost(lost.append)
        assert await lock.acquire(timeout=JOIN)
        redis_client.delete(_parts(lock)[0]._names.lock)
        deadline = time.monotonic() + LEASE + SLACK
        while not lost:
            assert time.monotonic() < deadline, "the renewer never found the key gone"
            await sleep(0.01)
        with pytest.raises(hybridlock.LockLostError):
            await _enter(lock)
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


@pytest.mark.server
async def test_ensure_held_raises_once_valid_until_has_passed_even_unreported(server: EmbeddedServer) -> None:
    """Without renewal (``auto_renew=False``) nothing reports the lease's end: ``ensure_held()`` reads the clock."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=0.5, auto_renew=False) as registry:
        lock = registry.obtain("unrenewed")
        assert await lock.acquire(timeout=JOIN)
        lock.ensure_held()
        until = lock.valid_until
        assert until is not None
        await sleep(max(0.0, until - time.monotonic()) + 0.01)
        with pytest.raises(hybridlock.LockLostError, match="valid_until"):
            lock.ensure_held()
        with pytest.raises(hybridlock.LockLostError):
            await _enter(lock)
        try:
            await lock.release()
        except hybridlock.LockLostError:
            pass  # (its lease may have run out in the server too)


@pytest.mark.server
async def test_the_loss_signal_can_be_waited_on_elsewhere(server: EmbeddedServer, redis_client: redis.Redis) -> None:
    """Another task (thread) can wait on the scope's ``lost_event`` for the holder's loss."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        lock = registry.obtain("watched")
        assert await lock.acquire(timeout=JOIN)
        scope = lock.until_lost()

        async def watcher() -> bool:
            return bool(await scope.lost_event.wait(JOIN))

        async def work() -> None:
            async with scope:
                redis_client.delete(lock._names.lock)
                assert await in_other(watcher) is True
                if IS_ASYNC:
                    await sleep(JOIN)  # cancelled here at once (threads: the exit raises)

        with pytest.raises(hybridlock.LockLostError):
            await work()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


@kinds()
async def test_on_every_backend_a_loss_the_renewer_reports_ends_the_scope(backend: Backend, kind: Kind) -> None:
    """Over every backend (a ``LocalLockRegistry``, whose leases never end, too): the calls pass while the lock is
    held, and a loss marked as the renewer marks it (``_claim_loss``) ends the scope with ``LockLostError``."""
    async with backend:
        registry = backend.registry(expire_after=30)
        lock = kind.make(registry, "everywhere")
        assert await lock.acquire(timeout=JOIN)
        lock.ensure_held()
        async with lock.until_lost() as scope:
            lock.ensure_held()
        assert not scope.lost
        reached: list[str] = []
        scope = lock.until_lost()

        async def work() -> None:
            async with scope:
                part = _parts(lock)[0]
                assert part._claim_loss(part._tenancy)
                await _wait_for_loss(scope, reached)

        with pytest.raises(hybridlock.LockLostError):
            await work()
        assert reached == ["told=True"]  # (marked by this very task: the event was set before its wait)
        with pytest.raises(hybridlock.LockLostError):
            lock.ensure_held()
        with pytest.raises(hybridlock.LockLostError):
            await lock.release()


# -- semaphore permits --------------------------------------------------------------------------------------------


@pytest.mark.server
async def test_a_permit_deleted_under_its_holder_stops_the_work(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    """``semaphore.until_lost()`` watches every permit the task holds: one deleted under it ends the work."""
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        semaphore = registry.obtain_semaphore("permits", 3)
        assert await semaphore.acquire(timeout=JOIN)
        assert await semaphore.acquire(timeout=JOIN)  # two permits: the scope watches both
        semaphore.ensure_held()
        victim = semaphore._watched_leases()[0]  # the older permit (oldest first)
        reached: list[str] = []
        deleted_at: list[float] = []
        scope = semaphore.until_lost()

        async def work() -> None:
            async with scope:
                redis_client.delete(victim._names.lock)
                deleted_at.append(time.monotonic())
                await _wait_for_loss(scope, reached)

        with pytest.raises(hybridlock.LockLostError, match="semaphore permit") as caught:
            await work()
        stopped_after = time.monotonic() - deleted_at[0]
        assert stopped_after < LEASE / 3 + SLACK, f"the work stopped {stopped_after:.2f} s after the permit was deleted"
        assert reached == ([] if IS_ASYNC else ["told=True"])
        assert caught.value.key == victim.key
        assert semaphore.lost
        with pytest.raises(hybridlock.LockLostError, match="semaphore permit"):
            semaphore.ensure_held()
        await semaphore.release()  # the newer permit: still good
        with pytest.raises(hybridlock.LockLostError):
            await semaphore.release()  # the lost one
        with pytest.raises(hybridlock.LockNotOwnedError, match="holds none"):
            semaphore.ensure_held()


@pytest.mark.server
async def test_a_permit_scope_refuses_a_task_without_a_permit_and_passes_while_held(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        semaphore = registry.obtain_semaphore("scoped", 2)
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"until_lost\(\) needs a permit") as caught:
            await _enter(semaphore)
        assert caught.value.key == semaphore.key
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"ensure_held\(\) needs a permit"):
            semaphore.ensure_held()
        assert await semaphore.acquire(timeout=JOIN)
        try:

            async def elsewhere() -> type[BaseException] | None:
                try:
                    semaphore.ensure_held()
                except hybridlock.LockNotOwnedError as exc:
                    return type(exc)
                return None

            # This task's permit, not another's.
            assert await in_other(elsewhere) is hybridlock.LockNotOwnedError
            async with semaphore.until_lost() as scope:
                for _ in range(4):
                    await sleep(0.2)  # across renewals
                    semaphore.ensure_held()
            assert not scope.lost
        finally:
            await semaphore.release()


# -- leadership ---------------------------------------------------------------------------------------------------


async def _leading(election: Any) -> None:
    await election.start()
    deadline = time.monotonic() + JOIN
    while not election.is_leader:
        assert time.monotonic() < deadline, "never elected"
        await sleep(0.005)


@pytest.mark.server
async def test_a_leaders_key_deleted_stops_the_work_of_its_term(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        election = registry.leader_election("lost-term")
        try:
            await _leading(election)
            election.ensure_held()
            epoch = election.epoch
            assert epoch is not None
            reached: list[str] = []
            deleted_at: list[float] = []
            scope = election.until_lost()

            async def work() -> None:
                async with scope:
                    redis_client.delete(election._lock._names.lock)
                    deleted_at.append(time.monotonic())
                    await _wait_for_loss(scope, reached)

            with pytest.raises(hybridlock.LockLostError, match="found lost") as caught:
                await work()
            stopped_after = time.monotonic() - deleted_at[0]
            assert stopped_after < LEASE / 3 + SLACK, (
                f"the work stopped {stopped_after:.2f} s after the key was deleted"
            )
            assert reached == ([] if IS_ASYNC else ["told=True"])
            assert caught.value.key == election.key
            # The term is over: lost (the worker may not have stepped down yet), not leading any more, or leading a
            # new term (the only candidate, its key gone, is elected again at once) with a greater epoch. (The
            # term's own epoch: the worker sets it before the term, and ``epoch`` only once it leads.)
            try:
                election.ensure_held()
            except (hybridlock.LockLostError, hybridlock.LockNotOwnedError):
                pass
            else:
                now_epoch = election._epoch
                assert now_epoch is not None
                assert now_epoch > epoch, f"ensure_held() passed in the term that was lost (epoch {epoch})"
        finally:
            await election.stop()


@pytest.mark.server
async def test_a_leader_that_yields_stops_the_work_of_its_term_before_on_revoked(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    scopes: list[Any] = []
    told_before_revoked: list[bool] = []

    async def on_revoked() -> None:
        told_before_revoked.append(scopes[0].lost)

    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        election = registry.leader_election("yielding", on_revoked=on_revoked)
        try:
            await _leading(election)
            scope = election.until_lost()
            scopes.append(scope)
            reached: list[str] = []

            async def work() -> None:
                async with scope:
                    # From a task (thread) other than the worker: returns once the lock is released.
                    await election.yield_leadership(pause=JOIN)
                    reached.append("yielded")

            with pytest.raises(hybridlock.LockLostError, match="the leader yielded") as caught:
                await work()
            assert reached == ([] if IS_ASYNC else ["yielded"])  # asyncio: cancelled in the wait
            assert told_before_revoked == [True]
            assert caught.value.key == election.key
            assert scope.lost
            with pytest.raises(hybridlock.LockNotOwnedError, match="does not"):
                election.ensure_held()
        finally:
            await election.stop()


@pytest.mark.server
async def test_a_partitioned_leader_stops_the_work_of_its_term_before_its_valid_until(
    own_server: EmbeddedServer,
) -> None:
    """Cut off from its server (its renewals unanswered), the leader steps down by its own clock: the work of its
    term stops then, before the lease's ``valid_until``, so before any successor can be elected."""
    proxy = FaultProxy(own_server.port)
    try:
        async with hybridlock.AsyncLockRegistry(proxy.url + SLOW, expire_after=1.2) as registry:
            election = registry.leader_election("cut-term")
            try:
                await _leading(election)
                last_valid: list[float] = []
                reached: list[str] = []

                async def work() -> None:
                    async with election.until_lost() as scope:
                        await sleep(0.45)  # a renewal round or so
                        proxy.partition()
                        # valid_until as the leader knows it until the loss: a renewal answered just before the cut
                        # may still move it later.
                        while not scope.lost:
                            until = election.valid_until
                            if until is not None:
                                last_valid.append(until)
                            await sleep(0.005)
                        reached.append("told")

                with pytest.raises(hybridlock.LockLostError, match="not renewed in time"):
                    await work()
                stopped_at = time.monotonic()
                if not IS_ASYNC:
                    assert reached == ["told"]  # (asyncio: cancelled in the wait, or it saw the loss just before)
                assert last_valid
                # The work stopped before the lease could have ended (the latest valid_until the leader had).
                assert stopped_at < max(last_valid), f"stopped {stopped_at - max(last_valid):.3f} s past valid_until"
            finally:
                proxy.heal()
                await election.stop()
    finally:
        proxy.close()


@pytest.mark.server
async def test_a_candidate_that_does_not_lead_is_refused_and_a_leader_passes(
    server: EmbeddedServer, redis_client: redis.Redis
) -> None:
    async with hybridlock.AsyncLockRegistry(server.url, expire_after=LEASE) as registry:
        election = registry.leader_election("refusing")
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"until_lost\(\) needs this candidate to lead") as err:
            await _enter(election)
        assert err.value.key == election.key
        with pytest.raises(hybridlock.LockNotOwnedError, match=r"ensure_held\(\) needs this candidate to lead"):
            election.ensure_held()
        try:
            await _leading(election)

            async def elsewhere() -> None:
                election.ensure_held()  # the term is the process's: any task (thread) may watch it

            await in_other(elsewhere)
            async with election.until_lost() as scope:
                for _ in range(4):
                    await sleep(0.2)  # across renewals
                    election.ensure_held()
            assert not scope.lost
            await election.stop()
            with pytest.raises(hybridlock.LockNotOwnedError):
                election.ensure_held()
            with pytest.raises(hybridlock.LockNotOwnedError):
                await _enter(election)
        finally:
            await election.stop()
