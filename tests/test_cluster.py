"""The cluster backend on a real Redis Cluster the suite starts itself (3 masters, a replica each): routing and
renewal per node, exclusion across processes over every slot, a slot migrated under held and awaited locks, a
master failover (manual: the lock is kept; a crash before replication: lost, and the holder told), a node killed
while a thread waits. The lock contract itself runs over the cluster in ``tests/_async`` / ``tests/_sync``.

Tests that fail nodes over or kill them start a cluster of their own; the others share the session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import threading
import time
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import hybridlock
from hybridlock._async.backends import cluster as async_cluster
from hybridlock._core.names import semaphore_names
from hybridlock._sync.backends import cluster as sync_cluster
from hybridlock._sync.backends.cluster import RedisClusterBackend
from hybridlock.testing.cluster import EmbeddedCluster
from tests import _cluster_workers
from tests._polling import until

pytestmark = [pytest.mark.server, pytest.mark.cluster]

CTX = multiprocessing.get_context("spawn")


def slot_of(key: str, registry_key: str = "hybridlock") -> int:
    return key_slot(f"{registry_key}:{{{key}}}".encode())


def keys_on_every_master(cluster: EmbeddedCluster, per_master: int, prefix: str = "k") -> list[str]:
    """Keys whose locks lie on every master, ``per_master`` on each."""
    found: dict[int, list[str]] = {}
    owners = {}
    for entry in cluster.command(cluster.masters[0], "CLUSTER", "SLOTS"):
        owners[(int(entry[0]), int(entry[1]))] = int(entry[2][1])
    index = 0
    while len(found) < len(cluster.masters) or min(len(v) for v in found.values()) < per_master:
        key = f"{prefix}{index}"
        index += 1
        slot = slot_of(key)
        port = next(port for (low, high), port in owners.items() if low <= slot <= high)
        if len(found.setdefault(port, [])) < per_master:
            found[port].append(key)
    return [key for keys in found.values() for key in keys]


# -- accepting a cluster ---------------------------------------------------------------------------------------------


def test_a_cluster_url_with_several_nodes_and_a_password_is_named_without_it(cluster_url):
    hosts = cluster_url.removeprefix("redis+cluster://")
    url = f"redis+cluster://:s3cret-pw@{hosts}"
    registry = hybridlock.LockRegistry(f"redis+cluster://{hosts}")
    try:
        assert registry.server == f"redis+cluster://{hosts}"
        assert isinstance(registry.backend, RedisClusterBackend)
    finally:
        registry.close()
    # (The session cluster has no password, and a server without one accepts any: only the naming is checked.)
    with hybridlock.LockRegistry(url) as registry:
        assert registry.server == f"redis+cluster://:***@{hosts}"
        with registry.obtain("passworded"):
            pass
    with pytest.raises(hybridlock.InvalidArgumentError, match="host:port"):
        hybridlock.LockRegistry("redis+cluster://127.0.0.1:notaport")


def test_a_cluster_client_passed_in_is_used_and_named_by_its_nodes(cluster, cluster_url):
    import redis.cluster
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    port = cluster.masters[0].port
    client = redis.cluster.RedisCluster(
        host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=5, retry=Retry(NoBackoff(), 1)
    )
    try:
        with hybridlock.LockRegistry(client) as registry, registry.obtain("named"):
            # The nodes it knows (having met the cluster, the blocking client knows them all): the first three.
            shown = registry.server.removeprefix("redis+cluster://").removesuffix(",...").split(",")
            assert 1 <= len(shown) <= 3
            assert {int(node.rpartition(":")[2]) for node in shown} <= {node.port for node in cluster.nodes}
    finally:
        client.close()
    # redis-py 8's defaults: 5 s timeouts on its nodes' connections (what the warning reads, as for one server, not
    # the cluster client's own kwargs, which lack them), and 10 cluster retries with backoff.
    loose = redis.cluster.RedisCluster(host="127.0.0.1", port=port)
    untimed = redis.cluster.RedisCluster(host="127.0.0.1", port=port, socket_timeout=None, retry=Retry(NoBackoff(), 1))
    try:
        with pytest.warns(hybridlock.ClientSettingsWarning, match="a retry policy of 10 retries") as record:
            hybridlock.LockRegistry(loose).close()
        assert "no socket_timeout" not in str(record[0].message)
        assert "no socket_connect_timeout" not in str(record[0].message)
        # (Its nodes' connections connect within redis-py's default socket_connect_timeout, 5 s.)
        with pytest.warns(hybridlock.ClientSettingsWarning, match="has no socket_timeout: a lock call"):
            hybridlock.LockRegistry(untimed).close()
    finally:
        loose.close()
        untimed.close()


def test_scripts_run_at_each_slots_master_and_announce_with_spublish(cluster, cluster_url):
    with hybridlock.LockRegistry(cluster_url) as registry:
        keys = keys_on_every_master(cluster, 2)
        for key in keys:
            with registry.obtain(key):
                owner = cluster.owner_of(slot_of(key))
                assert cluster.command(owner, "EXISTS", f"hybridlock:{{{key}}}") == 1
                # Another owner queues (a release with nobody queued announces nothing); counted from here, the
                # node's commands are the release's.
                assert not registry.backend.try_acquire(registry._names(key), "queued", 1000, queue=True).acquired
                cluster.command(owner, "CONFIG", "RESETSTAT")
        assert registry.backend._sharded is True
        for master in cluster.masters:
            stats = cluster.command(master, "INFO", "commandstats")
            assert "cmdstat_spublish" in stats, "the release scripts announce with SPUBLISH"
            assert "cmdstat_publish" not in stats


def test_a_refused_multi_key_attempt_announces_wanted_with_spublish(cluster, cluster_url):
    # A refused all-or-nothing attempt tells the holder it is wanted (ending a retention, a hand-off batch); on a
    # cluster only a sharded message reaches the holder's subscriber on the slot's node.
    owner = cluster.owner_of(slot_of("acct}1"))
    cluster.command(owner, "CONFIG", "RESETSTAT")
    with hybridlock.LockRegistry(cluster_url) as mine, hybridlock.LockRegistry(cluster_url) as theirs:
        with theirs.obtain("acct}2"):
            assert mine.obtain_many(["acct}1", "acct}2"]).acquire(blocking=False) is False
        stats = cluster.command(owner, "INFO", "commandstats")
        assert "cmdstat_spublish" in stats
        assert "cmdstat_publish" not in stats, "a classic PUBLISH on a cluster reaches no sharded subscriber"


def test_renewal_is_one_round_trip_per_node(cluster, cluster_url, monkeypatch):
    calls: list[str] = []
    original = sync_cluster.pipeline_on_node

    def counting(client: Any, node: Any, commands: Any) -> list[Any]:
        if any(command[0] == "EVALSHA" for command in commands):  # (not the owner description the renewer writes)
            calls.append(node.name)
        return original(client, node, commands)

    monkeypatch.setattr(sync_cluster, "pipeline_on_node", counting)
    with hybridlock.LockRegistry(cluster_url, expire_after=30) as registry:
        locks = [registry.obtain(f"renew{i}") for i in range(300)]
        for lock in locks:
            lock.acquire()
        slots = {slot_of(lock.key) for lock in locks}
        # (The first round of all may find a node's script cache cold: one more round trip there, once.)
        registry.backend.renew([lock._names for lock in locks], registry.client_id, 30_000)
        calls.clear()
        flags = registry.backend.renew([lock._names for lock in locks], registry.client_id, 30_000)
        assert flags == [True] * len(locks)
        owners = {f"127.0.0.1:{cluster.owner_of(slot).port}" for slot in slots}
        assert len(owners) == len(cluster.masters)
        assert sorted(calls) == sorted(owners)  # one pipeline per node, each carrying one script per slot
        for lock in locks:
            lock.release()


def test_keys_in_one_slot_are_taken_in_one_step_and_others_key_by_key(cluster_url):
    with hybridlock.LockRegistry(cluster_url) as mine, hybridlock.LockRegistry(cluster_url) as theirs:
        together = mine.obtain_many(["acct}1", "acct}2", "acct}3"])
        with together:
            assert together._atomic is True
        spread = mine.obtain_many(["a", "b", "c", "d"])
        assert len({slot_of(key) for key in spread.keys}) > 1
        blocker = theirs.obtain(spread.keys[2])
        blocker.acquire()
        try:
            assert not spread.acquire(timeout=0.3)
            assert spread._atomic is False
            # Rolled back: the keys before the busy one are free again.
            for key in spread.keys[:2]:
                assert not theirs.obtain(key).locked()
        finally:
            blocker.release()
        with spread:
            assert all(theirs.obtain(key).locked() for key in spread.keys)


def test_without_sharded_pubsub_nothing_is_announced_and_waiters_poll(cluster, cluster_url, monkeypatch):
    # As on a Redis 6 cluster, or one whose ACL refuses INFO: the scripts publish nothing, nobody subscribes.
    monkeypatch.setattr(RedisClusterBackend, "_has_sharded_pubsub", lambda self: False)
    with (
        hybridlock.LockRegistry(cluster_url, expire_after=1.0) as mine,
        hybridlock.LockRegistry(cluster_url, expire_after=1.0) as theirs,
    ):
        lock = mine.obtain("polled")
        lock.acquire()
        got: list[float] = []

        def wait() -> None:
            other = theirs.obtain("polled")
            if other.acquire(timeout=10):
                got.append(time.monotonic())
                other.release()

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(1.5)  # past a renewal: the holder keeps it while the waiter polls
        assert not lock.lost
        released = time.monotonic()
        lock.release()
        thread.join(15)
        assert got
        assert got[0] - released < 1.0  # polling: within its backoff (capped at 100 ms, and at the lease end)
        assert theirs.backend.subscribers == {}
        assert mine.backend._sharded is False


def test_a_client_library_without_sharded_subscribe_polls(cluster_url, monkeypatch):
    # As with redis-py before 5.0, whose PubSub has no ssubscribe: waiters poll. Four readers (two per owner) each
    # wait inside for all the others, which ends only if all of them are admitted together.
    monkeypatch.delattr(redis.client.PubSub, "ssubscribe")
    with hybridlock.LockRegistry(cluster_url) as mine, hybridlock.LockRegistry(cluster_url) as theirs:
        readers = [(mine, theirs)[i % 2].obtain_read_write("k").read_lock() for i in range(4)]
        together = threading.Barrier(len(readers))

        def read(lock: Any) -> None:
            with lock:
                together.wait(5)

        threads = [threading.Thread(target=read, args=(lock,)) for lock in readers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not together.broken
        assert theirs.backend.subscribers == {}


async def test_an_asyncio_client_library_without_sharded_subscribe_polls(cluster_url, monkeypatch):
    # As with redis-py before 8.0, whose asyncio PubSub has no ssubscribe: before, the waiters listened on a
    # subscriber failing at every connection, and two of these readers were never admitted (60 s) with redis-py 7.4.
    import redis.asyncio.client

    monkeypatch.delattr(redis.asyncio.client.PubSub, "ssubscribe")
    async with hybridlock.AsyncLockRegistry(cluster_url) as mine, hybridlock.AsyncLockRegistry(cluster_url) as theirs:
        readers = [(mine, theirs)[i % 2].obtain_read_write("k").read_lock() for i in range(4)]
        together = asyncio.Barrier(len(readers))

        async def read(lock: Any) -> None:
            async with lock:
                await asyncio.wait_for(together.wait(), 5)

        await asyncio.gather(*(read(lock) for lock in readers))
        assert theirs.backend.subscribers == {}


# -- exclusion -------------------------------------------------------------------------------------------------------


@pytest.mark.slow(reason="3 processes x 3 threads contend on keys on every master")
def test_exclusion_across_processes_with_keys_on_every_master(cluster, cluster_url, server):
    counters = redis.Redis.from_url(server.url)
    counters.flushall()
    keys = keys_on_every_master(cluster, 2, prefix="excl")
    processes, threads, iterations = 3, 3, 24
    workers = [
        CTX.Process(
            target=_cluster_workers.count_under_cluster_locks,
            args=(cluster_url, server.url, keys, threads, iterations, seed),
            daemon=True,
        )
        for seed in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 90
        for worker in workers:
            worker.join(max(0.1, deadline - time.monotonic()))
        assert not any(worker.is_alive() for worker in workers), "a worker process hung"
        assert counters.lrange("violations", 0, -1) == []
        assert counters.lrange("errors", 0, -1) == []
        assert [worker.exitcode for worker in workers] == [0] * processes
        per_thread = iterations + sum(1 for r in range(iterations) if r % 4 == 3)
        total = sum(int(counters.get(f"counter:{key}") or 0) for key in keys)
        assert total == processes * threads * per_thread
        assert int(counters.get("rounds") or 0) == processes * threads * iterations
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
            worker.join(10)
        counters.close()


# -- a slot migrated -------------------------------------------------------------------------------------------------


@pytest.mark.slow(reason="migrates a slot key by key while its locks are held and awaited")
def test_a_slot_migrated_while_its_locks_are_held_and_awaited(cluster, cluster_url):
    key = "migrating"
    slot = slot_of(key)
    source = cluster.owner_of(slot)
    target = next(master for master in cluster.masters if cluster.role(master) == "master" and master is not source)
    with (
        hybridlock.LockRegistry(cluster_url, expire_after=6.0) as holder,
        hybridlock.LockRegistry(cluster_url, expire_after=6.0) as waiter,
    ):
        lock = holder.obtain(key)
        assert lock.acquire(timeout=5)
        token = lock.fencing_token
        outcome: list[Any] = []

        def wait() -> None:
            mine = waiter.obtain(key)
            try:
                got = mine.acquire(timeout=20)
                outcome.append((got, mine.fencing_token, time.monotonic()))
                if got:
                    mine.release()
            except BaseException as exc:  # the test reads it below
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.5)  # the waiter is queued at the source, blocked on its grant box there

        attempts: list[Any] = []

        def try_meanwhile() -> None:
            # An acquire's script touches keys on both sides now: TRYAGAIN, retried until the migration ends.
            try:
                attempts.append(third.obtain(key).acquire(False))
            except BaseException as exc:  # the test reads it below
                attempts.append(exc)

        def half_moved() -> threading.Thread:
            # Some of the slot's keys are here, some there: the holder's renewal (lock keys only) still works,
            # and attempts meanwhile are retried, not failed.
            assert cluster.command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) > 0
            assert cluster.command(target, "CLUSTER", "COUNTKEYSINSLOT", slot) > 0
            lock.renew()
            attempt = threading.Thread(target=try_meanwhile)
            attempt.start()
            time.sleep(0.5)
            lock.renew()
            assert attempts == []  # still retrying
            return attempt

        with hybridlock.LockRegistry(cluster_url, expire_after=6.0) as third:
            started: list[threading.Thread] = []
            cluster.migrate_slot(slot, target, between=lambda: started.append(half_moved()))
            started[0].join(5)
        assert attempts == [False]  # refused (the lock is held), not failed
        assert cluster.owner_of(slot) is target
        renewer = holder._context.renewer
        rounds = renewer.rounds
        until(lambda: renewer.rounds >= rounds + 1, "a renewal round after the move", 10)
        assert not lock.lost  # the renewer followed the slot to its new node
        lock.renew()
        assert cluster.command(target, "GET", f"hybridlock:{{{key}}}") == holder.client_id.encode()
        released_at = time.monotonic()
        lock.release()
        thread.join(25)
        assert not thread.is_alive()
        assert len(outcome) == 1
        assert not isinstance(outcome[0], BaseException), outcome
        got, their_token, got_at = outcome[0]
        assert got
        assert their_token > token
        assert got_at - released_at < 2.0  # granted by the release, or its next attempt took it over
        # A new wait that is woken (a writer of a read-write lock) subscribes at the slot's new node.
        rw_lock = holder.obtain_read_write(key).write_lock()
        rw_lock.acquire()
        try:
            assert not waiter.obtain_read_write(key).write_lock().acquire(timeout=0.3)
            assert f"127.0.0.1:{target.port}" in waiter.backend.subscribers
        finally:
            rw_lock.release()


class _HolderAndWaiter:
    """A thread of ``holder`` takes the only permit of ``key`` (a permit is its thread's) and gives it back once
    ``release_now`` is set; a thread of ``other`` waits for it. What each got, for the test to read: ``released``
    ("released" or what the release raised), ``tokens`` (the holder's), ``outcome`` (the waiter's (got, token, whether
    ``release_now`` was set by then), or what it raised)."""

    def __init__(self, holder: Any, other: Any, key: str, patience: float) -> None:
        self.semaphore = holder.obtain_semaphore(key, 1)
        self.theirs = other.obtain_semaphore(key, 1)
        self.patience = patience
        self.held, self.release_now = threading.Event(), threading.Event()
        self.released: list[Any] = []
        self.tokens: list[int | None] = []
        self.outcome: list[Any] = []
        self.releasing = threading.Thread(target=self._hold_then_release)
        self.waiting = threading.Thread(target=self._wait)

    def _hold_then_release(self) -> None:
        try:
            assert self.semaphore.acquire(timeout=5)
            self.tokens.append(self.semaphore.fencing_token)
            self.held.set()
            self.release_now.wait(self.patience)
            self.semaphore.release()
            self.released.append("released")
        except BaseException as exc:  # the test reads it
            self.released.append(exc)
            self.held.set()

    def _wait(self) -> None:
        try:
            got = self.theirs.acquire(timeout=self.patience)
            self.outcome.append((got, self.theirs.fencing_token, self.release_now.is_set()))
            if got:
                self.theirs.release()
        except BaseException as exc:  # the test reads it
            self.outcome.append(exc)


def test_a_permit_released_while_its_slot_is_being_migrated_is_not_reported_lost(cluster, cluster_url, monkeypatch):
    # A semaphore's release reads permit slots it does not declare (which exist only the script knows). While the
    # slot is being migrated, its old master stops a script at such a key that is not there ("non local key"). Were
    # that after the release's first write (the permit deleted), the run again would find the permit gone and report
    # it lost; and the error itself was raised to the caller. The release now stops before it writes, and is retried
    # until the slot has moved.
    monkeypatch.setattr(sync_cluster, "_MIGRATION_PATIENCE", 20.0)  # (the window below is the test's, not a fault)
    key = "sem-migrating"
    slot = slot_of(key)
    source = cluster.owner_of(slot)
    target = next(master for master in cluster.masters if cluster.role(master) == "master" and master is not source)
    with (
        hybridlock.LockRegistry(cluster_url, expire_after=6.0) as holder,
        hybridlock.LockRegistry(cluster_url, expire_after=6.0) as other,
    ):
        pair = _HolderAndWaiter(holder, other, key, patience=20)
        released, tokens, outcome = pair.released, pair.tokens, pair.outcome
        releasing, waiting = pair.releasing, pair.waiting
        releasing.start()
        assert pair.held.wait(10)
        assert released == []
        waiting.start()
        until(lambda: cluster.command(source, "EXISTS", f"hybridlock:{{{key}}}:sem-queue") == 1, "a queue", 5)
        source_id, target_id = cluster.node_id(source), cluster.node_id(target)
        cluster.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        cluster.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        pair.release_now.set()
        time.sleep(0.3)
        assert released == []  # still retrying: the slot is being migrated
        assert outcome == []
        cluster.migrate_slot(slot, target)  # (its keys moved, the slot given to the target)
        releasing.join(10)
        waiting.join(25)
        assert not releasing.is_alive()
        assert not waiting.is_alive()
        assert released == ["released"]
        assert len(outcome) == 1
        assert not isinstance(outcome[0], BaseException), outcome
        got, their_token, _ = outcome[0]
        assert got
        assert their_token > tokens[0]
        assert cluster.owner_of(slot) is target


def test_a_semaphore_whose_keys_are_half_moved_gives_no_permit_held_on_the_other_master(
    cluster, cluster_url, monkeypatch
):
    # The semaphore's declared keys (config, counter, queue) moved to the new master, its held permit still on the
    # old one: a waiter's attempt is sent on to the new master (ASK), which would have read the permit as free and
    # given it out a second time (and the permit's own MIGRATE would then fail: BUSYKEY). The script stops at its
    # migration probe instead, and is run again until the slot has moved.
    monkeypatch.setattr(sync_cluster, "_MIGRATION_PATIENCE", 20.0)  # (the window below is the test's, not a fault)
    key = "sem-half-moved"
    names = semaphore_names("hybridlock", key)
    slot = slot_of(key)
    source = cluster.owner_of(slot)
    target = next(master for master in cluster.masters if cluster.role(master) == "master" and master is not source)
    with (
        hybridlock.LockRegistry(cluster_url) as holder,
        hybridlock.LockRegistry(cluster_url) as other,
    ):
        pair = _HolderAndWaiter(holder, other, key, patience=30)
        released, tokens, outcome = pair.released, pair.tokens, pair.outcome
        releasing, waiting = pair.releasing, pair.waiting
        releasing.start()
        assert pair.held.wait(10)
        waiting.start()
        until(lambda: cluster.command(source, "EXISTS", names.queue) == 1, "the waiter's place", 5)
        cluster.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
        cluster.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))
        moved = [names.config, names.fence, names.queue, names.queue_until]
        cluster.command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *moved)
        time.sleep(2.5)  # the waiter attempts again (at least once a second), at the new master
        assert outcome == []  # not admitted: the permit is held
        assert sorted(cluster.command(target, "CLUSTER", "GETKEYSINSLOT", slot, 100)) == sorted(
            name.encode() for name in moved
        )
        cluster.migrate_slot(slot, target)  # the permit's keys too (no BUSYKEY: none was written there)
        pair.release_now.set()
        releasing.join(30)
        waiting.join(30)
        assert not releasing.is_alive()
        assert not waiting.is_alive()
        assert released == ["released"]
        assert len(outcome) == 1
        assert not isinstance(outcome[0], BaseException), outcome
        got, their_token, after_release = outcome[0]
        assert got
        assert after_release  # admitted only once the holder was told to release
        assert their_token > tokens[0]


@pytest.mark.parametrize(("kind", "permits"), [("semaphore", 1), ("semaphore", 2), ("lock", 1)])
def test_threads_of_two_registries_contending_on_a_slot_being_migrated_fail_nothing(
    cluster, cluster_url, kind, permits, monkeypatch
):
    # Six threads of two registries take and give back a semaphore's permits (or one lock: its queue and grant boxes)
    # while its slot moves between masters, half moved for a while each time: at most ``permits`` inside at once,
    # and no call fails.
    monkeypatch.setattr(sync_cluster, "_MIGRATION_PATIENCE", 20.0)  # (each half-moved window is the test's)
    key = f"{kind}-moving-{permits}"
    slot = slot_of(key)
    with (
        hybridlock.LockRegistry(cluster_url) as first,
        hybridlock.LockRegistry(cluster_url) as second,
    ):
        if kind == "lock":
            contended: list[Any] = [registry.obtain(key) for registry in (first, second)]
        else:
            contended = [registry.obtain_semaphore(key, permits) for registry in (first, second)]
        running = threading.Event()
        running.set()
        failures: list[BaseException] = []
        guard = threading.Lock()
        inside = most = cycles = 0

        def worker(held: Any) -> None:
            nonlocal inside, most, cycles
            try:
                while running.is_set():
                    assert held.acquire(timeout=20)
                    with guard:
                        inside += 1
                        most = max(most, inside)
                    time.sleep(0.002)
                    with guard:
                        inside -= 1
                        cycles += 1
                    held.release()
            except BaseException as exc:  # reported by the test, in its own thread
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(contended[index % 2],)) for index in range(6)]
        for thread in threads:
            thread.start()
        for move in range(4):
            time.sleep(0.2)
            target = [master for master in cluster.masters if master is not cluster.owner_of(slot)][move % 2]
            cluster.migrate_slot(slot, target, between=lambda: time.sleep(0.3))
        time.sleep(0.2)
        running.clear()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert most <= permits
        assert cycles > 0


# -- failover and dead nodes -----------------------------------------------------------------------------------------


@pytest.fixture
def own_cluster():
    """A cluster of this test alone, for failing over or killing its nodes."""
    with EmbeddedCluster(masters=3, replicas=1) as started:
        yield started


def _on_replica(cluster: EmbeddedCluster, replica: Any, key: str) -> bytes | None:
    client = cluster.client(replica)
    try:
        client.execute_command("READONLY")
        value: bytes | None = client.get(key)
        return value
    finally:
        client.close()


@pytest.mark.slow(reason="forms a cluster of its own")
def test_start_returns_with_every_replica_in_sync(own_cluster):
    """A write made right after ``start()`` reaches every master's replica at once: no replica is still waiting
    for its first sync (which the server's default diskless sync delay puts 5 s after the replica connects)."""
    cluster = own_cluster
    for replica in cluster.replicas:
        info = cluster.command(replica, "INFO", "replication")
        assert (info["master_link_status"], info["master_sync_in_progress"]) == ("up", 0), replica.port
    for key in keys_on_every_master(cluster, 1, prefix="early"):
        name = f"hybridlock:{{{key}}}"
        master = cluster.owner_of(slot_of(key))
        client = cluster.client(master)
        try:
            client.set(name, "held", px=30_000)
            assert client.execute_command("WAIT", 1, 1000) == 1, f"the replica of {master.port} did not acknowledge"
        finally:
            client.close()
        assert _on_replica(cluster, cluster.replica_of(master), name) == b"held"


@pytest.mark.slow(reason="forms a cluster of its own and waits for a failover")
def test_a_master_killed_right_after_start_fails_over_with_the_lease(own_cluster):
    """The failover a test means to exercise right after ``start()``: the lease, replicated in the time a write
    takes, survives the master's crash on the promoted replica, and its holder keeps the lock."""
    cluster = own_cluster
    with hybridlock.LockRegistry(cluster.url, expire_after=15.0) as registry:
        lock = registry.obtain("early")
        lost: list[Any] = []
        lock.on_lost(lost.append)
        lock.acquire()
        master = cluster.owner_of(slot_of("early"))
        replica = cluster.replica_of(master)
        until(lambda: _on_replica(cluster, replica, "hybridlock:{early}"), "the lease on the replica", 1)
        master.kill()
        until(lambda: cluster.role(replica) == "master", "the replica's promotion", 20)
        cluster.wait_healthy()
        lock.renew()
        assert not lock.lost
        assert lost == []
        assert cluster.command(replica, "GET", "hybridlock:{early}") == registry.client_id.encode()
        lock.release()


@pytest.mark.slow(reason="forms a cluster of its own and waits for a failover")
def test_a_manual_failover_keeps_the_lock(own_cluster):
    cluster = own_cluster
    # A lease longer than the failover takes on a loaded machine: a lease that cannot be renewed while the slot has
    # no writable master for longer than itself is reported lost, as it should be.
    with hybridlock.LockRegistry(cluster.url, expire_after=10.0) as registry:
        lock = registry.obtain("kept")
        lost: list[Any] = []
        lock.on_lost(lost.append)
        lock.acquire()
        master = cluster.owner_of(slot_of("kept"))
        replica = cluster.replica_of(master)
        cluster.command(replica, "CLUSTER", "FAILOVER")  # waits for the replica to catch up: nothing is lost
        until(lambda: cluster.role(replica) == "master", "the replica's promotion", 15)
        cluster.wait_healthy()
        lock.renew()  # through a MOVED answer from the old master
        renewer = registry._context.renewer
        rounds = renewer.rounds
        until(lambda: renewer.rounds >= rounds + 1, "a renewal round after the failover", 10)
        assert not lock.lost
        assert lost == []
        assert cluster.command(replica, "GET", "hybridlock:{kept}") == registry.client_id.encode()
        lock.release()
        with hybridlock.LockRegistry(cluster.url) as other, other.obtain("kept"):
            pass


@pytest.mark.slow(reason="forms a cluster of its own and waits for a failover")
def test_a_master_crash_before_replication_loses_the_lock_and_tells_the_holder(own_cluster):
    cluster = own_cluster
    key = "unreplicated"
    with hybridlock.LockRegistry(cluster.url, expire_after=3.0) as registry:
        kept = registry.obtain("replicated")  # on another master: unaffected throughout
        master = cluster.owner_of(slot_of(key))
        while cluster.owner_of(slot_of(kept.key)) is master:
            kept = registry.obtain(kept.key + "x")
        kept.acquire()
        lock = registry.obtain(key)
        try:
            replica = cluster.replica_of(master)
            lost: list[Any] = []
            lock.on_lost(lost.append)
            # SIGSTOP the replica, then cut its link: a stopped replica's kernel would still take in what the
            # master sends, and read it once resumed (the lease then survives, which is the other test's case).
            replica.pause()
            try:
                assert cluster.command(master, "CLIENT", "KILL", "TYPE", "replica") == 1
                lock.acquire()
                token = lock.fencing_token
                master.kill()  # the lease dies with the only server that had it
            finally:
                replica.resume()
            cluster.command(replica, "CLUSTER", "FAILOVER", "TAKEOVER")
            until(lambda: cluster.role(replica) == "master", "the replica's promotion", 15)
            cluster.settle_takeover(replica)
            # Told at its next renewal (every second): lost, on_lost, LockLostError at release.
            until(lambda: lock.lost and lost, "the holder to be told", 10)  # (the loss is marked, then told)
            assert lost == [lock]
            with hybridlock.LockRegistry(cluster.url) as other:
                theirs = other.obtain(key)
                assert theirs.acquire(timeout=5)
                assert theirs.fencing_token > token  # the promoted replica's clock term is past the lost token
                theirs.release()
            with pytest.raises(hybridlock.LockLostError) as excinfo:
                lock.release()
            assert excinfo.value.server == cluster.url
            assert not kept.lost
            kept.release()
        finally:  # after a failure above: let go of what is still held, so that closing adds no warning to it
            for held in (lock, kept):
                if held.is_held_by_current_thread():
                    with contextlib.suppress(hybridlock.HybridLockError):
                        held.release()


def _cluster_info(cluster: EmbeddedCluster, node: Any, field: str) -> int:
    info = cluster.command(node, "CLUSTER", "INFO").decode()
    return int(next(line for line in info.split() if line.startswith(field + ":")).split(":")[1])


def _one_current_epoch(cluster: EmbeddedCluster) -> bool:
    return len({_cluster_info(cluster, node, "cluster_current_epoch") for node in cluster.nodes}) == 1


def _epoch_seen(cluster: EmbeddedCluster, node: Any, node_id: str) -> int:
    """The config epoch ``node`` holds for the node ``node_id``."""
    lines = cluster.command(node, "CLUSTER", "NODES").decode().splitlines()
    return int(next(line.split()[6] for line in lines if line.startswith(node_id)))


def _at_once(nodes: list[Any], command: bytes) -> list[str]:
    """Send a command (inline) to each node at the same moment, then read each reply."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.create_connection(("127.0.0.1", node.port), timeout=5)) for node in nodes]
        for sock in sockets:
            sock.sendall(command + b"\r\n")
        return [sock.recv(256).decode().strip() for sock in sockets]


@pytest.mark.slow(reason="forms a cluster of its own")
def test_start_gives_every_node_a_config_epoch_of_its_own(own_cluster):
    """As ``redis-cli --cluster create`` does. Left to the servers' own clash rule (which only two masters apply),
    a replica could keep its master's epoch: then its takeover, finding its epoch already the greatest, keeps it
    and claims the slots with no greater epoch than the dead master's (the next test shows what that tie does).
    A replica is listed with its master's epoch; a soft reset makes it a lone master that shows its own."""
    cluster = own_cluster
    epochs = [cluster.config_epoch(master) for master in cluster.masters]
    for replica in cluster.replicas:
        cluster.command(replica, "CLUSTER", "RESET", "SOFT")
        epochs.append(cluster.config_epoch(replica))
    assert 0 not in epochs
    assert len(set(epochs)) == len(cluster.nodes), epochs


@pytest.mark.slow(reason="forms a cluster of its own and waits for a failover")
def test_a_takeover_tied_with_its_dead_masters_epoch_still_settles(own_cluster):
    """A replica whose own config epoch equals its master's, and is the greatest in the cluster, takes over after
    its master's crash: the takeover keeps that epoch (the server bumps only one that is not the greatest), so the
    other nodes, holding the same epoch for the dead master, never give it the slots by themselves.
    ``settle_takeover`` raises the promoted node's epoch past the dead master's, and the cluster settles."""
    cluster = own_cluster
    # The tie: the master and its replica bump their epochs at the same moment, from the same current epoch, so
    # each takes the same next one before hearing of the other's (retried on the next pair if one heard first).
    for master in cluster.masters:
        replica = cluster.replica_of(master)
        until(lambda: _one_current_epoch(cluster), "one current epoch on every node", 10)
        replies = _at_once([master, replica], b"CLUSTER BUMPEPOCH")
        if replies[0].startswith("+BUMPED") and replies[0] == replies[1]:
            break
    else:
        pytest.fail("the master and its replica did not take the same epoch on any of the pairs")
    tied = int(replies[0].split()[1])
    slot = next(
        int(entry[0]) for entry in cluster.command(master, "CLUSTER", "SLOTS") if int(entry[2][1]) == master.port
    )
    master_id = cluster.node_id(master)
    others = [node for node in cluster.nodes if node is not master]
    until(lambda: all(_epoch_seen(cluster, node, master_id) == tied for node in others), "the master's epoch seen", 10)
    master.kill()
    cluster.command(replica, "CLUSTER", "FAILOVER", "TAKEOVER")
    until(lambda: cluster.role(replica) == "master", "the replica's promotion", 15)
    assert cluster.config_epoch(replica) == tied  # the takeover kept the epoch it shares with the dead master
    cluster.settle_takeover(replica, timeout=30)
    assert cluster.config_epoch(replica) > tied
    for node in others:
        assert _cluster_info(cluster, node, "cluster_slots_assigned") == 16384
        assert _epoch_seen(cluster, node, cluster.node_id(replica)) > tied
    assert cluster.owner_of(slot) is replica


@pytest.mark.slow(reason="forms a cluster of its own and waits for the node to be held failed")
def test_a_node_killed_while_a_thread_waits_gives_a_clear_error_in_time():
    # Without full coverage required, the other masters go on serving once the cluster holds the dead one failed
    # (with it, the default, the whole cluster refuses every command then: see the cluster table of docs/guarantees.md).
    with EmbeddedCluster(masters=3, replicas=0, extra_args=("--cluster-require-full-coverage", "no")) as cluster:
        key = "doomed"
        with (
            hybridlock.LockRegistry(cluster.url, expire_after=4.0) as holder,
            hybridlock.LockRegistry(cluster.url, expire_after=4.0) as waiter,
        ):
            lock = holder.obtain(key)
            lock.acquire()
            elsewhere = holder.obtain("survivor")
            master = cluster.owner_of(slot_of(key))
            while cluster.owner_of(slot_of(elsewhere.key)) is master:
                elsewhere = holder.obtain(elsewhere.key + "x")
            elsewhere.acquire()
            outcome: list[Any] = []
            timeout = 8.0

            def wait() -> None:
                started = time.monotonic()
                try:
                    outcome.append(waiter.obtain(key).acquire(timeout=timeout))
                except BaseException as exc:
                    outcome.append(exc)
                outcome.append(time.monotonic() - started)

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.5)
            master.kill()
            thread.join(timeout + 2 * 5 + 5)
            assert not thread.is_alive()
            error, took = outcome
            assert isinstance(error, hybridlock.BackendUnavailableError), error
            assert took < timeout + 2 * 5  # the documented bound: the timeout plus two socket timeouts
            assert error.key == key
            assert error.server == cluster.url
            assert f"127.0.0.1:{master.port}" in str(error)  # the node, beside the cluster
            # Locks on the other masters go on being renewed; the dead node's lease is reported lost when it ends.
            until(lambda: lock.lost, "the dead node's lease to be reported lost", 10)
            assert not elsewhere.lost
            elsewhere.release()
            with pytest.raises(hybridlock.HybridLockError):
                lock.release()


@pytest.mark.slow(reason="forms a cluster of its own and renews through a hung master for several leases")
def test_a_hung_master_does_not_stop_the_renewal_of_leases_on_the_others():
    # A 1.5 s lease, renewed every 0.5 s, far shorter than the client's 5 s socket timeout: a round that meets the
    # hung node gives up on it once the others have answered (plus a short patience), so their leases are renewed on
    # time. (Before, a round waited the whole socket timeout for the hung node, and every lease ran out.)
    with (
        EmbeddedCluster(masters=3, replicas=0, node_timeout=60_000) as cluster,
        hybridlock.LockRegistry(cluster.url, expire_after=1.5) as registry,
    ):
        keys = keys_on_every_master(cluster, 2, prefix="hung")
        locks = [registry.obtain(key) for key in keys]
        for lock in locks:
            lock.acquire()
        hung = cluster.owner_of(slot_of(keys[0]))
        on_hung = [lock for lock in locks if cluster.owner_of(slot_of(lock.key)) is hung]
        others = [lock for lock in locks if lock not in on_hung]
        hung.pause()
        try:
            until(lambda: all(lock.lost for lock in on_hung), "the hung node's leases to be reported lost", 25)
            assert not any(lock.lost for lock in others)
            time.sleep(4)  # eight more rounds, each meeting the hung node
            assert not any(lock.lost for lock in others)
            for lock in others:
                lock.renew()
        finally:
            hung.resume()
        for lock in others:
            lock.release()
        for lock in on_hung:  # (their holder is told again at release; none is left held at close)
            with pytest.raises(hybridlock.LockLostError):
                lock.release()


# -- asyncio ---------------------------------------------------------------------------------------------------------


async def test_asyncio_waiters_are_granted_plain_locks_on_every_node(cluster, cluster_url):
    async with hybridlock.AsyncLockRegistry(cluster_url) as mine, hybridlock.AsyncLockRegistry(cluster_url) as theirs:
        for key in keys_on_every_master(cluster, 1, prefix="grant"):
            lock = mine.obtain(key)
            await lock.acquire()
            woken: list[tuple[float, int | None]] = []

            async def wait(key: str = key, woken: list[tuple[float, int | None]] = woken) -> None:
                other = theirs.obtain(key)
                assert await other.acquire(timeout=10)
                woken.append((time.monotonic(), other.fencing_token))
                await other.release()

            task = asyncio.create_task(wait())
            queue = lock._names.queue
            deadline = time.monotonic() + 10
            while not await mine.backend.client.zcard(queue):
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.01)
            token = lock.fencing_token
            released = time.monotonic()
            await lock.release()
            await task
            assert woken[0][0] - released < 0.5
            assert woken[0][1] is not None
            assert token is not None
            assert woken[0][1] > token
        assert not any(sub._subscribed for sub in theirs.backend.subscribers.values())  # no channel was needed


