"""hybridlock: reentrant locks that hold across the threads of one process and across processes and machines
sharing a Redis or Valkey server.

    registry = hybridlock.LockRegistry("redis://localhost:6379/0")
    with registry.obtain("orders:42"):
        ...

Each lock takes a per-key local lock first, then a lease in the server whose value is the registry's
``client_id``: threads of one process queue locally at no cost to the server, and reentrant use never leaves the
process.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._sync.lock import HybridLock, LockStatistics
from ._sync.multi import MultiLock
from ._sync.registry import LocalLockRegistry, LockRegistry
from ._sync.rwlock import ReadLock, ReadWriteLock, WriteLock
from .errors import (
    BackendUnavailableError,
    ClientSettingsWarning,
    EventLoopBlockedError,
    HybridLockError,
    InvalidArgumentError,
    LockLostError,
    LockNotOwnedError,
    LockTimeoutError,
    LockUpgradeError,
    RegistryClosedError,
    TimeoutOverflowError,
)

try:
    __version__ = _version("hybridlock")
except _PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "BackendUnavailableError",
    "ClientSettingsWarning",
    "EventLoopBlockedError",
    "HybridLock",
    "HybridLockError",
    "InvalidArgumentError",
    "LocalLockRegistry",
    "LockLostError",
    "LockNotOwnedError",
    "LockRegistry",
    "LockStatistics",
    "LockTimeoutError",
    "LockUpgradeError",
    "MultiLock",
    "ReadLock",
    "ReadWriteLock",
    "RegistryClosedError",
    "TimeoutOverflowError",
    "WriteLock",
    "__version__",
]
