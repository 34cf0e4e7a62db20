"""The narrow interface between lock logic and a lock server: ``LockBackend`` and ``ReleaseWatch``.

Generated into ``hybridlock/_sync/backends/base.py`` from the asyncio source ``hybridlock/_async/backends/base.py``
(read the contract there); this module keeps the public import path.
"""

from __future__ import annotations

from .._sync.backends.base import (
    QUEUE_PLACE_KEEP_MS,
    AcquireManyResult,
    AcquireResult,
    LockBackend,
    ReleaseWatch,
)

__all__ = ["QUEUE_PLACE_KEEP_MS", "AcquireManyResult", "AcquireResult", "LockBackend", "ReleaseWatch"]