async def test_asyncio_waiters_wake_over_sharded_pubsub(cluster, cluster_url):
    async with hybridlock.AsyncLockRegistry(cluster_url) as mine, hybridlock.AsyncLockRegistry(cluster_url) as theirs:
        keys = keys_on_every_master(cluster, 1, prefix="wake")
        for key in keys:
            # The write half of a read-write lock: a waiter that is woken and takes the lock itself.
            lock = mine.obtain_read_write(key).write_lock()
            await lock.acquire()
            woken: list[float] = []

            async def wait(key: str = key, woken: list[float] = woken) -> None:
                other = theirs.obtain_read_write(key).write_lock()
                assert await other.acquire(timeout=10)
                woken.append(time.monotonic())
                await other.release()

            task = asyncio.create_task(wait())
            channel = theirs.obtain_read_write(key)._names.channel
            deadline = time.monotonic() + 10
            while not any(channel in sub._subscribed for sub in theirs.backend.subscribers.values()):
                assert time.monotonic() < deadline, "the waiter never subscribed"
                await asyncio.sleep(0.01)
            released = time.monotonic()
            await lock.release()
            await task
            assert woken[0] - released < 0.5
        assert isinstance(theirs.backend, async_cluster.AsyncRedisClusterBackend)
        assert len(theirs.backend.subscribers) == len(cluster.masters)  # one subscriber per node, no more


