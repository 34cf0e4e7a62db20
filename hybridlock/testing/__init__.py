"""Helpers for testing code that uses hybridlock: a throw-away Redis/Valkey server, or cluster, on free loopback
ports.

``EmbeddedServer`` starts ``redis-server`` (or ``valkey-server``; ``HYBRIDLOCK_REDIS_SERVER`` names the binary) in
a temporary directory with no persistence, and stops it by pid. ``EmbeddedCluster`` starts several of them in
cluster mode and forms a cluster (masters with replicas).
"""

from __future__ import annotations

from .cluster import EmbeddedCluster
from .server import EmbeddedServer, ServerNotFoundError, find_server_binary

__all__ = ["EmbeddedCluster", "EmbeddedServer", "ServerNotFoundError", "find_server_binary"]
