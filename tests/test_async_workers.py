"""The asyncio workers (``hybridlock/_async/``: renewer, retention reaper, wait keeper) against a small fake context:
they work, end when idle, come back on demand, survive failures, and stop() leaves no task behind.

The sync workers are generated from the same source and pinned by the rest of the suite (test_leases.py,
test_retention.py, test_waiting_places.py). Plain asyncio.run, each test bounded in time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import pytest

from hybridlock._async import retention as retention_module
from hybridlock._async import wait_keeper as keeper_module
from hybridlock._async._compat import monotonic
from hybridlock._async.renewer import LeaseRenewer
from hybridlock._async.retention import RetentionReaper
from hybridlock._async.wait_keeper import WaitKeeper
from hybridlock._core.config import RegistryConfig
from hybridlock._core.names import LockNames, lock_names
from hybridlock.errors import BackendUnavailableError

T = TypeVar("T")

LIMIT = 10.0  # seconds any one test may take
LEASE = 0.3  # seconds: the fake registry renews every 0.1 s


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        result = await asyncio.wait_for(coro, LIMIT)
        # Whatever the test did, the workers it started must all have ended by now.
        assert asyncio.all_tasks() == {asyncio.current_task()}, asyncio.all_tasks()
        return result

    return asyncio.run(bounded())


async def until(predicate: Callable[[], object], what: str, within: float = LIMIT / 2) -> float:
    """Let the loop run until ``predicate()`` holds; return how long that took."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)
    return time.monotonic() - start


def worker_tasks() -> list[str]:
    return sorted(task.get_name() for task in asyncio.all_tasks() if task.get_name().startswith("hybridlock-"))


# -- the fake context -----------------------------------------------------------------------------------------------


class FakeLease:
    """A held lease as the renewer sees it."""

    def __init__(self, key: str, valid_for: float = LEASE) -> None:
        self._names = lock_names("test", key)
        self._tenancy = 1
        self._acquired_at: float | None = monotonic()
        self._valid_until: float | None = self._acquired_at + valid_for
        self._retained_until: float | None = None
        self._giving_back = False
        self._hold_until: float | None = None  # (run_once's at_most_for: none here)
        self.lost = False
        self.renewed = 0
        self._abandoned = False
        self._abandoned_by: tuple[object, object] | None = None
        self.holder_gone = False  # set by a test: the holder ended without releasing (owners.py)
        self.ended = 0  # how often the worker ended it as abandoned
        self.key = key

    def _find_abandoned(self) -> list[tuple[object, object]]:
        if not self.holder_gone or self._abandoned:
            return []
        self._abandoned = True
        self._abandoned_by = ("the holder", None)
        return [self._abandoned_by]

    async def _end_abandoned(self) -> None:
        await asyncio.sleep(0)  # the real lock gives the lease back here
        self.ended += 1

    def _renewed(self, tenancy: int, start: float, lease: float | None = None) -> None:
        if tenancy == self._tenancy:
            self.renewed += 1
            self._valid_until = start + (lease or LEASE)

    async def _mark_lost(self, tenancy: int) -> None:
        await asyncio.sleep(0)  # the real lock may wait for its local mutex here
        if tenancy == self._tenancy and not self.lost:
            self.lost = True
            self._valid_until = None


class FakeLeases:
    def __init__(self) -> None:
        self.held: list[FakeLease] = []

    def __bool__(self) -> bool:
        return bool(self.held)

    def in_server(self) -> list[FakeLease]:
        return list(self.held)


class FakeBackend:
    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.refused: set[str] = set()  # keys whose renewal finds them gone
        self.renewals: list[list[str]] = []
        self.refreshes: list[list[str]] = []

    async def renew(self, names: Sequence[LockNames], owner: str, lease_ms: int) -> list[bool]:
        self.renewals.append([n.key for n in names])
        await asyncio.sleep(0.001)  # a round trip
        if self.error is not None:
            raise self.error
        return [n.key not in self.refused for n in names]

    async def keep_waiting(
        self, names: Sequence[LockNames], owner: str, places: Sequence[str | None] | None = None
    ) -> list[bool]:
        self.refreshes.append([n.key for n in names])
        await asyncio.sleep(0.001)
        if self.error is not None:
            raise self.error
        return [True for _ in names]


class FakeContext:
    def __init__(self, **options: Any) -> None:
        self.config = RegistryConfig.checked("test", LEASE, **options)
        self.leases = FakeLeases()
        self.backend = FakeBackend()
        self.client_id = "me"
        self.server = "fake"
        self.observer = None  # (LockContext's instrumentation hook: none here)
        self.describer = FakeDescriber()