def _reset_statistics(cluster: EmbeddedCluster) -> None:
    for master in cluster.masters:
        cluster.command(master, "CONFIG", "RESETSTAT")


def _moved_replies(cluster: EmbeddedCluster) -> int:
    """How many calls the masters answered MOVED (sent to a master not serving their slot) since the reset."""
    stats = [cluster.command(master, "INFO", "errorstats") for master in cluster.masters]
    return sum(int(stat.get("errorstat_MOVED", {}).get("count", 0)) for stat in stats)


async def _tasks_at_once(registry: hybridlock.AsyncLockRegistry, key: str) -> int:
    """8 tasks at once, each 3 times through a semaphore of 2 permits then a lock; the most inside it at once."""
    semaphore = registry.obtain_semaphore(key, 2)
    lock = registry.obtain(f"{key}-lock")
    inside: list[int] = []
    peak = 0

    async def worker() -> None:
        nonlocal peak
        for _ in range(3):
            assert await semaphore.acquire(timeout=20)
            inside.append(1)
            peak = max(peak, len(inside))
            await asyncio.sleep(0.002)
            inside.pop()
            await semaphore.release()
            assert await lock.acquire(timeout=20)
            await lock.release()

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 60)
    return peak


async def test_asyncio_tasks_at_once_on_a_new_registry_route_by_slot_and_fail_nothing(cluster, cluster_url):
    # redis-py's asyncio cluster client (8.x) picks a command's node before it learns the cluster's layout: on a new
    # client, the scripts of tasks started together went to random masters and were answered MOVED, and every fifth
    # MOVED made the client close all its connections, cutting off the other tasks' calls in flight ("Connection
    # closed by server"). Several new registries, 8 tasks at once on each: no error, the limit kept, and no call
    # sent to a master not serving its slot.
    _reset_statistics(cluster)
    for round_ in range(4):
        async with hybridlock.AsyncLockRegistry(cluster_url) as registry:
            assert await _tasks_at_once(registry, f"first-contact{round_}") <= 2
    assert _moved_replies(cluster) == 0


