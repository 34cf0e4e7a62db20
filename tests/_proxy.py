"""A TCP proxy on a free loopback port that can cut one client off from the server, for fault tests.

``FaultProxy(server_port)`` forwards every connection made to ``proxy.port`` to the server. ``partition()`` turns
it into a black hole: bytes in either direction are dropped and new connections are accepted but go nowhere, as
when a network path fails without resetting anything (the client only learns it from its own timeouts).
``heal()`` forwards again on new connections (connections open during the partition stay dead, as after a real
one). ``deafen()`` drops only what the server sends back: requests still reach it and run, their replies are lost
(a path that fails after the request went through); ``heal()`` ends that too.
``cut_reply_to(marker)`` loses exactly one reply: the next request containing ``marker`` reaches the server and
runs, and its connection is cut (both ends closed) as the reply comes back, which is then dropped; the client sees
the connection closed, and a retry on a new connection goes through.
``delay`` adds latency to every chunk sent towards the server. Only the clients pointed at the proxy are
affected; others talk to the server directly.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

__all__ = ["FaultProxy"]


class FaultProxy:
    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.delay = 0.0
        self._partitioned = threading.Event()
        self._deaf = threading.Event()
        self._marker: bytes | None = None  # (see cut_reply_to)
        self._doomed: set[socket.socket] = set()  # client ends whose next reply is cut off
        self._stopped = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket | None]] = []
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept_loop)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def partition(self) -> None:
        self._partitioned.set()

    def deafen(self) -> None:
        self._deaf.set()

    def cut_reply_to(self, marker: bytes) -> None:
        with self._lock:
            self._marker = marker

    @property
    def reply_cut(self) -> bool:
        """Whether the request ``cut_reply_to`` waits for has come (its reply is then cut off, or about to be)."""
        with self._lock:
            return self._marker is None

    def heal(self) -> None:
        # Connections that lived through the partition stay black holes: close them so clients reconnect.
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
        self._partitioned.clear()
        self._deaf.clear()

    def close(self) -> None:
        self._stopped.set()
        self.heal()
        with contextlib.suppress(OSError):
            self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _spawn(self, target, *args) -> None:  # type: ignore[no-untyped-def]
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = None
            if not self._partitioned.is_set():
                try:
                    upstream = socket.create_connection(("127.0.0.1", self.server_port), timeout=5)
                except OSError:
                    client.close()
                    continue
            with self._lock:
                self._pairs.append((client, upstream))
            self._spawn(self._pump, client, upstream)

    def _pump(self, client: socket.socket, upstream: socket.socket | None) -> None:
        peers = {client: upstream, upstream: client} if upstream is not None else {client: None}
        try:
            while not self._stopped.is_set():
                readable, _, _ = select.select(list(peers), [], [], 0.1)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    target = peers[sock]
                    if target is None or self._partitioned.is_set() or (sock is upstream and self._deaf.is_set()):
                        continue  # dropped on the floor
                    if sock is client and self.delay:
                        time.sleep(self.delay)
                    if sock is client and self._marker is not None:
                        with self._lock:
                            if self._marker is not None and self._marker in data:
                                self._marker = None
                                self._doomed.add(client)
                    elif sock is upstream and client in self._doomed:
                        self._doomed.discard(client)
                        return  # (the reply dropped; both ends are closed below)
                    target.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()
