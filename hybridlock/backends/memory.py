"""An in-process lock server, ``MemoryBackend``: the backend of ``LocalLockRegistry`` and of fast unit tests.

Generated into ``hybridlock/_sync/backends/memory.py`` from ``hybridlock/_async/backends/memory.py``; this module
keeps the public import path.
"""

from __future__ import annotations

from .._sync.backends.memory import MemoryBackend

__all__ = ["MemoryBackend"]
