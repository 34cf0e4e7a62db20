"""The Redis Cluster backend: locks in a Redis (7+) or Valkey cluster, through redis-py's (or valkey-py's) cluster
client.

Every name one lock uses shares one hash slot (``_core.names``), so each script runs whole on the master serving
that slot. How calls travel:

* One lock's operation (acquire, release, cancel, read/write) is one EVALSHA sent by the cluster client, which
  routes it by its keys' slot and follows MOVED (the slot moved: its table is updated) and ASK (the slot is being
  migrated, these keys already went). NOSCRIPT (a node new to us, a promoted replica) costs one EVAL.
* Renewal and the keeping of waiting places are grouped by node: one pipelined round trip per node per round,
  carrying one script per slot (and per ``_RENEW_CHUNK`` keys) of that node. A call the node redirected or found
  no script for is sent again on its own, routed; a node out of reach gets its calls counted as unreached (not
  renewed, not known lost), while the other nodes' leases are renewed.
* Several keys in one slot (``acct}1``, ``acct}2``) are taken in one script; keys over several slots key by key in
  the global order, with rollback (``multi``).
* Wake-ups use sharded pub/sub: the scripts announce with SPUBLISH on the lock's channel (same slot), and a waiter
  listens with SSUBSCRIBE on one subscriber connection per node at most (``pubsub.Subscriber(sharded=True)``).
  Without sharded pub/sub (a server before Redis 7, or one that refuses ``INFO``) nothing is announced and
  waiters poll (``lock_type="spin"``'s backoff, bounded by the holder's lease).

Failure modes
-------------
* A slot is being migrated: an operation whose keys are partly moved is answered TRYAGAIN, and a semaphore's script
  is stopped by its migration probe (before it reads or writes anything: ``_protocol.scripts``); either is retried
  for up to ``_MIGRATION_PATIENCE`` seconds, then reported as :class:`~hybridlock.BackendUnavailableError`.
  Renewal touches only the keys it declares: a lock's lease is renewed throughout a migration and moves with its
  key; a permit's renewal, which also keeps its semaphore's config, is retried (as TRYAGAIN) while the two are apart.
* A master fails: until a replica is promoted (the cluster's ``cluster-node-timeout`` and an election) its slots
  are unavailable: calls about them raise ``BackendUnavailableError`` naming the slot and node, within the client's
  timeouts; locks on other masters are not affected (their renewals go on). After the promotion, what the replica
  had received is kept; a lease it had not (asynchronous replication) is gone, and its holder is told at its next
  renewal (``lost``, ``on_lost``, ``LockLostError``), as on one server. ``CLUSTER FAILOVER`` (a manual failover)
  waits for the replica to catch up: nothing is lost.
* A master hangs (SIGSTOP, a stalled disk: connections stay open, nothing is answered): a renewal round sends every
  node's pipeline at once and, once one node has answered, waits for the others as long again, at least
  ``_STRAGGLER_PATIENCE``; a node still silent then has its leases counted as unreached for that round (renewed
  next round, or reported lost when they end), so the leases on the other masters are renewed on time whatever the
  lease and socket timeout.
* Subscriptions: a node that stops serving a channel's slot (migration, failover) ends its subscription; watches of
  it then poll until they end, and later ones subscribe at the new node. A subscriber connection that breaks falls
  back to polling and reconnects, as on one server.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import redis.asyncio.cluster
import redis.exceptions
from redis.crc import key_slot

from ..._core.config import FENCE_RETENTION, checked_fence_retention
from ..._core.names import LockNames, ReadWriteNames
from ...backends.clients import (
    asyncio_client_family,
    cluster_server_name,
    is_cluster_client,
    library_family,
    login_of,
    login_of_url,
    login_refused,
    redacted,
    redacted_url,
    unanswered_hint,
)
from ...errors import BackendUnavailableError, InvalidArgumentError
from .._compat import AsyncCondition, AsyncFanOut, monotonic, new_guard, sleep
from ._compat import (
    CLUSTER_CLIENT_OPTIONS,
    cluster_ready,
    cluster_routes_by_key,
    node_for_slot,
    node_pubsub_client,
    pipeline_on_node,
    sharded_subscribe,
)
from .base import AsyncReleaseWatch
from .pubsub import Subscriber
from .redis import About, AsyncRedisBackend, ScriptRunner, Unreached, blocking_slice, keys_of

__all__ = ["CLUSTER_SCHEMES", "AsyncRedisClusterBackend", "is_cluster_url", "redis_cluster_client_from_url"]

#: URL schemes that name a cluster: ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://`` over TLS).
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

# How long an operation keeps retrying while its slot is being migrated (TRYAGAIN), before it reports the cluster
# unavailable. Moving one slot's keys takes milliseconds; this covers a slow step of a resharding tool.
_MIGRATION_PATIENCE = 2.0
_MIGRATION_PAUSE = 0.02
# How a node stops a script at a key it does not declare and does not have, its slot being migrated: Redis's words
# (either side), and Valkey's on the importing side.
_STOPPED_BY_MIGRATION = (
    "Script attempted to access a non local key",
    "undeclared keys were accessed during rehashing",
)

# How long a batch waits for a node still silent after another node has answered (at least: as long again as the
# first answer took, if longer). A healthy node answers a pipeline of renewals in milliseconds.
_STRAGGLER_PATIENCE = 0.2
# How long the holder description keeps away from a node that was out of reach, unless a batch hears from it sooner.
_SUSPECT_FOR = 10.0
# How long aclose() lets operations in progress finish (as the one-server backend does).
_CLOSE_GRACE = 5.0


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


# scheme://[userinfo@]host:port[,host:port...][/db][?query]; the user info is read as widely as in
# clients._USERINFO, so that a password with an unescaped "/" or "@" is still all user info.
_CLUSTER_URL = re.compile(r"^(?P<scheme>[^:]+)://(?P<userinfo>[^?#]*@)?(?P<hosts>[^/?#@]*)(?P<tail>.*)$")


def redis_cluster_client_from_url(url: str, *, decode_responses: bool = False) -> redis.asyncio.cluster.RedisCluster:
    """A cluster client for ``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://`` for TLS; user,
    password and query options as in a ``redis://`` URL), with hybridlock's defaults: 5 s timeouts and one
    immediate retry, so a dead node costs about one connect timeout, not several; and ``CLUSTER_CLIENT_OPTIONS``
    (the asyncio client follows a MOVED instead of closing every connection at every fifth). Every host given is a
    node to start from; the client learns the rest of the cluster from them. The asyncio client does no I/O here; the
    blocking one connects to learn the cluster's layout (a ``BackendUnavailableError`` when it cannot).
    ``decode_responses`` as redis-py's (the command line reads text)."""
    from redis.asyncio import retry as retries
    from redis.backoff import NoBackoff

    match = _CLUSTER_URL.match(url)
    if match is None or match["scheme"].lower() not in CLUSTER_SCHEMES or not match["hosts"]:
        raise ValueError("a cluster URL looks like redis+cluster://host:port[,host:port...]")
    nodes = []
    for host_port in match["hosts"].split(","):
        host, colon, port = host_port.strip().rpartition(":")
        if not colon or not port.isdigit() or not host:
            raise ValueError(f"each node of a cluster URL is host:port, not {host_port!r}")
        nodes.append((host.strip("[]"), int(port)))
    plain = f"{CLUSTER_SCHEMES[match['scheme'].lower()]}://{match['userinfo'] or ''}{match['hosts'].split(',')[0]}"
    retry = retries.Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
    startup = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in nodes[1:]]  # type: ignore[no-untyped-call,unused-ignore]
    try:
        return redis.asyncio.cluster.RedisCluster.from_url(
            plain + match["tail"],
            startup_nodes=startup or None,
            socket_timeout=5.0,
            socket_connect_timeout=5.0,
            retry=retry,
            decode_responses=decode_responses,
            **CLUSTER_CLIENT_OPTIONS,  # (the asyncio client's own: see there)
        )
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # (Only the blocking client gets here: it connects at once.)
        refused = login_refused(
            exc,
            library_family("redis"),
            login_of_url(plain, "cluster"),
            operation="connection",
            key=None,
            server=redacted_url(url),
        )
        if refused is not None:
            raise refused from exc
        raise BackendUnavailableError(
            f"lock cluster unreachable: {redacted(str(exc), url)}", server=redacted_url(url)
        ) from exc


