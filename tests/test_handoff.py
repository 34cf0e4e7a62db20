"""Local hand-off (lock cohorting): threads of one process pass a held server lease among themselves."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import redis

import hybridlock
from tests._stats import script_runs

pytestmark = pytest.mark.server


def _contend(lock: hybridlock.HybridLock, threads: int, cycles: int, body=None) -> list[int]:  # type: ignore[no-untyped-def]
    """``threads`` threads each take ``lock`` ``cycles`` times; returns the fencing tokens seen inside."""
    tokens: list[int] = []
    inside = [0]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(cycles):
                assert lock.acquire(timeout=20)
                try:
                    inside[0] += 1
                    assert inside[0] == 1, "two threads inside at once"
                    tokens.append(lock.fencing_token)
                    if body is not None:
                        body()
                    time.sleep(0)
                    inside[0] -= 1
                finally:
                    lock.release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not errors, errors
    assert len(tokens) == threads * cycles
    return tokens


def test_the_hand_off_window_counts_from_the_grant_not_from_the_local_wait(make_registry, redis_client):
    # 16 threads holding 4 ms each: the thread that takes the server lock has queued locally for tens of
    # milliseconds, longer than the default 50 ms window would allow if it counted from the start of that wait.
    registry = make_registry()  # default budget: 64 passes, 50 ms
    lock = registry.obtain("long-queue")
    redis_client.config_resetstat()
    _contend(lock, threads=16, cycles=10, body=lambda: time.sleep(0.004))
    calls = script_runs(redis_client)
    # 160 critical sections: without hand-off that is 320 script calls; with it, about two per 50 ms window.
    assert calls < 100, f"{calls} script calls for 160 cycles: hand-off did not happen"


def test_contending_threads_share_one_tenancy_and_few_round_trips(make_registry, redis_client):
    registry = make_registry(handoff_limit=1000, handoff_window=30.0)
    lock = registry.obtain("cohort")
    redis_client.config_resetstat()
    tokens = _contend(lock, threads=6, cycles=50)
    calls = script_runs(redis_client)
    # 300 critical sections: without hand-off that is 600 script calls; with it, a handful of tenancies.
    assert calls < 60, f"{calls} script calls for 300 cycles"
    assert len(set(tokens)) < 30
    assert not redis_client.exists("hybridlock:{cohort}")


def test_fencing_token_is_one_per_tenancy_and_increases(make_registry):
    registry = make_registry(handoff_limit=5, handoff_window=30.0)
    lock = registry.obtain("fenced")
    tokens = _contend(lock, threads=4, cycles=30)
    # Within a tenancy (at most 1 + 5 passes) the token repeats; across tenancies it only grows.
    runs: list[int] = []
    for token in tokens:
        if runs and token == runs[-1]:
            continue
        runs.append(token)
    assert runs == sorted(set(runs))
    longest = max(sum(1 for t in tokens if t == token) for token in set(tokens))
    assert longest <= 6


def test_switched_off_every_final_release_reaches_the_server(make_registry, redis_client):
    registry = make_registry(handoff_limit=0)
    lock = registry.obtain("plain")
    with lock:
        pass  # load the scripts
    redis_client.config_resetstat()
    _contend(lock, threads=4, cycles=25)
    assert script_runs(redis_client) >= 2 * 100  # one acquire and one release per cycle (plus failed tries)
    assert len(set(_contend(lock, threads=2, cycles=5))) == 10


def test_pass_budget_is_respected(make_registry, redis_client):
    registry = make_registry(handoff_limit=3, handoff_window=30.0)
    lock = registry.obtain("budget")
    tokens = _contend(lock, threads=4, cycles=40)
    assert all(tokens.count(token) <= 4 for token in set(tokens))


def test_local_waiters_are_served_in_arrival_order(make_registry):
    registry = make_registry()
    lock = registry.obtain("fifo")
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(6):

        def take(i: int = i) -> None:
            with lock:
                order.append(i)

        thread = threading.Thread(target=take)
        thread.start()
        threads.append(thread)
        deadline = time.monotonic() + 5
        while lock._mutex.waiting < i + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
    lock.release()
    for thread in threads:
        thread.join(10)
    assert order == list(range(6))


@pytest.mark.parametrize("barge_window", [0.0, 30.0])
def test_the_barge_window_decides_whether_a_releasing_thread_may_retake_the_lock(make_registry, barge_window):
    registry = make_registry(handoff_limit=1000, handoff_window=30.0, handoff_barge_window=barge_window)
    lock = registry.obtain("barge")
    assert lock.acquire(timeout=5)
    token = lock.fencing_token
    entered: list[int | None] = []

    def take() -> None:
        with lock:
            entered.append(lock.fencing_token)

    waiter = threading.Thread(target=take)
    waiter.start()
    deadline = time.monotonic() + 5
    while lock._mutex.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    lock.release()  # a local thread waits: the lease is kept
    retook = lock.acquire(blocking=False)
    if barge_window == 0:
        # Strict FIFO: the lock went to the waiting thread at release; we cannot take it back.
        assert not retook
    else:
        # Within the window the running thread may go first, still in the same server tenancy...
        assert retook
        assert lock.fencing_token == token
        assert lock.statistics().local_passes == 1
        lock.release()
    # ...and the waiting thread gets in all the same, on that tenancy.
    waiter.join(10)
    assert entered == [token]


def test_a_remote_waiter_gets_in_while_local_threads_keep_contending(make_registry):
    local_registry = make_registry(handoff_limit=10_000, handoff_window=30.0)  # only "wanted" can end a streak
    remote_registry = make_registry()
    lock = local_registry.obtain("shared")
    stop = threading.Event()
    local_cycles = [0]

    def spin() -> None:
        while not stop.is_set():
            with lock:
                local_cycles[0] += 1
                time.sleep(0.001)

    spinners = [threading.Thread(target=spin) for _ in range(4)]
    for spinner in spinners:
        spinner.start()
    try:
        time.sleep(0.3)  # a long streak of local passes is under way
        other = remote_registry.obtain("shared")
        waits = []
        for _ in range(5):
            started = time.monotonic()
            assert other.acquire(timeout=10), "the other owner never got in"
            waits.append(time.monotonic() - started)
            other.release()
            time.sleep(0.05)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(10)
    assert local_cycles[0] > 50
    assert max(waits) < 2.0  # announced wants end the streak at the next release, not after the budget


def test_an_owner_queued_behind_one_the_streak_did_not_hear_still_ends_it(make_registry, redis_client):
    # The holder starts listening for "wanted" at its tenancy's first local pass: B, refused before that, announced
    # itself to nobody. C queues behind B once the holder listens: its announcement is what ends the streak (a
    # refusal that found others queued must still announce), so B gets in long before the 30 s window.
    local_registry = make_registry(handoff_limit=10_000, handoff_window=30.0)  # only "wanted" can end a streak
    lock = local_registry.obtain("unheard")
    queue_key = local_registry._names("unheard").queue
    stop = threading.Event()
    local_cycles = [0]
    entered: list[str] = []

    def remote(name: str) -> threading.Thread:
        def run() -> None:
            other = make_registry().obtain("unheard")
            if other.acquire(timeout=20):
                entered.append(name)
                other.release()

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def wait_for_queue(length: int) -> None:
        deadline = time.monotonic() + 5
        while redis_client.zcard(queue_key) < length:
            assert time.monotonic() < deadline, f"nobody queued {length}"
            time.sleep(0.005)

    def spin() -> None:
        while not stop.is_set():
            with lock:
                local_cycles[0] += 1
                time.sleep(0.001)

    lock.acquire()  # a fresh tenancy: nobody queued, nothing listened to yet
    b = remote("b")
    wait_for_queue(1)  # b's "wanted" went to nobody
    spinners = [threading.Thread(target=spin) for _ in range(2)]
    try:
        for spinner in spinners:
            spinner.start()
        time.sleep(0.05)
        lock.release()  # the first pass: the streak starts listening
        time.sleep(0.3)
        assert not entered  # nothing told the streak of b
        started = time.monotonic()
        c = remote("c")
        b.join(25)
        c.join(25)
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(10)
    assert entered == ["b", "c"]
    assert time.monotonic() - started < 10  # c's announcement ended the streak, not the 30 s window
    assert local_cycles[0] > 50


def test_lease_lost_during_a_streak_is_not_passed_on(make_registry, redis_client):
    registry = make_registry(expire_after=1.5, handoff_limit=10_000, handoff_window=30.0)
    lock = registry.obtain("streak")
    lost_errors: list[BaseException] = []
    tokens_after: list[int] = []
    entered_lost: list[int] = []
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                with lock:
                    if lock.lost:
                        entered_lost.append(lock.fencing_token)
                    if lost_errors:  # entries after the loss was noticed and reported
                        tokens_after.append(lock.fencing_token)
                    time.sleep(0.002)
            except hybridlock.LockLostError as exc:
                lost_errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(4)]
    for worker in workers:
        worker.start()
    time.sleep(0.2)
    with lock:
        token_before = lock.fencing_token
    redis_client.delete("hybridlock:{streak}")  # the lease ends behind the streak's back
    deadline = time.monotonic() + 5
    while not lost_errors and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    stop.set()
    for worker in workers:
        worker.join(10)
    # The holder at the time the loss was noticed is told. Nobody entered on the lease once it was known lost: a
    # thread can only see `lost` inside if the loss was noticed while it was inside, and then it was told too.
    assert 1 <= len(lost_errors) <= 2
    assert len(entered_lost) <= len(lost_errors) - 1
    assert tokens_after
    assert min(tokens_after) > token_before  # the others entered on a fresh tenancy


@pytest.mark.parametrize("options", [{}, {"retain_for": 0.05}], ids=["hand-off", "hand-off-and-retention"])
def test_remote_exclusion_holds_with_hand_off(make_registry, redis_client, options):
    """Two registries (two owners) x 4 threads: a non-atomic counter in Redis stays exact. Threads pause after
    every third cycle, so that with retention some leases are also kept idle between cycles."""
    registries = [make_registry(**options), make_registry(**options)]
    redis_client.set("counter", 0)
    inside = [0]
    errors: list[BaseException] = []

    def work(registry: hybridlock.LockRegistry) -> None:
        lock = registry.obtain("counted")
        client = redis.Redis.from_url(registry.server)
        try:
            for cycle in range(60):
                with lock:
                    inside[0] += 1
                    assert inside[0] == 1
                    value = int(client.get("counter"))
                    client.set("counter", value + 1)
                    inside[0] -= 1
                if cycle % 3 == 2:
                    time.sleep(0.001)
        except BaseException as exc:
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(r,)) for r in registries for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert int(redis_client.get("counter")) == 480


def test_expire_unused_never_drops_a_lock_in_a_streak(make_registry):
    registry = make_registry(handoff_limit=10_000, handoff_window=30.0)
    key = "streaky"
    stop = threading.Event()
    seen_ids: set[int] = set()

    def work() -> None:
        while not stop.is_set():
            lock = registry.obtain(key)
            seen_ids.add(id(lock))
            with lock:
                time.sleep(0.001)

    workers = [threading.Thread(target=work) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(50):
            registry.expire_unused_older_than(0)
            time.sleep(0.002)
    finally:
        stop.set()
        for worker in workers:
            worker.join(10)
    assert len(seen_ids) == 1  # one lock object for the key throughout: the streak's lock was never dropped


def test_a_thread_interrupted_as_the_lock_reaches_it_strands_no_lease(make_registry, redis_client, monkeypatch):
    from hybridlock._sync import _compat as _local

    class InterruptedWakeup:
        """Waits like the real wake-up lock, then is interrupted (as by KeyboardInterrupt) once woken."""

        def __init__(self) -> None:
            self._lock = threading.Lock()
            self._lock.acquire()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self._lock.acquire(blocking, timeout):
                raise KeyboardInterrupt
            return False

        def release(self) -> None:
            self._lock.release()

    class InterruptedTicket(_local._Ticket):
        def __init__(self) -> None:
            super().__init__()
            self.wakeup = InterruptedWakeup()  # type: ignore[assignment]

    registry = make_registry(handoff_limit=1000, handoff_window=30.0)
    lock = registry.obtain("interrupted")
    assert lock.acquire(timeout=5)
    monkeypatch.setattr(_local, "_Ticket", InterruptedTicket)
    interrupted: list[BaseException] = []

    def wait_for_it() -> None:
        try:
            lock.acquire()
        except KeyboardInterrupt as exc:
            interrupted.append(exc)

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    deadline = time.monotonic() + 5
    while lock._mutex.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    lock.release()  # a thread waits here: the lease is kept for it, and it is interrupted as it wakes
    waiter.join(5)
    assert len(interrupted) == 1
    # Nobody holds the lock; its lease must not outlive that (it would be renewed forever).
    deadline = time.monotonic() + 5
    while redis_client.exists("hybridlock:{interrupted}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not redis_client.exists("hybridlock:{interrupted}")
    assert not lock.statistics().holds_server_lease
    monkeypatch.undo()
    assert lock.acquire(timeout=5)
    lock.release()


def test_policy_allows_a_bounded_batch_of_passes_while_another_owner_waits():
    from hybridlock._core.policy import may_keep_lease

    def may(contended: bool, passes: int, elapsed: float, contended_window: float) -> bool:
        return may_keep_lease(
            lost=False,
            in_server=True,
            contended=contended,
            passes=passes,
            acquired_at=10.0,
            now=10.0 + elapsed,
            handoff_limit=64,
            handoff_window=0.05,
            contended_window=contended_window,
        )

    assert may(True, 3, 0.01, 0.02)
    assert not may(True, 3, 0.021, 0.02)  # the batch's time is spent
    assert not may(True, 64, 0.001, 0.02)  # and its count
    assert not may(True, 0, 0.0, 0.0)  # 0: no pass once another owner waits
    assert may(False, 3, 0.04, 0.02)  # nobody else waits: the whole window
    assert may(True, 3, 0.04, 1.0)
    assert not may(True, 3, 0.06, 1.0)  # never longer than the window itself


def _local_batches_against_a_remote_owner(make_registry, contended_window: float):  # type: ignore[no-untyped-def]
    """Two threads of one registry and one thread each of two others cycle on one key, for 1.5 s and until 10 local
    tenancies began contended (at most 20 s); returns the local cycles of each local server tenancy (each tenancy
    has one fencing token), the tokens of those whose grant said another owner waits, and the longest wait of the
    other owners. (With two of them, one is usually queued when the local registry is granted the lock, so the
    grant's reply tells it that another owner waits; how often depends on the scheduling, so the tests look at the
    tenancies that were told.)"""
    local = make_registry(handoff_contended_window=contended_window)
    mine = local.obtain("batch")
    cycles: Counter[int] = Counter()
    contended: set[int] = set()
    remote_waits: list[float] = []
    inside = [0]
    errors: list[BaseException] = []
    started_at = time.monotonic()

    def done() -> bool:
        elapsed = time.monotonic() - started_at
        return elapsed > 20 or (elapsed > 1.5 and len(contended) >= 10)

    def cycle(lock: hybridlock.HybridLock, local_side: bool) -> None:
        try:
            while not done():
                started = time.monotonic()
                assert lock.acquire(timeout=20)
                waited = time.monotonic() - started
                try:
                    inside[0] += 1
                    assert inside[0] == 1, "two owners inside at once"
                    if local_side:
                        token = lock.fencing_token
                        if cycles[token] == 0 and lock._contended:  # told at the grant: another owner waits
                            contended.add(token)
                        cycles[token] += 1
                    else:
                        remote_waits.append(waited)
                    time.sleep(0.001)
                    inside[0] -= 1
                finally:
                    lock.release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=cycle, args=(mine, True)) for _ in range(2)]
    threads += [threading.Thread(target=cycle, args=(make_registry().obtain("batch"), False)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert remote_waits, "the other owner never got in"
    assert len(contended) >= 10, f"only {len(contended)} local tenancies were granted while another owner waited"
    return cycles, contended, max(remote_waits)


def test_local_threads_get_a_bounded_batch_while_another_owner_waits(make_registry):
    cycles, _, longest_remote_wait = _local_batches_against_a_remote_owner(make_registry, 0.02)
    per_tenancy = sum(cycles.values()) / len(cycles)
    # The other owner waits all the time, yet each local tenancy serves several local cycles (1 ms each) ...
    assert per_tenancy >= 2.0, f"{per_tenancy:.2f} local cycles per tenancy"
    # ... and the batch is bounded: the other owner's wait is a batch and a hand-off or two, not the lease.
    assert longest_remote_wait < 1.0


def test_no_local_batch_while_another_owner_waits_with_a_contended_window_of_0(make_registry):
    cycles, contended, _ = _local_batches_against_a_remote_owner(make_registry, 0.0)
    # A tenancy told at its grant that another owner waits is never passed to another thread here. (One that was
    # not told may pass until an announcement is heard: that is the bounded batch of the test above.)
    passed_on = {token: cycles[token] for token in contended if cycles[token] != 1}
    assert not passed_on, f"local cycles of contended tenancies: {passed_on}"
