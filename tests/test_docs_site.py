"""The documentation site builds as the README and the docs index say (``mkdocs build``, no environment variable
to set), strictly, and neither the build nor the built site shows the theme's end-of-life notice (issue 34: it was
printed on every build and serve unless ``NO_MKDOCS_2_WARNING`` was set). Needs the ``docs`` extra; skipped, saying
so, without it (CI installs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parent.parent
_NOTICE = ("end of life", "Zensical", "NO_MKDOCS_2_WARNING", "MkDocs 2.0")


@pytest.mark.slow(reason="builds the whole site, the API reference from the docstrings too: about 6 s of CPU")
@pytest.mark.timeout(120)
def test_the_site_builds_strictly_without_the_themes_end_of_life_notice(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.endswith("MKDOCS_2_WARNING")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    output = build.stdout + build.stderr
    assert not [notice for notice in _NOTICE if notice in output], output[:2000]
    pages = list(site.rglob("*.html"))
    assert len(pages) > 20
    shown = [(page.name, notice) for page in pages for notice in _NOTICE if notice in page.read_text(encoding="utf-8")]
    assert not shown
