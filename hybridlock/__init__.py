"""hybridlock: reentrant locks that hold across the threads of one process and across processes and machines
sharing a Redis or Valkey server.

    registry = hybridlock.LockRegistry("redis://localhost:6379/0")
    with registry.obtain("orders:42"):
        ...

Each lock takes a per-key local lock first, then a lease in the server whose value is the registry's
``client_id``: threads of one process queue locally at no cost to the server, and reentrant use never leaves the
process.
"""

import importlib as _importlib
from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from ._core.runonce import RunOnceResult
from ._sync.election import LeaderElection
from ._sync.lock import HybridLock, LockStatistics
from ._sync.multi import MultiLock
from ._sync.registry import LocalLockRegistry, LockRegistry, QuorumLockRegistry
from ._sync.rwlock import ReadLock, ReadWriteLock, WriteLock
from ._sync.scope import LossScope
from ._sync.semaphore import Semaphore

if _TYPE_CHECKING:
    from ._async.election import AsyncLeaderElection
    from ._async.lock import AsyncHybridLock
    from ._async.multi import AsyncMultiLock
    from ._async.registry import AsyncLocalLockRegistry, AsyncLockRegistry, AsyncQuorumLockRegistry
    from ._async.rwlock import AsyncReadLock, AsyncReadWriteLock, AsyncWriteLock
    from ._async.scope import AsyncLossScope
    from ._async.semaphore import AsyncSemaphore

from .errors import (
    AuthenticationFailedError,
    BackendUnavailableError,
    ClientSettingsWarning,
    EventLoopBlockedError,
    EventLoopMismatchError,
    FencingCounterError,
    HybridLockError,
    HybridLockWarning,
    InvalidArgumentError,
    LockLostError,
    LockNotOwnedError,
    LocksHeldAtCloseWarning,
    LockTimeoutError,
    LockUpgradeError,
    LongLeaseWarning,
    RegistryClosedError,
    ReplicationNotConfirmedError,
    TimeoutOverflowError,
)

try:
    __version__ = _version("hybridlock")
except _PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AsyncHybridLock",
    "AsyncLeaderElection",
    "AsyncLocalLockRegistry",
    "AsyncLockRegistry",
    "AsyncLossScope",
    "AsyncMultiLock",
    "AsyncQuorumLockRegistry",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "AsyncWriteLock",
    "AuthenticationFailedError",
    "BackendUnavailableError",
    "ClientSettingsWarning",
    "EventLoopBlockedError",
    "FencingCounterError",
    "EventLoopMismatchError",
    "HybridLock",
    "HybridLockError",
    "HybridLockWarning",
    "InvalidArgumentError",
    "LeaderElection",
    "LocalLockRegistry",
    "LockLostError",
    "LockNotOwnedError",
    "LockRegistry",
    "LockStatistics",
    "LockTimeoutError",
    "LockUpgradeError",
    "LocksHeldAtCloseWarning",
    "LongLeaseWarning",
    "LossScope",
    "MultiLock",
    "QuorumLockRegistry",
    "ReadLock",
    "ReadWriteLock",
    "RegistryClosedError",
    "ReplicationNotConfirmedError",
    "RunOnceResult",
    "Semaphore",
    "TimeoutOverflowError",
    "WriteLock",
    "__version__",
]

# The asyncio API is imported at first use, so that a program using threads only does not import asyncio.
_ASYNC_NAMES = {
    "AsyncHybridLock": "hybridlock._async.lock",
    "AsyncLeaderElection": "hybridlock._async.election",
    "AsyncLocalLockRegistry": "hybridlock._async.registry",
    "AsyncLockRegistry": "hybridlock._async.registry",
    "AsyncLossScope": "hybridlock._async.scope",
    "AsyncMultiLock": "hybridlock._async.multi",
    "AsyncQuorumLockRegistry": "hybridlock._async.registry",
    "AsyncReadLock": "hybridlock._async.rwlock",
    "AsyncReadWriteLock": "hybridlock._async.rwlock",
    "AsyncSemaphore": "hybridlock._async.semaphore",
    "AsyncWriteLock": "hybridlock._async.rwlock",
}


def __getattr__(name: str) -> _Any:
    module = _ASYNC_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'hybridlock' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ASYNC_NAMES))
