"""What the pieces of a ``LockContext`` need of it and of each other: narrow protocols, below all of them.

The context (``context.py``) builds the lease table, the renewer, the describer, the retention reaper and the wait
keeper, and hands each of them itself. Each piece reads only a few of its attributes, named here; so none of them
imports ``LockContext`` (not even for its annotations), and the context is the one module that knows them all. A
test double needs only what the piece it stands in for uses (``tests/test_async_workers.py``).

The protocols' attributes are read-only (properties): a piece never reassigns what its context holds.
"""

from __future__ import annotations

from types import CodeType
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from .._core.config import RegistryConfig
    from .._core.names import LockNames
    from .backends.base import AsyncLockBackend
    from .observing import ObserverHook

__all__ = [
    "DescriberContext",
    "Describing",
    "HeldLease",
    "HeldLeases",
    "KeeperContext",
    "PieceContext",
    "RenewerContext",
    "Renewing",
    "Site",
    "TableContext",
    "Waiting",
]

#: Where a holder took its lock: the code and the instruction offset (``f_lasti``) of the calling frame
#: (``owners.py``).
Site: TypeAlias = "tuple[CodeType, int] | None"


class HeldLease(Protocol):
    """What the table and the renewer need of anything holding a lease: a plain lock, or a read-write half."""

    _names: LockNames  # ``_names.lock`` is the server key the lease lives in
    _tenancy: int  # counts server tenancies; results for an earlier one are ignored
    _acquired_at: float | None
    _valid_until: float | None
    _retained_until: float | None  # set while the lease is kept idle (retain_for)
    _hold_until: float | None  # never renewed past this monotonic() time (run_once's at_most_for)
    _giving_back: bool  # its release in the server is under way
    _granted_wall: float | None  # when the server granted the tenancy (time.time())
    _fencing_token: int | None
    _abandoned: bool  # every holder here ended without releasing it (owners.py)
    _abandoned_by: tuple[object, Site] | None

    @property
    def key(self) -> str: ...

    @property
    def lost(self) -> bool: ...

    def _holder(self) -> object | None: ...

    def _holders_gone(self) -> bool: ...

    def _holder_site(self) -> Site: ...

    def _find_abandoned(self) -> list[tuple[object, Site]]: ...

    async def _end_abandoned(self) -> None: ...

    async def _mark_lost(self, tenancy: int) -> None: ...

    def _renewed(self, tenancy: int, start: float, lease: float | None = None) -> None: ...

    async def _give_back_after_loss(self, tenancy: int) -> None: ...

    def _is_current(self, tenancy: int) -> bool: ...


class HeldLeases(Protocol):
    """What the renewer and the describer read of the lease table (``leases.LeaseTable``)."""

    def __bool__(self) -> bool: ...

    def in_server(self) -> list[HeldLease]: ...


class Renewing(Protocol):
    """What the lease table tells the renewer (``renewer.LeaseRenewer``): plain calls that never wait."""

    def ensure_started(self) -> None: ...

    def renew_before(self, deadline: float) -> None: ...

    def nothing_held(self) -> None: ...

    def watch(self, until: float | None) -> None: ...


class Describing(Protocol):
    """What the renewer's and the wait keeper's workers ask of the describer (``describer.OwnerDescriber``)."""

    async def describe(self) -> None: ...


class Waiting(Protocol):
    """What the describer asks of the wait keeper (``wait_keeper.WaitKeeper``)."""

    @property
    def running(self) -> bool: ...


class PieceContext(Protocol):
    """What every piece reads of its context: the registry's settings, backend, owner identity and observer (the
    whole need of the retention reaper, and of ``owners.watch_owner``)."""

    @property
    def config(self) -> RegistryConfig: ...

    @property
    def backend(self) -> AsyncLockBackend: ...

    @property
    def client_id(self) -> str: ...

    @property
    def observer(self) -> ObserverHook | None: ...

    @property
    def server(self) -> str: ...


class TableContext(PieceContext, Protocol):
    """The lease table's context: it starts and wakes the renewer, and renews by hand from the caller's loop."""

    @property
    def renewer(self) -> Renewing | None: ...

    def check_loop(self, key: str | None = None) -> None: ...


class RenewerContext(PieceContext, Protocol):
    """The renewer's context: the leases it renews, and the describer its worker runs after its rounds."""

    @property
    def leases(self) -> HeldLeases: ...

    @property
    def describer(self) -> Describing: ...


class DescriberContext(PieceContext, Protocol):
    """The describer's context: the leases it describes, and whether this owner waits in a server queue."""

    @property
    def leases(self) -> HeldLeases: ...

    @property
    def wait_keeper(self) -> Waiting: ...


class KeeperContext(PieceContext, Protocol):
    """The wait keeper's context: the describer its worker runs after its refreshes."""

    @property
    def describer(self) -> Describing: ...
