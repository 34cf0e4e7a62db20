"""The quorum backend, ``QuorumBackend``: one lock held in a majority of N independent Redis/Valkey servers.

Generated into ``hybridlock/_sync/backends/quorum.py`` from ``hybridlock/_async/backends/quorum.py`` (read its
choices and failure modes there, and the argument for its fencing tokens in ``hybridlock/_core/quorum.py``); this
module keeps the public import path.
"""

from __future__ import annotations

from .._sync.backends.quorum import QuorumBackend

__all__ = ["QuorumBackend"]