async def test_asyncio_tasks_on_a_slot_being_migrated_fail_nothing(cluster, cluster_url):
    # Locks of one slot, taken and given back by 8 tasks of one registry at once while the slot moves between
    # masters: the calls on their way to the old master are answered MOVED, and redis-py's asyncio cluster client
    # closed all its connections at every fifth MOVED (its reinitialize_steps), cutting off the other tasks' calls
    # in flight (a release then retried found its lock gone: LockLostError; or a raw AttributeError). The client
    # hybridlock makes follows each MOVED instead (reinitialize_steps=0): nothing fails, nothing is closed.
    async with hybridlock.AsyncLockRegistry(cluster_url) as registry:
        client = registry.backend.client
        closed = 0
        close = client.aclose

        async def counted_close() -> None:
            nonlocal closed
            closed += 1
            await close()

        client.aclose = counted_close
        locks = [registry.obtain(f"moving}}{index}") for index in range(8)]
        slot = slot_of(locks[0].key)
        running = True

        async def worker(lock: Any) -> int:
            cycles = 0
            while running:
                assert await lock.acquire(timeout=20)
                await asyncio.sleep(0.001)
                await lock.release()
                cycles += 1
            return cycles

        tasks = [asyncio.create_task(worker(lock)) for lock in locks]
        for move in range(4):
            await asyncio.sleep(0.1)
            target = [master for master in cluster.masters if master is not cluster.owner_of(slot)][move % 2]
            await asyncio.to_thread(cluster.migrate_slot, slot, target)
        await asyncio.sleep(0.1)
        running = False
        cycles = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert min(cycles) > 0
        assert closed == 0


