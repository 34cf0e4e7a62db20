"""The source distribution carries what its users need: the licence, and a test suite that runs after unpacking."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def unpacked_sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sdist")
    # Built from a clean copy: setuptools would otherwise also pack whatever an earlier build listed in the
    # checkout's *.egg-info, and the test would pass without MANIFEST.in.
    source = out / "source"
    shutil.copytree(
        ROOT, source, ignore=shutil.ignore_patterns(".git", "*.egg-info", "__pycache__", "build", "dist", ".*_cache")
    )
    build = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = (
        subprocess.run(
            [sys.executable, "-c", build, str(out)], cwd=source, capture_output=True, text=True, check=True, timeout=120
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    with tarfile.open(out / name) as archive:
        archive.extractall(out, filter="data")
    return out / name.removesuffix(".tar.gz")


def test_the_sdist_carries_the_licence_and_the_test_helpers(unpacked_sdist: Path) -> None:
    for path in ("LICENSE", "CHANGELOG.md", "README.md", "tests/conftest.py", "tests/_workers.py", "tests/__init__.py"):
        assert (unpacked_sdist / path).is_file(), path
    assert "MIT License" in (unpacked_sdist / "LICENSE").read_text()


@pytest.mark.server
def test_the_tests_run_from_the_unpacked_sdist(unpacked_sdist: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(unpacked_sdist)}
    where = subprocess.run(
        [sys.executable, "-c", "import hybridlock; print(hybridlock.__file__)"],
        cwd=unpacked_sdist, env=env, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert where.startswith(str(unpacked_sdist)), where  # the unpacked copy, not this checkout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_smoke.py"],
        cwd=unpacked_sdist, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
