"""The command line over every topology a registry takes: ``inspect``, ``list`` and ``release --force`` on a
Sentinel service (its current master), on a cluster (each key at its slot's node) and over a quorum of independent
servers (each server read, a verdict by majority; a force release on every server), and ``run`` over a quorum.
Subprocesses against real servers the suite starts itself."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
import redis
from redis.crc import key_slot

import hybridlock
from hybridlock._cli.common import EXIT_FAILED, split_server_urls
from hybridlock.testing.cluster import EmbeddedCluster
from hybridlock.testing.server import EmbeddedServer
from tests._polling import until
from tests.conftest import CLUSTER_PASSWORD, MASTER_PASSWORD, SENTINEL_PASSWORD

pytestmark = [pytest.mark.server, pytest.mark.timeout(120)]

_PY = sys.executable
_SERVICE_NAME = "sentinel://hybridlock-test/0"


def _cli(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    # The servers come from the arguments (or from env): never from the caller's environment.
    base = {k: v for k, v in os.environ.items() if k not in ("HYBRIDLOCK_SERVER_URL", "HYBRIDLOCK_REGISTRY_KEY")}
    return subprocess.run(
        [_PY, "-m", "hybridlock", *args],
        env={**base, **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _servers(urls: list[str]) -> list[str]:
    return [arg for url in urls for arg in ("--server", url)]


def _json(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done
    document: dict[str, Any] = json.loads(done.stdout)
    return document


# -- Sentinel --------------------------------------------------------------------------------------------------------


@pytest.mark.sentinel
def test_sentinel_inspect_and_list_read_the_current_master_and_name_the_service(sentinel_url: str) -> None:
    with hybridlock.LockRegistry(sentinel_url, expire_after=20) as registry:
        lock = registry.obtain("orders:1")
        assert lock.acquire(timeout=5)
        try:
            document = _json(_cli("inspect", "--json", "orders:1", "--server", sentinel_url))
            assert document["server"] == _SERVICE_NAME
            (state,) = document["locks"]
            assert state["held"] is True
            assert state["holder"]["owner"] == registry.client_id
            assert state["fencing_counter"] == lock.fencing_token

            listed = _json(_cli("list", "--json", "orders:*", HYBRIDLOCK_SERVER_URL=sentinel_url))
            assert [(entry["key"], entry["holder"]["owner"]) for entry in listed["locks"]] == [
                ("orders:1", registry.client_id)
            ]
            text = _cli("list", "--server", sentinel_url)
            assert text.returncode == 0, text
            assert f"orders:1 [lock]: held by {registry.client_id}" in text.stdout
        finally:
            lock.release()


@pytest.mark.sentinel
def test_sentinel_force_release_frees_the_lock_on_the_master(sentinel_url: str) -> None:
    with (
        hybridlock.LockRegistry(sentinel_url, expire_after=20) as holder,
        hybridlock.LockRegistry(sentinel_url, expire_after=20) as rival,
    ):
        lock = holder.obtain("stuck")
        assert lock.acquire(timeout=5)
        assert not rival.obtain("stuck").acquire(blocking=False)
        done = _cli("release", "--force", "--yes", "stuck", "--server", sentinel_url)
        assert done.returncode == 0, done
        assert f"was held by {holder.client_id}" in done.stdout
        taken = rival.obtain("stuck")
        assert taken.acquire(timeout=5), "the force release did not free the lock on the master"
        taken.release()
        with pytest.raises(hybridlock.LockLostError):
            lock.release()


@pytest.mark.parametrize("command", [["inspect", "k"], ["list"], ["release", "--force", "--yes", "k"]])
def test_an_unreachable_sentinel_service_is_named_by_its_service_never_its_password(command: list[str]) -> None:
    # Nothing listens on port 1: the sentinels cannot be asked for the master.
    url = "redis+sentinel://:hunter22@127.0.0.1:1/locks/2"
    done = _cli(*command, "--server", url)
    assert done.returncode == EXIT_FAILED, done
    assert "sentinel://locks/2" in done.stderr
    assert "hunter22" not in done.stderr + done.stdout


# -- cluster ---------------------------------------------------------------------------------------------------------


def _keys_on_every_master(cluster: EmbeddedCluster, per_master: int) -> dict[int, list[str]]:
    """Lock keys whose locks lie on each master (by port), ``per_master`` on each."""
    ranges = [(int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in cluster.command(cluster.masters[0],
              "CLUSTER", "SLOTS")]  # fmt: skip
    found: dict[int, list[str]] = {port: [] for _, _, port in ranges}
    index = 0
    while min(len(keys) for keys in found.values()) < per_master:
        key = f"job{index}"
        index += 1
        slot = key_slot(f"hybridlock:{{{key}}}".encode())
        port = next(port for low, high, port in ranges if low <= slot <= high)
        if len(found[port]) < per_master:
            found[port].append(key)
    return found


@pytest.mark.cluster
def test_cluster_list_scans_every_master_and_inspect_reads_each_keys_node(
    cluster: EmbeddedCluster, cluster_url: str
) -> None:
    by_master = _keys_on_every_master(cluster, 2)
    keys = sorted(key for keys in by_master.values() for key in keys)
    with hybridlock.LockRegistry(cluster_url, expire_after=20) as registry:
        locks = [registry.obtain(key) for key in keys]
        for lock in locks:
            assert lock.acquire(timeout=5)
        try:
            listed = _json(_cli("list", "--json", "--server", cluster_url))
            assert listed["server"] == cluster_url
            assert [entry["key"] for entry in listed["locks"]] == keys, "list missed a master's locks"
            assert {entry["holder"]["owner"] for entry in listed["locks"]} == {registry.client_id}

            def described() -> dict[str, Any] | None:
                # Each owner describes itself a second after its first lease (its hash lies in a slot of its own).
                document = _json(_cli("inspect", "--json", *keys, "--server", cluster_url))
                return document if all(entry["holder"]["host"] for entry in document["locks"]) else None

            inspected = until(described, "the owner's description")
            tokens = {entry["key"]: entry["fencing_counter"] for entry in inspected["locks"]}
            assert tokens == {lock.key: lock.fencing_token for lock in locks}
            assert all(0 < entry["lease_remaining_ms"] <= 20_000 for entry in inspected["locks"])
            assert {entry["holder"]["pid"] for entry in inspected["locks"]} == {os.getpid()}

            text = _cli("list", "job*", HYBRIDLOCK_SERVER_URL=cluster_url)
            assert text.returncode == 0, text
            assert text.stdout.count(f"held by {registry.client_id}") == len(keys)
        finally:
            for lock in locks:
                lock.release()


@pytest.mark.cluster
def test_cluster_list_and_inspect_find_semaphores_on_every_master(cluster: EmbeddedCluster, cluster_url: str) -> None:
    keys = sorted(keys[0] for keys in _keys_on_every_master(cluster, 1).values())
    with hybridlock.LockRegistry(cluster_url, expire_after=20) as registry:
        semaphores = [registry.obtain_semaphore(key, permits=3) for key in keys]
        for semaphore in semaphores:
            assert semaphore.acquire(timeout=5)
        try:
            listed = _json(_cli("list", "--json", "--server", cluster_url))
            assert [(entry["key"], entry["kind"]) for entry in listed["locks"]] == [(k, "semaphore") for k in keys]
            inspected = _json(_cli("inspect", "--semaphore", "--json", *keys, "--server", cluster_url))
            for entry in inspected["locks"]:
                assert entry["permits"] == 3
                assert entry["held"] == 1
                assert [holder["owner"] for holder in entry["holders"]] == [registry.client_id]
        finally:
            for semaphore in semaphores:
                semaphore.release()


@pytest.mark.cluster
def test_cluster_force_release_goes_to_the_keys_node_and_the_waiter_takes_it(
    cluster: EmbeddedCluster, cluster_url: str
) -> None:
    # A key on the last master, so that a release sent to the first node the URL names would not find it.
    key = _keys_on_every_master(cluster, 1)[cluster.masters[-1].port][0]
    with (
        hybridlock.LockRegistry(cluster_url, expire_after=20) as holder,
        hybridlock.LockRegistry(cluster_url, expire_after=20) as rival,
    ):
        lock = holder.obtain(key)
        assert lock.acquire(timeout=5)
        assert not rival.obtain(key).acquire(blocking=False)
        done = _cli("release", "--force", "--yes", key, "--server", cluster_url)
        assert done.returncode == 0, done
        assert f"was held by {holder.client_id}" in done.stdout
        taken = rival.obtain(key)
        assert taken.acquire(timeout=5), "the force release did not free the lock on its node"
        taken.release()
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
        assert _cli("release", "--force", "--yes", key, "--server", cluster_url).returncode == 1


# -- a quorum --------------------------------------------------------------------------------------------------------


def _delete_holder(url: str, key: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.delete(f"hybridlock:{{{key}}}")


@pytest.mark.quorum
def test_quorum_inspect_gives_the_verdict_by_majority_with_each_servers_holder(
    quorum_servers: list[EmbeddedServer],
) -> None:
    urls = [srv.url for srv in quorum_servers]
    n, needed = len(urls), len(urls) // 2 + 1
    with hybridlock.QuorumLockRegistry(urls, expire_after=30) as registry:
        lock = registry.obtain("job")
        assert lock.acquire(timeout=5)
        try:
            document = _json(_cli("inspect", "--json", "job", *_servers(urls)))
            assert document["majority"] == needed
            assert document["unreachable"] == []
            (state,) = document["locks"]
            assert (state["held"], state["holder"], state["holding_servers"]) == (True, registry.client_id, n)
            assert [entry["lock"]["holder"]["owner"] for entry in state["servers"]] == [registry.client_id] * n
            assert max(entry["lock"]["fencing_counter"] for entry in state["servers"]) == lock.fencing_token

            def described() -> dict[str, Any] | None:
                # The owner describes itself on every server a second after its first lease.
                (state,) = _json(_cli("inspect", "--json", "job", *_servers(urls)))["locks"]
                holders = [entry["lock"]["holder"] for entry in state["servers"]]
                return state if all(holder and holder["host"] for holder in holders) else None

            described_state = until(described, "the owner's description on every server")
            assert {entry["lock"]["holder"]["pid"] for entry in described_state["servers"]} == {os.getpid()}

            # The lease gone from a minority: still held, on a bare majority.
            for url in urls[: n - needed]:
                _delete_holder(url, "job")
            text = _cli("inspect", "job", *_servers(urls))
            assert text.returncode == 0, text
            assert f"held by {registry.client_id} on {needed} of {n} servers" in text.stdout
            assert text.stdout.count(": free;") == n - needed

            # From one more: no majority holds it, whoever still holds it somewhere.
            _delete_holder(urls[n - needed], "job")
            (state,) = _json(_cli("inspect", "--json", "job", *_servers(urls)))["locks"]
            assert (state["held"], state["holder"]) == (False, None)
            assert state["verdict"].startswith("not held (no majority")
            listed = _cli("list", *_servers(urls))
            assert listed.returncode == 0, listed
            assert "job [lock]: not held (no majority" in listed.stdout
            (entry,) = _json(_cli("list", "--json", *_servers(urls)))["locks"]
            assert [server["server"] for server in entry["servers"]] == urls
            holders = [server["lock"]["holder"] for server in entry["servers"]]
            assert [holder["owner"] if holder else None for holder in holders] == [None] * (needed) + [
                registry.client_id
            ] * (n - needed)
        finally:
            with contextlib.suppress(hybridlock.LockLostError):
                lock.release()


@pytest.mark.quorum
def test_quorum_inspect_and_list_answer_with_a_server_down_and_fail_without_a_majority(
    quorum_servers: list[EmbeddedServer],
) -> None:
    urls = [srv.url for srv in quorum_servers]
    n, needed = len(urls), len(urls) // 2 + 1
    with hybridlock.QuorumLockRegistry(urls, expire_after=30) as registry:
        lock = registry.obtain("job")
        assert lock.acquire(timeout=5)
        try:
            quorum_servers[0].kill()
            document = _json(_cli("inspect", "--json", "job", *_servers(urls)))
            assert [entry["server"] for entry in document["unreachable"]] == [urls[0]]
            assert "Connection refused" in document["unreachable"][0]["error"]
            (state,) = document["locks"]
            assert (state["held"], state["holder"], state["holding_servers"]) == (True, registry.client_id, n - 1)
            assert state["servers"][0]["reachable"] is False
            assert "Connection refused" in state["servers"][0]["error"]

            listed = _cli("list", *_servers(urls))
            assert listed.returncode == 0, listed
            assert f"job [lock]: held by {registry.client_id} on {n - 1} of {n} servers" in listed.stdout
            assert f"unreachable, counted as not holding: server {urls[0]}" in listed.stderr

            for srv in quorum_servers[1 : n - needed + 1]:
                srv.kill()
            for command in (["inspect", "job"], ["list"], ["release", "--force", "--yes", "job"]):
                failed = _cli(*command, *_servers(urls))
                assert failed.returncode == EXIT_FAILED, failed
                assert f"fewer than a majority ({needed} of {n})" in failed.stderr
        finally:
            with contextlib.suppress(hybridlock.HybridLockError):
                lock.release()


@pytest.mark.quorum
def test_quorum_force_release_frees_every_server_and_another_owner_takes_it_at_once(
    quorum_servers: list[EmbeddedServer],
) -> None:
    urls = [srv.url for srv in quorum_servers]
    with (
        hybridlock.QuorumLockRegistry(urls, expire_after=30) as holder,
        hybridlock.QuorumLockRegistry(urls, expire_after=30) as rival,
    ):
        lock = holder.obtain("stuck")
        assert lock.acquire(timeout=5)
        assert not rival.obtain("stuck").acquire(blocking=False)
        # The environment variable lists the servers too, by commas and spaces.
        listed = ",".join(urls[:2]) + " " + " ".join(urls[2:])
        done = _cli("release", "--force", "--yes", "stuck", HYBRIDLOCK_SERVER_URL=listed)
        assert done.returncode == 0, done
        assert f"released 'stuck' on {len(urls)} of {len(urls)} servers" in done.stdout
        assert done.stdout.count(f"released (was held by {holder.client_id}") == len(urls)
        started = time.monotonic()
        taken = rival.obtain("stuck")
        assert taken.acquire(timeout=10), "the force release did not free the lock"
        assert time.monotonic() - started < 5, "the rival waited for the lease, not the release"
        taken.release()
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
        again = _cli("release", "--force", "--yes", "stuck", *_servers(urls))
        assert again.returncode == 1, again
        assert "held on none" in again.stderr


@pytest.mark.quorum
def test_quorum_force_release_refused_by_every_holding_server_is_a_server_failure(
    quorum_servers: list[EmbeddedServer],
) -> None:
    urls = [srv.url for srv in quorum_servers]
    with hybridlock.QuorumLockRegistry(urls, expire_after=30) as holder:
        lock = holder.obtain("stuck")
        assert lock.acquire(timeout=5)
        for url in urls:  # every server now refuses writes (NOREPLICAS): the release script cannot delete
            with redis.Redis.from_url(url) as client:
                client.config_set("min-replicas-to-write", 1)
        try:
            done = _cli("release", "--force", "--yes", "stuck", *_servers(urls))
            assert done.returncode == EXIT_FAILED, done  # not 1: the lock is held, the servers refused
            assert done.stdout.count("not released") == len(urls)
        finally:
            for url in urls:
                with redis.Redis.from_url(url) as client:
                    client.config_set("min-replicas-to-write", 0)
        lock.release()


@pytest.mark.quorum
def test_quorum_run_holds_the_lock_on_every_server_while_the_command_runs(
    quorum_urls: list[str], tmp_path: Any
) -> None:
    go = tmp_path / "go"
    waiting = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    with hybridlock.QuorumLockRegistry(quorum_urls, expire_after=30) as rival:
        child = subprocess.Popen(
            [_PY, "-m", "hybridlock", "run", *_servers(quorum_urls), "job", "--", _PY, "-c", waiting],
            env={k: v for k, v in os.environ.items() if k != "HYBRIDLOCK_SERVER_URL"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def held() -> dict[str, Any] | None:
                assert child.poll() is None, child.communicate()
                (state,) = _json(_cli("inspect", "--json", "job", *_servers(quorum_urls)))["locks"]
                return state if state["held"] else None

            state = until(held, "run to take the lock")
            assert state["holding_servers"] == len(quorum_urls)
            assert not rival.obtain("job").acquire(blocking=False)
            go.touch()
            out, err = child.communicate(timeout=30)
            assert child.returncode == 0, (out, err)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate(timeout=30)
        taken = rival.obtain("job")
        assert taken.acquire(timeout=5)
        taken.release()


@pytest.mark.parametrize(
    "command",
    [["inspect", "k"], ["list"], ["release", "--force", "--yes", "k"], ["run", "k", "--", "true"]],
    ids=["inspect", "list", "release", "run"],
)
def test_a_server_twice_or_a_cluster_in_a_quorum_is_a_usage_error(command: list[str]) -> None:
    # No server is reached: the list is refused first. (The options come before KEY: run's CMD takes the rest.)
    def cli(*servers: str, **env: str) -> subprocess.CompletedProcess[str]:
        return _cli(command[0], *servers, *command[1:], **env)

    twice = cli("--server", "redis://:hunter22@127.0.0.1:1", "--server", "redis://127.0.0.1:1/0")
    assert twice.returncode == 2, twice
    assert "a quorum's servers must be distinct" in twice.stderr
    assert "hunter22" not in twice.stderr
    clustered = cli("--server", "redis://127.0.0.1:1", "--server", "redis+cluster://:hunter22@127.0.0.1:2,127.0.0.1:3")
    assert clustered.returncode == 2, clustered
    assert "redis+cluster://:***@127.0.0.1:2,127.0.0.1:3 is a cluster: a quorum is made of independent" in (
        clustered.stderr
    )
    assert "hunter22" not in clustered.stderr
    same_by_env = cli(HYBRIDLOCK_SERVER_URL="redis://127.0.0.1:1 redis://127.0.0.1:1")
    assert same_by_env.returncode == 2, same_by_env
    assert "must be distinct" in same_by_env.stderr


@pytest.mark.parametrize(
    "command", [["inspect", "--read-write", "k"], ["release", "--force", "-y", "--read-write", "k"]]
)
def test_read_write_locks_over_a_quorum_are_a_usage_error(command: list[str]) -> None:
    done = _cli(*command, "--server", "redis://127.0.0.1:1", "--server", "redis://127.0.0.1:2")
    assert done.returncode == 2, done
    assert "read-write locks are not available over a quorum" in done.stderr


# -- the list of servers (no server) ---------------------------------------------------------------------------------


def test_the_environment_lists_urls_by_spaces_or_by_commas_where_a_url_starts() -> None:
    assert split_server_urls(" redis://a:1  redis://b:2\n") == ["redis://a:1", "redis://b:2"]
    assert split_server_urls("redis://a:1,redis://b:2, rediss://c:3") == ["redis://a:1", "redis://b:2", "rediss://c:3"]
    # A comma between hosts stays in its URL: sentinel and cluster URLs list their hosts so.
    assert split_server_urls("redis+sentinel://h1,h2:26380/svc,redis://c:3") == [
        "redis+sentinel://h1,h2:26380/svc",
        "redis://c:3",
    ]
    assert split_server_urls("redis+cluster://h1:7000,h2:7001") == ["redis+cluster://h1:7000,h2:7001"]
    assert split_server_urls("  ") == []


# -- refused logins ----------------------------------------------------------------------------------------------


def _refused(done: subprocess.CompletedProcess[str], status: int, *parts: str) -> None:
    assert done.returncode == status, done
    assert "authentication failed" in done.stderr, done.stderr
    for part in parts:
        assert part in done.stderr, done.stderr
    for secret in ("wrong-pw-e28b", MASTER_PASSWORD, SENTINEL_PASSWORD, CLUSTER_PASSWORD):
        assert secret not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.sentinel
def test_a_sentinel_service_refusing_the_login_is_told_whose_password_is_missing(protected_sentinel: Any) -> None:
    hosts = protected_sentinel.url().removeprefix("redis+sentinel://")
    no_master_password = f"redis+sentinel://{hosts}?sentinel_password={SENTINEL_PASSWORD}"
    no_sentinel_password = f"redis+sentinel://:{MASTER_PASSWORD}@{hosts}"
    for command, status in ((["inspect", "k"], EXIT_FAILED), (["run", "k", "--", "true"], EXIT_FAILED)):
        done = _cli(command[0], "--server", no_master_password, *command[1:])
        _refused(done, status, "the master of", "no password was given")
        done = _cli(command[0], "--server", no_sentinel_password, *command[1:])
        _refused(done, status, "the sentinels of", "sentinel_password=")


@pytest.mark.cluster
def test_a_cluster_refusing_the_login_is_told_so(protected_cluster: EmbeddedCluster) -> None:
    url = protected_cluster.url.replace("redis+cluster://", "redis+cluster://:wrong-pw-e28b@")
    for command, status in (
        (["inspect", "k"], EXIT_FAILED),
        (["list"], EXIT_FAILED),
        (["run", "k", "--", "true"], EXIT_FAILED),
    ):
        done = _cli(command[0], "--server", url, *command[1:])
        _refused(done, status, "the password given was refused", "redis+cluster://user")


def test_a_quorum_refusing_the_login_is_told_so() -> None:
    servers = [EmbeddedServer(extra_args=("--requirepass", MASTER_PASSWORD)).start() for _ in range(3)]
    try:
        for command, status in ((["inspect", "k"], EXIT_FAILED), (["run", "k", "--", "true"], EXIT_FAILED)):
            done = _cli(command[0], *_servers([server.url for server in servers]), *command[1:])
            _refused(done, status, "for user 'default'", "no password was given")
    finally:
        for server in servers:
            server.stop()