async def test_asyncio_tasks_of_two_registries_on_a_semaphore_whose_slot_is_migrated_fail_nothing(
    cluster, cluster_url, monkeypatch
):
    # The asyncio side of the contended test above: a semaphore's scripts stopped at a permit slot not there (the
    # slot half moved) are run again until it has moved, and nothing fails.
    monkeypatch.setattr(async_cluster, "_MIGRATION_PATIENCE", 20.0)  # (each half-moved window is the test's)
    key = "sem-moving-tasks"
    slot = slot_of(key)
    async with (
        hybridlock.AsyncLockRegistry(cluster_url) as first,
        hybridlock.AsyncLockRegistry(cluster_url) as second,
    ):
        semaphores = [registry.obtain_semaphore(key, 2) for registry in (first, second)]
        running = True
        inside = most = 0

        async def worker(semaphore: Any) -> int:
            nonlocal inside, most
            cycles = 0
            while running:
                assert await semaphore.acquire(timeout=20)
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.002)
                inside -= 1
                await semaphore.release()
                cycles += 1
            return cycles

        tasks = [asyncio.create_task(worker(semaphores[index % 2])) for index in range(6)]
        for move in range(4):
            await asyncio.sleep(0.2)
            target = [master for master in cluster.masters if master is not cluster.owner_of(slot)][move % 2]
            await asyncio.to_thread(cluster.migrate_slot, slot, target, lambda: time.sleep(0.3))
        await asyncio.sleep(0.2)
        running = False
        cycles = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert sum(cycles) > 0
        assert most <= 2


