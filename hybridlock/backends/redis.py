"""The Redis / Valkey backend, ``RedisBackend``, and the helpers other modules share: ``ScriptRunner`` (EVALSHA with
an EVAL fallback), ``translated_errors`` (client exceptions -> hybridlock's), ``redis_client_from_url``.

Generated into ``hybridlock/_sync/backends/redis.py`` from ``hybridlock/_async/backends/redis.py`` (read its
failure modes there); this module keeps the public import path.
"""

from __future__ import annotations

from .._sync.backends.redis import (
    RedisBackend,
    ScriptRunner,
    client_address,
    redis_client_from_url,
    translated_errors,
)

__all__ = ["RedisBackend", "ScriptRunner", "client_address", "redis_client_from_url", "translated_errors"]
