"""Hand-written, asyncio side: what the cluster backend needs of a cluster client that the asyncio and blocking
clients of redis-py (and valkey-py) spell differently. ``hybridlock/_sync/backends/_compat.py`` is the twin.

* ``CLUSTER_CLIENT_OPTIONS``: what the cluster clients hybridlock makes are given besides its timeouts and retry.
* ``cluster_ready``: the asyncio client learns the cluster's layout at its first command (or ``initialize()``);
  the blocking one did at construction.
* ``cluster_routes_by_key``: the asyncio client must have learnt the layout before a keyed command is sent through
  it, or it sends it to a random master (see there); the blocking one always has.
* ``node_for_slot``: the master serving a slot, from the client's own slot table (no I/O).
* ``pipeline_on_node``: several commands to one node in one round trip, each reply or error in order. The cluster
  clients' own pipelines cannot carry EVALSHA (the blocking one refuses it, and both would ask the server for the
  keys of every command first), so the commands go over the node's own connections.
* ``node_pubsub_client``: a plain client for a subscriber connection to one node.
* ``connection_ready``: the look a connection pool gives a connection before it hands it out, for one kept out of
  the pool between calls (``ScriptRunner``); the asyncio connection spells its non-blocking read differently.
* ``packs_like_us``: whether a connection packs commands as ``_protocol.resp`` does, so that the script runner may
  pack them itself (the asyncio connection packs in a method of its own, the blocking one in a packer object).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio
import redis.asyncio.client
import redis.asyncio.connection

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


#: redis-py's asyncio cluster client answers every ``reinitialize_steps``-th MOVED (5 by default) with its own
#: ``aclose()``: every connection closed, those of other tasks' calls in flight too, which fail (or are retried after
#: the server ran them: a release retried so finds its lock gone, and reports it lost). Under tasks at once, a slot
#: migration or a failover brings that many MOVED answers. With 0 it follows each MOVED (the slot's new master is
#: learnt from it, as after a failover), which is all a change of the layout needs; a node out of reach still makes
#: it learn the whole layout again.
CLUSTER_CLIENT_OPTIONS: dict[str, Any] = {"reinitialize_steps": 0}


async def cluster_ready(client: Any) -> None:
    """Make sure ``client`` knows the cluster's slot table (one round trip the first time, none after)."""
    await client.initialize()


async def cluster_routes_by_key(client: Any) -> None:
    """Make sure a keyed command sent through ``client`` next goes to the master serving its key's slot (no I/O
    unless the client knows no layout).

    redis-py's asyncio cluster client (8.x) chooses a command's node *before* its retry loop learns the cluster's
    layout, and with no layout known (a new client, or one its own ``aclose()`` emptied: it does so at every fifth
    MOVED, and on CLUSTERDOWN) it takes a keyed command for a keyless one, sent to a random master. Alone, that costs
    a MOVED and a second round trip; from several tasks at once, the MOVED answers add up to a fifth, and the
    ``aclose()`` it sets off closes every connection of the client, the other tasks' calls in flight with them
    ("Connection closed by server"), whose failures make the client learn the layout again, and so on. Learning it
    first (the client's own lock lets one task do it while the others wait) routes every call by its slot."""
    if client.get_default_node() is None:  # (what the client looks at to tell whether it can route by key)
        await client.initialize()


def node_for_slot(client: Any, slot: int) -> Any:
    return client.nodes_manager.get_node_from_slot(slot)


class _Command:
    """One command of a node pipeline, in the shape ``ClusterNode.execute_pipeline`` reads and fills in."""

    __slots__ = ("args", "kwargs", "position", "result")

    def __init__(self, position: int, args: Sequence[Any]) -> None:
        self.position = position
        self.args = tuple(args)
        self.kwargs: dict[str, Any] = {}
        self.result: Any = None


async def pipeline_on_node(client: Any, node: Any, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """Send ``commands`` to ``node`` in one round trip; each reply, or the error the server answered it with, in
    order. Raises the client's ConnectionError / TimeoutError when the node cannot be reached."""
    batch = [_Command(position, args) for position, args in enumerate(commands)]
    await node.execute_pipeline(batch)
    return [command.result for command in batch]


def sharded_subscribe() -> bool:
    """Whether the client of ``node_pubsub_client`` can listen on sharded pub/sub (SSUBSCRIBE): redis-py's asyncio
    ``PubSub`` can from 8.0 only. Without, a cluster's waiters poll (the scripts still announce, for others)."""
    return hasattr(redis.asyncio.client.PubSub, "ssubscribe")


def node_pubsub_client(client: Any, node: Any) -> tuple[Any, bool]:
    """A plain client that connects to ``node`` with the cluster client's settings, for one subscriber connection;
    and whether the caller owns it (must close it). The asyncio cluster client keeps bare connections per node, not
    clients, so this is a new client of our own."""
    kwargs = dict(node.connection_kwargs)
    pool = redis.asyncio.ConnectionPool(connection_class=node.connection_class, max_connections=2, **kwargs)
    return redis.asyncio.Redis(connection_pool=pool), True


async def connection_ready(connection: Any, unavailable: tuple[type[BaseException], ...]) -> None:
    """Make ``connection`` (kept out of its pool since its last call, every reply read) ready to send, as the pool's
    own check does for one it hands out: a socket with something to read was closed by the server meanwhile (its idle
    ``timeout``, a restart, ``CLIENT KILL``), and is reconnected. ``unavailable``: the client library's errors for a
    connection that failed, raised when the server cannot be reached. (The non-blocking read is ``can_read`` in
    redis-py 8, ``can_read_destructive`` in redis-py 4.5 to 7 and valkey-py.)"""
    await connection.connect()  # (nothing when connected; a connection the pool's disconnect() closed reconnects)
    readable = getattr(connection, "can_read", None) or connection.can_read_destructive
    failed: tuple[type[BaseException], ...] = (*unavailable, OSError)
    try:
        stale = await readable()
    except failed:  # (a socket closed by the server reads as an error here)
        stale = True
    if stale:
        await connection.disconnect()
        await connection.connect()


# redis-py's own packing and encoder, as imported (absent before redis-py 4.6: then nothing is packed here). A
# connection is trusted only with these very functions: a subclass's, a patched one (a test's fault) or the user's
# ``encoder_class`` may send other bytes.
_LIBRARY_PACKING = getattr(getattr(redis.asyncio.connection, "AbstractConnection", None), "pack_command", None)
_ENCODER = getattr(redis.asyncio.connection, "Encoder", None)
_ENCODE = getattr(_ENCODER, "encode", None)


def packs_like_us(connection: Any) -> bool:
    """Whether ``connection`` packs a command exactly as ``_protocol.resp.pack_commands`` does: redis-py's own
    pure-Python packing (not a subclass's, a patched one or another library's) with its own encoder, UTF-8 and
    strict. Anything else (valkey-py, an encoder or encoding of the user's) packs its own commands."""
    if _LIBRARY_PACKING is None or _ENCODER is None:
        return False
    encoder: Any = getattr(connection, "encoder", None)
    return (
        getattr(type(connection), "pack_command", None) is _LIBRARY_PACKING
        and "pack_command" not in getattr(connection, "__dict__", {})
        and type(encoder) is _ENCODER
        and getattr(_ENCODER, "encode", None) is _ENCODE
        and encoder.encoding_errors == "strict"
        and is_utf8(encoder.encoding)
    )