def test_threads_on_a_slot_being_migrated_fail_nothing(cluster, cluster_url):
    # The blocking twin: its client learns the layout again at a MOVED without closing the connections in use.
    with hybridlock.LockRegistry(cluster_url) as registry:
        locks = [registry.obtain(f"moving-threads}}{index}") for index in range(8)]
        slot = slot_of(locks[0].key)
        running = threading.Event()
        running.set()
        failures: list[BaseException] = []
        cycles = [0] * len(locks)

        def worker(index: int) -> None:
            try:
                while running.is_set():
                    assert locks[index].acquire(timeout=20)
                    time.sleep(0.001)
                    locks[index].release()
                    cycles[index] += 1
            except BaseException as exc:  # reported by the test, in its own thread
                failures.append(exc)

        threads = [threading.Thread(target=worker, args=(index,)) for index in range(len(locks))]
        for thread in threads:
            thread.start()
        for move in range(4):
            time.sleep(0.1)
            target = [master for master in cluster.masters if master is not cluster.owner_of(slot)][move % 2]
            cluster.migrate_slot(slot, target)
        time.sleep(0.1)
        running.clear()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
        assert failures == []
        assert min(cycles) > 0


def _threads_at_once(registry: hybridlock.LockRegistry, key: str) -> list[BaseException]:
    """The blocking twin of ``_tasks_at_once``: 8 threads started together; what they raised."""
    semaphore = registry.obtain_semaphore(key, 2)
    lock = registry.obtain(f"{key}-lock")
    start = threading.Barrier(8)
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            start.wait(10)
            for _ in range(3):
                assert semaphore.acquire(timeout=20)
                time.sleep(0.002)
                semaphore.release()
                assert lock.acquire(timeout=20)
                lock.release()
        except BaseException as exc:  # reported by the test, in its own thread
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    return failures


