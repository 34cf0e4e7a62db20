"""The FastAPI guide's example runs as written (``docs/fastapi.md``), in a fresh interpreter against a real server
the suite starts, with warnings as errors (as ``tests/test_docs.py`` runs the other pages)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybridlock.testing.server import EmbeddedServer

from .test_docs import DOCS, ROOT, python_blocks

pytest.importorskip("fastapi")


@pytest.mark.server
def test_the_fastapi_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(DOCS / "fastapi.md")
    assert len(blocks) == 1
    env = {
        **os.environ,
        "REDIS_URL": server.url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # Starlette 1.x warns, importing its TestClient, that it wants httpx2 rather than httpx (which the test
        # extra installs): that one warning is not the example's fault.
        "PYTHONWARNINGS": "error,ignore:Using `httpx`:UserWarning",
    }
    run = subprocess.run([sys.executable, "-c", blocks[0]], env=env, capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "started; lease 10.0 s" in run.stdout
    assert "payments: [200, 200, 200] one at a time: True" in run.stdout
    assert "a fencing token each: True" in run.stdout
    assert "reports: [200, 200, 429]" in run.stdout
    assert "all 2 permits of 'reports' are taken by other requests; try again later" in run.stdout
    assert run.stdout.rstrip().endswith("stopping")
