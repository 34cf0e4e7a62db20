"""LockContext: everything a lock needs from its registry, handed to it at birth.

A lock never sees the registry (which only makes locks, maps keys to them and closes): it is given this context,
as kazoo's lock recipe is given its client's handler. The context holds the registry's settings, backend and
owner identity, and owns the registry's shared machinery, each piece with one job:

* ``leases``: the table of leases held in the server (renewal by hand, loss reporting);
* ``renewer``, ``retention``, ``wait_keeper``: the background workers (see their modules); the renewer's also
  looks for holders that are gone (``owners.py``), in every registry;
* ``describer``: this owner's description in the server, written by the renewer's worker;
* ``closed``: set once the registry is closed; every wait watches it;
* ``loop``: the event loop an asyncio registry belongs to, the first it is used in (``check_open`` refuses any
  other: ``EventLoopMismatchError``); nothing on the thread side;
* ``observer``: the registry's instrumentation hook (``observing.ObserverHook``), or None: the one
  attribute a lock checks before reporting anything.

Each piece is handed the context itself, but knows it only by the narrow protocol of what it reads (``roles.py``),
so that no piece imports this module, not even for its annotations.

Nothing here is reassigned after construction. A forked child gets a whole new context (``forked``): a new
owner identity, an empty lease table and workers with no threads, while settings, backend and ``on_lost``
callbacks carry over.
"""

from __future__ import annotations

import uuid
from typing import Any

from .._core.config import RegistryConfig
from ..errors import RegistryClosedError
from ._compat import AsyncEvent, LoopBinding
from .backends.base import AsyncLockBackend
from .describer import OwnerDescriber
from .leases import LeaseTable, LostCallback
from .observing import ObserverHook
from .renewer import LeaseRenewer
from .retention import RetentionReaper
from .wait_keeper import WaitKeeper

__all__ = ["LockContext"]


class LockContext:
    __slots__ = (
        "backend",
        "client_id",
        "closed",
        "config",
        "describer",
        "leases",
        "loop",
        "observer",
        "registry",
        "renewer",
        "retention",
        "wait_keeper",
    )

    def __init__(
        self,
        config: RegistryConfig,
        backend: AsyncLockBackend,
        registry: Any,
        *,
        closed: bool = False,
        lost_callbacks: list[LostCallback] | None = None,
        observer: ObserverHook | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        #: The public registry, only so that ``lock.registry`` can return it; no lock calls it.
        self.registry = registry
        #: This owner's identity in the server: the value of every server key it holds.
        self.client_id = str(uuid.uuid4())
        #: Told of acquires, releases, renewal rounds and losses; None when nobody asked (``observer=``).
        self.observer = observer
        self.closed = AsyncEvent()
        if closed:
            self.closed.set()
        self.loop = LoopBinding()
        self.leases = LeaseTable(self, lost_callbacks)
        self.describer = OwnerDescriber(self)
        # Also where leases are not renewed (auto_renew=False, LocalLockRegistry): its worker then only looks for
        # holders that are gone (owners.py).
        self.renewer = LeaseRenewer(self)
        self.retention = RetentionReaper(self)
        self.wait_keeper = WaitKeeper(self)

    @property
    def server(self) -> str:
        """The lock server's address, as error messages give it."""
        return self.backend.address

    def check_open(self, key: str | None = None) -> None:
        """Before a lock does anything: ``RegistryClosedError`` after ``close()``, and ``EventLoopMismatchError``
        from an event loop other than the registry's (asyncio; call it from a coroutine there)."""
        self.check_not_closed(key)
        self.check_loop(key)

    def check_not_closed(self, key: str | None = None) -> None:
        if self.closed.is_set():
            raise RegistryClosedError("the lock registry is closed", key=key, server=self.server)

    def check_loop(self, key: str | None = None) -> None:
        """``EventLoopMismatchError`` from an event loop other than the registry's (asyncio; a coroutine only)."""
        self.loop.check(self, key)

    def forked(self) -> LockContext:
        """The context a forked child continues with: same settings, backend and registry-wide ``on_lost``
        callbacks and observer; a new identity, no leases, no threads."""
        return LockContext(
            self.config,
            self.backend,
            self.registry,
            closed=self.closed.is_set(),
            lost_callbacks=self.leases.lost_callbacks,
            observer=self.observer,
        )
