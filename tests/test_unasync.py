"""scripts/unasync.py: the rename table on small samples, and --check on a throw-away tree."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "unasync.py"


@pytest.fixture(scope="module")
def unasync() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("_unasync_under_test", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class body runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


# -- the pure rewrite --------------------------------------------------------------------------------------------------


def test_coroutines_and_protocols_become_plain(unasync: ModuleType) -> None:
    source = (
        "class AsyncHybridLock:\n"
        "    async def __aenter__(self) -> AsyncHybridLock:\n"
        "        await self._mutex.acquire()\n"
        "        async with self._guard:\n"
        "            await sleep(0)\n"
        "        return self\n"
        "\n"
        "    async def __aexit__(self, *exc: object) -> None:\n"
        "        await self.aclose()\n"
    )
    text, used = unasync.unasync_text(source)
    assert text == (
        "class HybridLock:\n"
        "    def __enter__(self) -> HybridLock:\n"
        "        self._mutex.acquire()\n"
        "        with self._guard:\n"
        "            sleep(0)\n"
        "        return self\n"
        "\n"
        "    def __exit__(self, *exc: object) -> None:\n"
        "        self.close()\n"
    )
    names = {unasync.RULES[i][0] for i in used}
    assert names == {"async def", "__aenter__", "__aexit__", "await ", "async with", "aclose",
                     "AsyncHybridLock"}  # fmt: skip


def test_imports_and_paired_names(unasync: ModuleType) -> None:
    source = (
        "import redis.asyncio as redis\n"
        "from hybridlock._async._compat import AsyncFifoMutex, AsyncWorker, current_owner\n"
        "from ._async.registry import AsyncLocalLockRegistry, AsyncLockRegistry\n"
    )
    text, _ = unasync.unasync_text(source)
    assert text == (
        "import redis as redis\n"
        "from hybridlock._sync._compat import FifoMutex, Worker, current_owner\n"
        "from ._sync.registry import LocalLockRegistry, LockRegistry\n"
    )


def test_only_whole_words_are_renamed(unasync: ModuleType) -> None:
    # Longer names that merely contain a token stay as they are.
    source = "MyAsyncWorker(); _async_helper(); self.aclosed; AsyncFifoMutexes; awaiting; asyncio.run(x)\n"
    text, used = unasync.unasync_text(source)
    assert text == source
    assert used == frozenset()


def test_custom_table_and_usage_report(unasync: ModuleType) -> None:
    rules = (("await ", ""), ("AsyncThing", "Thing"), ("never", "seen"))
    text, used = unasync.unasync_text("x = await AsyncThing()\n", rules)
    assert text == "x = Thing()\n"
    assert used == frozenset({0, 1})


def test_generated_file_names_its_source(unasync: ModuleType) -> None:
    expected = unasync.expected_outputs({"hybridlock/_async/lock.py": "async def f() -> None: ...\n"})
    text = expected.files["hybridlock/_sync/lock.py"]
    first, rest = text.split("\n", 1)
    assert first.startswith("# GENERATED")
    assert "from hybridlock/_async/lock.py" in first
    assert "do not edit" in first
    assert rest == "def f() -> None: ...\n"


def test_shims_and_root_init_are_never_generated(unasync: ModuleType) -> None:
    expected = unasync.expected_outputs(
        {
            "hybridlock/_async/__init__.py": '"""asyncio side"""\n',
            "hybridlock/_async/_compat.py": "async def sleep() -> None: ...\n",
            "hybridlock/_async/backends/__init__.py": "from ._async import x\n",
            "tests/_async/_compat.py": "",
        }
    )
    assert set(expected.files) == {"hybridlock/_sync/backends/__init__.py"}
    assert expected.shim_partners == {"hybridlock/_sync/_compat.py", "tests/_sync/_compat.py"}


# -- --check on a temporary tree ---------------------------------------------------------------------------------------

RULES = (("async def", "def"), ("await ", ""), ("AsyncThing", "Thing"))
SOURCE = "async def go(thing: AsyncThing) -> None:\n    await thing.run()\n"


def _write(root: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


@pytest.fixture
def tree(unasync: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A repository with one async source, one shim per side and a small rule table, freshly generated."""
    monkeypatch.setattr(unasync, "RULES", RULES)
    _write(
        tmp_path,
        {
            "hybridlock/_async/__init__.py": '"""async"""\n',
            "hybridlock/_async/_compat.py": "# async shim\n",
            "hybridlock/_async/work.py": SOURCE,
            "hybridlock/_sync/__init__.py": '"""sync"""\n',
            "hybridlock/_sync/_compat.py": "# sync shim\n",
        },
    )
    assert unasync.main(["--root", str(tmp_path)]) == 0
    return tmp_path


