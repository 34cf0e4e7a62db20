"""Read-write locks: many readers or one writer, across the threads of a process and across processes.

As with the plain lock, a local lock sits in front of the server's. Locally, threads count as readers or as the
writer; remotely, the whole process holds at most **one** read hold (whatever the number of its reader threads)
or the write hold:

* the first local reader takes the process's read hold in the server, later ones join it with no round trip, and
  the last one to leave gives it back;
* the writer waits until no local reader or writer remains, then takes the write hold in the server.

Writers are not starved. Locally, once a thread waits to write, new reader threads wait behind it. Remotely, a
writer that is refused is recorded as waiting, which refuses new read holds, and announces itself on the lock's
channel; a process that hears it stops admitting new reader threads to its current read hold, so the hold drains
and the writer gets in even under a never-ending stream of overlapping readers.

A writer may take the read lock (downgrade: acquire read, then release write). A reader asking for the write lock
gets ``LockUpgradeError`` at once: two readers both upgrading would wait for each other forever.

Failure modes
-------------
* Each reader process's hold carries its own expiry, so a crashed reader stops blocking writers when its own
  lease ends, however busy the other readers are.
* Leases, renewal, ``lost`` and ``LockLostError`` work as for the plain lock, separately for each half (the read
  hold is one lease for all reader threads of the process; the thread that gives it back hears of a loss).
"""

from __future__ import annotations

import logging
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._core.config import validate_timeout
from .._core.events import LockKind
from .._core.names import LockNames, ReadWriteNames
from .._core.results import AcquireResult
from ..errors import HybridLockError, LockNotOwnedError, LockUpgradeError
from ._compat import (
    AsyncCondition,
    asking_owner,
    current_owner,
    describe_owner,
    monotonic,
    owner_alive,
    refuse_a_task_of_its_own,
    refuse_in_event_loop,
    returned_to_with,
    shielded,
)
from .backends.base import AsyncReleaseWatch
from .lease import ServerLease
from .lock import AsyncJavaStyleLock
from .observing import AcquireProbe, observe_acquire, observe_release
from .owners import Site, caller_frame, caller_site
from .scope import LossWatching
from .waiting import Grant, acquire_remote, contention_watch

if TYPE_CHECKING:
    from .context import LockContext

__all__ = ["AsyncReadLock", "AsyncReadWriteLock", "AsyncWriteLock"]

logger = logging.getLogger("hybridlock.lock")


