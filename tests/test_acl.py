"""The ACL the docs give lock users is enough for every lock kind, and a command missing from it is reported.

A server ACL checks every command, those a Lua script calls included, so the list has to name what the scripts
call as well as what the client sends. These tests run real workloads as a user restricted to exactly that list,
on a server of their own, and check the server's ACL log stays empty (nothing was refused along the way).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

import hybridlock
from hybridlock.backends import redis_pubsub
from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env

pytestmark = pytest.mark.server


def _documented_acl() -> list[str]:
    """The commands of the ACL in ``docs/acl.md``, so the test runs what users copy."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "acl.md").read_text(encoding="utf-8")
    block = page[page.index("ACL SETUSER locker") :]
    block = block[: block.index("```")]
    return [word[1:] for word in block.split() if word.startswith("+")]


LOCK_USER_COMMANDS = _documented_acl()


def set_lock_user(admin: redis.Redis, commands: list[str]) -> None:
    admin.execute_command(
        "ACL", "SETUSER", "locker", "reset", "on", ">locker-pw", "~hybridlock:*", "&hybridlock:*", "-@all",
        *(f"+{command}" for command in commands),
    )  # fmt: skip


@pytest.fixture
def acl_server(own_server: EmbeddedServer) -> Iterator[tuple[redis.Redis, str]]:
    """A server with an admin client, and the URL of the restricted lock user."""
    admin = redis.Redis.from_url(own_server.url)
    admin.acl_log_reset()
    yield admin, f"redis://locker:locker-pw@127.0.0.1:{own_server.port}/0"
    admin.close()


def _refused(admin: redis.Redis) -> set[str]:
    """The commands the server refused to the lock user. redis-py names each new connection with CLIENT SETINFO
    and shrugs off a refusal; servers that know the command (Redis 7.2+, Valkey) log it, so it is left out."""
    return {entry["object"] for entry in admin.acl_log()} - {"client|setinfo"}


class Waiter:
    """Takes ``lock`` in a thread of its own (it is busy: a contended wait), then releases it."""

    def __init__(self, lock: object) -> None:
        self.got = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(lock,), daemon=True)
        self.thread.start()

    def _run(self, lock: object) -> None:
        try:
            if lock.acquire(timeout=10):  # type: ignore[attr-defined]
                self.got.set()
                lock.release()  # type: ignore[attr-defined]
        except BaseException as exc:  # reported by the test
            self.error = exc

    def join(self) -> None:
        self.thread.join(15)
        assert self.error is None, self.error
        assert self.got.is_set(), "the waiter never got the lock"


def _contended_cycle(mine: object, theirs: object, waiting: Callable[[], object]) -> None:
    """``mine`` held past several renewals while ``theirs`` waits (``waiting()`` says when it does: subscribed to its
    notification, or queued for a grant); then handed over."""
    assert mine.acquire(timeout=5)  # type: ignore[attr-defined]
    waiter = Waiter(theirs)
    deadline = time.monotonic() + 5
    while not waiting():
        assert time.monotonic() < deadline, "the waiter never started waiting"
        time.sleep(0.01)
    time.sleep(0.5)  # the lease is 0.3 s: only renewals keep the lock
    assert not getattr(mine, "lost", False)
    mine.release()  # type: ignore[attr-defined]
    waiter.join()


