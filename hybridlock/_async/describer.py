"""The holder description: who this owner is, for operators (``hybridlock inspect``), written off the hot path.

An owner (a registry in a process) describes itself in one small hash of the server (``owner_key`` in
``hybridlock._core.names``): its host, pid and start, and, for each lease it holds, the name of the holding thread
or task, where it took the lock (``file:line``), when the tenancy was granted, its fencing token, and whether its
holder has ended without releasing it (``abandoned``: no longer renewed, see ``owners.py``). Nothing of it is sent
by ``acquire`` or ``release``: the registry's renewer writes it from its own worker,

* one second after the worker starts (at the registry's first lease after a quiet spell), so a lock held for
  longer than that is described soon after it was taken;
* at each renewal round, for the leases taken (or found abandoned) since the last one, dropping the fields of
  leases given back since;
  the whole hash is rewritten, with its expiry, at the first round after half its life (``ttl_ms``: a minute, or
  three leases if longer), so it outlives every lease of a live owner;
* by the wait keeper, at its refreshes (every second while some thread waits in a server queue): an owner that
  waits more than a second is described too (host, pid), so ``inspect`` can say who waits.

So an uncontended acquire/release cycle costs the server exactly what it did, and a busy registry one small
pipelined write (``HSET``, ``HDEL``, ``PEXPIRE``) per renewal period at most (a waiting one, per half ``ttl_ms``).
What it does not promise: a hold shorter than a second, or than a renewal period once the worker runs, may never
be described (it is over before anyone could look), and a field may outlive its lease until the next round
(readers check the fencing token).

Failure modes: a description that cannot be written is logged at debug level and tried again at the next
occasion; it never affects a lock. With ``auto_renew=False`` there is no renewer: an owner is described only
while it waits in a server queue.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

from .._core.names import owner_key
from ._compat import monotonic, new_guard, owner_name
from .owners import site_text

if TYPE_CHECKING:
    from .roles import DescriberContext, HeldLease

__all__ = ["OwnerDescriber", "lease_description"]

logger = logging.getLogger("hybridlock.describer")

_MIN_OWNER_TTL_MS = 60_000


def lease_description(lease: HeldLease) -> dict[str, object]:
    """What the owner hash says of one held lease (also what ``statistics()`` shows)."""
    holder, site = lease._holder(), lease._holder_site()
    if lease._abandoned_by is not None:
        holder, site = lease._abandoned_by  # (a read hold whose last reader here ended has no holder left)
    return {
        "thread": None if holder is None else owner_name(holder),
        "site": site_text(site),
        "acquired_at": lease._granted_wall,
        "token": lease._fencing_token,
        "abandoned": lease._abandoned,
    }


class OwnerDescriber:
    """Keeps one owner's description in the server; called only from the renewer's worker."""

    def __init__(self, context: DescriberContext) -> None:
        self._context = context
        config = context.config
        self.key = owner_key(config.registry_key, context.client_id)
        lease_ms = config.lease_ms or 0
        self.ttl_ms = max(_MIN_OWNER_TTL_MS, 3 * lease_ms)
        self.started_at = time.time()
        self._refresh_at = -1.0  # monotonic: when the hash must be written again (it lapses at ttl_ms)
        # Server key of a lease -> the tenancy its field describes, and whether it said the hold was abandoned.
        self._described: dict[str, tuple[int, bool]] = {}
        self._written = False  # the hash may exist in the server
        # The renewer and the wait keeper both describe; one write at a time (the other skips: nothing is lost, the
        # next occasion writes what it would have).
        self._guard = new_guard()
        self._busy = False

    async def describe(self) -> None:
        """Write what changed since the last description (see the module docstring for when); an owner waiting in
        a server queue is described even if it holds nothing. Never raises."""
        with self._guard:
            if self._busy:
                return  # the other worker is writing it right now
            self._busy = True
        try:
            await self._write(monotonic(), self._context.wait_keeper.running)
        except Exception:
            logger.debug("could not write the description of owner %s", self.key, exc_info=True)
        finally:
            self._busy = False

    async def _write(self, now: float, waiting: bool) -> None:
        leases = self._context.leases.in_server()
        if not leases and not self._described and not (waiting and now >= self._refresh_at):
            return  # an owner that holds nothing and waits for nothing has nothing to tell
        current = {lease._names.lock: lease for lease in leases}
        fields: dict[str, str] = {}
        refresh = now >= self._refresh_at
        if refresh:
            fields.update(host=socket.gethostname(), pid=str(os.getpid()), started_at=repr(self.started_at))
        for name, lease in current.items():
            if refresh or self._described.get(name) != (lease._tenancy, lease._abandoned):
                fields[name] = json.dumps(lease_description(lease), separators=(",", ":"))
        gone = [name for name in self._described if name not in current]
        if not fields and not gone:
            return
        await self._context.backend.describe_owner(self.key, fields, gone, self.ttl_ms)
        self._described = {name: (lease._tenancy, lease._abandoned) for name, lease in current.items()}
        self._written = True
        if refresh:
            self._refresh_at = now + self.ttl_ms / 2000.0

    async def forget(self) -> None:
        """The registry closes: remove its description now rather than let it lapse. Never raises."""
        if not self._written:
            return
        self._written = False
        self._described = {}
        self._refresh_at = -1.0
        try:
            await self._context.backend.describe_owner(self.key, {}, [], 0)  # an expiry of 0 deletes the hash
        except Exception:
            logger.debug("could not remove the description of owner %s", self.key, exc_info=True)
