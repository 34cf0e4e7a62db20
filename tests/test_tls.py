"""Locks over TLS, as docs/tls.md describes them: a ``rediss://`` URL and a client built by hand, both with a client
certificate, against a real server's TLS port that requires one.

The certificates (a CA, the server's for 127.0.0.1, a client's) are made for the test with the ``openssl`` command.
The server keeps its plain port too, for the readiness check and for an admin client that watches which port the
lock clients use; the lock clients only ever reach the TLS port. Skipped when ``openssl`` is missing or the server
binary was built without TLS.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import hybridlock
from hybridlock.testing.server import EmbeddedServer

pytestmark = pytest.mark.server


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_certificates(where: Path) -> None:
    """ca.pem, server.pem/.key (for IP 127.0.0.1), client.pem/.key, all signed by the CA; valid for two days."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=hybridlock test CA", cwd=where)  # fmt: skip
    (where / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, extra in (("server", ("-extfile", "server.ext")), ("client", ())):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=hybridlock test {name}", cwd=where)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *extra, cwd=where)  # fmt: skip


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TlsServer:
    def __init__(self, server: EmbeddedServer, tls_port: int, certs: Path) -> None:
        self.server = server
        self.tls_port = tls_port
        self.certs = certs

    def url(self, *, client_cert: bool = True) -> str:
        query = f"ssl_ca_certs={self.certs / 'ca.pem'}"
        if client_cert:
            query += f"&ssl_certfile={self.certs / 'client.pem'}&ssl_keyfile={self.certs / 'client.key'}"
        return f"rediss://127.0.0.1:{self.tls_port}/0?{query}"

    def client(self) -> redis.Redis:
        """A client built by hand, as docs/tls.md shows it: TLS settings plus the timeouts and the single retry."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.tls_port,
            ssl=True,
            ssl_ca_certs=str(self.certs / "ca.pem"),
            ssl_certfile=str(self.certs / "client.pem"),
            ssl_keyfile=str(self.certs / "client.key"),
            socket_timeout=5,
            socket_connect_timeout=5,
            retry=Retry(NoBackoff(), 1),
        )

    def waiting_ports(self) -> set[int]:
        """The server ports that the connections waiting in the server came in on (CLIENT LIST's laddr): those
        blocked in a command (a waiter reading its grant with BLPOP) or subscribed to a channel."""
        admin = redis.Redis.from_url(self.server.url)
        try:
            clients = admin.client_list()
        finally:
            admin.close()
        waiting = [c for c in clients if int(c.get("sub", 0)) > 0 or "b" in c.get("flags", "")]
        return {int(c["laddr"].rsplit(":", 1)[1]) for c in waiting}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test certificates")
    certs = tmp_path_factory.mktemp("tls")
    _make_certificates(certs)
    for _ in range(3):  # the free TLS port may be taken between choosing it and the server binding it
        tls_port = _free_port()
        server = EmbeddedServer(
            extra_args=(
                "--tls-port", str(tls_port),
                "--tls-cert-file", str(certs / "server.pem"),
                "--tls-key-file", str(certs / "server.key"),
                "--tls-ca-cert-file", str(certs / "ca.pem"),
                "--tls-auth-clients", "yes",
            )
        )  # fmt: skip
        try:
            server.start()
        except RuntimeError as exc:
            if "in use" in str(exc):  # the TLS port was taken meanwhile (another test worker's server): another
                continue
            # Built without TLS: Redis rejects the tls-* directives, Valkey says "Failed finding TLS support".
            if "tls" in str(exc).lower():
                pytest.skip(f"{server.binary} cannot serve TLS: {str(exc).strip().splitlines()[-1]}")
            continue
        try:
            yield TlsServer(server, tls_port, certs)
        finally:
            server.stop()
        return
    pytest.fail("could not start a server with a TLS port")


def test_a_rediss_url_with_a_client_certificate(tls_server: TlsServer) -> None:
    with hybridlock.LockRegistry(tls_server.url(), expire_after=5) as registry:
        assert registry.server == f"rediss://127.0.0.1:{tls_server.tls_port}/0"
        with registry.obtain("tls:url") as lock:
            assert lock.fencing_token is not None
            assert lock.locked()


def test_a_client_built_by_hand_waits_and_wakes_over_tls(tls_server: TlsServer) -> None:
    first_client, second_client = tls_server.client(), tls_server.client()
    try:
        # Two registries are two owners: the second waits in the server, blocked reading the box its grant comes to.
        with (
            hybridlock.LockRegistry(first_client, expire_after=5) as first,
            hybridlock.LockRegistry(second_client, expire_after=5) as second,
        ):
            assert first.server == f"rediss://127.0.0.1:{tls_server.tls_port}/0"
            held = first.obtain("tls:client")
            assert held.acquire(timeout=5)
            got = threading.Event()

            def wait_for_it() -> None:
                lock = second.obtain("tls:client")
                if lock.acquire(timeout=10):
                    got.set()
                    lock.release()

            waiter = threading.Thread(target=wait_for_it, daemon=True)
            waiter.start()
            deadline = 50
            while not tls_server.waiting_ports() and deadline:  # the waiter waits in the server
                deadline -= 1
                threading.Event().wait(0.1)
            # The waiting connection is made from the same client: it came in on the TLS port, not the plain one.
            assert tls_server.waiting_ports() == {tls_server.tls_port}
            held.release()
            waiter.join(15)
            assert got.is_set()
    finally:
        first_client.close()
        second_client.close()


def test_the_asyncio_registry_takes_the_same_url(tls_server: TlsServer) -> None:
    async def main() -> None:
        async with hybridlock.AsyncLockRegistry(tls_server.url(), expire_after=5) as registry:
            lock = registry.obtain("tls:async")
            async with lock:
                assert lock.fencing_token is not None

    asyncio.run(main())


def test_without_a_client_certificate_the_lock_is_not_taken(tls_server: TlsServer) -> None:
    with (
        hybridlock.LockRegistry(tls_server.url(client_cert=False)) as registry,
        pytest.raises(hybridlock.BackendUnavailableError) as excinfo,
    ):
        registry.obtain("tls:refused").acquire(timeout=2)
    assert excinfo.value.key == "tls:refused"
    assert excinfo.value.server == f"rediss://127.0.0.1:{tls_server.tls_port}/0"


def test_plain_tcp_to_the_tls_port_is_not_a_lock(tls_server: TlsServer) -> None:
    with (
        hybridlock.LockRegistry(f"redis://127.0.0.1:{tls_server.tls_port}/0") as registry,
        pytest.raises(hybridlock.BackendUnavailableError),
    ):
        registry.obtain("tls:plain").acquire(timeout=2)


def test_a_tls_url_to_a_server_without_tls_says_so(server: EmbeddedServer) -> None:
    """Issue 34: a rediss:// URL to a plain server raised after the socket timeout, "Timeout connecting to server",
    with nothing pointing at TLS (a plain server never answers the handshake). Needs no TLS build of the server."""
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_cert_reqs=none&socket_timeout=1&socket_connect_timeout=1"
    start = time.monotonic()
    with (
        hybridlock.LockRegistry(url) as registry,
        pytest.raises(hybridlock.BackendUnavailableError) as excinfo,
    ):
        registry.obtain("tls:plain-server").acquire(timeout=0.2)
    assert time.monotonic() - start < 0.2 + 1.0 + 2.0
    message = str(excinfo.value)
    assert "the TLS handshake failed or got no answer: is the server serving TLS on that port?" in message
    assert "use redis:// for it" in message
    assert excinfo.value.key == "tls:plain-server"
