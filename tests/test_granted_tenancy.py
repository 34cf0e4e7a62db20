"""A lock granted by a release holds its tenancy, "<client_id>|<token>" (``scripts.grant``): what the holder's
renewals and release compare. The review of that change found the ways a granted tenancy could outlive itself or be
misread; each test here failed on the code the review read:

* the tenancy goes with the lease: an acquire after it (an own attempt, bare owner id) that is interrupted in flight
  gives back what it took, and a forked child never releases its parent's granted lease;
* an interrupt landing after the reply that took the lock, anywhere before the local hold, gives the lease back;
* the late give-back of a renewal answered after the loss was told never ends a newer tenancy of the same registry;
* ``hybridlock inspect`` describes a granted holder as it does one that took the lock itself.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import redis

import hybridlock
from hybridlock._cli.inspection import inspect_locks, scan_keys
from hybridlock.errors import LockLostError
from hybridlock.testing import EmbeddedServer

pytestmark = [pytest.mark.server, pytest.mark.timeout(60)]


def _granted(lock: Any, rival: Any) -> None:
    """``lock`` (held by the calling thread) is granted by ``rival``'s release: it then holds "<id>|<token>"."""
    taken = threading.Event()

    def rival_holds() -> None:
        assert rival.acquire(timeout=10)
        taken.set()
        time.sleep(0.3)
        rival.release()

    holder = threading.Thread(target=rival_holds)
    holder.start()
    assert taken.wait(10)
    assert lock.acquire(timeout=10)
    holder.join(10)
    assert lock._names.tenancy == f"{lock._context.client_id}|{lock.fencing_token}"


@pytest.fixture
def owners(server: EmbeddedServer, redis_client: Any) -> Any:
    mine = hybridlock.LockRegistry(server.url, registry_key="gt", expire_after=30)
    theirs = hybridlock.LockRegistry(server.url, registry_key="gt", expire_after=30)
    try:
        yield mine, theirs
    finally:
        mine.close()
        theirs.close()


def test_an_acquire_interrupted_in_flight_after_a_granted_tenancy_gives_back_what_it_took(
    owners: Any, redis_client: Any
) -> None:
    mine, theirs = owners
    lock, rival = mine.obtain("k"), theirs.obtain("k")
    _granted(lock, rival)
    lock.release()
    assert lock._names.tenancy == "", "the granted tenancy outlived its lease"
    backend = mine.backend
    attempt = backend.try_acquire

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        backend.try_acquire = attempt
        attempt(*args, **kwargs)  # (it takes the lock: the key holds our bare owner id)
        raise KeyboardInterrupt  # (a signal handler's exception as the reply is read)

    backend.try_acquire = interrupted
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(blocking=False)
    assert not redis_client.exists("gt:{k}"), "the lease was left held by nobody"
    assert rival.acquire(blocking=False)
    rival.release()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_releases_its_parents_granted_lease(owners: Any, redis_client: Any) -> None:
    mine, theirs = owners
    lock, rival = mine.obtain("k"), theirs.obtain("k")
    _granted(lock, rival)
    pid = os.fork()
    if pid == 0:  # the child: its first acquire is interrupted as its refused attempt's reply is read
        code = 1
        try:
            backend = mine.backend
            attempt = backend.try_acquire

            def interrupted(*args: Any, **kwargs: Any) -> Any:
                attempt(*args, **kwargs)
                raise KeyboardInterrupt

            backend.try_acquire = interrupted
            try:
                mine.obtain("k").acquire(blocking=False)
            except KeyboardInterrupt:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    value = redis_client.get("gt:{k}")
    assert value == f"{mine.client_id}|{lock.fencing_token}".encode(), "the child released the parent's lease"
    assert not rival.acquire(blocking=False)
    lock.release()


