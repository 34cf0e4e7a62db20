"""Hand-written, blocking side: what the cluster backend needs of a cluster client that the asyncio and blocking
clients of redis-py (and valkey-py) spell differently. ``hybridlock/_async/backends/_compat.py`` is the twin (read
the why there).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

import redis.connection

__all__ = [
    "CLUSTER_CLIENT_OPTIONS",
    "cluster_ready",
    "cluster_routes_by_key",
    "connection_ready",
    "node_for_slot",
    "node_pubsub_client",
    "packs_like_us",
    "pipeline_on_node",
]


#: None: the blocking client learns the layout again at a MOVED without closing the connections in use.
CLUSTER_CLIENT_OPTIONS: dict[str, Any] = {}


def cluster_ready(client: Any) -> None:
    """The blocking client learnt the cluster's slot table at construction: nothing to do."""


def cluster_routes_by_key(client: Any) -> None:
    """The blocking client routes every keyed command by its slot (it learnt the layout at construction, and learns
    it again before it routes after a failure): nothing to do."""


def node_for_slot(client: Any, slot: int) -> Any:
    return client.nodes_manager.get_node_from_slot(slot)


def pipeline_on_node(client: Any, node: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Send ``commands`` to ``node`` in one round trip; each reply, or the error the server answered it with, in
    order. Raises the client's ConnectionError / TimeoutError when the node cannot be reached."""
    pipe = client.get_redis_connection(node).pipeline(transaction=False)
    for args in commands:
        pipe.execute_command(*args)
    return list(pipe.execute(raise_on_error=False))


def node_pubsub_client(client: Any, node: Any) -> tuple[Any, bool]:
    """The cluster client's own plain client of ``node`` (its pub/sub takes one connection from the node's pool),
    and False: the cluster client owns it."""
    return client.get_redis_connection(node), False


def connection_ready(connection: Any, unavailable: tuple[type[BaseException], ...]) -> None:
    """Make ``connection`` (kept out of its pool since its last call, every reply read) ready to send, as the pool's
    own check does for one it hands out: a socket with something to read was closed by the server meanwhile, and is
    reconnected. ``unavailable``: the client library's errors for a connection that failed, raised when the server
    cannot be reached."""
    connection.connect()  # (nothing when connected; a connection the pool's disconnect() closed reconnects)
    failed: tuple[type[BaseException], ...] = (*unavailable, OSError)
    try:
        stale = connection.can_read()
    except failed:  # (a socket closed by the server reads as an error here)
        stale = True
    if stale:
        connection.disconnect()
        connection.connect()


def packs_like_us(connection: Any) -> bool:
    """Whether ``connection`` packs a command exactly as ``_protocol.resp.pack_commands`` does: redis-py's own
    pure-Python packer (not hiredis's, nor a subclass's or another library's) with the default encoder."""
    encoder = getattr(connection, "encoder", None)
    return (
        type(getattr(connection, "_command_packer", None)) is redis.connection.PythonRespSerializer
        and getattr(type(connection), "pack_command", None) is redis.connection.Connection.pack_command
        and encoder is not None
        and getattr(encoder, "encoding_errors", None) == "strict"
        and _is_utf8(getattr(encoder, "encoding", None))
    )


def _is_utf8(encoding: object) -> bool:
    try:
        return isinstance(encoding, str) and codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False
