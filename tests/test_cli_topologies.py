"""The command line over every topology a registry takes: ``inspect``, ``list`` and ``release --force`` on a
Sentinel service (its current master), on a cluster (each key at its slot's node) and over a quorum of independent
servers (each server read, a verdict by majority; a force release on every server), and ``run`` over a quorum.
Subprocesses against real servers the suite starts itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import hybridlock
from hybridlock._cli.common import split_server_urls

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
    assert done.returncode == 3, done
    assert "sentinel://locks/2" in done.stderr
    assert "hunter22" not in done.stderr + done.stdout


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
