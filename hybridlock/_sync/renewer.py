"""The lease renewer: one background thread per registry keeps every held lock's lease alive.

Every ``expire_after / 3`` seconds it renews all the locks the registry holds in one backend call (one round
trip on a single server, one per slot on a cluster), so 10,000 held locks cost what one does. A lock whose
renewal finds the key gone or another owner's is marked lost at once (``lock.lost``, its ``on_lost`` callbacks,
``LockLostError`` at release).

Failure modes
-------------
* The server is unreachable, or the round fails in any other way (an error the client does not translate, a
  command a cluster client refuses, a bug): the failure is logged once per streak and the round retried at the
  next period, or just at the earliest ``valid_until`` if that comes first. The leases keep running out
  meanwhile; a lock whose ``valid_until`` has passed without a successful renewal is marked lost (``lost``,
  ``on_lost``, ``LockLostError`` at release), because another owner may have taken it by then. The thread
  itself never ends on an error.
* The process is paused (GC, SIGSTOP) longer than the lease: nothing can renew; on resuming the renewal finds the
  keys gone or taken and reports the loss. Fencing tokens are the defence for the resource.
* ``max_hold``: locks held longer than that are no longer renewed and end with their lease.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import LockContext
    from .leases import HeldLease

__all__ = ["LeaseRenewer"]

logger = logging.getLogger("hybridlock")

_IDLE_LINGER = 0.15  # seconds the thread waits, with nothing held, before it ends (a quick re-acquire reuses it)
_RETRY_MIN = 0.05  # seconds: the shortest wait before retrying a failed round
_LONGEST_WAIT = threading.TIMEOUT_MAX / 2  # a huge expire_after must not overflow the wait


class LeaseRenewer:
    """Renews every lease of one registry, from one thread that runs while there is a lease to renew.

    The thread starts at the first lease (``ensure_started``), ends about ``_IDLE_LINGER`` seconds after the last
    one is given back (``nothing_held``), and starts again at the next. It never dies of an error: a round that
    fails, whatever the reason, is logged (once per streak of failures) and retried, and a lease that could not
    be renewed before its ``valid_until`` is reported lost to its holder like any other loss."""

    def __init__(self, context: LockContext) -> None:
        self._context = context
        self._period = context.config.renew_period
        self._init_thread_state()
        #: Completed renewal rounds and backend calls made (for statistics and benchmarks).
        self.rounds = 0

    def _init_thread_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # The running thread, or None once it has decided to end (or before the first start). Cleared *before*
        # the thread's last look at the registry's leases, so ensure_started() can read it without the lock: a
        # lease added before that look is seen by the thread, one added after finds None and starts a new one.
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._sleeping_with_leases = False  # nothing_held() must wake the thread, or it sleeps a whole period
        self._failing = False  # in a streak of failed rounds (logged once per streak)
        self._delay = self._period  # until the next round

    def ensure_started(self) -> None:
        """A lease is now held (already in the registry's table): make sure a thread will renew it."""
        if self._thread is not None:
            return
        with self._cond:
            if self._thread is None and not self._stopped:
                thread = threading.Thread(
                    target=self._run, name=f"hybridlock-renewer-{self._context.config.registry_key}", daemon=True
                )
                self._thread = thread
                thread.start()

    def nothing_held(self) -> None:
        """The registry's last lease was given back: let the thread end soon (it may be in a long sleep)."""
        if self._sleeping_with_leases:
            with self._cond:
                if self._sleeping_with_leases:
                    self._sleeping_with_leases = False
                    self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            thread = self._thread
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def _run(self) -> None:
        me = threading.current_thread()
        leases = self._context.leases
        lingering = False  # the last wait began with nothing held
        while True:
            with self._cond:
                if self._stopped:
                    return
                # Set before looking, so a release emptying the table after the look sees it and wakes us.
                self._sleeping_with_leases = True
                if not leases:
                    self._sleeping_with_leases = False
                    if lingering:
                        self._thread = None  # from here on, a new lease starts a new thread (see _init_thread_state)
                        if not leases:
                            return
                        self._thread = me
                    lingering = True
                    self._cond.wait(_IDLE_LINGER)
                    continue
                if lingering:
                    # Every lease now held was taken during the linger, at most _IDLE_LINGER ago: renew it a
                    # period from now, not at once.
                    lingering = False
                    self._delay = self._period
                self._cond.wait(min(self._delay, _LONGEST_WAIT))
                self._sleeping_with_leases = False
                if self._stopped:
                    return
            self.renew_once()

    def renew_once(self) -> None:
        """Renew every held lease once (the thread's body; also callable from tests). Never raises.

        A round that fails for any reason (the server is out of reach, the client refused a command, a bug) is
        logged once per streak of failures and retried at the next period, or sooner: just at the earliest
        ``valid_until``, so that a lease the failure keeps from being renewed is reported lost as it ends."""
        try:
            asked = self._renew_all()
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning(
                    "hybridlock: renewing the leases of registry %r on %s failed; retrying (logged once until it "
                    "works again)",
                    self._context.config.registry_key,
                    self._context.server,
                    exc_info=exc,
                )
            self._delay = self._retry_delay()
            return
        if asked and self._failing:
            self._failing = False
            logger.warning(
                "hybridlock: renewing the leases of registry %r on %s works again",
                self._context.config.registry_key,
                self._context.server,
            )
        self._delay = self._period

    def _renew_all(self) -> bool:
        """One round; returns whether it asked the server (False: nothing to renew)."""
        context = self._context
        now = time.monotonic()
        max_hold = context.config.max_hold
        locks = []
        for lock in context.leases.in_server():
            tenancy, acquired_at, valid_until = lock._tenancy, lock._acquired_at, lock._valid_until
            if lock.lost:
                continue
            if max_hold is not None and acquired_at is not None and now - acquired_at >= max_hold:
                # No longer renewed; once its lease has certainly run out, the holder must hear it is lost.
                if valid_until is not None and valid_until <= now:
                    lock._mark_lost(tenancy)
                continue
            locks.append((lock, tenancy))
        lease_ms = context.config.lease_ms
        if not locks or lease_ms is None:  # (a registry whose leases never end has no renewer)
            return False
        start = time.monotonic()
        try:
            flags = context.backend.renew([lock._names for lock, _ in locks], context.client_id, lease_ms)
        except Exception:
            # Whatever the cause (an unreachable server, an untranslated client error): the leases keep running
            # out, and any that certainly ended is lost, because another owner may have taken the key by now.
            self._mark_ended_lost(locks)
            raise
        self.rounds += 1
        for (lock, tenancy), renewed in zip(locks, flags, strict=True):
            if renewed:
                lock._renewed(tenancy, start)
            else:
                lock._mark_lost(tenancy)
        return True

    @staticmethod
    def _mark_ended_lost(locks: list[tuple[HeldLease, int]]) -> None:
        after = time.monotonic()
        for lock, tenancy in locks:
            until = lock._valid_until
            if until is not None and until <= after:
                lock._mark_lost(tenancy)

    def _retry_delay(self) -> float:
        """After a failed round: the next period, or the earliest ``valid_until`` if that comes first (at least
        ``_RETRY_MIN``, so a round that fails at once does not spin)."""
        now = time.monotonic()
        delay = self._period
        try:
            for lock in self._context.leases.in_server():
                until = lock._valid_until
                if until is not None and not lock.lost:
                    delay = min(delay, until - now)
        except Exception:  # a bug here must not end the thread either: fall back to the period
            logger.debug("hybridlock: could not compute the retry delay", exc_info=True)
        return max(delay, _RETRY_MIN)
