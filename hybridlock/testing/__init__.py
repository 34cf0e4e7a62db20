"""Helpers for testing code that uses hybridlock: a throw-away Redis/Valkey server on a free loopback port.

``EmbeddedServer`` starts ``redis-server`` (or ``valkey-server``; ``HYBRIDLOCK_REDIS_SERVER`` names the binary) in
a temporary directory with no persistence, and stops it by pid. ``SentinelService`` starts a master, its replicas
and sentinels the same way, and fails the master over on demand.
"""

from __future__ import annotations

from .sentinel import SentinelService
from .server import EmbeddedServer, ServerNotFoundError, find_server_binary

__all__ = ["EmbeddedServer", "SentinelService", "ServerNotFoundError", "find_server_binary"]
