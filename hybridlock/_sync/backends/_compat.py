"""Hand-written, blocking side: what the cluster backend needs of a cluster client that the asyncio and blocking
clients of redis-py (and valkey-py) spell differently. ``hybridlock/_async/backends/_compat.py`` is the twin (read
the why there).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.client
import redis.connection

from ..._protocol.resp import is_utf8

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


def sharded_subscribe() -> bool:
    """Whether the client of ``node_pubsub_client`` can listen on sharded pub/sub (SSUBSCRIBE): redis-py's
    ``PubSub`` can from 5.0. Without, a cluster's waiters poll (the scripts still announce, for others)."""
    return hasattr(redis.client.PubSub, "ssubscribe")


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


# redis-py's own packer and encoder, as imported (the packer is absent before redis-py 4.5: then nothing is packed
# here); see the asyncio twin for why only these very functions are trusted.
_PYTHON_PACKER = getattr(redis.connection, "PythonRespSerializer", None)
_PACK = getattr(_PYTHON_PACKER, "pack", None)
_LIBRARY_PACKING = getattr(getattr(redis.connection, "AbstractConnection", None), "pack_command", None)
_ENCODER = getattr(redis.connection, "Encoder", None)
_ENCODE = getattr(_ENCODER, "encode", None)


def packs_like_us(connection: Any) -> bool:
    """Whether ``connection`` packs a command exactly as ``_protocol.resp.pack_commands`` does: redis-py's own
    pure-Python packer (not hiredis's, a subclass's, a patched one or another library's) with its own encoder, UTF-8
    and strict, the one the packer encodes with."""
    if _PYTHON_PACKER is None or _LIBRARY_PACKING is None or _ENCODER is None:
        return False
    encoder: Any = getattr(connection, "encoder", None)
    packer = getattr(connection, "_command_packer", None)
    return (
        type(packer) is _PYTHON_PACKER
        and getattr(_PYTHON_PACKER, "pack", None) is _PACK
        and getattr(type(connection), "pack_command", None) is _LIBRARY_PACKING
        and "pack_command" not in getattr(connection, "__dict__", {})
        and type(encoder) is _ENCODER
        and getattr(_ENCODER, "encode", None) is _ENCODE
        and getattr(packer, "encode", None) == encoder.encode
        and encoder.encoding_errors == "strict"
        and is_utf8(encoder.encoding)
    )
