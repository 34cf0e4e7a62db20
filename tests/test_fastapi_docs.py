"""The FastAPI guide's example runs as written (``docs/fastapi.md``), in a fresh interpreter against a real server
the suite starts, with warnings as errors (as ``tests/test_docs.py`` runs the other pages)."""

from __future__ import annotations

import pytest

from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env, run_program
from tests._extras import skip_reason

from .test_docs import DOCS, python_blocks

pytest.importorskip("fastapi", reason=skip_reason("fastapi", "fastapi"))


@pytest.mark.server
def test_the_fastapi_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(DOCS / "fastapi.md")
    assert len(blocks) == 1
    # Starlette 1.x warns, importing its TestClient, that it wants httpx2 rather than httpx (which the test
    # extra installs): that one warning is not the example's fault.
    env = checkout_env(warnings="error,ignore:Using `httpx`:UserWarning", REDIS_URL=server.url)
    stdout = run_program(blocks[0], env)
    assert "started; lease 10.0 s" in stdout
    assert "payments: [200, 200, 200] one at a time: True" in stdout
    assert "a fencing token each: True" in stdout
    assert "reports: [200, 200, 429]" in stdout
    assert "all 2 permits of 'reports' are taken by other requests; try again later" in stdout
    assert stdout.rstrip().endswith("stopping")