class _Half(ServerLease, AsyncJavaStyleLock, LossWatching):
    """What both halves share: the thread-facing API, and one server lease as the renewer sees it."""

    #: Name of the half in messages, reprs and observer events; the subclasses differ in this and in the four hooks
    #: below.
    kind: LockKind
    _waits_in_server = False  # whether a refused blocking attempt takes a place in the server (see _acquire_remote)

    def __init__(self, parent: AsyncReadWriteLock, names: LockNames) -> None:
        super().__init__(parent._context, names)
        self._parent = parent

    @property
    def valid_until(self) -> float | None:
        return self._valid_until if self._in_server else None

    # -- the thread-facing API ---------------------------------------------------------------------------------------

    async def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As ``threading.RLock.acquire``; the timeout covers the local and the remote wait. (On the thread side
        ``with half.acquire(timeout=5):`` works too: see ``HybridLock.acquire``.)"""
        caller = caller_frame()
        return returned_to_with(self, await self._acquire_from(caller, blocking, timeout), caller)

    async def _acquire_from(self, caller: FrameType | None, blocking: bool, timeout: float) -> bool:
        wait = validate_timeout(blocking, timeout)
        refuse_in_event_loop(self.key, self._context.server)
        self._context.check_open(self.key)
        start = monotonic()
        deadline = None if wait is None else start + wait
        me = current_owner()
        if self._depth(me):
            return await self._acquire(me, blocking, deadline)  # reentrant: only counts (and is not reported)
        refuse_a_task_of_its_own(f"{self.kind} lock", self.key, self._context)
        site = caller_site(caller)
        observer = self._context.observer
        if observer is not None:
            acquire = partial(self._acquire, me, blocking, deadline, site=site)
            return await observe_acquire(observer, self, self.key, self.kind, me, start, acquire)
        return await self._acquire(me, blocking, deadline, site=site)

    async def release(self) -> None:
        me = current_owner()
        observer = self._context.observer
        if observer is not None and self.hold_count == 1:  # (a reentrant release is not reported)
            await observe_release(observer, self, self.key, self.kind, me, partial(self._release, me))
            return
        await self._release(me)

    def __repr__(self) -> str:
        return f"<hybridlock.{type(self).__name__} {self.key!r} depth {self.hold_count} here at {id(self):#x}>"

    @property
    def hold_count(self) -> int:
        me = asking_owner()
        return 0 if me is None else self._depth(me)

    def _depth(self, owner: object) -> int:
        """How many times ``owner`` holds this half (0: not at all)."""
        raise NotImplementedError

    def is_held_by_current_task(self) -> bool:
        """Whether this task holds this half of the lock (no round trip)."""
        return self.hold_count > 0

    # -- one server tenancy ------------------------------------------------------------------------------------------

    async def _remote(self, blocking: bool, deadline: float | None, probe: AcquireProbe | None) -> Grant | None:
        context = self._context
        return await acquire_remote(
            context,
            self._names,
            blocking,
            deadline,
            attempt=lambda: self._try_once(context.client_id, blocking),
            give_up=lambda: self._give_up(context.client_id),
            undo=lambda: self._give_back(context.client_id),
            queues=self._waits_in_server,
            probe=probe,
        )

    async def _try_once(self, owner: str, wait: bool) -> AcquireResult:
        raise NotImplementedError

    async def _give_up(self, owner: str) -> None:
        """A blocking wait for the server hold ended without it."""

    async def _give_back(self, owner: str) -> bool:
        """Release the server hold (after an attempt interrupted in flight, which may have taken it)."""
        raise NotImplementedError

    async def _acquire(
        self,
        me: object,
        blocking: bool,
        deadline: float | None,
        probe: AcquireProbe | None = None,
        site: Site = None,
    ) -> bool:
        raise NotImplementedError

    async def _give_back_abandoned(self) -> None:
        """The I/O of ``_end_abandoned``: release the server hold in place of its holders, which are gone."""
        try:
            await shielded(partial(self._give_back, self._context.client_id))
        except HybridLockError as exc:
            logger.warning("hybridlock: could not give back the abandoned %s hold of %r: %s", self.kind, self.key, exc)

    async def _release(self, me: object) -> None:
        raise NotImplementedError


def _remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - monotonic())


class AsyncReadLock(_Half):
    """The shared half: any number of threads, in any number of processes, while nobody writes."""

    kind: LockKind = "read"
    _loss_what = "read lock"
    _waits_in_server = False  # a blocked reader records nothing in the server: it just retries

    def __init__(self, parent: AsyncReadWriteLock) -> None:
        super().__init__(parent, parent._names.read)
        self._watch: AsyncReleaseWatch | None = None  # hears writers of other owners asking for the lock

    def _depth(self, owner: object) -> int:
        return self._parent._readers.get(owner, 0)

    def _holder(self) -> object | None:
        # One of the reader threads here (the first to come): the server sees one read hold for all of them.
        return next(iter(self._parent._readers), None)

    def _holder_site(self) -> Site:
        rw = self._parent
        holder = next(iter(rw._readers), None)
        return None if holder is None else rw._reader_sites.get(holder)

    def _holders_gone(self) -> bool:
        readers = list(self._parent._readers)
        return self._abandoned or (bool(readers) and not any(owner_alive(reader) for reader in readers))

    def _find_abandoned(self) -> list[tuple[object, Site]]:
        rw = self._parent
        with rw._cond:
            if rw._read_hold != "held" or self._abandoned:
                return []
            # Reader threads that are gone can release nothing: their part of the read hold is dropped.
            gone = [(reader, rw._reader_sites.get(reader)) for reader in rw._readers if not owner_alive(reader)]
            for reader, _ in gone:
                del rw._readers[reader]
                rw._reader_sites.pop(reader, None)
                if self._observed_hold_starts:
                    self._observed_hold_starts.pop(reader, None)
            if gone and not rw._readers:
                # Nobody left to give the read hold back; nobody joins it (may_enter) until it has ended.
                self._abandoned = True
                self._abandoned_by = gone[-1]
            return gone

    async def _end_abandoned(self) -> None:
        rw = self._parent
        with rw._cond:
            if not self._abandoned or rw._readers or rw._read_hold != "held":
                return
            rw._read_hold = "busy"
            self._give_back_lease()
        try:
            await self._give_back_abandoned()
        finally:
            with rw._cond:
                if self._watch is not None:
                    self._watch.close()
                    self._watch = None
                self._end_lease()
                rw._read_hold = "none"
                rw._cond.notify_all()

    async def _try_once(self, owner: str, wait: bool) -> AcquireResult:
        return await self._context.backend.try_acquire_read(self._parent._names, owner, self._context.config.lease_ms)

    async def _give_back(self, owner: str) -> bool:
        return await self._context.backend.release_read(self._parent._names, owner)

    async def locked(self) -> bool:
        """Whether anyone holds a read hold: a thread of this process (no round trip) or another owner (one)."""
        if self._parent._readers:
            return True
        self._context.check_open(self.key)
        return await self._context.backend.is_read_locked(self._parent._names)

    def _writer_elsewhere_waits(self) -> bool:
        return self._watch is not None and self._watch.contended()

    async def _acquire(
        self,
        me: object,
        blocking: bool,
        deadline: float | None,
        probe: AcquireProbe | None = None,
        site: Site = None,
    ) -> bool:
        rw = self._parent
        with rw._cond:
            if rw._readers.get(me):
                if self._lost:
                    raise self._reentry_error(f"{self.kind} hold")
                rw._readers[me] += 1
                return True
            downgrade = rw._writer == me

            def may_enter() -> bool:
                if rw._read_hold == "busy":
                    return False
                if rw._read_hold == "held" and (self._lost or self._abandoned):
                    # Nobody joins a lost read hold (wait for it to drain, then take a fresh one), nor an abandoned
                    # one (no longer renewed: wait for it to end, see owners.py).
                    return False
                if downgrade:
                    return True
                if rw._writer is not None or rw._writers_waiting:
                    return False  # local writer preference
                # A writer of another owner waits: let our read hold drain instead of extending it.
                return not (rw._read_hold == "held" and self._writer_elsewhere_waits())

            if not blocking:
                if not may_enter():
                    return False
            elif not await rw._cond.wait_for(may_enter, _remaining(deadline)):
                return False
            if rw._read_hold == "held":
                rw._readers[me] = 1
                rw._reader_sites[me] = site
                return True
            rw._read_hold = "busy"
        grant = watch = None
        try:
            # Listen for other owners' writers before taking the hold, so that nothing is left to do once the hold
            # is ours (an interruption from here on would leave the hold with nobody).
            watch = await contention_watch(self._context, self._names)
            grant = await self._remote(blocking, deadline, probe)
        finally:
            with rw._cond:
                if grant is not None:
                    rw._read_hold = "held"
                    rw._readers[me] = 1
                    rw._reader_sites[me] = site
                    self._begin_lease(grant.result.fencing_token, grant.sent_at)
                    self._watch = watch
                else:
                    rw._read_hold = "none"
                    if watch is not None:
                        watch.close()
                rw._cond.notify_all()
        return grant is not None

    async def _release(self, me: object) -> None:
        rw = self._parent
        with rw._cond:
            depth = rw._readers.get(me, 0)
            if not depth:
                raise LockNotOwnedError(
                    "cannot release a read lock this task does not hold", key=self.key, server=self._context.server
                )
            if depth > 1:
                rw._readers[me] = depth - 1
                return
            del rw._readers[me]
            rw._reader_sites.pop(me, None)
            if rw._readers:
                return  # other reader threads of this process keep the read hold
            rw._read_hold = "busy"
            was_lost = self._give_back_lease()
        released = False
        unreachable: HybridLockError | None = None
        try:
            # Shielded, as the plain lock's final release: a cancel while the release is on its way (a reconnect,
            # say) would otherwise forget the hold here and leave it in the server, held by nobody, for its lease.
            released = await shielded(partial(self._give_back, self._context.client_id))
        except HybridLockError as exc:
            if not was_lost:
                raise
            unreachable = exc  # known lost: the loss is what the caller must hear (as for the plain lock)
        finally:
            with rw._cond:
                if self._watch is not None:
                    self._watch.close()
                    self._watch = None
                self._end_lease()
                rw._read_hold = "none"
                rw._cond.notify_all()
        if was_lost or not released:
            raise self._lost_error(f"{self.kind} hold") from unreachable


class AsyncWriteLock(_Half):
    """The exclusive half: one thread in the whole system, and no reader."""

    kind: LockKind = "write"
    _loss_what = "write lock"
    _waits_in_server = True  # a blocked writer is recorded among the waiting writers (``_names`` is names.write)

    def _depth(self, owner: object) -> int:
        rw = self._parent
        return rw._write_count if rw._writer == owner else 0

    def __init__(self, parent: AsyncReadWriteLock) -> None:
        super().__init__(parent, parent._names.write)
        self._site: Site = None  # where the writer here took the lock (owners.py)

    def _holder(self) -> object | None:
        return self._parent._writer

    def _holder_site(self) -> Site:
        return self._site if self._parent._writer is not None else None

    def _find_abandoned(self) -> list[tuple[object, Site]]:
        rw = self._parent
        with rw._cond:
            writer = rw._writer
            if writer is None or owner_alive(writer) or self._abandoned:
                return []
            # (A writer that is gone changes nothing any more, and nobody else can write meanwhile.)
            self._abandoned = True
            self._abandoned_by = (writer, self._site)
            return [self._abandoned_by]

    async def _end_abandoned(self) -> None:
        rw = self._parent
        with rw._cond:
            writer = rw._writer
            if not self._abandoned or writer is None:
                return
            self._give_back_lease()
        try:
            await self._give_back_abandoned()
        finally:
            with rw._cond:
                self._end_lease()
                rw._writer, rw._write_count = None, 0
                self._site = None
                rw._cond.notify_all()
            if self._observed_hold_starts:
                self._observed_hold_starts.pop(writer, None)

    @property
    def fencing_token(self) -> int | None:
        """The token minted for this process's current write hold (see ``HybridLock.fencing_token``)."""
        return self._fencing_token if self._parent._writer is not None else None

    async def locked(self) -> bool:
        """Whether anyone holds the write lock: a thread of this process (no round trip) or another owner (one)."""
        if self._parent._writer is not None:
            return True
        self._context.check_open(self.key)
        return await self._context.backend.is_locked(self._names)  # ``_names.lock`` is the write hold's key

    async def _try_once(self, owner: str, wait: bool) -> AcquireResult:
        context = self._context
        return await context.backend.try_acquire_write(self._parent._names, owner, context.config.lease_ms, wait)

    async def _give_up(self, owner: str) -> None:
        # We may be recorded as a waiting writer: stop holding back other owners' readers.
        await self._context.backend.cancel_write_wait(self._parent._names, owner)

    async def _give_back(self, owner: str) -> bool:
        return await self._context.backend.release_write(self._parent._names, owner)

    async def _acquire(
        self,
        me: object,
        blocking: bool,
        deadline: float | None,
        probe: AcquireProbe | None = None,
        site: Site = None,
    ) -> bool:
        rw = self._parent
        with rw._cond:
            if rw._writer == me:
                if self._lost:
                    raise self._reentry_error(f"{self.kind} hold")
                rw._write_count += 1
                return True
            if rw._readers.get(me):
                raise LockUpgradeError(
                    "this task holds the read lock: release it before taking the write lock (upgrading could "
                    "deadlock with another upgrading reader)",
                    key=self.key,
                    server=self._context.server,
                )

            def may_enter() -> bool:
                return rw._writer is None and not rw._readers and rw._read_hold == "none"

            if not may_enter():
                if not blocking:
                    return False
                rw._writers_waiting += 1
                try:
                    entered = await rw._cond.wait_for(may_enter, _remaining(deadline))
                finally:
                    rw._writers_waiting -= 1
                if not entered:
                    rw._cond.notify_all()  # readers held back by our wish may go now
                    return False
            rw._writer, rw._write_count = me, 1
            self._site = site
        grant = None
        try:
            grant = await self._remote(blocking, deadline, probe)
        finally:
            if grant is None:
                with rw._cond:
                    rw._writer, rw._write_count = None, 0
                    rw._cond.notify_all()
        if grant is None:
            return False
        with rw._cond:
            self._begin_lease(grant.result.fencing_token, grant.sent_at)
        return True

    async def _release(self, me: object) -> None:
        rw = self._parent
        with rw._cond:
            if rw._writer != me:
                raise LockNotOwnedError(
                    "cannot release a write lock this task does not hold", key=self.key, server=self._context.server
                )
            if rw._write_count > 1:
                rw._write_count -= 1
                return
            was_lost = self._give_back_lease()
        released = False
        unreachable: HybridLockError | None = None
        try:
            # Shielded, as the plain lock's final release: a cancel while the release is on its way (a reconnect,
            # say) would otherwise forget the hold here and leave it in the server, held by nobody, for its lease.
            released = await shielded(partial(self._give_back, self._context.client_id))
        except HybridLockError as exc:
            if not was_lost:
                raise
            unreachable = exc  # known lost: the loss is what the caller must hear (as for the plain lock)
        finally:
            with rw._cond:
                self._end_lease()
                rw._writer, rw._write_count = None, 0
                rw._cond.notify_all()
        if was_lost or not released:
            raise self._lost_error(f"{self.kind} hold") from unreachable