def test_threads_at_once_on_a_new_registry_route_by_slot_and_fail_nothing(cluster, cluster_url):
    # The blocking twin: its client learns the layout when it is made, before any thread calls.
    _reset_statistics(cluster)
    for round_ in range(2):
        with hybridlock.LockRegistry(cluster_url) as registry:
            assert _threads_at_once(registry, f"first-contact{round_}") == []
    assert _moved_replies(cluster) == 0


# -- the ACL ---------------------------------------------------------------------------------------------------------


def test_the_documented_cluster_acl_runs_every_lock_kind():
    from tests.test_acl import LOCK_USER_COMMANDS

    # The ACL of docs/acl.md: the one-server list, with sharded pub/sub instead of the classic one, and what the
    # cluster client sends to learn the layout.
    swapped = {"publish": "spublish", "subscribe": "ssubscribe", "unsubscribe": "sunsubscribe"}
    commands = [swapped.get(command, command) for command in LOCK_USER_COMMANDS] + ["cluster|slots", "command"]
    with EmbeddedCluster(masters=3, replicas=0) as cluster:
        for node in cluster.nodes:
            cluster.command(
                node, "ACL", "SETUSER", "locker", "reset", "on", ">locker-pw", "~hybridlock:*", "&hybridlock:*",
                "-@all", *(f"+{command}" for command in commands),
            )  # fmt: skip
            cluster.command(node, "ACL", "LOG", "RESET")
        url = cluster.url.replace("redis+cluster://", "redis+cluster://locker:locker-pw@")
        keys = keys_on_every_master(cluster, 1, prefix="acl")

        def contended(mine: Any, theirs: Any) -> None:
            assert mine.acquire(timeout=5)
            done = threading.Event()

            def wait() -> None:
                if theirs.acquire(timeout=10):
                    theirs.release()
                    done.set()

            thread = threading.Thread(target=wait)
            thread.start()
            time.sleep(0.5)  # past renewals of the 0.3 s lease, with the waiter subscribed
            assert not getattr(mine, "lost", False)
            mine.release()
            thread.join(15)
            assert done.is_set()

        with (
            hybridlock.LockRegistry(url, expire_after=0.3) as mine,
            hybridlock.LockRegistry(url, expire_after=0.3) as theirs,
        ):
            for key in keys:
                contended(mine.obtain(key), theirs.obtain(key))
                assert not theirs.obtain(key).locked()
            rw_mine, rw_theirs = mine.obtain_read_write("rw"), theirs.obtain_read_write("rw")
            contended(rw_mine.write_lock(), rw_theirs.read_lock())
            contended(rw_mine.read_lock(), rw_theirs.write_lock())
            with mine.obtain_many(keys), mine.obtain_many(["acl}1", "acl}2"]):
                pass
            assert theirs.backend.subscribers  # it waited on sharded pub/sub, not by polling

        async def asyncio_side() -> None:
            # A longer lease than the thread side's: the asyncio cluster client's first use parses the cluster's
            # command table in the event loop (0.1-0.25 s here on a loaded machine), which eats much of a 0.3 s lease
            # counted from the attempt's start, and a first renewal round held up past valid_until now reports the
            # lease lost, as documented.
            async with hybridlock.AsyncLockRegistry(url, expire_after=1.0) as registry:
                lock = registry.obtain(keys[0])
                async with lock:
                    await asyncio.sleep(0.5)  # past a renewal round

        asyncio.run(asyncio_side())
        for node in cluster.nodes:
            client = cluster.client(node)
            try:
                refused = {entry["object"] for entry in client.acl_log()} - {"client|setinfo"}
            finally:
                client.close()
            assert refused == set(), (node.port, refused)


