"""The lease renewer: one background thread per registry keeps every held lock's lease alive.

Every ``expire_after / 3`` seconds it renews all the locks the registry holds in one backend call (one round
trip on a single server, one per slot on a cluster), so 10,000 held locks cost what one does. A lock whose
renewal finds the key gone or another owner's is marked lost at once (``lock.lost``, its ``on_lost`` callbacks,
``LockLostError`` at release).

Failure modes
-------------
* The server is unreachable: the renewal is retried at the next period. The leases keep running out meanwhile;
  a lock whose ``valid_until`` has passed without a successful renewal is marked lost, because another owner may
  have taken it by then (the server will have expired the key).
* The process is paused (GC, SIGSTOP) longer than the lease: nothing can renew; on resuming the renewal finds the
  keys gone or taken and reports the loss. Fencing tokens are the defence for the resource.
* ``max_hold``: locks held longer than that are no longer renewed and end with their lease.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

from ._keys import LockNames
from .errors import HybridLockError

if TYPE_CHECKING:
    from ._registry import LockRegistry

__all__ = ["HeldLease", "LeaseRenewer"]


class HeldLease(Protocol):
    """What the renewer needs of anything holding a lease: a plain lock, or a half of a read-write lock."""

    _names: LockNames  # ``_names.lock`` is the server key the lease lives in
    _tenancy: int  # counts server tenancies; results for an earlier one are ignored
    _acquired_at: float | None
    _valid_until: float | None
    _retained_until: float | None  # set while the lease is kept idle (retain_for)

    @property
    def key(self) -> str: ...

    @property
    def lost(self) -> bool: ...

    def _mark_lost(self, tenancy: int) -> None: ...

    def _renewed(self, tenancy: int, start: float, lease: float | None = None) -> None: ...


class LeaseRenewer:
    def __init__(self, registry: LockRegistry) -> None:
        self._registry = registry
        self._period = registry.expire_after / 3
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        #: Completed renewal rounds and backend calls made (for statistics and benchmarks).
        self.rounds = 0

    def ensure_started(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None and not self._stop.is_set():
                thread = threading.Thread(
                    target=self._run, name=f"hybridlock-renewer-{self._registry.registry_key}", daemon=True
                )
                thread.start()
                self._thread = thread

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def after_fork_in_child(self) -> None:
        # The parent's thread does not exist in the child; start a new one when the child first holds a lock.
        self._thread = None
        self._start_lock = threading.Lock()
        # And the parent's Event may have been mid-use by another thread at fork time. (Only open registries are
        # reset after a fork, so a fresh, unset Event is right.)
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self.renew_once()

    def renew_once(self) -> None:
        """Renew every held lock once (the thread's body; also callable from tests)."""
        registry = self._registry
        now = time.monotonic()
        max_hold = registry._max_hold
        locks = []
        for lock in registry._server_leases():
            tenancy, acquired_at, valid_until = lock._tenancy, lock._acquired_at, lock._valid_until
            if lock.lost:
                continue
            if max_hold is not None and acquired_at is not None and now - acquired_at >= max_hold:
                # No longer renewed; once its lease has certainly run out, the holder must hear it is lost.
                if valid_until is not None and valid_until <= now:
                    lock._mark_lost(tenancy)
                continue
            locks.append((lock, tenancy))
        if not locks:
            return
        start = time.monotonic()
        try:
            flags = registry.backend.renew([lock._names for lock, _ in locks], registry.client_id, registry._lease_ms)
        except HybridLockError:
            # Unreachable server: leases keep running out; any that certainly ended is lost (see module docstring).
            after = time.monotonic()
            for lock, tenancy in locks:
                until = lock._valid_until
                if until is not None and until <= after:
                    lock._mark_lost(tenancy)
            return
        self.rounds += 1
        for (lock, tenancy), renewed in zip(locks, flags, strict=True):
            if renewed:
                lock._renewed(tenancy, start)
            else:
                lock._mark_lost(tenancy)
