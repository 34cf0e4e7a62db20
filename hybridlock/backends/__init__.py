"""Lock servers behind one narrow interface (``base.LockBackend``, ``AsyncLockBackend`` for asyncio): in memory,
Redis/Valkey, a Redis/Valkey cluster, and a quorum of independent Redis/Valkey servers.

The lock logic never imports a client library; only the backend modules do. The implementations live in
``hybridlock/_async/backends/`` (the source) and ``hybridlock/_sync/backends/`` (generated from it); this package
is their public face, and its modules (``base``, ``memory``, ``redis``, ``redis_pubsub``, ``quorum``) keep the
import paths of the blocking classes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .base import AcquireResult, LockBackend, ReleaseWatch
from .memory import MemoryBackend

if TYPE_CHECKING:
    from .._async.backends.base import AsyncLockBackend, AsyncReleaseWatch
    from .._async.backends.cluster import AsyncRedisClusterBackend
    from .._async.backends.memory import AsyncMemoryBackend
    from .._async.backends.quorum import AsyncQuorumBackend
    from .._async.backends.redis import AsyncRedisBackend
    from .._sync.backends.cluster import RedisClusterBackend
    from .quorum import QuorumBackend
    from .redis import RedisBackend

__all__ = [
    "AcquireResult",
    "LockBackend",
    "MemoryBackend",
    "QuorumBackend",
    "RedisBackend",
    "RedisClusterBackend",
    "ReleaseWatch",
    "AsyncLockBackend",
    "AsyncMemoryBackend",
    "AsyncQuorumBackend",
    "AsyncRedisBackend",
    "AsyncRedisClusterBackend",
    "AsyncReleaseWatch",
]

# Imported at first use: the Redis backends import their client library, the asyncio ones asyncio, and a program
# that uses neither should not pay for them. (It also keeps this package out of an import cycle: the Redis backends
# import ``backends.clients``, which runs this file first.)
_LAZY = {
    "RedisBackend": "hybridlock._sync.backends.redis",
    "RedisClusterBackend": "hybridlock._sync.backends.cluster",
    "AsyncRedisClusterBackend": "hybridlock._async.backends.cluster",
    "QuorumBackend": "hybridlock._sync.backends.quorum",
    "AsyncQuorumBackend": "hybridlock._async.backends.quorum",
    "AsyncLockBackend": "hybridlock._async.backends.base",
    "AsyncReleaseWatch": "hybridlock._async.backends.base",
    "AsyncMemoryBackend": "hybridlock._async.backends.memory",
    "AsyncRedisBackend": "hybridlock._async.backends.redis",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
