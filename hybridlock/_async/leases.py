"""The lease table: every lease one registry holds in the server, and what happens to them outside renewal rounds.

It is the one owner of "which leases are held" (by server key): a lock enters it when a tenancy begins and
leaves it when the tenancy ends; the renewer reads it; ``held_locks()`` lists it. It also renews a lease by hand
(``lock.renew()``) and reports losses: the registry-wide ``on_lost`` callbacks live here, beside the lock's own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .._core.config import MIN_LEASE, lease_ms, validate_seconds
from .._core.names import LockNames
from ..errors import BackendUnavailableError, LockLostError, LockNotOwnedError, ReplicationNotConfirmedError
from ._compat import monotonic, new_guard
from .roles import HeldLease, TableContext

__all__ = ["HeldLease", "LeaseTable", "LostCallback"]

logger = logging.getLogger("hybridlock.lock")

LostCallback = Callable[[Any], Any]


class LeaseTable:
    def __init__(self, context: TableContext, lost_callbacks: list[LostCallback] | None = None) -> None:
        self._context = context
        self._mutex = new_guard()
        self._held: dict[str, HeldLease] = {}
        #: Held while a lease is marked lost (``ServerLease._claim_loss``) and while a renewal by hand books a
        #: shorter lease: rare, and apart from ``track``/``untrack`` on the acquire and release path.
        self.loss_guard = new_guard()
        #: Registry-wide ``on_lost`` callbacks (a forked child's table starts with the parent's).
        self.lost_callbacks: list[LostCallback] = list(lost_callbacks or ())

    def __bool__(self) -> bool:
        """Whether any lease is held (read without the lock: a hint for the renewer's idle check)."""
        return bool(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def get(self, names: LockNames) -> HeldLease | None:
        return self._held.get(names.lock)

    def track(self, lease: HeldLease, renew_by: float | None = None) -> None:
        """From now until ``untrack``, ``lease`` is held in the server and the renewer keeps it alive; ``renew_by``:
        its lease ends sooner than a renewal period from now (a grant's provisional lease), so the renewer must renew
        it before that ``monotonic()`` deadline."""
        with self._mutex:
            self._held[lease._names.lock] = lease
        renewer = self._context.renewer
        if renewer is not None:
            renewer.ensure_started()
            if renew_by is not None:
                renewer.renew_before(renew_by)

    def untrack(self, lease: HeldLease) -> None:
        with self._mutex:
            if self._held.get(lease._names.lock) is lease:
                del self._held[lease._names.lock]
            nothing_held = not self._held
        renewer = self._context.renewer
        if nothing_held and renewer is not None:
            renewer.nothing_held()  # so that its thread can end soon instead of sleeping a whole period

    def held(self) -> list[HeldLease]:
        """Leases some thread holds right now: not those kept idle by ``retain_for``, nor those whose release is
        under way (the reaper giving back an idle lease stays listed until the server answers, and the key may be
        gone already)."""
        with self._mutex:
            return [lease for lease in self._held.values() if lease._retained_until is None and not lease._giving_back]

    def in_server(self) -> list[HeldLease]:
        """Every lease held in the server, retained ones included (for the renewer)."""
        with self._mutex:
            return list(self._held.values())

    async def renew_by_hand(self, lock: Any, expire_after: float | None) -> None:
        """Reset ``lock``'s lease to ``expire_after`` seconds (default: the registry's) from now, in one round trip.
        Raises ``LockNotOwnedError`` when nobody here holds it, ``LockLostError`` when it is no longer ours (or its
        ``valid_until`` passed before the answer came).

        A lease shorter than the registry's lowers ``valid_until`` before the request leaves (see ``lease.py``),
        so a renewal that fails, or whose answer is lost, leaves the deadline the shorter lease gives; one that
        is not shorter costs what it always did. A longer lease is sent as asked, but ``valid_until`` counts the
        registry's at most (``RegistryConfig.valid_until``)."""
        context = self._context
        context.check_loop(lock.key)
        config = context.config
        lease = (
            config.expire_after
            if expire_after is None
            else validate_seconds("expire_after", expire_after, minimum=MIN_LEASE)
        )
        if lock._owner is None:
            raise LockNotOwnedError(
                "cannot renew a lock this registry does not hold", key=lock.key, server=context.server
            )
        if lock._abandoned:
            raise LockNotOwnedError(
                "cannot renew a lock whose holder here has ended without releasing it: its lease is left to run out "
                "(see statistics().abandoned)",
                key=lock.key,
                server=context.server,
            )
        if lock.lost:
            raise LockLostError("the lock's lease has already ended", key=lock.key, server=context.server)
        start = monotonic()
        tenancy = lock._tenancy
        if config.lease is None:
            # A registry without expiry (LocalLockRegistry): its leases never end, and renewing must not give them
            # an end either.
            lock._renewed(tenancy, start)
            return
        shorter = lease < config.lease
        if shorter:
            with self.loss_guard:
                lock._short_renewal_sent(tenancy, lease)
            if lock._lower_valid_until(tenancy, config.valid_until(start, lease)) and context.renewer is not None:
                context.renewer.watch(lock._valid_until)  # the deadline watch must now wake earlier
        answered = False
        try:
            try:
                (renewed,) = await context.backend.renew([lock._names], context.client_id, lease_ms(lease))
            except ReplicationNotConfirmedError as exc:
                if exc.renewed != [False]:
                    raise
                renewed = False  # the master reported the lease gone: lost, whatever the replicas say
            answered = renewed is not None
        finally:
            if shorter and answered:
                with self.loss_guard:
                    lock._short_renewal_answered(tenancy)
        if renewed is None:  # (a backend raises when it could ask about no lock at all; this is a safety net)
            raise BackendUnavailableError(
                "the lease could not be renewed: its servers were out of reach (it is not known lost)",
                key=lock.key,
                server=context.server,
            )
        if not renewed:
            await lock._mark_lost(tenancy)
            raise LockLostError(
                "the lock's lease had ended before renewal: another owner may have held it meanwhile",
                key=lock.key,
                server=context.server,
            )
        lock._renewed(tenancy, start, lease)
        if lock.lost and lock._tenancy == tenancy:
            # Renewed in the server for a holder already told it lost the lock: given back, not left for nobody.
            await lock._give_back_after_loss(tenancy)
            raise LockLostError(
                "the lock's valid_until passed before the renewal was answered, so it was reported lost: another "
                "owner may have held it meanwhile",
                key=lock.key,
                server=context.server,
            )

    def report_lost(self, lock: Any, callbacks: list[LostCallback]) -> None:
        """Tell everyone who asked (the lock's callbacks, then the registry's) that ``lock``'s lease was lost."""
        logger.warning("hybridlock: lease of %r on %s was lost while held", lock.key, self._context.server)
        observer = self._context.observer
        if observer is not None:
            observer.lost(lock.key, getattr(lock, "kind", "lock"))
        for callback in callbacks + self.lost_callbacks:
            try:
                callback(lock)
            except Exception:
                logger.exception("hybridlock: on_lost callback %r failed for %r", callback, lock.key)