class _ClusterScriptRunner(ScriptRunner):
    """Scripts on a cluster: one call routed by the client; a batch as one pipeline per node (see the module)."""

    def __init__(self, backend: AsyncRedisClusterBackend) -> None:
        super().__init__(backend.client, backend._family)
        self._backend = backend
        # One pipeline per node, all at once: a hung node (it costs a whole socket timeout) must not hold back the
        # renewal of the leases on the others, which would then run out while they wait.
        self.fan_out = AsyncFanOut("hybridlock-cluster")
        # Nodes out of reach in a batch that asked them, until one gets an answer from them again or
        # _SUSPECT_FOR seconds pass (the describer avoids them: a hung one would hold back the next renewal round by
        # a socket timeout): node name -> until when (monotonic).
        self._suspects: dict[str, float] = {}
        family = backend._family
        # Answers that a call sent down a node's pipeline gets when it must go elsewhere, or again: the client's
        # routed path knows what to do with each (follow the redirection, wait out the migration, EVAL).
        self._send_again = (family.cluster_redirect, family.cluster_try_again, family.no_script)

    async def run(self, source: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        family = self._backend._family
        started: float | None = None
        while True:
            try:
                return await super().run(source, keys, args)
            except family.cluster_unavailable as exc:
                # TRYAGAIN (or redirections that did not settle): the slot is being migrated. Another error of the
                # kind (the cluster is down) is not going to pass this soon: report it at once.
                if not _is_migration(exc):
                    raise
                started = monotonic() if started is None else started
                if monotonic() - started >= _MIGRATION_PATIENCE:
                    raise
            except family.response_error as exc:
                # A node stopped the script at a key of the slot it does not have, the slot being migrated (a
                # semaphore's migration probe, before the script reads or writes anything: see _protocol.scripts).
                # Reported as TRYAGAIN if the slot is still moving when the patience runs out.
                if not _stopped_by_migration(exc):
                    raise
                started = monotonic() if started is None else started
                if monotonic() - started >= _MIGRATION_PATIENCE:
                    raise family.cluster_try_again(f"TRYAGAIN {exc}") from exc
            await sleep(_MIGRATION_PAUSE)

    async def run_many(self, source: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Every call, one pipeline per node (all nodes at once), each call in the node its first key's slot is
        served by. A call whose node is out of reach, or failed there, gets ``Unreached`` in its place, unless no
        node answered at all (then the first node's error is raised)."""
        client = self._backend.client
        unavailable = self._backend._family.unavailable
        await cluster_ready(client)
        sha = self._digest(source)
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        unreached: dict[int, BaseException] = {}
        tried: set[str] = set()  # nodes found out of reach in this batch
        answered: set[str] = set()
        for attempt in range(2):
            by_node: dict[str, tuple[Any, list[int]]] = {}
            for index in pending:
                node = node_for_slot(client, key_slot(calls[index][0][0].encode()))
                by_node.setdefault(node.name, (node, []))[1].append(index)
            pending = []
            timed_out = False
            # Not to a node out of reach a moment ago (in this batch): no second timeout.
            groups = [(name, *by_node[name]) for name in by_node if name not in tried]
            outcomes = await self.fan_out.run(
                [partial(self._on_node, node, source, sha, [calls[i] for i in indexes]) for _, node, indexes in groups],
                enough=1,
                patience=_STRAGGLER_PATIENCE,
                # A lane of its own per call: batches from several callers (the renewer, the wait keeper, a renewal
                # by hand) may be at one node at once.
                lanes=[object() for _ in groups],
            )
            for (name, node, indexes), outcome in zip(groups, outcomes, strict=True):
                if type(outcome) is TimeoutError:
                    # A straggler (the fan-out gave up on it): hung or cut off. Not sent again this batch, and no
                    # layout refresh for it (see below).
                    unreached.update(dict.fromkeys(indexes, TimeoutError(f"cluster node {node.name}: {outcome}")))
                    tried.add(name)
                    timed_out = True
                elif isinstance(outcome, unavailable):
                    failure = _naming_node(outcome, node.name)
                    unreached.update(dict.fromkeys(indexes, failure))
                    pending.extend(indexes)
                    tried.add(name)
                    timed_out = timed_out or "Timeout" in type(outcome).__name__
                elif isinstance(outcome, Exception):
                    # Any other failure there (CLUSTERDOWN, a migration that outlasted our patience, a refused
                    # script, OOM) is that node's alone: its calls fail, the other nodes' answers stand.
                    unreached.update(dict.fromkeys(indexes, outcome))
                else:
                    answered.add(name)
                    for index, result in zip(indexes, outcome, strict=True):
                        unreached.pop(index, None)
                        replies[index] = result
            # NOTE: a node that timed out is hung or cut off, not (yet) replaced: learning the layout again would
            # ask the nodes in turn and cost a second socket timeout when the hung one comes first, making the
            # round outlast a short lease. A failed-over node refuses connections at once, and that is learnt below.
            if not pending or attempt or timed_out:
                break
            # A node out of reach may have been replaced (a failover): learn the layout again, then one more try
            # for its calls at whichever node serves their slots now.
            with contextlib.suppress(Exception):
                await client.nodes_manager.initialize()
        until = monotonic() + _SUSPECT_FOR
        for name in answered:
            self._suspects.pop(name, None)
        self._suspects.update(dict.fromkeys(tried, until))
        if unreached and len(unreached) == len(calls):
            raise next(iter(unreached.values()))
        for index, error in unreached.items():
            replies[index] = Unreached(error)
        return replies

    def suspected(self, node: str) -> bool:
        """Whether ``node`` was out of reach in a recent batch and has not answered one since."""
        return self._suspects.get(node, 0.0) > monotonic()

    async def _on_node(
        self, node: Any, source: str, sha: str, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        client = self._backend.client
        commands = [("EVALSHA", sha, len(keys), *keys, *args) for keys, args in calls]
        results = await pipeline_on_node(client, node, commands)
        missing = [i for i, result in enumerate(results) if isinstance(result, self._no_script)]
        if missing:
            # A node that never ran the script (new to us, a promoted replica): load it and send those again, in
            # one more round trip.
            again = await pipeline_on_node(client, node, [("SCRIPT", "LOAD", source), *(commands[i] for i in missing)])
            for i, result in zip(missing, again[1:], strict=True):
                results[i] = result
        for i, result in enumerate(results):
            if isinstance(result, self._send_again):
                results[i] = await self.run(source, *calls[i])  # redirected: routed by the client, alone
            elif isinstance(result, Exception):
                raise result
        return results


def _naming_node(error: Exception, node: str) -> Exception:
    """``error`` again, its message prefixed with the node it came from (the client's own errors do not name it);
    ``error`` itself if its type cannot be made from a message alone."""
    try:
        return type(error)(f"cluster node {node}: {error}")
    except Exception:
        return error


def _stopped_by_migration(exc: BaseException) -> bool:
    text = str(exc)
    return any(words in text for words in _STOPPED_BY_MIGRATION)


def _is_migration(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ == "TryAgainError" or "TTL exhausted" in text or "TRYAGAIN" in text


class AsyncRedisClusterBackend(AsyncRedisBackend):
    """Locks in a Redis or Valkey cluster. ``client`` is a ``redis.asyncio.RedisCluster`` (or valkey-py's twin); an
    asyncio backend and its client serve one event loop. ``address`` names the cluster in messages (default: the
    nodes the client was given, as ``redis+cluster://host:port,...``). ``fence_retention``: as
    ``AsyncRedisBackend``'s."""

    def __init__(
        self,
        client: Any,
        *,
        owns_client: bool = False,
        address: str | None = None,
        fence_retention: float | None = None,
    ) -> None:
        # Refuses clients of the other side (asyncio vs blocking) with the one to use instead.
        self._family = asyncio_client_family(client)
        if not is_cluster_client(client):
            raise InvalidArgumentError(
                f"{type(client).__module__}.{type(client).__name__} is not a cluster client; "
                "use AsyncRedisBackend for one server"
            )
        self.client = client
        self.address = address or cluster_server_name(client, self._family)
        self.login = login_of(client)  # for a refused login's message
        self._owns_client = owns_client
        # Replica confirmation (WAIT on the connection that wrote) is built for one master; the registry refuses it
        # for a cluster.
        self.confirmation = None
        self.fence_retention = checked_fence_retention(fence_retention, None, FENCE_RETENTION)
        self._cluster_scripts = _ClusterScriptRunner(self)
        self._scripts = self._cluster_scripts
        self._blocking_slice = blocking_slice(client)
        self._cluster_mode = True
        self._sharded: bool | None = None  # whether the servers have sharded pub/sub (learnt at first use)
        self._guard = new_guard()
        # node name -> (its subscriber, the client it listens with, whether we made that client)
        self._subscribers: dict[str, tuple[Subscriber, Any, bool]] = {}
        self._wanted_listeners: list[Any] = []
        self._in_flight = 0
        self._idle = AsyncCondition()
        self._closed = False

    def after_fork_in_child(self) -> None:
        with self._guard:
            subscribers = list(self._subscribers.values())
        for subscriber, _, _ in subscribers:
            subscriber.after_fork_in_child()
        self._guard = new_guard()
        self._in_flight = 0
        self._idle = AsyncCondition()
        self._cluster_scripts.fan_out.after_fork_in_child()

    async def _disconnect_after_close(self) -> None:
        await self.client.aclose()  # (a cluster client has a pool per node: closing it closes them all)

    async def _slot_of(self, name: str) -> int:
        return key_slot(name.encode())

    @contextlib.asynccontextmanager
    async def _translated(self, about: About, operation: str) -> AsyncIterator[None]:
        async with super()._translated(about, operation):
            # Every command that the cluster client routes itself (a script, a pop, a query) is sent in here: the
            # client must know the cluster's layout first, or it sends them to random masters (see
            # cluster_routes_by_key), which fails the calls of other tasks when many start at once.
            await cluster_routes_by_key(self.client)
            yield

    @property
    def pipelines_waits(self) -> bool:
        return False  # a call and a blocking pop in one pipeline would need a node pipeline of their own here

    async def _announcement(self) -> str:
        if self._sharded is None:
            # Often the first call to the cluster (the asyncio client connects then): its errors are translated too.
            async with self._translated(None, "check of the cluster's servers"):
                self._sharded = await self._has_sharded_pubsub()
        return "spublish" if self._sharded else ""

    async def _has_sharded_pubsub(self) -> bool:
        """Whether the cluster's servers have SPUBLISH/SSUBSCRIBE (Redis 7 and later, Valkey, which reports a
        Redis version of 7.2). A server that will not say (``INFO`` refused) is taken as without: waiters then
        poll, which is slower but never wrong, whereas a script calling a missing SPUBLISH would fail every call."""
        await cluster_ready(self.client)
        try:
            info = await self.client.info("server", target_nodes=self.client.get_default_node())
        except self._family.response_error:
            return False
        if isinstance(info, dict) and "redis_version" not in info and info:
            info = next(iter(info.values()))  # one node's answer, keyed by node
        version = str(info.get("redis_version", "0")) if isinstance(info, dict) else "0"
        return int(version.split(".")[0] or 0) >= 7

    @contextlib.contextmanager
    def _errors_at(self, about: About, operation: str) -> Iterator[None]:
        """Errors of the cluster (no master for a slot, a migration that did not settle, a node out of reach)
        become ``BackendUnavailableError``s naming the slot and the node."""
        family = self._family
        try:
            yield
        except (*family.cluster_unavailable, *family.unavailable) as exc:
            where = self._where(about)
            # A node refusing the login (found even under what the cluster client wrapped it in) says so.
            refused = login_refused(
                exc, family, self.login, operation=operation, key=keys_of(about), server=self.address, where=where
            )
            if refused is not None:
                raise refused from exc
            if isinstance(exc, family.cluster_unavailable):
                message = f"lock cluster cannot serve {where} now, {operation} refused: {exc}"
            else:
                hint = unanswered_hint(exc, self.login)
                message = f"lock server unreachable during {operation} ({where}): {exc}{hint}"
            raise BackendUnavailableError(message, key=keys_of(about), server=self.address) from exc

    def _where(self, about: About) -> str:
        """``slot S at node host:port`` for the locks an operation was about (where the client sends them now)."""
        if about is None:
            return "the cluster"
        names = [about] if isinstance(about, (LockNames, ReadWriteNames)) else list(about)
        slots = {key_slot((n.lock if isinstance(n, LockNames) else n.writer).encode()) for n in names}
        if len(slots) != 1:
            return f"{len(slots)} slots"
        slot = slots.pop()
        try:
            return f"slot {slot} at node {node_for_slot(self.client, slot).name}"
        except Exception:  # the client has no table yet, or no node for the slot
            return f"slot {slot}"

    async def describe_owner(self, key: str, fields: Mapping[str, str], gone: Sequence[str], ttl_ms: int) -> None:
        # Sent by the renewal worker after its round, straight to the key's node in one round trip (the cluster
        # client's own pipeline would first ask a server for the keys of each command). A node that round found out
        # of reach is not asked again now: a hung one would hold back the next renewal round by a socket timeout.
        async with self._translated(None, "description of the owner"):
            await cluster_ready(self.client)
            node = node_for_slot(self.client, key_slot(key.encode()))
            if self._cluster_scripts.suspected(node.name):
                raise BackendUnavailableError(
                    f"cluster node {node.name} was out of reach a moment ago", key=None, server=self.address
                )
            commands: list[tuple[Any, ...]] = []
            if fields:
                commands.append(("HSET", key, *(item for pair in fields.items() for item in pair)))
            if gone:
                commands.append(("HDEL", key, *gone))
            commands.append(("PEXPIRE", key, ttl_ms))
            for reply in await pipeline_on_node(self.client, node, commands):
                if isinstance(reply, Exception):
                    raise reply

    async def watch(self, names: LockNames, owner: str) -> AsyncReleaseWatch | None:
        async with self._translated(names, "subscription"):
            if not await self._announcement() or not sharded_subscribe():
                return None  # no sharded pub/sub (here, or in the client library): the caller polls
            subscriber = self._subscriber_of(key_slot(names.channel.encode()))
        return await subscriber.watch(names.channel, owner)

    def _subscriber_of(self, slot: int) -> Subscriber:
        """The subscriber of the node serving ``slot`` now (made at first need: one connection per node)."""
        node = node_for_slot(self.client, slot)
        with self._guard:
            entry = self._subscribers.get(node.name)
            if entry is None:
                pubsub_client, owned = node_pubsub_client(self.client, node)
                subscriber = Subscriber(pubsub_client, sharded=True)
                subscriber.wanted_listeners = self._wanted_listeners  # one list for every node: see on_wanted
                entry = self._subscribers[node.name] = (subscriber, pubsub_client, owned)
            return entry[0]

    def on_wanted(self, callback: Any) -> bool:
        self._wanted_listeners.append(callback)
        return True

    @property
    def subscribers(self) -> dict[str, Subscriber]:
        """The subscriber of each node listened to so far, by node name (for tests and statistics)."""
        with self._guard:
            return {name: entry[0] for name, entry in self._subscribers.items()}

    async def aclose(self) -> None:
        with self._idle:  # (see AsyncRedisBackend._translated: an operation ending from now on notifies)
            self._closed = True
        with self._guard:
            entries = list(self._subscribers.values())
        for subscriber, pubsub_client, owned in entries:
            await subscriber.aclose()
            if owned:
                with contextlib.suppress(Exception):
                    await pubsub_client.aclose()
        if self._owns_client:
            # As for one server: let the calls under way finish first (they reconnect if they come later).
            with self._idle:
                await self._idle.wait_for(lambda: not self._in_flight, _CLOSE_GRACE)
            with contextlib.suppress(Exception):
                await self.client.aclose()
        await self._cluster_scripts.fan_out.aclose()