def test_an_interrupt_after_the_reply_that_took_the_lock_gives_it_back(owners: Any, redis_client: Any) -> None:
    mine, theirs = owners
    lock = mine.obtain("k")

    class Interrupting:
        """The lock's wait hint: storing into it is the first thing after the reply that took the lock."""

        __slots__ = ()

        @property
        def expect_wait(self) -> bool:
            return False

        @expect_wait.setter
        def expect_wait(self, value: bool) -> None:
            raise KeyboardInterrupt  # (a signal handler's exception at this point)

    lock._wait_hint = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(blocking=False)
    assert not redis_client.exists("gt:{k}"), "the lease was left held by nobody"
    assert theirs.obtain("k").acquire(blocking=False)
    theirs.obtain("k").release()


def test_a_late_give_back_never_ends_a_newer_tenancy_of_the_same_registry(owners: Any, redis_client: Any) -> None:
    # The renewer takes a late "yes" for a tenancy found lost, and is preempted between its look at the tenancy and
    # the give-back; meanwhile the holder releases and another thread takes the lock anew. That new tenancy must not
    # be given back.
    mine, theirs = owners
    lock = mine.obtain("k")
    go_release, released, second_holds, done = (threading.Event() for _ in range(4))
    first_holds = threading.Event()

    def first() -> None:
        assert lock.acquire(timeout=10)
        first_holds.set()
        go_release.wait(10)
        try:
            lock.release()
        except LockLostError:
            pass
        released.set()

    def second() -> None:
        released.wait(10)
        assert lock.acquire(timeout=10)
        second_holds.set()
        done.wait(10)
        lock.release()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert first_holds.wait(10)
        tenancy = lock._tenancy
        lock._claim_loss(tenancy)  # (its valid_until passed with a renewal in flight)
        is_current = type(lock)._is_current

        def preempted(asked: int) -> bool:
            answer = is_current(lock, asked)
            del lock._is_current
            go_release.set()
            assert second_holds.wait(10)  # (the renewer thread stands still here)
            return answer

        lock._is_current = preempted
        lock._give_back_after_loss(tenancy)  # (what the renewer does with the late yes)
        assert second_holds.is_set()
        assert redis_client.get("gt:{k}") == mine.client_id.encode(), "the newer tenancy's lease was given back"
        assert not lock.lost
        assert not theirs.obtain("k").acquire(blocking=False)
    finally:
        go_release.set()
        done.set()
        for thread in threads:
            thread.join(10)


def test_inspect_describes_a_granted_holder(owners: Any, server: EmbeddedServer) -> None:
    mine, theirs = owners
    lock, rival = mine.obtain("k"), theirs.obtain("k")
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        _granted(lock, rival)
        deadline = time.monotonic() + 10
        while True:  # (the registry describes itself a moment after its first lease)
            holder = inspect_locks(client, "gt", scan_keys(client, "gt"))[0]["holder"]
            if holder.get("host") is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert holder["owner"] == mine.client_id
        assert holder["host"] is not None, f"a granted holder shown without its description: {holder}"
        assert holder["value"] == f"{mine.client_id}|{lock.fencing_token}"
        lock.release()
    finally:
        client.close()


def test_a_granted_waiter_whose_confirmation_fails_gives_the_grant_back(
    server: EmbeddedServer, redis_client: Any
) -> None:
    # With confirm_replicas and no replica to confirm: the waiter granted the lock raises, saying the lease was given
    # back, and it was (the key held the granted tenancy, which the give-back must name).
    with (
        hybridlock.LockRegistry(server.url, registry_key="gt", expire_after=20) as holders,
        hybridlock.LockRegistry(
            server.url, registry_key="gt", expire_after=20, confirm_replicas=1, confirm_timeout=0.2
        ) as waiters,
    ):
        holder = holders.obtain("k")
        assert holder.acquire()
        raised: list[BaseException] = []

        def wait() -> None:
            try:
                waiters.obtain("k").acquire(timeout=5)
            except hybridlock.HybridLockError as exc:
                raised.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 10
        while not redis_client.zcard("gt:{k}:queue"):
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        holder.release()  # (grants the lock to the waiter)
        waiter.join(15)
        assert raised, "the unconfirmed grant was taken"
        assert "given back" in str(raised[0])
        assert not redis_client.exists("gt:{k}"), "the grant was left held by nobody"