def test_the_documented_acl_runs_every_lock_kind(acl_server, monkeypatch):
    monkeypatch.setattr(redis_pubsub, "_IDLE_UNSUBSCRIBE", 0.2)
    admin, url = acl_server
    set_lock_user(admin, LOCK_USER_COMMANDS)
    with (
        hybridlock.LockRegistry(url, expire_after=0.3) as mine,
        hybridlock.LockRegistry(url, expire_after=0.3, retain_for=0.05) as theirs,
    ):
        sub = theirs.backend._subscriber

        def subscribed(channel: str) -> Callable[[], object]:
            return lambda: channel in sub._subscribed

        def queued(key: str) -> Callable[[], object]:
            return lambda: admin.zcard(mine._names(key).queue)

        # A plain lock's waiter is granted the lock (a blocking pop on its box), the others are woken.
        _contended_cycle(mine.obtain("plain"), theirs.obtain("plain"), queued("plain"))
        assert not theirs.obtain("plain").locked()  # EXISTS, from the side that does not hold it

        rw_mine, rw_theirs = mine.obtain_read_write("rw"), theirs.obtain_read_write("rw")
        channel = rw_mine._names.channel
        _contended_cycle(rw_mine.write_lock(), rw_theirs.read_lock(), subscribed(channel))
        _contended_cycle(rw_mine.read_lock(), rw_theirs.write_lock(), subscribed(channel))

        _contended_cycle(
            mine.obtain_many(["a", "b"]), theirs.obtain_many(["b", "c"]), subscribed(mine._names("b").channel)
        )
        with mine.obtain("plain"):
            mine.renew_lock("plain")
        for lock in (mine.obtain("plain"), theirs.obtain("plain")):
            assert lock.try_lock() is True
            lock.release()

        admin.script_flush()  # a cold script cache: EVALSHA, NOSCRIPT, then EVAL
        with theirs.obtain("plain"):
            pass
        # Renewing more than 500 locks pipelines several scripts: after a flush, SCRIPT LOAD, then EVALSHA again.
        # Its own registry with a longer lease: taking 501 keys under a loaded CI machine outlasted 0.3 s once.
        with (
            hybridlock.LockRegistry(url, expire_after=10) as bulk,
            bulk.obtain_many([f"many:{i}" for i in range(501)]) as many,
        ):
            keys = [bulk._names(f"many:{i}").lock for i in (0, 500)]
            time.sleep(0.2)
            worn = [admin.pttl(key) for key in keys]
            admin.script_flush()
            bulk._context.renewer.renew_once()
            assert not any(lock.lost for lock in many.locks)
            renewed = [admin.pttl(key) for key in keys]
            assert all(after > before for before, after in zip(worn, renewed, strict=True)), (worn, renewed)
        # Channels nobody waits on any more are unsubscribed after a while (shortened here).
        deadline = time.monotonic() + 10
        while sub._subscribed:
            assert time.monotonic() < deadline, "idle channels were never unsubscribed"
            time.sleep(0.05)
        assert sub.failures == 0, "the subscription was refused or broke"
    assert _refused(admin) == set(), "the server refused some command to the lock user"


def test_a_renewal_the_acl_refuses_is_reported_as_a_lost_lock(acl_server):
    # Without PEXPIRE (which an uncontended acquire and release do not need) the renewal script fails with NOPERM:
    # the holder must learn its lock is lost once its lease has certainly ended, not keep going on silently.
    admin, url = acl_server
    set_lock_user(admin, [c for c in LOCK_USER_COMMANDS if c != "pexpire"])
    lost = threading.Event()
    with hybridlock.LockRegistry(url, expire_after=0.3) as registry:
        registry.on_lost(lambda lock: lost.set())
        lock = registry.obtain("k")
        lock.acquire()
        valid_until = lock.valid_until
        assert lost.wait(5), "a refused renewal went unreported"
        assert lock.lost
        assert time.monotonic() >= valid_until
        with pytest.raises(hybridlock.LockLostError):
            lock.release()
    assert _refused(admin) == {"pexpire"}


def test_the_documented_acl_runs_the_semaphore_run_once_and_election(acl_server):
    """The coordination primitives and the command line run as exactly the documented lock user: a contended
    semaphore (its config hash, permit slots and queue) with its limit changed, a run-once job kept after its run, a
    leader elected and handed over, ``hybridlock run --no-wait`` refused; the server refuses nothing."""
    admin, url = acl_server
    set_lock_user(admin, LOCK_USER_COMMANDS)
    with (
        hybridlock.LockRegistry(url, expire_after=0.3) as mine,
        hybridlock.LockRegistry(url, expire_after=0.3) as theirs,
    ):
        semaphore, other = mine.obtain_semaphore("sem", permits=1), theirs.obtain_semaphore("sem", permits=1)
        queue = semaphore._names.queue  # (the semaphore's queue in the server)
        _contended_cycle(semaphore, other, lambda: admin.zcard(queue))
        semaphore.set_permits(2)
        with semaphore, other:
            pass

        ran = mine.run_once("job", lambda: "done", at_least_for=5)
        assert ran.result == "done"
        assert not theirs.run_once("job", lambda: "again", at_least_for=5)

        elected = threading.Event()
        with mine.leader_election("leader", on_elected=lambda epoch: elected.set()):
            assert elected.wait(10), "never elected"

        # The command line as the same user, refused: it reads who holds the lock to say so.
        with mine.obtain("held"):
            refused = subprocess.run(
                [sys.executable, "-m", "hybridlock", "run", "--no-wait", "--server", url, "held", "--", "true"],
                env=checkout_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        assert refused.returncode == 75, refused.stderr
        assert "held by" in refused.stderr
    assert _refused(admin) == set(), "the server refused some command to the lock user"
