"""Lock servers behind one narrow interface (``base.LockBackend``): in memory, and Redis/Valkey.

The lock logic never imports a client library; only the backend modules do.
"""

from .base import AcquireResult, LockBackend, ReleaseWatch
from .memory import MemoryBackend

__all__ = ["AcquireResult", "LockBackend", "MemoryBackend", "ReleaseWatch"]