class AsyncReadWriteLock:
    """A lock with a shared read half and an exclusive write half: ``registry.obtain_read_write(key)``.

    ``with rw.read_lock(): ...`` admits many readers at once (in this process and in others);
    ``with rw.write_lock(): ...`` admits one writer and no reader.
    """

    def __init__(self, context: LockContext, names: ReadWriteNames) -> None:
        self._context = context
        self._names = names
        self._reset_local_state()
        self._read = AsyncReadLock(self)
        self._write = AsyncWriteLock(self)

    def _reset_local_state(self) -> None:
        self._cond = AsyncCondition()
        self._writer: object | None = None
        self._write_count = 0
        self._readers: dict[object, int] = {}  # owner (thread, or task) -> read depth
        self._reader_sites: dict[object, Site] = {}  # owner -> where it took the read lock (owners.py)
        self._writers_waiting = 0  # local threads waiting to write
        # The process's read hold in the server: "none", "busy" (being taken or given back) or "held".
        self._read_hold = "none"

    @property
    def key(self) -> str:
        return self._names.key

    def read_lock(self) -> AsyncReadLock:
        return self._read

    def write_lock(self) -> AsyncWriteLock:
        return self._write

    def _reset_after_fork(self, context: LockContext) -> None:
        self._context = context
        self._reset_local_state()
        self._read._context = self._write._context = context
        for half in (self._read, self._write):
            half._forget_lease_after_fork()
        self._read._watch = None
        self._write._site = None

    def __repr__(self) -> str:
        state: Any = f"{len(self._readers)} readers" if self._readers else "no readers"
        if self._writer is not None:
            state = f"written by {describe_owner(self._writer)}"
        return f"<hybridlock.AsyncReadWriteLock {self.key!r} {state} here at {id(self):#x}>"
