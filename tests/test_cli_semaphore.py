"""``hybridlock inspect --semaphore`` and ``hybridlock list`` for semaphores (``registry.obtain_semaphore``): each
permit's holder with its lease, the limit, the fencing counter and the queue in order; ``list`` shows a semaphore
while a permit is held or someone waits, as it shows a lock."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from hybridlock._cli.common import EXIT_USAGE
from tests._polling import until
from tests.test_cli import _cli

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def _json(server: Any, *args: str) -> list[dict[str, Any]]:
    result = _cli(server, *args, "--json")
    assert result.returncode == 0, result.stderr
    locks: list[dict[str, Any]] = json.loads(result.stdout)["locks"]
    return locks


def test_inspect_and_list_show_each_permits_holder_and_the_queue(server, make_registry):
    holder, waiter = make_registry(expire_after=5.0), make_registry()
    semaphore = holder.obtain_semaphore("api", permits=2)
    assert semaphore.acquire(timeout=10)
    assert semaphore.acquire(timeout=10)  # both permits, to this thread
    other = waiter.obtain_semaphore("api", permits=2)
    got = threading.Event()

    def wait_for_a_permit() -> None:
        if other.acquire(timeout=30):
            got.set()
            other.release()

    waiting = threading.Thread(target=wait_for_a_permit)
    waiting.start()
    try:
        until(lambda: _json(server, "inspect", "--semaphore", "api")[0]["waiting"], what="the waiter to queue")
        (state,) = _json(server, "inspect", "--semaphore", "api")
        assert state["kind"] == "semaphore"
        assert state["permits"] == 2
        assert state["held"] == 2
        assert {h["permit"] for h in state["holders"]} == {0, 1}
        assert {h["owner"] for h in state["holders"]} == {holder.client_id}
        assert all(0 < h["lease_remaining_ms"] <= 5000 for h in state["holders"])
        assert [w["owner"] for w in state["waiting"]] == [waiter.client_id]
        assert state["fencing_counter"] > 0

        text = _cli(server, "inspect", "--semaphore", "api").stdout
        assert "2 of 2 held" in text
        assert "permit 0:" in text
        assert "permit 1:" in text
        assert "waiting 1:" in text

        listed = {(lock["key"], lock["kind"]): lock for lock in _json(server, "list")}
        assert listed[("api", "semaphore")]["held"] == 2
        assert "api [semaphore]: 2 of 2 held; 1 waiting" in _cli(server, "list").stdout
    finally:
        semaphore.release()
        semaphore.release()
        waiting.join(30)
    assert got.is_set()
    # Nothing held, nobody waiting: no longer listed (its config outlives its permits), still inspectable.
    assert ("api", "semaphore") not in {(lock["key"], lock["kind"]) for lock in _json(server, "list")}
    assert _json(server, "inspect", "--semaphore", "api")[0]["held"] == 0


def test_a_quorum_has_no_semaphores_to_inspect(server):
    # Refused before any server is asked (the second is not even there).
    refused = _cli(server, "inspect", "--semaphore", "--server", server.url, "--server", "redis://127.0.0.1:2", "k")
    assert refused.returncode == EXIT_USAGE, refused.stderr
    assert "no semaphores" in refused.stderr
