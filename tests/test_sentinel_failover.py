"""Failovers of a Sentinel-managed master while locks are held and waited for (real master, 2 replicas and
3 sentinels, started here; sentinels notice a dead master after 500 ms).

What docs/guarantees.md promises: a lock the promoted replica has survives the failover and its renewals go on
at the new master; a lock the promoted replica never received is gone, its holder is told at its next renewal, and
waiters get it at the new master; with confirmation, a lock survives even the old master's crash.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest

import hybridlock
from hybridlock.testing.sentinel import SentinelService

pytestmark = [
    pytest.mark.server,
    pytest.mark.sentinel,
    pytest.mark.slow(reason="fails a Sentinel service of its own over and waits for the promotion"),
    pytest.mark.timeout(180),
]

LOCK_KEY = "hybridlock:{orders:1}"


@pytest.fixture(scope="module")
def service() -> Iterator[SentinelService]:
    with SentinelService() as started:
        yield started


@pytest.fixture
def url(service: SentinelService) -> str:
    """The service settled, emptied, and every replica caught up with its master. A replica still resyncing after
    an earlier test's failover (or holding what ``_forget_on_replicas`` left) may be the one the sentinels promote
    next (they choose by the replication offsets they last saw), which is a replica that never acknowledged a
    confirmed lease: the case the guarantees' Sentinel table leaves outside, not the one these tests show."""
    service.wait_healthy()
    deadline = time.monotonic() + 30
    with service.node_client(service.master()) as master:
        master.flushall()
        while master.execute_command("WAIT", service.replica_count, 1000) < service.replica_count:
            assert time.monotonic() < deadline, f"the replicas did not catch up: {service.state_report()}"
    return service.url()


def _forget_on_replicas(service: SentinelService, key: str) -> None:
    """Delete ``key`` on every replica only (a replica's own writes are not replicated): as if the acquire never
    reached them. The replicas are writable only for that moment: a client still connected to a demoted master
    must get READONLY (and reconnect to the new master), not write to a replica."""
    for replica in service.replicas():
        with service.node_client(replica) as client:
            client.config_set("replica-read-only", "no")
            try:
                client.delete(key)
            finally:
                client.config_set("replica-read-only", "yes")


def test_start_returns_with_every_replica_in_sync() -> None:
    """As for EmbeddedCluster: a write made right after ``start()`` reaches every replica at once (no replica is
    still waiting for its first sync)."""
    with SentinelService() as fresh:
        master = fresh.master()
        for replica in fresh.replicas():
            with fresh.node_client(replica) as client:
                info = client.info("replication")
            assert (info["master_link_status"], info["master_sync_in_progress"]) == ("up", 0), replica.port
        with fresh.node_client(master) as client:
            client.set(LOCK_KEY, "held", px=30_000)
            assert client.execute_command("WAIT", fresh.replica_count, 1000) == fresh.replica_count
        for replica in fresh.replicas():
            with fresh.node_client(replica) as client:
                assert client.get(LOCK_KEY) == "held"


def test_a_lock_the_promoted_replica_had_survives_and_renewals_go_on(service: SentinelService, url: str) -> None:
    lost = threading.Event()
    # The lease outlasts the failover: renewals made at the old master after the promotion never reach the new one.
    with (
        hybridlock.LockRegistry(url, expire_after=10.0) as registry,
        hybridlock.LockRegistry(url) as observer,
    ):
        lock = registry.obtain("orders:1")
        lock.on_lost(lambda _lock: lost.set())
        assert lock.acquire(timeout=5)
        token = lock.fencing_token
        assert observer.obtain("orders:1").locked()  # its pooled connection is to the old master
        old_port = service.master().port
        new_port = service.failover()
        assert new_port != old_port
        assert observer.obtain("orders:1").locked()  # asked at the new master, not refused
        lock.renew()  # reaches the new master (the demoted one answers READONLY; the client asks the sentinels)
        with service.node_client(service.master()) as master:
            assert master.get(LOCK_KEY) == registry.client_id
            assert master.pttl(LOCK_KEY) > 8000
        time.sleep(1.5)  # a renewal round by the renewer at the new master
        assert not lost.is_set()
        assert not lock.lost
        assert lock.fencing_token == token
        lock.release()


