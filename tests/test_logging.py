"""hybridlock's logging: the logger names are the documented set, and trouble is logged once, not once per round.

The Logging table of docs/metrics.md lists every logger the library uses; the first test holds the code to it.
The others drive a real server through an outage (killed, then restarted empty) with several locks held, and count
the records: one WARNING from the renewer for the whole streak of failed rounds, one when rounds work again, and
one loss WARNING per lock.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from pathlib import Path
from typing import Any

import pytest

import hybridlock
from hybridlock.backends import MemoryBackend
from hybridlock.metrics import LockObserver, RenewalEvent
from hybridlock.testing.server import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent
JOIN = 10.0


def _logger_names_in_code() -> set[str]:
    names = set()
    for path in (ROOT / "hybridlock").rglob("*.py"):
        names.update(re.findall(r'logging\.getLogger\("([^"]+)"\)', path.read_text(encoding="utf-8")))
    return names


def test_every_logger_is_a_documented_child_of_hybridlock() -> None:
    in_code = _logger_names_in_code()
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    table = re.split(r"\n##+ ", page.split("\n## Logging\n", 1)[1], maxsplit=1)[0]
    documented = set(re.findall(r"^\| `(hybridlock\.[a-z_]+)` \|", table, flags=re.MULTILINE))
    assert in_code == documented
    assert all(name.startswith("hybridlock.") for name in in_code)
    assert not [p for p in (ROOT / "hybridlock").rglob("*.py") if "getLogger(__name__)" in p.read_text()]


class Rounds(LockObserver):
    def __init__(self) -> None:
        self.failed = 0
        self.ok = 0

    def on_renewal(self, event: RenewalEvent) -> None:
        if event.error is None:
            self.ok += 1
        else:
            self.failed += 1


def until(predicate: object, what: str, within: float = JOIN) -> None:
    deadline = time.monotonic() + within
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.server
def test_an_outage_is_logged_once_for_the_renewer_and_once_per_lost_lock(
    own_server: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="hybridlock")
    rounds = Rounds()
    # A lease of 1.2 s is renewed every 0.4 s; failed rounds retry at that period (or at the leases' end).
    with hybridlock.LockRegistry(own_server.url, expire_after=1.2, observer=rounds) as registry:
        locks = [registry.obtain(f"job:{n}") for n in range(3)]
        for lock in locks:
            assert lock.acquire()
        until(lambda: rounds.ok >= 1, "a first renewal round")
        own_server.kill()
        until(lambda: rounds.failed >= 2, "two failed rounds")
        until(lambda: all(lock.lost for lock in locks), "the unrenewed leases to be reported lost")
        own_server.restart()  # empty, as after a crash
        fresh = registry.obtain("job:fresh")
        assert fresh.acquire(timeout=JOIN)
        until(lambda: rounds.ok >= 2, "a round that reached the server again")
        fresh.release()
        for lock in locks:
            with pytest.raises(hybridlock.LockLostError):
                lock.release()
    records = [r for r in caplog.records if r.name.startswith("hybridlock")]
    renewer = [r for r in records if r.name == "hybridlock.renewer" and r.levelno >= logging.WARNING]
    assert len(renewer) == 2, [r.getMessage() for r in renewer]
    assert "failed" in renewer[0].getMessage()
    # Issue 34: an expected event, so one line naming its cause (it had a 60-line traceback), which is at DEBUG.
    assert renewer[0].exc_info is None
    assert "BackendUnavailableError: " in renewer[0].getMessage()
    assert "\n" not in renewer[0].getMessage()
    traced = [r for r in records if r.name == "hybridlock.renewer" and r.levelno == logging.DEBUG and r.exc_info]
    assert len(traced) == 1, [r.getMessage() for r in traced]
    assert "works again" in renewer[1].getMessage()
    losses = [r for r in records if r.name == "hybridlock.lock" and "was lost while held" in r.getMessage()]
    assert sorted(r.getMessage().split("'")[1] for r in losses) == ["job:0", "job:1", "job:2"]
    assert all(r.levelno == logging.WARNING for r in losses)
    assert rounds.failed >= 2  # more failed rounds than log lines


class _BrokenRenewals(MemoryBackend):
    """Renewals fail with an error that is no hybridlock error: a bug, not an expected event."""

    def renew(self, names: Any, owner: str, lease_ms: int) -> list[bool]:
        raise ZeroDivisionError("a bug in a renewal")


def test_a_renewal_that_fails_with_no_hybridlock_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="hybridlock")
    rounds = Rounds()
    with hybridlock.LockRegistry(_BrokenRenewals(), expire_after=3.0, observer=rounds) as registry:
        lock = registry.obtain("k")
        assert lock.acquire()
        until(lambda: rounds.failed >= 1, "a failed round (a period: 1 s)")
        with contextlib.suppress(hybridlock.LockLostError):  # (on a machine slow enough for the lease to end)
            lock.release()
    renewer = [r for r in caplog.records if r.name == "hybridlock.renewer" and r.levelno >= logging.WARNING]
    assert renewer, "no warning"
    assert "ZeroDivisionError: a bug in a renewal" in renewer[0].getMessage()
    assert renewer[0].exc_info is not None