def test_one_nodes_error_fails_only_its_own_leases_in_a_renewal_round(cluster, cluster_url, monkeypatch):
    # A node that answers with an error (here: refused as by CLUSTERDOWN or OOM) must not cost the leases held on
    # the other masters their renewal: theirs are renewed, the failing node's are neither renewed nor known lost.
    with hybridlock.LockRegistry(cluster_url, expire_after=30) as registry:
        locks = [registry.obtain(key) for key in keys_on_every_master(cluster, 2, prefix="err")]
        for lock in locks:
            lock.acquire()
        failing = f"127.0.0.1:{cluster.owner_of(slot_of(locks[0].key)).port}"
        original = sync_cluster.pipeline_on_node

        def refusing(client: Any, node: Any, commands: Any) -> list[Any]:
            if node.name == failing:
                raise redis.exceptions.ResponseError("CLUSTERDOWN The cluster is down (injected)")
            return original(client, node, commands)

        monkeypatch.setattr(sync_cluster, "pipeline_on_node", refusing)
        flags = registry.backend.renew([lock._names for lock in locks], registry.client_id, 30_000)
        monkeypatch.setattr(sync_cluster, "pipeline_on_node", original)
        on_failing = [f"127.0.0.1:{cluster.owner_of(slot_of(lock.key)).port}" == failing for lock in locks]
        assert flags == [None if bad else True for bad in on_failing]
        assert not any(lock.lost for lock in locks)
        for lock in locks:
            lock.release()