def test_a_lock_the_new_master_never_saw_is_reported_lost_and_a_waiter_gets_it(
    service: SentinelService, url: str
) -> None:
    lost = threading.Event()
    with (
        hybridlock.LockRegistry(url, expire_after=2.0) as holder_registry,
        hybridlock.LockRegistry(url, expire_after=2.0) as waiter_registry,
    ):
        holder = holder_registry.obtain("orders:1")
        holder.on_lost(lambda _lock: lost.set())
        assert holder.acquire(timeout=5)
        holder_token = holder.fencing_token
        waited: dict[str, object] = {}

        def wait_for_it() -> None:
            lock = waiter_registry.obtain("orders:1")
            started = time.monotonic()
            deadline = started + 30
            while "acquired" not in waited:
                try:
                    waited["acquired"] = lock.acquire(timeout=max(0.1, deadline - time.monotonic()))
                except hybridlock.BackendUnavailableError as exc:  # not expected: the failover is followed
                    waited["error"] = exc
                    break
            waited["after"] = time.monotonic() - started
            waited["token"] = lock.fencing_token
            waited["told_first"] = lost.is_set()
            if waited["acquired"]:
                lock.release()

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(0.2)  # the waiter is queued
        _forget_on_replicas(service, LOCK_KEY)
        service.failover()
        assert lost.wait(10), "the holder was not told its lock was lost"
        assert holder.lost
        waiter.join(30)
        assert not waiter.is_alive()
        assert waited["acquired"] is True, waited
        assert waited["after"] < 25  # type: ignore[operator]
        assert waited["token"] > holder_token  # type: ignore[operator]
        with pytest.raises(hybridlock.LockLostError) as caught:
            holder.release()
        assert caught.value.server == f"sentinel://{service.service}/0"


def test_with_confirmation_a_lock_survives_the_masters_crash_and_waiters_go_on(
    service: SentinelService, url: str
) -> None:
    lost = threading.Event()

    def where() -> str:
        """Each node's role and copy of the lock key, and each sentinel's view (for messages)."""
        nodes = []
        for node in service.servers:
            try:
                with service.node_client(node) as client:
                    role = client.info("replication").get("role")
                    nodes.append(f"{node.port}:{role}:{client.get(LOCK_KEY)!r}")
            except Exception as exc:  # a node down just now
                nodes.append(f"{node.port}:{type(exc).__name__}")
        return f"{', '.join(nodes)}; sentinels: {service.state_report()}"

    with (
        # One replica is enough against a crash: the sentinels promote the replica furthest ahead, which has it.
        # Every owner confirms, as the guarantees assume: a node the sentinels promote and then pass over (two
        # failovers in a row, which a kill right after another test's failover sometimes sets off) stays a master,
        # with no replica, until the sentinels convert it, seconds later; a waiter that followed the sentinels to it
        # in between would otherwise take the lock there once the holder's lease, renewed at the real master, ends
        # on it. Confirmed, that acquire is refused (no replica acknowledges it).
        hybridlock.LockRegistry(url, expire_after=12.0, confirm_replicas=1) as holder_registry,
        hybridlock.LockRegistry(url, expire_after=12.0, confirm_replicas=1) as waiter_registry,
    ):
        holder = holder_registry.obtain("orders:1")
        holder.on_lost(lambda _lock: lost.set())
        events: list[str] = []
        # This is the crash of the master of a settled service. A failover under way when the lease is taken (one
        # this test did not cause: on a loaded machine the sentinels may hold a slow master down) is another row
        # of the guarantees: the lease may then be on a master being replaced, confirmed by a replica not yet
        # moved, and a second owner may get in at the new master (documented for N below the replicas). So once
        # the lease is taken, the service must still be settled on the master it was taken from (a failover
        # shows at the sentinels for seconds); if not, the lease is given back and taken again once it is.
        for _attempt in range(3):
            master_port = service.master().port
            assert holder.acquire(timeout=5)  # on a replica before acquire returned
            events.append(f"holder granted token {holder.fencing_token} with the master at {master_port}: {where()}")
            if service.healthy(master_port):
                break
            with contextlib.suppress(hybridlock.HybridLockError):
                holder.release()
            service.wait_healthy()
            lost.clear()
        else:
            pytest.fail("the service did not stay settled while the lease was taken:\n" + "\n".join(events))
        order: list[str] = []

        def wait_for_it() -> None:
            lock = waiter_registry.obtain("orders:1")
            # Unreachable master for a few seconds: a waiter may see BackendUnavailableError; it retries.
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                try:
                    if lock.acquire(timeout=max(0.1, deadline - time.monotonic())):
                        order.append("waiter")
                        # For a failure message: where and with which token the waiter got in.
                        events.append(f"waiter granted token {lock.fencing_token}: {where()}")
                        lock.release()
                        return
                except (hybridlock.BackendUnavailableError, hybridlock.ReplicationNotConfirmedError) as exc:
                    events.append(f"waiter: {type(exc).__name__}")
                    time.sleep(0.2)

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(0.2)
        killed = service.master().port
        new_port = service.kill_master()  # SIGKILL; a replica is promoted; the old node comes back, empty, as a replica
        events.append(f"master {killed} killed, {new_port} promoted")
        # The lease was on a replica: still ours at the new master, and renewals go on there.
        holder.renew()
        events.append(f"holder renewed: {where()}")
        with service.node_client(service.master()) as master:
            assert master.get(LOCK_KEY) == holder_registry.client_id
        assert not order, "\n".join(events)  # nobody got in meanwhile
        order.append("holder released")
        holder.release()
        waiter.join(40)
        assert order == ["holder released", "waiter"], "\n".join(events)
        assert not lost.is_set()


