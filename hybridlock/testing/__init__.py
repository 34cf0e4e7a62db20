"""Helpers for testing code that uses hybridlock: a throw-away Redis/Valkey server, or cluster, on free loopback
ports.

``EmbeddedServer`` starts ``redis-server`` (or ``valkey-server``; ``HYBRIDLOCK_REDIS_SERVER`` names the binary) in
a temporary directory with no persistence, and stops it by pid. ``SentinelService`` starts a master, its replicas
and sentinels the same way, and fails the master over on demand. ``EmbeddedCluster`` starts several servers in
cluster mode and forms a cluster (masters with replicas).
"""

from __future__ import annotations

from .cluster import EmbeddedCluster
from .sentinel import SentinelService
from .server import EmbeddedServer, ServerNotFoundError, find_server_binary

__all__ = ["EmbeddedCluster", "EmbeddedServer", "SentinelService", "ServerNotFoundError", "find_server_binary"]