def _check(unasync: ModuleType, root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = unasync.main(["--check", "--root", str(root)])
    out, err = capsys.readouterr()
    return code, out + err


def test_check_passes_on_a_fresh_tree(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generated = (tree / "hybridlock/_sync/work.py").read_text()
    assert generated.endswith("def go(thing: Thing) -> None:\n    thing.run()\n")
    assert (tree / "hybridlock/_sync/_compat.py").read_text() == "# sync shim\n"  # hand-written: left alone
    code, output = _check(unasync, tree, capsys)
    assert code == 0, output


def test_check_fails_on_a_stale_file(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "hybridlock/_async/work.py").write_text(SOURCE + "    await thing.stop()\n")
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "stale: hybridlock/_sync/work.py" in output
    assert "+    thing.stop()" in output  # a readable diff, not just a verdict
    assert unasync.main(["--root", str(tree)]) == 0
    assert _check(unasync, tree, capsys)[0] == 0


def test_check_fails_on_a_hand_edited_file(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tree / "hybridlock/_sync/work.py"
    target.write_text(target.read_text().replace("thing.run()", "thing.run(fast=True)"))
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "-    thing.run(fast=True)" in output


def test_check_fails_on_a_missing_file(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tree / "hybridlock/_sync/work.py").unlink()
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "missing: hybridlock/_sync/work.py" in output


def test_check_fails_on_an_orphan(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The source was renamed; the file generated from its old name stays behind.
    (tree / "hybridlock/_async/work.py").rename(tree / "hybridlock/_async/job.py")
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "orphan: hybridlock/_sync/work.py" in output
    assert "missing: hybridlock/_sync/job.py" in output
    # Writing removes the orphan it generated, but never a file it did not write.
    (tree / "hybridlock/_sync/mine.py").write_text("x = 1\n")
    assert unasync.main(["--root", str(tree)]) == 1
    assert not (tree / "hybridlock/_sync/work.py").exists()
    assert (tree / "hybridlock/_sync/mine.py").exists()
    (tree / "hybridlock/_sync/mine.py").unlink()
    assert _check(unasync, tree, capsys)[0] == 0


def test_check_fails_on_an_unused_rule(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No source says AsyncThing any more: the rule is dead.
    (tree / "hybridlock/_async/work.py").write_text("async def go() -> None:\n    await run()\n")
    assert unasync.main(["--root", str(tree)]) == 1  # writes the file, still fails on the rule
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "unused rule: 'AsyncThing' -> 'Thing'" in output
    assert "stale" not in output


def test_check_fails_on_a_shim_with_no_partner(
    unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tree / "hybridlock/_sync/_compat.py").unlink()
    code, output = _check(unasync, tree, capsys)
    assert code == 1
    assert "missing shim: hybridlock/_sync/_compat.py" in output


def test_test_trees_are_generated_too(unasync: ModuleType, tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tree, {"tests/_async/test_work.py": "async def test_go() -> None:\n    await go(AsyncThing())\n"})
    assert _check(unasync, tree, capsys)[0] == 1
    assert unasync.main(["--root", str(tree)]) == 0
    assert (tree / "tests/_sync/test_work.py").read_text().endswith("def test_go() -> None:\n    go(Thing())\n")
    assert _check(unasync, tree, capsys)[0] == 0


def test_a_renamed_import_line_stays_sorted_and_names_each_name_once(unasync: ModuleType) -> None:
    source = "from collections.abc import AsyncIterator, Callable, Iterator, Sequence\nx = AsyncIterator\n"
    text, _ = unasync.unasync_text(source)
    assert text == "from collections.abc import Callable, Iterator, Sequence\nx = Iterator\n"
    # A line no rule touched is left exactly as written.
    untouched = "from typing import b, A\n"
    assert unasync.unasync_text(untouched)[0] == untouched


def test_the_repository_is_up_to_date(unasync: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    # CI runs the suite: a stale generated file, an orphan or a dead rule in this repository fails it here.
    assert unasync.main(["--check"]) == 0, capsys.readouterr().err
