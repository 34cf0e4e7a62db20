"""A throw-away Sentinel-managed service: one master, its replicas and a few sentinels, all on free loopback ports.

For the tests and the failover measurement (``benchmarks/failover.py``). Every process is a ``redis-server`` (or
``valkey-server``, the binary ``find_server_binary`` picks; sentinels run it with ``--sentinel``), binds 127.0.0.1,
keeps its files in a temporary directory, persists nothing, and is stopped by pid. Sentinels are set to notice a
dead master quickly (``down_after_ms``, 500 ms by default), so a failover takes a few seconds.

    with SentinelService() as service:
        registry = hybridlock.LockRegistry(service.url())     # redis+sentinel://127.0.0.1:p1,.../hybridlock-test/0
        ...
        service.failover()                                     # SENTINEL FAILOVER, then wait for the new master
        service.kill_master()                                  # SIGKILL, then wait for the sentinels to promote one
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from .server import EmbeddedServer, _free_port, find_server_binary, stop_process

__all__ = ["SentinelService"]

_HOST = "127.0.0.1"


class _SentinelProcess:
    def __init__(self, binary: str, config: str, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.config_text = config
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> None:
        last = ""
        for _ in range(5):  # the free port may be taken between choosing and binding it
            self.port = _free_port()
            conf = self.directory / f"sentinel-{self.port}.conf"
            conf.write_text(self.config_text.format(port=self.port, dir=self.directory))
            self.process = subprocess.Popen(
                [self.binary, str(conf), "--sentinel"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.process.poll() is None:
                with contextlib.suppress(redis.RedisError), _client(self.port) as client:
                    # Ours, not another process's that picked the same free port (parallel test workers, say).
                    if client.info("server").get("process_id") == self.process.pid:
                        return
                time.sleep(0.05)
            log = self.directory / f"sentinel-{self.port}.log"
            last = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            self.stop()
        raise RuntimeError(f"could not start a sentinel: {last}")

    def stop(self) -> None:
        stop_process(self.process)


def _client(port: int) -> redis.Redis:
    return redis.Redis(_HOST, port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)


class SentinelService:
    """``replicas`` replicas of one master, watched by ``sentinels`` sentinels (quorum: a majority of them).

    ``servers`` are the data nodes (``EmbeddedServer``; the first is the master at the start). Nothing here is meant
    for anything but a test or a measurement on one machine."""

    def __init__(
        self,
        service: str = "hybridlock-test",
        *,
        replicas: int = 2,
        sentinels: int = 3,
        binary: str | None = None,
        down_after_ms: int = 500,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.service = service
        self.binary = binary or find_server_binary()
        self.replica_count = replicas
        self.sentinel_count = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.servers: list[EmbeddedServer] = []
        self.sentinels: list[_SentinelProcess] = []
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    # -- addresses -------------------------------------------------------------------------------------------------

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(_HOST, s.port) for s in self.sentinels]

    def url(self, db: int = 0) -> str:
        """``redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,.../<service>/<db>``."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service}/{db}"

    def master_address(self) -> tuple[str, int]:
        """The master's address as the first sentinel that answers gives it."""
        for _host, port in self.sentinel_addresses:
            with contextlib.suppress(redis.RedisError), _client(port) as client:
                address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                if address:
                    return str(address[0]), int(address[1])
        raise RuntimeError(f"no sentinel knows the master of {self.service}")

    def master(self) -> EmbeddedServer:
        """The data node that is the master now (per the sentinels)."""
        _, port = self.master_address()
        return next(server for server in self.servers if server.port == port)

    def replicas(self) -> list[EmbeddedServer]:
        master = self.master()
        return [server for server in self.servers if server is not master]

    def node_client(self, server: EmbeddedServer) -> redis.Redis:
        """A plain client of one data node (the caller closes it)."""
        return _client(server.port)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def _server_args(self, master_port: int | None) -> tuple[str, ...]:
        args: list[str] = [
            # A new replica syncs at once (the default waits 5 s for more replicas to share one transfer).
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if master_port is not None:
            args += ["--replicaof", _HOST, str(master_port)]
        return tuple(args)

    def start(self, timeout: float = 30.0) -> SentinelService:
        self._dir = tempfile.TemporaryDirectory(prefix="hybridlock-sentinel-")
        directory = Path(self._dir.name)
        try:
            master = EmbeddedServer(self.binary, extra_args=self._server_args(None)).start()
            self.servers.append(master)
            for _ in range(self.replica_count):
                self.servers.append(EmbeddedServer(self.binary, extra_args=self._server_args(master.port)).start())
            quorum = self.sentinel_count // 2 + 1
            config = "\n".join(
                [
                    "port {port}",
                    f"bind {_HOST}",
                    "daemonize no",
                    "dir {dir}",
                    "logfile {dir}/sentinel-{port}.log",
                    f"sentinel monitor {self.service} {_HOST} {master.port} {quorum}",
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
                    f"sentinel parallel-syncs {self.service} {max(1, self.replica_count)}",
                    "",
                ]
            )
            for _ in range(self.sentinel_count):
                sentinel = _SentinelProcess(self.binary, config, directory)
                self.sentinels.append(sentinel)
                sentinel.start(timeout)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()
        self.sentinels.clear()
        self.servers.clear()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> SentinelService:
        return self.start() if not self.servers else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------------------------------

    def healthy(self, master_port: int | None = None) -> bool:
        """Every sentinel agrees on one master (``master_port`` if given), is not failing over and knows every
        other sentinel; the master has every replica online, acknowledging within a second."""
        expected: int | None = master_port
        for _host, port in self.sentinel_addresses:
            try:
                with _client(port) as client:
                    state = _pairs(client.execute_command("SENTINEL", "MASTER", self.service))
            except redis.RedisError:
                return False
            if state.get("flags") != "master" or state.get("failover-state", "none") not in ("none", ""):
                return False
            if expected is None:
                expected = int(state["port"])
            if int(state["port"]) != expected or int(state.get("num-other-sentinels", 0)) < self.sentinel_count - 1:
                return False
            # (Their view of the replicas lags: they read a replica's INFO every 10 s. SENTINEL FAILOVER retries
            # until they see a good one.)
        if expected is None:
            return False
        try:
            with _client(expected) as client:
                info = client.info("replication")
        except redis.RedisError:
            return False
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return (
            info.get("role") == "master"
            and len(online) >= self.replica_count
            and all(r.get("state") == "online" and int(r.get("lag", 99)) <= 1 for r in online)
        )

    def wait_healthy(self, timeout: float = 30.0, master_port: int | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy(master_port):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the sentinel service {self.service} did not settle within {timeout} s: {self.state_report()}"
                )
            time.sleep(0.1)

    def state_report(self) -> str:
        """What each sentinel says of the service now (the master's port, its flags, such as ``o_down`` or
        ``failover_in_progress``, and the config epoch, which each failover raises) and each data node's role: for
        failure messages."""
        parts = []
        for _host, port in self.sentinel_addresses:
            try:
                with _client(port) as client:
                    state = _pairs(client.execute_command("SENTINEL", "MASTER", self.service))
                flags, epoch = state.get("flags"), state.get("config-epoch")
                parts.append(f"sentinel {port}: master {state.get('port')} {flags} epoch {epoch}")
            except redis.RedisError as exc:
                parts.append(f"sentinel {port}: {type(exc).__name__}")
        for server in self.servers:
            try:
                with _client(server.port) as client:
                    parts.append(f"node {server.port}: {client.info('replication').get('role')}")
            except redis.RedisError as exc:
                parts.append(f"node {server.port}: {type(exc).__name__}")
        return "; ".join(parts)

    def wait_new_master(self, old_port: int, timeout: float = 30.0) -> int:
        """Wait until every sentinel has switched to a master other than ``old_port`` (``SENTINEL MASTER``, which is
        what clients ask, not ``GET-MASTER-ADDR-BY-NAME``, which names the promoted replica mid-failover), is no
        longer failing over, and that master answers as one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ports = set()
            for _host, port in self.sentinel_addresses:
                with contextlib.suppress(redis.RedisError), _client(port) as client:
                    state = _pairs(client.execute_command("SENTINEL", "MASTER", self.service))
                    if "failover_in_progress" not in state.get("flags", ""):
                        ports.add(int(state["port"]))
                    else:
                        ports.add(-1)
            if len(ports) == 1 and old_port not in ports and -1 not in ports:
                (new_port,) = ports
                with contextlib.suppress(redis.RedisError), _client(new_port) as client:
                    if client.info("replication").get("role") == "master":
                        return new_port
            time.sleep(0.05)
        raise TimeoutError(f"no new master for {self.service} within {timeout} s")

    # -- faults ----------------------------------------------------------------------------------------------------

    def failover(self, timeout: float = 30.0, *, settle: bool = True, demote_old: bool = True) -> int:
        """``SENTINEL FAILOVER``: promote a replica now; returns the new master's port once every sentinel names
        it (and, with ``settle``, once the old master has become its replica and every node is caught up).

        ``demote_old``: turn the old master into a replica at once, as an operator would; without it the sentinels
        do it when they next read its INFO (up to 10 s), and until then it still takes writes from clients that
        stayed connected to it, as a partitioned master does."""
        old_port = self.master_address()[1]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with _client(self.sentinels[0].port) as client:
                    client.execute_command("SENTINEL", "FAILOVER", self.service)
                break
            except redis.ResponseError as exc:  # INPROG, NOGOODSLAVE: the last change has not settled yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"SENTINEL FAILOVER {self.service} refused: {exc}") from exc
                time.sleep(0.1)
        new_port = self.wait_new_master(old_port, max(1.0, deadline - time.monotonic()))
        if settle:
            # The sentinels turn the old master into a replica only when they next read its INFO (every 10 s):
            # do it now, as an operator would.
            if demote_old:
                with contextlib.suppress(redis.RedisError), _client(old_port) as client:
                    if client.info("replication").get("role") == "master":
                        client.execute_command("REPLICAOF", _HOST, new_port)
            new_port = self._settled(old_port, deadline)
        return new_port

    def _settled(self, old_port: int, deadline: float) -> int:
        """Wait until the service has settled on a master other than ``old_port``, and return its port. Usually the
        one just promoted; but on a loaded machine the sentinels sometimes pass over a node they just promoted and
        fail over once more (a new epoch), and the master they settle on then is another replica."""
        self.wait_healthy(max(1.0, deadline - time.monotonic()))
        port = self.master_address()[1]
        if port == old_port:
            raise TimeoutError(f"the sentinel service {self.service} settled back on {old_port}: {self.state_report()}")
        return port

    def kill_master(self, timeout: float = 30.0, *, restart: bool = True) -> int:
        """SIGKILL the master and wait for the sentinels to promote a replica; with ``restart``, start the killed
        node again, empty, as a replica of the new master, and wait until all is settled. Returns the new port."""
        old = self.master()
        old.kill()
        new_port = self.wait_new_master(old.port, timeout)
        if restart:
            index = self.servers.index(old)
            old.stop()
            revived = EmbeddedServer(self.binary, extra_args=self._server_args(new_port))
            self.servers[index] = revived.start(port=old.port)
            new_port = self._settled(old.port, time.monotonic() + timeout)
        return new_port


def _pairs(flat: Any) -> dict[str, str]:
    """A ``SENTINEL MASTER``/``REPLICAS`` reply (a flat list of names and values, or a dict) as a dict."""
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    items = list(flat)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}
