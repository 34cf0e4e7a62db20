"""The leader election guide's example runs as written (``docs/election.md``), in a fresh interpreter against a
real server the suite starts, with warnings as errors (as ``tests/test_docs.py`` runs the other pages)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hybridlock.testing.server import EmbeddedServer

from .test_docs import DOCS, ROOT, python_blocks


@pytest.mark.server
def test_the_election_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(DOCS / "election.md")
    assert len(blocks) == 1
    env = {
        **os.environ,
        "REDIS_URL": server.url,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONWARNINGS": "error",
    }
    run = subprocess.run([sys.executable, "-c", blocks[0]], env=env, capture_output=True, text=True, timeout=90)
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "leading, epoch" in run.stdout
    assert "handed over: epoch" in run.stdout