class FakeDescriber:
    """The owner description the renewer's worker writes after its rounds (``OwnerDescriber``): counted, not sent."""

    def __init__(self) -> None:
        self.calls = 0

    async def describe(self) -> None:
        self.calls += 1


class FakeRetainedLock:
    """A lock as the reaper sees it: ``_end_retention`` gives the lease back, or says it is busy ``busy`` times."""

    def __init__(self, key: str, busy: int = 0) -> None:
        self.key = key
        self._retained_until: float | None = None
        self.wanted = False
        self.busy = busy
        self.ended_at: float | None = None

    def _wanted_elsewhere(self) -> bool:
        return self.wanted

    async def _end_retention(self) -> bool:
        await asyncio.sleep(0)  # the real lock sends a release
        if self.busy:
            self.busy -= 1
            return False
        if self._retained_until is not None:
            self._retained_until = None
            self.ended_at = monotonic()
        return True


# -- the renewer ----------------------------------------------------------------------------------------------------


def test_the_renewer_renews_idles_out_and_comes_back() -> None:
    async def main() -> None:
        context = FakeContext()
        renewer = LeaseRenewer(context)
        lease = FakeLease("a")
        for _ in range(2):  # the second time: a worker that ended starts again
            context.leases.held.append(lease)
            renewer.ensure_started()
            worker = renewer._worker
            assert worker is not None
            assert worker.running
            renewer.ensure_started()
            assert renewer._worker is worker  # one worker per registry
            rounds = renewer.rounds
            await until(lambda rounds=rounds: renewer.rounds >= rounds + 3, "three rounds")
            assert not lease.lost
            assert lease._valid_until is not None
            assert lease._valid_until > monotonic()
            assert renewer._worker is worker
            context.leases.held.remove(lease)
            renewer.nothing_held()
            # It lingers a moment (a quick re-acquire reuses it), then ends.
            took = await until(lambda worker=worker: not worker.running, "the idle worker to end", within=1.0)
            assert 0.1 <= took <= 0.5, took
        assert all(keys == ["a"] for keys in context.backend.renewals)
        await renewer.stop()
        renewer.ensure_started()  # a stopped renewer starts nothing
        assert renewer._worker is worker

    run(main())


def test_a_lease_taken_while_lingering_is_renewed_by_the_same_worker() -> None:
    async def main() -> None:
        context = FakeContext()
        renewer = LeaseRenewer(context)
        first = FakeLease("a")
        context.leases.held.append(first)
        renewer.ensure_started()
        worker = renewer._worker
        context.leases.held.remove(first)
        renewer.nothing_held()
        await asyncio.sleep(0.05)  # lingering
        second = FakeLease("b")
        context.leases.held.append(second)
        renewer.ensure_started()
        assert renewer._worker is worker
        await until(lambda: second.renewed >= 2, "the new lease's renewals")
        assert worker is not None
        assert worker.running
        await renewer.stop()
        assert not worker.running

    run(main())


