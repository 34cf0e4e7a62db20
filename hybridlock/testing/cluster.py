"""Start a throw-away Redis Cluster (or Valkey cluster) on free loopback ports: masters, each with its replicas.

Each node is an :class:`~hybridlock.testing.EmbeddedServer` started with ``--cluster-enabled yes``. A cluster node
also listens on its port + 10000 (the cluster bus), so every port is chosen with that one free too. The cluster is
then formed with plain commands, so no ``redis-cli`` is needed: each node gets a config epoch of its own (``CLUSTER
SET-CONFIG-EPOCH``, as ``redis-cli --cluster create`` gives them), the 16384 slots are split evenly over the masters
(``CLUSTER ADDSLOTSRANGE``), the nodes meet (``CLUSTER MEET``), each replica follows its master (``CLUSTER
REPLICATE``), and ``start`` returns once every node reports ``cluster_state:ok`` and agrees on the slots, and every
replica has made its first sync with its master and caught up (``wait_synced``): a lease taken right after
``start`` reaches the replicas as it would in a cluster long up, so a test that kills a master then tests a
failover, not a replica that had nothing yet. A replica syncs at once (``repl-diskless-sync-delay 0``: the
server's default waits 5 s for more replicas to share one transfer). Nothing is persisted; every node is stopped
by pid.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

from .server import EmbeddedServer

__all__ = ["EmbeddedCluster"]

SLOTS = 16384
_BUS_OFFSET = 10000  # a cluster node's bus port is its port + 10000


def _port_pair_free(port: int) -> bool:
    """Whether ``port`` and ``port + 10000`` can both be bound on loopback now."""
    if port + _BUS_OFFSET > 65535:
        return False
    with contextlib.ExitStack() as stack:
        for candidate in (port, port + _BUS_OFFSET):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _slots(fields: list[str]) -> set[int]:
    """The slots in the slot fields of a ``CLUSTER NODES`` line (``0-5460``, ``5461``; migrations in brackets
    are left out)."""
    slots: set[int] = set()
    for field in fields:
        if not field.startswith("["):
            low, _, high = field.partition("-")
            slots.update(range(int(low), int(high or low) + 1))
    return slots


def _free_cluster_port(taken: set[int]) -> int:
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + _BUS_OFFSET > 65535:
            port -= _BUS_OFFSET + 1  # the ephemeral range is high: look below it instead
        if port > 1024 and port not in taken and port + _BUS_OFFSET not in taken and _port_pair_free(port):
            return port
    raise RuntimeError("no free loopback port pair (port, port + 10000) found for a cluster node")


class EmbeddedCluster:
    """A cluster of ``masters`` masters with ``replicas`` replicas each, on loopback. Use as a context manager, or
    ``start()`` / ``stop()``. ``nodes`` lists every node (masters first, in slot order, then replicas in the same
    order); ``url`` is a ``redis+cluster://`` URL of the masters, for ``LockRegistry``.

    ``node_timeout`` (ms) is how long a node may be silent before the others hold it failed and a replica takes
    over: short for fast failover tests, but not so short that a loaded machine fails nodes over by itself."""

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        *,
        binary: str | None = None,
        node_timeout: int = 2000,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one master and no negative number of replicas")
        self.masters_count = masters
        self.replicas_per_master = replicas
        self.binary = binary
        self.node_timeout = node_timeout
        self.extra_args = extra_args
        self.nodes: list[EmbeddedServer] = []

    @property
    def masters(self) -> list[EmbeddedServer]:
        """The nodes started as masters (a failover may have changed roles since: see ``role``)."""
        return self.nodes[: self.masters_count]

    @property
    def replicas(self) -> list[EmbeddedServer]:
        return self.nodes[self.masters_count :]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.masters)

    def start(self, timeout: float = 30.0) -> EmbeddedCluster:
        try:
            taken: set[int] = set()
            for _ in range(self.masters_count * (1 + self.replicas_per_master)):
                port = _free_cluster_port(taken)
                taken.update((port, port + _BUS_OFFSET))
                node = EmbeddedServer(
                    self.binary,
                    extra_args=(
                        "--cluster-enabled", "yes",
                        "--cluster-config-file", "nodes.conf",
                        "--cluster-node-timeout", str(self.node_timeout),
                        # A replica may always take over, however long it was cut off (tests cut them off).
                        "--cluster-replica-validity-factor", "0",
                        # A new replica syncs at once (the default waits 5 s for more replicas to share one transfer).
                        "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                        *self.extra_args,
                    ),
                )  # fmt: skip
                self.nodes.append(node.start(port=port))
            self._form(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self, timeout: float) -> None:
        # Every node a config epoch of its own, given before it knows any other (the only time the server takes
        # one). Left to the servers, all start at 0 and tell clashes apart only between two masters: a node that
        # turns replica first keeps an epoch equal to another's, unseen (a replica is listed with its master's).
        # Then a takeover by a replica whose epoch is already the greatest keeps it (the server bumps only an
        # epoch that is not), and claims its dead master's slots with the master's own epoch: the other nodes
        # keep the dead master as the owner for good (see settle_takeover).
        for epoch, node in enumerate(self.nodes, start=1):
            self.command(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        first = self.client(self.nodes[0])
        per_master = SLOTS // self.masters_count
        for index, master in enumerate(self.masters):
            low = index * per_master
            high = SLOTS - 1 if index == self.masters_count - 1 else low + per_master - 1
            self.command(master, "CLUSTER", "ADDSLOTSRANGE", low, high)
        for node in self.nodes[1:]:
            first.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout
        # A replica can only follow a master it already knows.
        master_ids = [self.node_id(master) for master in self.masters]
        for index, replica in enumerate(self.replicas):
            master_id = master_ids[index % self.masters_count]
            while True:
                try:
                    self.command(replica, "CLUSTER", "REPLICATE", master_id)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        self.wait_healthy(timeout=max(1.0, deadline - time.monotonic()))
        self.wait_synced(timeout=max(1.0, deadline - time.monotonic()))

    def wait_synced(self, timeout: float = 30.0) -> None:
        """Until every running replica is in sync with its master: its link is up (``master_link_status:up``, no
        sync under way) at the master's replication offset, and the master has it online at that offset too (the
        replica's acknowledgement arrived). From then on a write reaches the replicas in the time a write takes to
        replicate, not after a full sync."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                lagging = self._unsynced()
            except Exception as exc:  # a node restarting, say: ask again
                lagging = [f"{type(exc).__name__}: {exc}"]
            if not lagging:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replicas did not sync within {timeout} s: {'; '.join(lagging)}")
            time.sleep(0.05)

    def _unsynced(self) -> list[str]:
        """What each running replica not in sync lacks (empty when all are)."""
        running = [node for node in self.nodes if node.process is not None and node.process.poll() is None]
        lagging = []
        for node in running:
            info = self.command(node, "INFO", "replication")
            if info.get("role") != "slave":
                continue
            master_port = int(info["master_port"])
            link, syncing = info.get("master_link_status"), int(info.get("master_sync_in_progress", 0))
            if link != "up" or syncing:
                lagging.append(f"replica {node.port}: link to {master_port} {link}, sync in progress {syncing}")
                continue
            master = self.command(next(n for n in running if n.port == master_port), "INFO", "replication")
            offset = int(master.get("master_repl_offset", -1))
            seen = [v for k, v in master.items() if k.startswith("slave") and isinstance(v, dict)]
            mine = next((entry for entry in seen if int(entry.get("port", 0)) == node.port), None)
            if int(info.get("slave_repl_offset", -1)) != offset or mine is None:
                lagging.append(f"replica {node.port}: at {info.get('slave_repl_offset')} of {master_port}'s {offset}")
            elif mine.get("state") != "online" or int(mine.get("offset", -1)) != offset:
                state, at = mine.get("state"), mine.get("offset")
                lagging.append(f"replica {node.port}: its master {master_port} sees it {state} at {at}")
        return lagging

    def wait_healthy(self, timeout: float = 30.0, nodes: list[EmbeddedServer] | None = None) -> None:
        """Until every running node (or each of ``nodes``) says ``cluster_state:ok``, knows every running node,
        and all of them see the same slot owners."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._healthy(nodes):
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cluster did not settle within {timeout} s: {self._state_report()}")
            time.sleep(0.05)

    def settle_takeover(self, promoted: EmbeddedServer, timeout: float = 60.0) -> None:
        """Wait until the cluster settles after ``CLUSTER FAILOVER TAKEOVER`` on ``promoted`` (as ``wait_healthy``
        does), making sure the others can give it the slots; ``TimeoutError`` if it does not within ``timeout``.

        A takeover claims the old master's slots with a config epoch the replica gives itself without the others'
        agreement: a fresh one (one past the cluster's current epoch), unless its own is already the greatest it
        knows of. The other nodes hand it the slots only for an epoch greater than the one they hold for their
        owner; an equal one is a tie that the servers break only between two live masters, so with the old master
        dead the other nodes keep it as the owner (``cluster_state:fail``) for good. ``start`` gives every node an
        epoch of its own, so a takeover claims an epoch no other node has; should the promoted node's epoch still be
        no greater than another master's (as the other nodes see it), this raises it with ``CLUSTER BUMPEPOCH``:
        on the promoted node, and, when it answers that its epoch is already the greatest it knows of, first on
        another master (which then holds a greater one) and on the promoted node once it has heard of that."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._outbid(promoted, deadline)
            except Exception:  # a node not answering yet: try again while there is time
                if time.monotonic() > deadline:
                    raise
            try:
                self.wait_healthy(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
                return
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise

    def _outbid(self, promoted: EmbeddedServer, deadline: float) -> None:
        """Give ``promoted`` a config epoch greater than any a running node holds for another owner of the slots it
        claims (see ``settle_takeover``), if it does not have one."""
        if self.config_epoch(promoted) > self._rival_epoch(self.node_id(promoted)):
            return
        if self._bump_epoch(promoted):
            return
        # Its epoch is the greatest it knows of, and tied: no bump of its own can pass it. A bump elsewhere can.
        other = next(
            (
                node
                for node in self.nodes
                if node is not promoted
                and node.process is not None
                and node.process.poll() is None
                and self.role(node) == "master"
            ),
            None,
        )
        if other is None:  # no other master running: nothing here can break the tie (wait_healthy will say so)
            return
        self._bump_epoch(other)
        above = self.config_epoch(other)
        while self._current_epoch(promoted) < above and time.monotonic() < deadline:
            time.sleep(0.05)  # until the promoted node hears of it (its next heartbeat)
        self._bump_epoch(promoted)

    def _bump_epoch(self, node: EmbeddedServer) -> bool:
        """``CLUSTER BUMPEPOCH`` on ``node``: whether it took a new epoch (not when its own is already the
        greatest it knows of)."""
        reply = self.command(node, "CLUSTER", "BUMPEPOCH")
        return (reply.decode() if isinstance(reply, bytes) else str(reply)).startswith("BUMPED")

    def config_epoch(self, node: EmbeddedServer) -> int:
        """The config epoch under which ``node`` serves its slots, as it says now (a replica: its master's)."""
        return int(self._cluster_info(node)["cluster_my_epoch"])

    def _current_epoch(self, node: EmbeddedServer) -> int:
        return int(self._cluster_info(node)["cluster_current_epoch"])

    def _cluster_info(self, node: EmbeddedServer) -> dict[str, str]:
        info = self.command(node, "CLUSTER", "INFO")
        text = info.decode() if isinstance(info, bytes) else str(info)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def _rival_epoch(self, promoted_id: str) -> int:
        """The greatest config epoch that a running node holds for another master it lists as owning any of the
        slots the node ``promoted_id`` claims (0 if none does)."""
        running = [node for node in self.nodes if node.process is not None and node.process.poll() is None]
        views = []
        for node in running:
            known = self.command(node, "CLUSTER", "NODES")
            views.append(
                [line.split() for line in (known.decode() if isinstance(known, bytes) else str(known)).splitlines()]
            )
        claimed = set()
        for view in views:
            for fields in view:
                if fields[0] == promoted_id and "myself" in fields[2].split(","):
                    claimed = _slots(fields[8:])
        rival = 0
        for view in views:
            for fields in view:
                if fields[0] != promoted_id and "master" in fields[2].split(",") and claimed & _slots(fields[8:]):
                    rival = max(rival, int(fields[6]))
        return rival

    def _state_report(self) -> str:
        """Each running node's cluster state and what it thinks of every node (for a settling that timed out)."""
        running = [node for node in self.nodes if node.process is not None and node.process.poll() is None]
        parts = []
        for node in running:
            try:
                info = self.command(node, "CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                state = next((line for line in text.splitlines() if line.startswith("cluster_state")), "?")
                known = self.command(node, "CLUSTER", "NODES")
                lines = (known.decode() if isinstance(known, bytes) else str(known)).splitlines()
                seen = ", ".join(
                    f"{fields[1].split('@')[0].rsplit(':', 1)[-1]} {fields[2]} epoch {fields[6]} "
                    f"{' '.join(fields[8:]) or '-'}"
                    for fields in (line.split() for line in lines)
                )
                parts.append(f"node {node.port}: {state.strip()}; sees [{seen}]")
            except Exception as exc:  # a node that does not answer is part of the picture
                parts.append(f"node {node.port}: {type(exc).__name__}: {exc}")
        return "; ".join(parts)

    def _healthy(self, nodes: list[EmbeddedServer] | None) -> bool:
        running = [node for node in self.nodes if node.process is not None and node.process.poll() is None]
        views = set()
        for node in nodes or running:
            info = self.command(node, "CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
            slots = self.command(node, "CLUSTER", "SLOTS")
            views.add(tuple(sorted((int(entry[0]), int(entry[1]), int(entry[2][1])) for entry in slots)))
            known = self.command(node, "CLUSTER", "NODES")
            lines = (known.decode() if isinstance(known, bytes) else str(known)).splitlines()
            if sum(1 for line in lines if "fail" not in line.split()[2] and "handshake" not in line) < len(running):
                return False
        return len(views) == 1

    def client(self, node: EmbeddedServer) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=10, socket_connect_timeout=5)

    def command(self, node: EmbeddedServer, *args: Any) -> Any:
        """One command sent to ``node`` alone (a plain connection, no redirection)."""
        client = self.client(node)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def node_id(self, node: EmbeddedServer) -> str:
        reply = self.command(node, "CLUSTER", "MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def role(self, node: EmbeddedServer) -> str:
        """``"master"`` or ``"slave"``, as the node itself says now."""
        reply = self.command(node, "ROLE")
        first = reply[0]
        return first.decode() if isinstance(first, bytes) else str(first)

    def owner_of(self, slot: int) -> EmbeddedServer:
        """The node serving ``slot`` now, as the first running node sees it."""
        running = [node for node in self.nodes if node.process is not None and node.process.poll() is None]
        for entry in self.command(running[0], "CLUSTER", "SLOTS"):
            if int(entry[0]) <= slot <= int(entry[1]):
                port = int(entry[2][1])
                return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, master: EmbeddedServer) -> EmbeddedServer:
        """A running replica of ``master`` now."""
        master_id = self.node_id(master)
        for node in self.nodes:
            if node is master or node.process is None or node.process.poll() is not None:
                continue
            for line in self.command(node, "CLUSTER", "NODES").decode().splitlines():
                fields = line.split()
                if "myself" in fields[2] and fields[3] == master_id:
                    return node
        raise LookupError(f"no running replica follows the node on port {master.port}")

    def migrate_slot(self, slot: int, target: EmbeddedServer, between: Any = None) -> None:
        """Move ``slot`` with its keys to ``target`` the way ``redis-cli --cluster reshard`` does: mark it
        IMPORTING at the target and MIGRATING at the source, MIGRATE its keys, then give it to the target
        everywhere. ``between()``, if given, runs while the slot is half moved (some keys here, some there)."""
        source = self.owner_of(slot)
        if source is target:
            return
        source_id, target_id = self.node_id(source), self.node_id(target)
        self.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        keys = self.command(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000)
        half = len(keys) // 2
        for part, batch in enumerate((keys[:half], keys[half:])):
            if batch:
                self.command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *batch)
            if between is not None and part == 0:
                between()
        for key in self.command(source, "CLUSTER", "GETKEYSINSLOT", slot, 1000):  # written meanwhile
            self.command(source, "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", key)
        self.command(target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self.command(source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for node in self.masters:
            if node not in (source, target) and node.process is not None and node.process.poll() is None:
                with contextlib.suppress(Exception):
                    self.command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> EmbeddedCluster:
        return self.start() if not self.nodes else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