async def test_asyncio_a_lock_survives_a_failover_and_renews_at_the_new_master(
    service: SentinelService, url: str
) -> None:
    import asyncio

    async with hybridlock.AsyncLockRegistry(url, expire_after=10.0) as registry:
        lock = registry.obtain("orders:1")
        assert await lock.acquire(timeout=5)
        await asyncio.to_thread(service.failover)
        await lock.renew()  # at the new master, though the pooled connection was to the demoted one
        assert not lock.lost
        await lock.release()
        other = hybridlock.AsyncLockRegistry(url)
        try:
            assert await other.obtain("orders:1").acquire(blocking=False)
            await other.obtain("orders:1").release()
        finally:
            await other.aclose()


def test_with_confirmation_a_lock_handed_over_just_before_the_masters_crash_keeps_its_lease(
    service: SentinelService, url: str
) -> None:
    # A release grants the lock to a waiter of another process (a direct grant, with its provisional lease of at most
    # 3 s), and the master is SIGKILLed 0.3 s later. The granted holder extended the grant to its own lease (12 s:
    # the failover and the replica's move to the new master, which confirms the renewals there, take 2-4 s on an
    # idle machine; with the whole suite running on 2 cores, one run lost an 8 s lease to them), confirmed by a
    # replica, before its acquire returned: it keeps the lock through a failover of a few seconds,
    # renews it at the new master, and nobody else gets in. Before, its lease was the provisional one until the
    # renewer's first round: a failover longer than that lost it (../shared/repros/x2; 4 of 6 fault runs).
    LEASE = 12.0  # noqa: N806
    lost = threading.Event()
    with (
        hybridlock.LockRegistry(url, expire_after=LEASE, confirm_replicas=1) as first_registry,
        hybridlock.LockRegistry(url, expire_after=LEASE, confirm_replicas=1) as second_registry,
        hybridlock.LockRegistry(url, expire_after=LEASE, confirm_replicas=1) as third_registry,
    ):
        first = first_registry.obtain("orders:1")
        second = second_registry.obtain("orders:1")
        second.on_lost(lambda _lock: lost.set())
        assert first.acquire(timeout=5)
        state: dict[str, object] = {}
        let_go = threading.Event()

        def hold() -> None:
            state["acquired"] = second.acquire(timeout=20)
            state["left"] = (second._valid_until or 0.0) - time.monotonic()
            state["token"] = second.fencing_token
            let_go.wait(60)
            with contextlib.suppress(hybridlock.HybridLockError):
                second.release()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            with service.node_client(service.master()) as master:
                deadline = time.monotonic() + 10
                while not master.zcard(f"{LOCK_KEY}:queue"):
                    assert time.monotonic() < deadline, "the waiter never queued"
                    time.sleep(0.01)
            first.release()  # (grants the lock to the waiter's place)
            deadline = time.monotonic() + 10
            while "acquired" not in state:
                assert time.monotonic() < deadline, "the grant never reached the waiter"
                time.sleep(0.005)
            assert state["acquired"] is True
            # Its own lease, not the grant's provisional one (at most 3 s), from when its acquire returned.
            assert state["left"] > LEASE - 2.0, state  # type: ignore[operator]
            time.sleep(0.3)
            service.kill_master()  # SIGKILL; a replica is promoted; the old node comes back, empty, as a replica
            assert not lost.is_set(), "the granted holder lost its lease in the failover"
            assert not second.lost
            granted = f"{second_registry.client_id}|{state['token']}"  # (a granted tenancy: see scripts.grant)
            with service.node_client(service.master()) as master:
                assert master.get(LOCK_KEY) == granted
            assert not third_registry.obtain("orders:1").acquire(blocking=False)
            time.sleep(LEASE / 3 + 0.5)  # (a renewal round at the new master)
            assert not lost.is_set()
            with service.node_client(service.master()) as master:
                assert master.get(LOCK_KEY) == granted
                assert master.pttl(LOCK_KEY) > 4000
        finally:
            let_go.set()
            holder.join(30)
        assert not holder.is_alive()
        assert not lost.is_set()
