"""The leader election guide's example runs as written (``docs/election.md``), in a fresh interpreter against a
real server the suite starts, with warnings as errors (as ``tests/test_docs.py`` runs the other pages)."""

from __future__ import annotations

import pytest

from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env, run_program

from .test_docs import DOCS, python_blocks


@pytest.mark.server
def test_the_election_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(DOCS / "election.md")
    assert len(blocks) == 1
    env = checkout_env(REDIS_URL=server.url)
    stdout = run_program(blocks[0], env)
    assert "leading, epoch" in stdout
    assert "handed over: epoch" in stdout
