"""docs/django.md: its example runs as written (as ``tests/test_docs.py`` runs the other guides'), and the tests
it cites exist."""

from __future__ import annotations

import re

import pytest

from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env, run_program
from tests._extras import skip_reason
from tests.test_docs import DOCS, ROOT, python_blocks

PAGE = DOCS / "django.md"


@pytest.mark.server
def test_the_django_pages_example_runs(server: EmbeddedServer, redis_client: object) -> None:
    pytest.importorskip("django", reason=skip_reason("django", "django"))
    blocks = python_blocks(PAGE)
    assert len(blocks) == 1
    env = checkout_env(REDIS_URL=server.url)
    stdout = run_program(blocks[0], env)
    assert "holding orders:42 with fencing token" in stdout
    assert stdout.count("sending reports (fencing token ") == 1, stdout
    assert "refused with exit status 75" in stdout, stdout


def test_the_tests_the_page_cites_exist() -> None:
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", PAGE.read_text(encoding="utf-8"))
    assert cited
    for path, name in cited:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, re.MULTILINE), f"{path}::{name} does not exist"