def test_a_failing_round_is_retried_logged_once_and_marks_lost_what_ended(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        context = FakeContext()
        renewer = LeaseRenewer(context)
        doomed, other = FakeLease("doomed"), FakeLease("other")
        context.leases.held += [doomed, other]
        renewer.ensure_started()
        worker = renewer._worker
        await until(lambda: renewer.rounds >= 1, "a first round")
        context.backend.error = RuntimeError("a bug in the client")
        failed_from = len(context.backend.renewals)
        # Retried before the leases end, and once they have ended unrenewed, they are lost.
        await until(lambda: doomed.lost and other.lost, "the unrenewed leases to be marked lost", within=2.0)
        assert len(context.backend.renewals) - failed_from >= 2
        failures = [r for r in caplog.records if "renewing the leases" in r.getMessage()]
        assert len(failures) == 1, [r.getMessage() for r in failures]
        # The worker carries on: fresh leases are renewed once the server answers again, and a key found gone is
        # reported lost at once.
        context.backend.error = None
        context.leases.held[:] = [FakeLease("fresh"), FakeLease("gone")]
        context.backend.refused.add("gone")
        fresh, gone = context.leases.held
        await until(lambda: fresh.renewed >= 1 and gone.lost, "renewal to work again")
        assert not fresh.lost
        assert renewer._worker is worker
        assert any("works again" in r.getMessage() for r in caplog.records)
        await renewer.stop()

    with caplog.at_level(logging.WARNING, logger="hybridlock"):
        run(main())


def test_max_hold_stops_renewing_and_marks_lost_once_the_lease_ends() -> None:
    async def main() -> None:
        context = FakeContext(max_hold=0.15)
        renewer = LeaseRenewer(context)
        lease = FakeLease("long")
        context.leases.held.append(lease)
        renewer.ensure_started()
        await until(lambda: lease.lost, "the over-long hold to be marked lost", within=2.0)
        assert lease.renewed <= 1  # renewed at most once, within the first 0.15 s
        await renewer.stop()

    run(main())


@pytest.mark.parametrize(
    "options", [{}, {"auto_renew": False}, {"never_expires": True}], ids=["renews", "watches", "local"]
)
def test_a_hold_whose_holder_is_gone_is_not_renewed_and_ends_with_its_lease(
    options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # The worker also runs where nothing is renewed (auto_renew=False, LocalLockRegistry), only to look for holders
    # that are gone (owners.py); without leases (never_expires) it looks every second and ends such a hold at once.
    async def main() -> None:
        context = FakeContext(**options)
        renewer = LeaseRenewer(context)
        kept, gone = FakeLease("kept"), FakeLease("gone")
        if options.get("never_expires"):
            kept._valid_until = gone._valid_until = float("inf")
        gone.holder_gone = True
        context.leases.held.extend([kept, gone])
        start = monotonic()
        renewer.ensure_started()
        await until(lambda: gone.ended, "the abandoned hold to be ended", within=3.0)
        took = monotonic() - start
        assert gone.renewed == 0
        if options.get("never_expires"):
            assert 0.9 <= took < 2.5  # at the first look, a second in
        else:
            # Not before its lease ran out (valid_until), and not long after: the worker wakes for it.
            assert LEASE * 0.9 <= took < LEASE + 0.5
        if options:
            assert context.backend.renewals == []
        else:
            await until(lambda: kept.renewed >= 2, "the other hold to be renewed as usual")
        await renewer.stop()

    with caplog.at_level(logging.WARNING, logger="hybridlock.lock"):
        run(main())
    warnings = [r.getMessage() for r in caplog.records if "still holding" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once, however many rounds saw it
    assert "'gone'" in warnings[0]
    assert "'the holder'" in warnings[0]


def test_renew_once_by_hand_and_stop_mid_sleep() -> None:
    async def main() -> None:
        context = FakeContext()
        renewer = LeaseRenewer(context)
        await renewer.renew_once()  # nothing held: nothing asked
        assert context.backend.renewals == []
        assert renewer.rounds == 0
        lease = FakeLease("a")
        context.leases.held.append(lease)
        await renewer.renew_once()
        assert renewer.rounds == 1
        assert lease.renewed == 1
        renewer.ensure_started()
        await asyncio.sleep(0.01)  # asleep until the next period
        start = time.monotonic()
        await renewer.stop()
        assert time.monotonic() - start < 0.05  # the sleep is cut short
        assert renewer._worker is not None
        assert not renewer._worker.running

    run(main())


# -- the wait keeper ------------------------------------------------------------------------------------------------


def test_the_keeper_refreshes_while_waits_last_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keeper_module, "REFRESH_INTERVAL", 0.05)
    monkeypatch.setattr(keeper_module, "IDLE_LINGER", 0.2)

    async def main() -> None:
        context = FakeContext()
        keeper = WaitKeeper(context)
        assert not keeper.running
        refreshes = context.backend.refreshes
        for _ in range(2):  # the second time: a worker that ended starts again
            first = keeper.begin(lock_names("test", "a"))
            again = keeper.begin(lock_names("test", "a"))  # two waits on one key: one place to refresh
            other = keeper.begin(lock_names("test", "b"))
            assert keeper.running
            seen = len(refreshes)
            await until(lambda seen=seen: len(refreshes) >= seen + 3, "three refreshes")
            assert all(sorted(keys) == ["a", "b"] for keys in refreshes[seen:])
            keeper.end(other)
            keeper.end(first)
            seen = len(refreshes)
            await until(lambda seen=seen: len(refreshes) >= seen + 2, "refreshes for the wait left")
            assert refreshes[-1] == ["a"]
            keeper.end(again)
            # The last wait ended: the keeper stays a moment for the next one, then stops; a wait that begins
            # meanwhile is kept by the same worker.
            worker = keeper._worker
            await asyncio.sleep(0.1)
            assert keeper.running
            keeper.end(keeper.begin(lock_names("test", "a")))
            assert keeper._worker is worker
            took = await until(lambda: not keeper.running, "the keeper to stop", within=1.0)
            assert 0.1 < took < 0.35, took
            worker = keeper._worker
            assert worker is not None
            await until(lambda worker=worker: not worker.running, "its task to end", within=0.5)
        # A failing refresh is logged and tried again; the keeper carries on.
        context.backend.error = BackendUnavailableError("down", key=None, server="fake")
        place = keeper.begin(lock_names("test", "c"))
        seen = len(refreshes)
        await until(lambda: len(refreshes) >= seen + 2, "refreshes despite the failures")
        assert keeper.running
        await keeper.stop()
        assert not keeper.running
        keeper.end(place)
        keeper.begin(lock_names("test", "d"))  # a stopped keeper keeps nothing
        assert not keeper.running

    run(main())


# -- the retention reaper -------------------------------------------------------------------------------------------


def test_the_reaper_gives_back_on_deadline_on_poke_and_when_busy_retries() -> None:
    async def main() -> None:
        reaper = RetentionReaper(FakeContext(retain_for=0.1))
        soon, later = FakeRetainedLock("soon"), FakeRetainedLock("later")
        start = monotonic()
        assert reaper.retain(soon, start + 0.1)
        assert reaper.retain(later, start + 60)
        await until(lambda: soon.ended_at is not None, "the deadline")
        assert soon.ended_at is not None
        assert 0.1 <= soon.ended_at - start < 0.3
        assert later.ended_at is None
        # Another owner wants it: a poke ends it now, not in a minute.
        later.wanted = True
        reaper.poke()
        took = await until(lambda: later.ended_at is not None, "the poke", within=1.0)
        assert took < 0.05, took
        # Caught mid-release: tried again a moment later until it settles.
        busy = FakeRetainedLock("busy", busy=3)
        assert reaper.retain(busy, monotonic())
        await until(lambda: busy.ended_at is not None, "the busy lock to settle", within=1.0)
        assert busy.busy == 0
        # Retaken here before its deadline: the reaper only forgets it.
        retaken = FakeRetainedLock("retaken")
        assert reaper.retain(retaken, monotonic() + 0.05)
        retaken._retained_until = None  # an acquire here picked it up
        await asyncio.sleep(0.1)
        assert retaken.ended_at is None
        assert not reaper._retained
        # Nothing retained: the worker ends after a moment; the next retention starts it again.
        worker = reaper._worker
        assert worker is not None
        await until(lambda: not worker.running, "the idle reaper to end", within=1.0)
        again = FakeRetainedLock("again")
        assert reaper.retain(again, monotonic() + 0.02)
        assert reaper._worker is not worker
        await until(lambda: again.ended_at is not None, "the restarted reaper")
        await reaper.stop()

    run(main())


def test_a_retain_that_finds_the_lock_already_wanted_ends_at_once() -> None:
    async def main() -> None:
        reaper = RetentionReaper(FakeContext(retain_for=60))
        lock = FakeRetainedLock("late")
        lock.wanted = True  # announced after the releasing task looked, poked before the lock was in the set
        assert reaper.retain(lock, monotonic() + 60)
        await until(lambda: lock.ended_at is not None, "the retention to end", within=1.0)
        await reaper.stop()

    run(main())


def test_stop_gives_every_retained_lease_back_and_refuses_more(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        reaper = RetentionReaper(FakeContext(retain_for=60))
        locks = [FakeRetainedLock("a"), FakeRetainedLock("b", busy=5), FakeRetainedLock("c")]
        for lock in locks:
            assert reaper.retain(lock, monotonic() + 60)
        broken = FakeRetainedLock("broken")

        async def fails() -> bool:
            raise RuntimeError("simulated failure")

        broken._end_retention = fails  # type: ignore[method-assign]
        assert reaper.retain(broken, monotonic() + 60)
        await asyncio.sleep(0.01)
        await reaper.stop()
        assert all(lock.ended_at is not None for lock in locks)
        assert "simulated failure" in caplog.text  # logged, and the others were given back all the same
        assert not reaper.retain(FakeRetainedLock("d"), monotonic() + 60)  # closing: release in the server
        reaper.poke()  # harmless

    with caplog.at_level(logging.ERROR, logger="hybridlock"):
        run(main())


# -- all three ------------------------------------------------------------------------------------------------------


def test_stop_leaves_no_task_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "_IDLE_EXIT", 60.0)  # so that only stop() can end the reaper

    async def main() -> None:
        context = FakeContext(retain_for=60)
        renewer, reaper, keeper = LeaseRenewer(context), RetentionReaper(context), WaitKeeper(context)
        context.leases.held.append(FakeLease("held"))
        renewer.ensure_started()
        kept = FakeRetainedLock("kept")
        reaper.retain(kept, monotonic() + 60)
        keeper.begin(lock_names("test", "waited"))
        await asyncio.sleep(0.02)
        assert worker_tasks() == ["hybridlock-renewer-test", "hybridlock-retention-test", "hybridlock-wait-keeper"]
        await reaper.stop()
        await keeper.stop()
        await renewer.stop()
        assert worker_tasks() == []
        assert kept.ended_at is not None

    run(main())
