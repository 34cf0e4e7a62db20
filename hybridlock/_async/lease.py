"""ServerLease: the bookkeeping of one server tenancy, shared by every lock kind that holds a lease.

A plain lock and each half of a read-write lock hold at most one lease in the server at a time. This base class
keeps what the renewer and the loss reporting need of it: which tenancy it is (late renewal replies for an
earlier one are ignored), when it started, the conservative ``valid_until`` deadline, the fencing token, and
whether it was found lost, with the callbacks to run once when it is.

``valid_until`` is the one deadline the holder may trust, so every path keeps it at or before the end of the
shortest lease any server may hold for the tenancy:

* a grant or a renewal counts from when its request was sent, with the registry's lease at most
  (``RegistryConfig.valid_until``: a longer lease asked by hand may be cut back by a round of ours still on its
  way);
* a renewal by hand with a shorter lease lowers ``valid_until`` *before* it is sent (``_lower_valid_until``):
  once it has left, the server may run it whatever becomes of the reply (lost to a timeout, not confirmed by the
  replicas, answered by part of a quorum), and a reply that never comes must not leave the old deadline standing;
* such a shorter renewal may still reach a server after a renewal sent while it was unanswered (two connections,
  two threads), so those renewals count its lease at most (``_ShortRenewals``); one whose answer never came
  counts for the rest of the tenancy;
* a lease marked lost stays lost: a renewal's reply that comes after it (the renewer's deadline watch marks a
  lease lost when ``valid_until`` passes, whatever the round in flight is doing) changes nothing, and its
  ``valid_until`` stays in the past until the lock is released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .._core.names import LockNames
from ..errors import HybridLockError, InvalidArgumentError, LockLostError
from ._compat import monotonic, owner_alive
from .leases import LostCallback

if TYPE_CHECKING:
    from .context import LockContext
    from .owners import Site

__all__ = ["ServerLease"]

logger = logging.getLogger("hybridlock.lock")


class _ShortRenewals:
    """The renewals by hand of one tenancy that asked for less than the registry's lease (see ``ServerLease``).

    ``lease``: the shortest of them. ``open``: how many are unanswered; one whose answer never came (an error, a
    quorum too silent to tell) is never closed. ``settled_at``: when the last one was answered (``monotonic()``).
    A renewal sent after ``settled_at`` with none open was sent after every shorter one had been run, so nothing
    shorter can reach a server after it; any other counts ``lease`` at most."""

    __slots__ = ("lease", "open", "settled_at", "tenancy")

    def __init__(self, tenancy: int, lease: float) -> None:
        self.tenancy = tenancy
        self.lease = lease
        self.open = 0
        self.settled_at = monotonic()


class ServerLease:
    def __init__(self, context: LockContext, names: LockNames) -> None:
        self._context = context
        self._names = names  # (with the current tenancy's value where it is not the owner id: see _begin_lease)
        self._base_names = names  # (what the names are between tenancies)
        self._tenancy = 0  # counts server tenancies, so late renewal results for an earlier one are ignored
        self._in_server = False  # this process holds the lease now
        # Two clocks per tenancy, deliberately different (see _begin_lease): when the server granted it (the reply
        # came back; max_hold and the hand-off windows count the hold from here), and the conservative deadline
        # counted from when the granting request was sent.
        self._acquired_at: float | None = None
        self._valid_until: float | None = None
        self._fencing_token: int | None = None
        self._granted_wall: float | None = None  # when the server granted the tenancy (time.time(), for people)
        self._lost = False
        # The final release of the current tenancy is under way: a renewal reply for it can no longer mean a loss.
        self._giving_back = False
        # Renewals by hand shorter than the registry's lease (None until the first; it names its tenancy, so a new
        # tenancy needs no reset on the acquire path).
        self._short: _ShortRenewals | None = None
        self._callbacks: list[LostCallback] = []
        # Who waits for the loss of the current tenancy (``until_lost()`` scopes: see scope.py): plain calls made
        # once, as the loss is claimed, and dropped when the tenancy ends.
        self._loss_listeners: list[Callable[[], None]] = []
        # Every holder here of the current tenancy has ended without releasing it (see owners.py): it is no longer
        # renewed, and ends when its lease runs out. With (one of) those holders and where it took the lock.
        self._abandoned = False
        self._abandoned_by: tuple[object, Site] | None = None
        # Lease retention (LockRegistry(retain_for=...), see _retention.py; plain locks only): while no thread here
        # holds the lock, the lease is kept until this time.monotonic() deadline. None when not retained.
        self._retained_until: float | None = None
        # A bound on this tenancy (run_once's at_most_for): a monotonic() time past which the lease is never
        # renewed, the last renewals asking only for what is left (renewer.py). None: renewed while held.
        self._hold_until: float | None = None
        # When each holder's observed acquire returned (only with a registry observer; see observing.py). Set here,
        # not on first use: an attribute added after __init__ slows every attribute access on the object.
        self._observed_hold_starts: dict[object, float] | None = None

    @property
    def key(self) -> str:
        return self._names.key

    @property
    def lost(self) -> bool:
        """True once a renewal (or a release) found the server lease gone or another owner's; reset by the next
        fresh acquisition in the server."""
        return self._lost

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lock)`` from the registry's renewer when the held lease is found lost: once per loss. It
        stays registered for every later hold of this lock (the lock object lives as long as its registry), so
        register it once, not at each acquire."""
        if not callable(callback):
            raise InvalidArgumentError("on_lost needs a callable", key=self.key)
        self._callbacks.append(callback)

    def _holder(self) -> object | None:
        """Who holds the lease here (``current_owner()``: a thread's token, or a task), for holder descriptions;
        None if nobody does."""
        return None

    def _holder_site(self) -> Site:
        """Where ``_holder()`` took the lock."""
        return None

    # -- holders that are gone (owners.py) ----------------------------------------------------------------------------

    def _holders_gone(self) -> bool:
        """Whether the hold here is abandoned, or every holder it has has ended (a look that changes nothing: the
        worker's ``_find_abandoned`` acts on it)."""
        if self._abandoned:
            return True
        holder = self._holder()
        return holder is not None and not owner_alive(holder)

    def _find_abandoned(self) -> list[tuple[object, Site]]:
        """Look for holders here that ended without releasing: forget them and return them with where they took the
        lock, and mark the hold abandoned (``_abandoned``, ``_abandoned_by``) once none of its holders is left. (Called
        by the registry's worker only.)"""
        return []

    async def _end_abandoned(self) -> None:
        """End an abandoned hold in the server and here, in place of its holder (the registry's worker calls it once
        the lease has run out)."""

    def _begin_lease(
        self, token: int | None, sent_at: float, valid_until: float | None = None, tenancy: str | None = None
    ) -> None:
        """The server granted a fresh tenancy, to the request sent at ``sent_at`` (``monotonic()``; see
        ``waiting.Grant``); call it as the reply is read.

        Each clock is taken where it is safe:

        * the lease (``valid_until``) counts from ``sent_at``: the server started it no earlier, so the deadline
          errs early. Not from the start of ``acquire``: the local wait and refused attempts before the granting
          one would make a lock just granted look expired, and a single failed renewal would report it lost;
        * the hold (``_acquired_at``: ``max_hold``, the hand-off windows; ``_granted_wall`` for people) counts from
          now, the grant: it is a limit on how long the lock is held, and must not be spent on the wait for it.

        ``valid_until``: the lease's deadline when the server set it otherwise (a lock granted to our place in its
        queue, with a provisional lease: see ``waiting``); the renewer is asked to extend it before then.

        ``tenancy``: what the key holds while it is this tenancy's where that is not the owner id alone ("" for the
        owner id; None: the names given at construction say it), which renewals and the release compare."""
        if tenancy is not None:
            base = self._base_names
            self._names = replace(base, tenancy=tenancy) if tenancy != base.tenancy else base
        self._tenancy += 1
        self._in_server = True
        self._giving_back = False
        self._retained_until = None
        self._hold_until = None
        self._lost = False
        self._abandoned = False
        self._abandoned_by = None
        self._fencing_token = token
        self._acquired_at = monotonic()
        self._granted_wall = time.time()
        if valid_until is None:
            self._valid_until = self._context.config.valid_until(sent_at)
            self._context.leases.track(self)
        else:
            self._valid_until = valid_until
            self._context.leases.track(self, renew_by=valid_until)

    def _give_back_lease(self) -> bool:
        """The lease is about to be released in the server; returns whether it had been reported lost.

        NOTE: a renewal round may find the key gone once our release lands, and must not report a loss. A round
        that looked at the lease before this point holds the old tenancy number, which is stale from now on; one
        that looks at it after this point (the lease is still listed as held until ``_end_lease``) finds
        ``_giving_back`` set. The flag is set before the number moves, so a round reading the new number also
        reads the flag."""
        self._giving_back = True
        self._tenancy += 1
        self._retained_until = None  # no longer kept idle: whoever sees the key gone sees the retention over
        return self._lost

    def _end_lease(self) -> None:
        """The tenancy is over (released, or found lost)."""
        self._in_server = False
        self._giving_back = False
        self._abandoned = False
        self._abandoned_by = None
        self._retained_until = None
        self._hold_until = None
        self._fencing_token = None
        self._valid_until = None
        self._loss_listeners = []
        self._names = self._base_names  # (a granted tenancy's value goes with it: the next one says its own)
        self._context.leases.untrack(self)

    def _forget_lease_after_fork(self) -> None:
        # The child holds none of its parent's leases.
        self._observed_hold_starts = None
        self._in_server = False
        self._giving_back = False
        self._abandoned = False
        self._abandoned_by = None
        self._retained_until = None
        self._hold_until = None
        self._fencing_token = None
        self._valid_until = None
        self._lost = False
        self._loss_listeners = []
        self._names = self._base_names  # (the parent's granted tenancy is not the child's)

    def _is_current(self, tenancy: int) -> bool:
        """Whether a renewal result for ``tenancy`` speaks of the lease held now (not an earlier one, and not one
        whose release is under way)."""
        return self._in_server and self._tenancy == tenancy and not self._giving_back

    async def _give_back_after_loss(self, tenancy: int) -> None:
        """A renewal of ``tenancy`` was answered yes after the tenancy had been found lost (its ``valid_until``
        passed with the renewal in flight, and the holder was told): the server holds the lease again, for nobody.
        Give it back now, not at the end of the lease the renewal gave it (``_give_back_late``); best effort."""
        # What the give-back names is read before the check that it is still this tenancy's: on threads, the holder
        # may release and another thread take a new tenancy at any moment, and that one must never be given back.
        # Read after a new tenancy began, the check fails; read before, it names this tenancy's token, which the
        # server compares with its counter (a new tenancy minted another).
        token, names = self._fencing_token, self._names
        if not (self._lost and self._is_current(tenancy)):
            return
        try:
            given = await self._give_back_late(token, names)
        except HybridLockError as exc:
            logger.debug("hybridlock: could not give back the lease of %r renewed after its loss: %s", self.key, exc)
            return
        if given:
            logger.debug("hybridlock: gave back the lease of %r, renewed after its loss was told", self.key)

    async def _give_back_late(self, token: int | None, names: LockNames) -> bool:
        """Give back the lease of this (lost) tenancy, with fencing token ``token`` and names ``names``, in the
        server if the key still holds it and no later tenancy was taken: see ``_give_back_after_loss``. Returns
        whether it did. This default gives nothing back: the lease ends with its lease."""
        return False

    def _renewed(self, tenancy: int, start: float, lease: float | None = None) -> None:
        """A renewal of ``tenancy`` sent at ``start`` (with ``lease``, or the registry's) was answered yes: move
        ``valid_until`` to what it gives. Ignored for another tenancy, and for a lease already marked lost."""
        # (``_is_current`` spelled out: this runs for every lease in every renewal round.)
        if not self._in_server or self._tenancy != tenancy or self._giving_back or self._lost:
            return
        config = self._context.config
        short = self._short
        if short is not None and short.tenancy == tenancy and (short.open or start <= short.settled_at):
            lease = short.lease if lease is None else min(lease, short.lease)
        self._valid_until = until = config.valid_until(start, lease)
        # Two threads (sync side): a shorter renewal by hand sent, or a loss marked, between the look above and
        # the write must still win. Neither happens on the async side, where nothing here awaits.
        short = self._short
        if short is not None and short.tenancy == tenancy and short.open:
            self._valid_until = until = min(until, config.valid_until(start, short.lease))
        if self._lost:
            self._valid_until = min(until, monotonic())

    def _lower_valid_until(self, tenancy: int, until: float) -> bool:
        """A renewal about to be sent may leave the lease ending as early as ``until``: bring ``valid_until`` down to
        it if it is later. Returns whether it did."""
        current = self._valid_until
        if not self._is_current(tenancy) or current is None or current <= until:
            return False
        self._valid_until = until
        if self._lost:  # marked lost meanwhile (another thread): its deadline stays past
            self._valid_until = min(until, monotonic())
        return True

    def _short_renewal_sent(self, tenancy: int, lease: float) -> None:
        """A renewal by hand of ``tenancy`` asking for ``lease`` seconds, less than the registry's, is about to be
        sent. (Called under the lease table's guard: two threads may renew by hand at once.)"""
        short = self._short
        if short is None or short.tenancy != tenancy:
            self._short = short = _ShortRenewals(tenancy, lease)
        else:
            short.lease = min(short.lease, lease)
        short.open += 1

    def _short_renewal_answered(self, tenancy: int) -> None:
        """That renewal was answered (yes or no; not an error): the server ran it, and cannot run it again later.
        (Called under the lease table's guard.)"""
        short = self._short
        if short is not None and short.tenancy == tenancy and short.open:
            short.open -= 1
            short.settled_at = monotonic()

    def _claim_loss(self, tenancy: int) -> bool:
        """Mark the lease of ``tenancy`` lost, once: True for the one caller that did (it reports the loss). The
        renewer's worker, its deadline watch and a renewal by hand may all find the same loss at once. The loss
        listeners (``_watch_loss``) are called here, before the callbacks: they only signal, and must not wait on
        a slow ``on_lost`` callback."""
        with self._context.leases.loss_guard:
            if self._lost or not self._is_current(tenancy):
                return False
            self._lost = True
            # Held still, but no longer certainly ours: a deadline already past (so that the check the docs advise,
            # ``time.monotonic() < lock.valid_until``, says no), not None, which only a lock not held has.
            now = monotonic()
            until = self._valid_until
            self._valid_until = now if until is None else min(until, now)
            listeners, self._loss_listeners = self._loss_listeners, []
        for listener in listeners:
            _tell(listener, self.key)
        return True

    def _watch_loss(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` once when the tenancy held now is found lost (from whichever thread or task finds it:
        the renewer's, as a rule), or at once if it already is. It must be quick and must not raise. Nothing is
        called for a tenancy that ends by its release; ``_unwatch_loss`` stops watching sooner."""
        with self._context.leases.loss_guard:
            if not self._lost:
                self._loss_listeners.append(listener)
                return
        _tell(listener, self.key)

    def _unwatch_loss(self, listener: Callable[[], None]) -> None:
        with self._context.leases.loss_guard:
            try:
                self._loss_listeners.remove(listener)
            except ValueError:
                pass  # already called, or the tenancy has ended

    async def _mark_lost(self, tenancy: int) -> None:
        """Record that the lease of tenancy ``tenancy`` ended while held; run the callbacks once. (A coroutine on
        the async side because a plain lock overrides it to look at its local mutex.)"""
        if self._claim_loss(tenancy):
            self._context.leases.report_lost(self, list(self._callbacks))

    def _reentry_error(self, what: str = "lock") -> LockLostError:
        return LockLostError(
            f"the {what}'s lease has ended (lost) while this task held it: a reentrant acquire cannot succeed; "
            "release it (which raises LockLostError too) and take it afresh",
            key=self.key,
            server=self._context.server,
        )

    def _lost_error(self, what: str = "lock") -> LockLostError:
        self._lost = True
        return LockLostError(
            f"the {what}'s lease had ended before release: another owner may have held it meanwhile, so data it "
            "guarded may have been changed",
            key=self.key,
            server=self._context.server,
        )


def _tell(listener: Callable[[], None], key: str) -> None:
    try:
        listener()
    except Exception:  # (a bug in a listener must not keep the loss from being reported)
        logger.exception("hybridlock: a loss listener failed for %r", key)
