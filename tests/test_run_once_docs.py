"""docs/run-once.md: its example runs as written (as ``tests/test_docs.py`` runs the other guides'), and its table
cites tests that exist."""

from __future__ import annotations

import re

import pytest

from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env, run_program
from tests.test_docs import DOCS, ROOT, python_blocks

PAGE = DOCS / "run-once.md"


@pytest.mark.server
def test_the_run_once_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(PAGE)
    assert len(blocks) == 1
    env = checkout_env(REDIS_URL=server.url)
    stdout = run_program(blocks[0], env)
    assert stdout.count("sending the report for 2026-11-26") == 1, stdout
    assert "RunOnceResult(ran=True, result='sent') RunOnceResult(ran=False, result=None)" in stdout


def test_the_failure_table_cites_tests_that_exist() -> None:
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", PAGE.read_text(encoding="utf-8"))
    assert len(cited) >= 10
    for path, name in cited:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {name}\(", source, re.MULTILINE), f"{path}::{name} does not exist"
