"""A leader's ``yield_leadership()`` from another thread racing the leader's own step-down (its lease found lost).

The yield is asked for the term that is ending: the step-down serves it, and none is left pending for the next
term. Before, the asking thread could look (leading), then the worker stepped down, and then the ask landed: the
candidate's next acquisition was let go at once as "asked to yield while waiting", a term skipped (issue 33's
review). The interleaving is forced: the asking thread's look at ``_leading`` waits for the step-down to finish
(or, where the look and the step-down exclude each other, for a while, then goes on).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import hybridlock
from hybridlock.testing import EmbeddedServer

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def _until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_a_yield_racing_the_leaders_own_step_down_is_served_by_it_and_skips_no_term(
    server: EmbeddedServer, redis_client: Any
) -> None:
    with hybridlock.LockRegistry(server.url, expire_after=1.5) as registry:
        elected: list[int | None] = []
        election = registry.leader_election("race", on_elected=elected.append)
        lock = election._lock
        taken: list[bool] = []
        acquire = lock.acquire

        def counted_acquire(*args: Any, **kwargs: Any) -> bool:
            got = acquire(*args, **kwargs)
            if got:
                taken.append(True)
            return got

        lock.acquire = counted_acquire  # type: ignore[method-assign]
        asking: list[int] = []

        class Racing(type(election)):  # type: ignore[misc]
            @property
            def _leading(self) -> bool:
                leading = self.__dict__["_leading_flag"]
                if leading and asking and threading.get_ident() == asking[0]:
                    asking.clear()
                    # The term ends by itself right after this look: its key is deleted, the renewer finds the
                    # lease lost and the worker steps down (or waits for this look, where they exclude each other).
                    ended = self._terms_ended
                    redis_client.delete(lock._names.lock)
                    deadline = time.monotonic() + 3.0
                    while self._terms_ended == ended and time.monotonic() < deadline:
                        time.sleep(0.005)
                return leading

            @_leading.setter
            def _leading(self, value: bool) -> None:
                self.__dict__["_leading_flag"] = value

        election.__dict__["_leading_flag"] = election.__dict__.pop("_leading")
        election.__class__ = Racing
        election.start()
        try:
            _until(lambda: election.is_leader, 10, "the first term")

            def ask() -> None:
                asking.append(threading.get_ident())
                election.yield_leadership(pause=0.0)

            asker = threading.Thread(target=ask)
            asker.start()
            asker.join(20)
            assert not asker.is_alive()
            _until(lambda: len(elected) == 2, 10, "the next term")
            time.sleep(0.3)
            assert election._yield_for is None, "a yield was left pending past the term it was asked for"
            assert election.is_leader
            assert len(elected) == 2, f"terms {elected}: the yield asked for the term that ended ended the next one"
            assert len(taken) == 2, f"{len(taken)} acquisitions for 2 terms: one let go as if asked to yield"
        finally:
            election.stop()
