"""The quorum backend: one lock held in a majority of N independent Redis/Valkey servers (Redlock), with fencing
tokens that increase across the quorum.

Each operation is sent to every server at once (``AsyncFanOut``: tasks here, threads on the sync side), through
one ``AsyncRedisBackend`` per server running the same scripts as a single server does; the replies are decided by
``hybridlock._core.quorum``, whose docstring has the validity arithmetic and the argument for the fencing tokens
(the write-back) and for the delayed-restart rule. In short:

* acquire: ACQUIRE on every server (never queueing: see below); with a majority granted, ``T`` = the largest
  token minted, then RAISE_FENCE to ``T`` on the granting servers that minted less; the attempt counts only if a
  majority of servers holds ``T`` and the lease is still valid (lease - elapsed - drift > 0). A failed attempt
  gives back every grant it got. Then, best effort and not counted, RAISE_FENCE on every other server that
  answered (those that refused), so that ``T`` survives a lost counter ("Lost counters" in
  ``hybridlock._core.quorum``): one more parallel round trip, only when some server refused (contention) or a
  majority minted ``T`` already. Uncontended, an acquire costs what it did: N ACQUIRE, then RAISE_FENCE on the
  granting servers that minted less (two parallel round trips).
* renew: RENEW on every server; a lease is extended if a majority renewed it and the replies came back while the
  renewed lease is valid. If not, but the servers that renewed it and the silent ones among its last holders are a
  majority, it stays ours, not extended, until the last holders' deadline (the renewal is reported unreachable,
  as a failed round); otherwise the holder is told it lost the lock. A renewal whose lease ends before that
  deadline (a shorter lease by hand) brings the deadline down to its own before it is sent: a silent holder may
  have run it, and one that said yes certainly did; and it goes in the lock's lanes, so that while it is still
  out at a server, later renewals do not count that server's yes (the shorter lease may still land there after
  them).
* release: RELEASE on every server (also where the attempt never got the key: harmless); True if a majority still
  held our lease, or the same covering as for a renewal holds.

Choices
-------
* No server queues. Each server's queue is fair on its own, but N queues can disagree on who is first, and each
  server keeps its free key for its queue's head: three owners heading one queue each would wait for ever. So
  attempts never queue, and waiting is polling with jittered exponential backoff (``WaitPolicy``: 2 ms doubling
  to 100 ms, never past the holder's lease end). Owners are not served first come, first served. Threads of one
  process still queue on the local lock and pass the lease between them (local hand-off) as usual.
* No release notifications (``watch`` is None): polling as with ``lock_type="spin"``.
* Plain locks and multi-key locks (taken key by key, in one global order, with rollback) only. Read-write locks
  are refused (``InvalidArgumentError``): their scripts hold readers in a sorted set per server, and a quorum of
  reader sets is not built here.

Failure modes
-------------
* A minority of servers down, cut off or refusing: every operation goes on with the majority. Their failures are
  part of any error raised.
* Fewer than a majority answer: ``BackendUnavailableError`` naming the key and every server (never a password),
  with each failure; an acquire gives back what it got first.
* A server that hangs (does not answer, does not reset) costs little while a majority answers: once a majority
  has answered (failures do not count), the others get as long again as that took, and at least
  ``STRAGGLER_PATIENCE`` (20 ms); then they count as failed for that round (``AsyncFanOut`` with ``enough``).
  Each server carries one call per lock at a time (a *lane*: the lock's key on that server; renewals, queries and
  descriptions, whose order does not matter, are not held back): while a straggler is out, later calls about that
  lock are not sent to its server and count as failed there at once, except releases (and give-backs), which wait
  for it and follow it. So nothing of ours about a lock reaches a server out of order: a grant that arrives after
  its round gave up on it is given back, in its lane, before any later call about the lock is sent there, unless
  the lock is ours by then (and no round under way counts that server meanwhile). A straggler ends at its client's
  socket timeout at the latest: give each URL a short one (``redis://host:6379/0?socket_timeout=0.5``; 5 s
  otherwise). When fewer than a majority answer, an operation takes up to that timeout and then fails (a release
  that waits in a lane: up to that of the call ahead too).
* A caller cancelled (or, on threads, interrupted by ``KeyboardInterrupt``) while its calls are out: they are on
  the wire already, so they are left to finish in their lanes as stragglers (a grant among them is given back
  there), and the attempt's undo, a release, waits behind them in each lane.
* A server restarted without persistence must stay out for the longest lease first, and for more than twice the
  clock skew (the delayed-restart rule in ``hybridlock._core.quorum``). Keys it lost are not rebuilt there: a lock
  held across it lives on the others.
* A key's fencing counter lost on one server (deleted, evicted): tokens stay higher while the servers that lost it
  and those the last acquisition's write-back missed are fewer than a majority; the next acquisition that reaches
  it restores it. A counter at or above 2^53 - 1 makes its server refuse the key (``FencingCounterError``), which
  counts as that server failing; when that leaves no majority, acquire raises ``FencingCounterError``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..._core.config import QUORUM_FENCE_RETENTION, checked_fence_retention, lease_drift
from ..._core.names import LockNames, ReadWriteNames
from ..._core.quorum import majority, tally_acquire, tally_flags, validity_left, write_back_holds
from ...errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    FencingCounterError,
    HybridLockError,
    InvalidArgumentError,
)
from .._compat import AsyncFanOut, LateHandler, monotonic, shielded
from .base import AcquireResult, AsyncLockBackend
from .redis import AsyncRedisBackend

__all__ = ["READ_WRITE_REFUSED", "STRAGGLER_PATIENCE", "AsyncQuorumBackend"]

logger = logging.getLogger("hybridlock.backend")

READ_WRITE_REFUSED = (
    "read-write locks are not available over a quorum of servers: use plain locks (obtain) or one server"
)

#: Seconds a server still silent after a majority answered is waited for, at least (as long again as the majority
#: took, if that is longer); then it counts as failed for that round.
STRAGGLER_PATIENCE = 0.02


class AsyncQuorumBackend(AsyncLockBackend):
    """Locks held in a majority of ``servers``: each a ``redis://`` URL, a ``redis.asyncio.Redis`` client (or
    valkey's twin) or an ``AsyncRedisBackend``; independent servers (not replicas of one another), at least one,
    an odd number of them (3 or 5) being the useful choice. Use it through ``AsyncQuorumLockRegistry``, or pass
    it to ``AsyncLockRegistry`` as the connection.

    ``fence_retention`` (seconds, default ``QUORUM_FENCE_RETENTION``: a week) is how long each server keeps a lock's
    fencing counter after its last acquisition or write-back; it is set on every server's backend, those given as
    ``AsyncRedisBackend`` objects too (the quorum's tokens rest on its counters: see ``hybridlock._core.quorum``)."""

    def __init__(self, servers: Sequence[Any], *, fence_retention: float | None = None) -> None:
        if isinstance(servers, (str, bytes)) or not isinstance(servers, Sequence):
            raise InvalidArgumentError("a quorum needs a list of servers (URLs, clients or backends)")
        if not servers:
            raise InvalidArgumentError("a quorum needs at least one server")
        retention = checked_fence_retention(fence_retention, None, QUORUM_FENCE_RETENTION)
        self.servers: list[AsyncRedisBackend] = [_server_backend(server) for server in servers]
        for server in self.servers:
            server.fence_retention = retention
        self.fence_retention = retention
        addresses = [server.address for server in self.servers]
        if len(set(addresses)) != len(addresses):
            raise InvalidArgumentError(f"a quorum's servers must be distinct, not {', '.join(addresses)}")
        self.address = f"quorum({', '.join(addresses)})"
        self.majority = majority(len(self.servers))
        self._fan_out = AsyncFanOut("hybridlock-quorum")
        # Per held lease (server key name, owner): the servers of the last majority round that granted or renewed
        # it, and that round's deadline (monotonic). Silent holders keep counting until then (tally_flags).
        self._holders: dict[tuple[str, str], _Holders] = {}

    def after_fork_in_child(self) -> None:
        self._holders.clear()  # the child holds none of its parent's leases
        for server in self.servers:
            server.after_fork_in_child()
        self._fan_out.after_fork_in_child()

    async def _on_all(
        self, lock: str | None, operation: str, *args: Any, late: LateHandler | None = None, queue: bool = False
    ) -> list[Any]:
        """``operation(*args)`` on every server at once, a majority's answers awaited (``_on_servers``)."""
        return await self._on_servers(
            range(len(self.servers)), self.majority, lock, operation, *args, late=late, queue=queue
        )

    async def _on_servers(
        self,
        indexes: Sequence[int],
        enough: int,
        lock: str | None,
        operation: str,
        *args: Any,
        late: LateHandler | None = None,
        queue: bool = False,
    ) -> list[Any]:
        """``operation(*args)`` on the servers ``indexes`` at once: one outcome per server (a result, or its error;
        one still silent ``STRAGGLER_PATIENCE`` or more after ``enough`` of them succeeded counts as failed, its
        reply going to ``late``). ``lock``: the lock key the calls are about; a server still busy with an earlier
        call about it is not sent another (``AsyncFanOut``'s lanes), so calls about one lock reach each server in the
        order they were made; with ``queue`` (releases), the call waits there for the earlier one instead, and is
        sent once it is done. None for calls whose order does not matter (renewals, which only extend our own
        leases; queries; descriptions): they may overlap (the renewer's round and a renewal by hand)."""
        return await self._fan_out.run(
            [partial(getattr(self.servers[index], operation), *args) for index in indexes],
            enough=enough,
            patience=STRAGGLER_PATIENCE,
            late=late,
            lanes=[(index, lock if lock is not None else object()) for index in indexes],
            queue=queue,
        )

    def _unavailable(
        self, key: str | None, operation: str, outcomes: Sequence[Any], *, counter: str | None = None
    ) -> HybridLockError:
        """The error for a round that fewer than a majority answered, naming every failed server with its failure:
        ``BackendUnavailableError``; ``AuthenticationFailedError`` when only refused logins cost the majority; or
        ``FencingCounterError`` when some server refused the key's fencing counter (``counter``: its key name) and
        no majority is left without those servers."""
        errors = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
        failures = [
            f"{server.address}: {_reason(outcome)}"
            for server, outcome in zip(self.servers, outcomes, strict=True)
            if isinstance(outcome, Exception)
        ]
        message = (
            f"fewer than a majority ({self.majority} of {len(self.servers)}) of the quorum's servers answered the "
            f"{operation}; failed: {'; '.join(failures)}"
        )
        refused = [outcome for outcome in outcomes if isinstance(outcome, FencingCounterError)]
        if refused and counter is not None:
            return FencingCounterError(message, key=key, server=self.address, counter=counter, value=refused[0].value)
        if errors and all(isinstance(error, AuthenticationFailedError) for error in errors):
            # Only refused logins cost the majority: a setting to fix, not a wait for servers to come back.
            users = {error.user for error in errors if isinstance(error, AuthenticationFailedError)}
            user = users.pop() if len(users) == 1 else None
            who = f" for user {user!r}" if user is not None else ""
            return AuthenticationFailedError(
                f"authentication failed at {len(errors)} of the quorum's {len(self.servers)} servers{who}: {message}",
                key=key,
                server=self.address,
                user=user,
            )
        return BackendUnavailableError(message, key=key, server=self.address)

    # -- plain locks -----------------------------------------------------------------------------------------------

    async def try_acquire(
        self, names: LockNames, owner: str, lease_ms: int | None, queue: bool, place: str | None = None
    ) -> AcquireResult:
        if lease_ms is None:
            raise InvalidArgumentError("quorum locks need a lease (expire_after)", key=names.key, server=self.address)
        lease = lease_ms / 1000.0
        start = monotonic()
        outcomes = await self._on_all(
            names.lock, "try_acquire", names, owner, lease_ms, False, late=partial(self._late_grant, names, owner)
        )
        replies = [outcome if isinstance(outcome, AcquireResult) else None for outcome in outcomes]
        decision = tally_acquire(replies, lease, monotonic() - start)
        if not decision.acquired:
            if decision.granted:
                await shielded(partial(self._give_back, names, owner, decision.granted))
            if decision.reachable < self.majority:
                raise self._unavailable(names.key, "acquire", outcomes, counter=names.fence)
            return AcquireResult(False, None, decision.holder_ttl)
        token = decision.token
        assert token is not None
        counted: tuple[int, ...] = ()
        if not write_back_holds(len(self.servers), decision.already_at_token, 0):
            # (When a majority minted the token already, it holds there: nothing needs counting.)
            counted = decision.write_back
            written = await self._on_servers(
                counted, self.majority - decision.already_at_token, names.lock, "raise_fence", names, token
            )
            raised = sum(1 for outcome in written if not isinstance(outcome, Exception))
            if not write_back_holds(len(self.servers), decision.already_at_token, raised):
                await shielded(partial(self._give_back, names, owner, decision.granted))
                failed = dict(zip(counted, written, strict=True))
                raise self._unavailable(names.key, "fencing write-back", [failed.get(i) for i in range(len(outcomes))])
        # Then, best effort and not counted, every other server that answered: the token then survives lost
        # counters on as many servers as possible ("Lost counters" in hybridlock._core.quorum). A separate round
        # trip, and only when some server answered without being counted above (it refused us, or a majority
        # minted the token already): a refuser counted among the calls above could cut a needed one short.
        spare = tuple(i for i in decision.write_back if i not in counted) + decision.also_raise
        if spare:
            await self._on_servers(spare, 0, names.lock, "raise_fence", names, token)
        if validity_left(lease, monotonic() - start) <= 0:
            # The replies came back too late to leave any of the lease: as if refused (the caller retries).
            await shielded(partial(self._give_back, names, owner, decision.granted))
            return AcquireResult(False, None, None)
        self._holders[names.lock, owner] = _Holders(decision.granted, start + lease - lease_drift(lease))
        return AcquireResult(True, token, None, decision.contended)

    async def _give_back(self, names: LockNames, owner: str, indexes: Sequence[int]) -> None:
        """Release the grants of a failed attempt (best effort: a grant we cannot reach ends with its lease; one
        that does not answer within ``STRAGGLER_PATIENCE`` is released in its lane, without us waiting, after any
        earlier call still under way there: a straggling write-back, say)."""
        await self._on_servers(indexes, 0, names.lock, "release", names, owner, True, queue=True)

    async def _late_grant(self, names: LockNames, owner: str, lane: tuple[int, str], outcome: Any) -> None:
        """A server granted an acquire after its round had counted it as failed: give the grant back, unless the
        lock is ours again by now (then the grant is part of our lease, renewed and released with it).

        Safe although the release is by owner, not by grant: this runs while the lane still holds that server for
        this lock, so no later call of ours about the lock can have reached the server first, and no attempt under
        way counts that server (its call was refused for the busy lane)."""
        if isinstance(outcome, AcquireResult) and outcome.acquired and (names.lock, owner) not in self._holders:
            await self.servers[lane[0]].release(names, owner, True)

    async def cancel_wait(self, names: LockNames, owner: str, place: str | None = None) -> None:
        return None  # attempts never queue (see the module docstring)

    async def keep_waiting(
        self, names: Sequence[LockNames], owner: str, places: Sequence[str | None] | None = None
    ) -> list[bool]:
        return [False] * len(names)  # no places to keep: attempts never queue

    async def release(self, names: LockNames, owner: str, notify: bool) -> bool:
        """Release on every server; where an earlier call about the lock is still under way (a straggler of this
        lease's write-back, or of an attempt cut off by a cancel or an interrupt, whose undo this is), the RELEASE
        waits for it and follows it (``queue``), so it cannot be refused there or overtaken by it."""
        held = self._holders.pop((names.lock, owner), None)
        outcomes = await self._on_all(names.lock, "release", names, owner, notify, queue=True)
        verdict = tally_flags(
            [None if isinstance(outcome, Exception) else bool(outcome) for outcome in outcomes],
            held.servers if held is not None else (),
        )
        if verdict.held or (verdict.covered and held is not None and monotonic() < held.until):
            return True
        if not verdict.decided:
            raise self._unavailable(names.key, "release", outcomes)
        return False

    keeps_keys = True

    async def keep_for(self, names: LockNames, owner: str, marker: str, keep_ms: int) -> bool:
        """Keep the key on every server (after any earlier call about the lock, as ``release`` does). True only when
        a majority kept it: then no other owner can take it on a majority before it ends. (Unlike a release, silent
        holders do not count: they keep our lease only until its deadline, not for ``keep_ms``.) False when a
        majority said no (the lease had ended); ``BackendUnavailableError`` when too few answered to tell."""
        self._holders.pop((names.lock, owner), None)
        outcomes = await self._on_all(names.lock, "keep_for", names, owner, marker, keep_ms, queue=True)
        verdict = tally_flags([None if isinstance(outcome, Exception) else bool(outcome) for outcome in outcomes])
        if verdict.held:
            return True
        if not verdict.decided:
            raise self._unavailable(names.key, "keep of a run's key", outcomes)
        return False

    async def renew(self, names: Sequence[LockNames], owner: str, lease_ms: int) -> list[bool | None]:
        """Per lease: True renewed by a majority in time; None not renewed, but still ours until its last
        holders' deadline (the renewer treats it as out of reach, and reports it lost once that has passed); False
        lost."""
        if not names:
            return []
        lease = lease_ms / 1000.0
        start = monotonic()
        deadline = start + lease - lease_drift(lease)
        before = [self._holders.get((lock.lock, owner)) for lock in names]
        shortening = False
        for index, held in enumerate(before):
            if held is not None and deadline < held.until:
                # The servers that run this renewal keep our lease only until its own deadline: a holder that says
                # yes, or stays silent after running it, covers no longer than that (see the module docstring).
                shortening = True
                lowered = _Holders(held.servers, deadline)
                self._holders[names[index].lock, owner] = before[index] = lowered
        # A server still carrying an earlier call about a lock (a give-back, a late grant's release, a straggling
        # write-back) may be about to delete what it holds of ours: its yes to this renewal counts for nothing.
        # (Renewals do not wait in those lanes, so they can overtake such a call; an acquire round never counts
        # such a server either.)
        pending = [
            {index for index in range(len(self.servers)) if self._fan_out.busy((index, lock.lock))} for lock in names
        ]
        # A shortening renewal (by hand: one lock) travels in the lock's lanes: a server that has not answered it
        # keeps the lane busy, and is not counted by the renewals after it (``pending`` above) until it has.
        lane = names[0].lock if shortening and len(names) == 1 else None
        outcomes = await self._on_all(lane, "renew", names, owner, lease_ms)
        now = monotonic()
        in_time = validity_left(lease, now - start) > 0
        kept: list[bool | None] = []
        for index, lock in enumerate(names):
            flags = [
                None if isinstance(reply, Exception) or server in pending[index] else reply[index]
                for server, reply in enumerate(outcomes)
            ]
            held = before[index]
            verdict = tally_flags(flags, held.servers if held is not None else ())
            if verdict.held and in_time:
                renewed = tuple(i for i, flag in enumerate(flags) if flag)
                if self._holders.get((lock.lock, owner)) is held:  # not released (or taken afresh) meanwhile
                    self._holders[lock.lock, owner] = _Holders(renewed, deadline)
                kept.append(True)
            elif verdict.covered and held is not None and now < held.until:
                kept.append(None)
            elif verdict.decided:
                kept.append(False)
            else:
                raise self._unavailable(lock.key if len(names) == 1 else None, "renewal", outcomes)
        return kept

    async def is_locked(self, names: LockNames) -> bool:
        outcomes = await self._on_all(None, "is_locked", names)
        answered = [outcome for outcome in outcomes if not isinstance(outcome, Exception)]
        if len(answered) < self.majority:
            raise self._unavailable(names.key, "lock query", outcomes)
        holding = sum(1 for outcome in answered if outcome)
        # Held by someone if the servers that say so, with those that did not answer, could be a majority.
        return holding > 0 and holding + len(outcomes) - len(answered) >= self.majority

    async def ping(self, probe: str) -> None:
        """Ping every server at once; raises (as an acquire that fewer than a majority granted would, naming every
        server that failed and why) unless a majority answers. A minority failing is logged (a warning naming each
        server) and not raised: a lock would still be taken."""
        outcomes = await self._on_all(None, "ping", probe)
        failed = [
            f"{server.address}: {_reason(outcome)}"
            for server, outcome in zip(self.servers, outcomes, strict=True)
            if isinstance(outcome, Exception)
        ]
        if len(outcomes) - len(failed) < self.majority:
            raise self._unavailable(None, "ping", outcomes)
        if failed:
            logger.warning(
                "hybridlock: %d of %d quorum servers did not answer a ping (a majority did): %s",
                len(failed),
                len(outcomes),
                "; ".join(failed),
            )

    async def describe_owner(self, key: str, fields: Mapping[str, str], gone: Sequence[str], ttl_ms: int) -> None:
        """Write the owner's description on every server (``hybridlock inspect`` over a quorum reads it from any
        that holds the lock). Best effort like a single server's: raises ``BackendUnavailableError`` only when
        fewer than a majority took it; a hung server is not waited for (``STRAGGLER_PATIENCE``)."""
        outcomes = await self._on_all(None, "describe_owner", key, fields, gone, ttl_ms)
        if sum(1 for outcome in outcomes if not isinstance(outcome, Exception)) < self.majority:
            raise self._unavailable(None, "description of the owner", outcomes)

    # -- read-write locks: refused ---------------------------------------------------------------------------------

    def _no_read_write(self, names: ReadWriteNames) -> InvalidArgumentError:
        return InvalidArgumentError(READ_WRITE_REFUSED, key=names.key, server=self.address)

    async def try_acquire_read(self, names: ReadWriteNames, owner: str, lease_ms: int | None) -> AcquireResult:
        raise self._no_read_write(names)

    async def try_acquire_write(
        self, names: ReadWriteNames, owner: str, lease_ms: int | None, wait: bool
    ) -> AcquireResult:
        raise self._no_read_write(names)

    async def release_write(self, names: ReadWriteNames, owner: str) -> bool:
        raise self._no_read_write(names)

    async def release_read(self, names: ReadWriteNames, owner: str) -> bool:
        raise self._no_read_write(names)

    async def is_read_locked(self, names: ReadWriteNames) -> bool:
        raise self._no_read_write(names)

    async def cancel_write_wait(self, names: ReadWriteNames, owner: str) -> None:
        raise self._no_read_write(names)

    async def aclose(self) -> None:
        await self._fan_out.aclose()  # first: stragglers still running would meet closed clients
        for server in self.servers:
            try:
                await server.aclose()
            except HybridLockError:
                pass  # closing one server must not keep the others open


@dataclass(frozen=True)
class _Holders:
    """The servers of the last majority round that granted or renewed one lease, and that round's deadline."""

    servers: tuple[int, ...]
    until: float


def _server_backend(server: Any) -> AsyncRedisBackend:
    if isinstance(server, AsyncRedisBackend):
        return server
    from ...backends.clients import check_client_settings, redacted, redacted_url
    from .redis import redis_client_from_url

    if isinstance(server, str):
        if not server:
            raise InvalidArgumentError("a quorum server's URL must not be empty")
        try:
            client = redis_client_from_url(server)
        except ValueError as exc:
            shown, detail = redacted_url(server), redacted(str(exc), server)
            raise InvalidArgumentError(f"not a valid server URL: {shown!r} ({detail})") from None
        return AsyncRedisBackend(client, owns_client=True)
    if hasattr(server, "evalsha") and hasattr(server, "connection_pool"):
        backend = AsyncRedisBackend(server)  # refuses a client of the other side, or a cluster client
        check_client_settings(server, backend.address)
        return backend
    raise InvalidArgumentError(
        "each quorum server must be a redis:// URL, a redis.asyncio.Redis client (or valkey's twin) or an "
        f"AsyncRedisBackend, not {type(server).__name__}"
    )


def _reason(error: Exception) -> str:
    """One failure, for a message: the hybridlock error's own text, or the exception's type and text."""
    if isinstance(error, HybridLockError):
        return error.message
    return f"{type(error).__name__}: {error}"
