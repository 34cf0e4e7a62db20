#!/usr/bin/env python3
"""Generate the synchronous code from the asyncio code: ``hybridlock/_async/`` -> ``hybridlock/_sync/`` and
``tests/_async/`` -> ``tests/_sync/``.

    python scripts/unasync.py           # (re)write every generated file, delete generated files with no source
    python scripts/unasync.py --check   # change nothing; exit 1 and say why if anything is out of date

Every ``.py`` file under an async tree is rewritten by one table of renames (``RULES``) into the same relative path
under the sync tree, with a header line naming its source. Two kinds of file are hand-written on each side and never
generated: every ``_compat.py`` (the paired shims: ``AsyncFifoMutex``/``FifoMutex`` and friends) and the tree's own
root ``__init__.py`` (its docstring describes that side).

``--check`` fails when a generated file is stale or missing, when the sync tree holds a file that is neither
hand-written nor generated from an existing source (an orphan: its source was renamed or deleted), when a shim
exists on one side only, or when a rule was not used by any source (the table must not carry dead rules: each one
is a promise about what the async code says).

The core is pure (text in, text out: ``unasync_text``, ``expected_outputs``, ``find_problems``); ``main`` only reads
and writes files.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# (async tree, sync tree), relative to the repository root.
TREES: tuple[tuple[str, str], ...] = (
    ("hybridlock/_async", "hybridlock/_sync"),
    ("tests/_async", "tests/_sync"),
)

SHIM_NAME = "_compat.py"

# One row per rename: (async token, sync token). Each is matched as whole words (a `\b` is added at each end that
# starts or ends with a word character), across the whole file: code, comments and docstrings alike, so prose that
# names an async thing is renamed with it. Keep it short; a name needed on both sides with the same meaning should
# simply be spelled the same (`sleep`, `monotonic`, `current_owner`, `shielded` in the shims).
RULES: tuple[tuple[str, str], ...] = (
    # The language: coroutines, awaiting and the async protocols.
    ("async def", "def"),
    ("async with", "with"),
    ("async for", "for"),
    ("await ", ""),
    ("__aenter__", "__enter__"),
    ("__aexit__", "__exit__"),
    ("__aiter__", "__iter__"),
    ("__anext__", "__next__"),
    ("aclose", "close"),
    ("asynccontextmanager", "contextmanager"),
    ("AsyncIterator", "Iterator"),
    ("AsyncGenerator", "Generator"),
    # Where things live.
    ("_async", "_sync"),
    ("redis.asyncio", "redis"),
    # hybridlock's paired names: the shims (hand-written on each side) and the public classes.
    ("AsyncFifoMutex", "FifoMutex"),
    ("AsyncWorker", "Worker"),
    ("AsyncEvent", "Event"),
    ("AsyncCondition", "Condition"),
    ("AsyncLockRegistry", "LockRegistry"),
    ("AsyncLocalLockRegistry", "LocalLockRegistry"),
    ("AsyncHybridLock", "HybridLock"),
)

# Short enough that a source path of up to 48 characters keeps the line within the linter's 120.
HEADER_TEMPLATE = "# GENERATED from {source} by scripts/unasync.py: do not edit, edit the source and rerun.\n"


def _compile(rules: Sequence[tuple[str, str]]) -> list[tuple[re.Pattern[str], str]]:
    compiled = []
    for old, new in rules:
        pattern = re.escape(old)
        if re.match(r"\w", old):
            pattern = r"\b" + pattern
        if re.search(r"\w$", old):
            pattern += r"\b"
        compiled.append((re.compile(pattern), new.replace("\\", "\\\\")))
    return compiled


def unasync_text(text: str, rules: Sequence[tuple[str, str]] = RULES) -> tuple[str, frozenset[int]]:
    """Apply every rule, in table order; return the new text and the indexes of the rules that changed something."""
    used = set()
    for index, (pattern, replacement) in enumerate(_compile(rules)):
        text, count = pattern.subn(replacement, text)
        if count:
            used.add(index)
    return text, frozenset(used)


def header(source: str) -> str:
    """The first line of a file generated from ``source`` (a path relative to the repository root)."""
    return HEADER_TEMPLATE.format(source=source)


def is_hand_written(path_in_tree: str) -> bool:
    """True for the files each side writes for itself (``path_in_tree`` is relative to the tree's root)."""
    return path_in_tree == "__init__.py" or path_in_tree.rsplit("/", 1)[-1] == SHIM_NAME


@dataclass
class Expected:
    """What the sync trees should hold, computed from the async sources."""

    files: dict[str, str] = field(default_factory=dict)  # generated path -> its full text
    used_rules: set[int] = field(default_factory=set)
    # Hand-written shims found on the async side, as the sync path where their partner must exist.
    shim_partners: set[str] = field(default_factory=set)


def expected_outputs(
    sources: Mapping[str, str],
    trees: Sequence[tuple[str, str]] = TREES,
    rules: Sequence[tuple[str, str]] = RULES,
) -> Expected:
    """Map async sources (path relative to the root -> text) to the sync files they generate."""
    expected = Expected()
    for path, text in sorted(sources.items()):
        for async_root, sync_root in trees:
            if not path.startswith(async_root + "/"):
                continue
            in_tree = path[len(async_root) + 1 :]
            target = f"{sync_root}/{in_tree}"
            if is_hand_written(in_tree):
                if in_tree != "__init__.py":
                    expected.shim_partners.add(target)
                break
            body, used = unasync_text(text, rules)
            expected.files[target] = header(path) + body
            expected.used_rules |= used
            break
    return expected


def _diff_summary(path: str, want: str, have: str, max_lines: int) -> list[str]:
    lines = list(
        difflib.unified_diff(
            have.splitlines(), want.splitlines(), f"{path} (on disk)", f"{path} (generated)", n=1, lineterm=""
        )
    )
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... and {len(lines) - max_lines} more diff lines"]
    return ["    " + line for line in lines]


def orphans(expected: Expected, sync_files: Iterable[str], trees: Sequence[tuple[str, str]] = TREES) -> list[str]:
    """Files in a sync tree that are neither hand-written nor generated from an existing source."""
    found = []
    for path in sorted(sync_files):
        if path in expected.files:
            continue
        for _, sync_root in trees:
            if path.startswith(sync_root + "/"):
                if not is_hand_written(path[len(sync_root) + 1 :]):
                    found.append(path)
                break
    return found


def find_problems(
    expected: Expected,
    sync_files: Mapping[str, str],
    trees: Sequence[tuple[str, str]] = TREES,
    rules: Sequence[tuple[str, str]] = RULES,
    max_diff_lines: int = 20,
) -> list[str]:
    """Everything ``--check`` complains about, as readable lines (empty: all up to date).

    ``sync_files`` holds every ``.py`` file now under the sync trees (path relative to the root -> text)."""
    problems: list[str] = []
    for path, want in sorted(expected.files.items()):
        have = sync_files.get(path)
        if have is None:
            problems.append(f"missing: {path} (run scripts/unasync.py)")
        elif have != want:
            problems.append(f"stale: {path} differs from what its source generates (run scripts/unasync.py):")
            problems.extend(_diff_summary(path, want, have, max_diff_lines))
    for path in orphans(expected, sync_files, trees):
        problems.append(f"orphan: {path} has no source in the async tree (delete it, or run the script)")
    for path in sorted(expected.shim_partners - set(sync_files)):
        problems.append(f"missing shim: {path} (each side hand-writes its own {SHIM_NAME})")
    for index, (old, new) in enumerate(rules):
        if index not in expected.used_rules:
            problems.append(f"unused rule: {old!r} -> {new!r} matches no source (remove it from RULES)")
    return problems


def _read_tree(root: Path, tree: str) -> dict[str, str]:
    base = root / tree
    if not base.is_dir():
        return {}
    return {path.relative_to(root).as_posix(): path.read_text(encoding="utf-8") for path in sorted(base.rglob("*.py"))}


def _read_all(root: Path, trees: Iterable[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    sources: dict[str, str] = {}
    sync_files: dict[str, str] = {}
    for async_root, sync_root in trees:
        sources.update(_read_tree(root, async_root))
        sync_files.update(_read_tree(root, sync_root))
    return sources, sync_files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of date")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the repository root")
    args = parser.parse_args(argv)
    root: Path = args.root
    sources, sync_files = _read_all(root, TREES)
    # The table is read here, at call time, so that a test can run main() with a table of its own.
    expected = expected_outputs(sources, TREES, RULES)
    problems = find_problems(expected, sync_files, TREES, RULES)
    if args.check:
        if problems:
            print("scripts/unasync.py --check: the generated sync code is out of date", file=sys.stderr)
            if not expected.files:
                print("(no async sources yet: every rule stays unused until the first one lands)", file=sys.stderr)
            for line in problems:
                print(line, file=sys.stderr)
            return 1
        print(f"scripts/unasync.py --check: {len(expected.files)} generated files up to date")
        return 0
    written = 0
    for path, text in expected.files.items():
        if sync_files.get(path) != text:
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8", newline="")
            written += 1
    removed = 0
    remaining: list[str] = []
    for path in orphans(expected, sync_files):
        # Only a file this script wrote is deleted; anything else in the sync tree is reported, never lost.
        if sync_files[path].startswith(HEADER_TEMPLATE.split("{", 1)[0]):
            (root / path).unlink()
            removed += 1
        else:
            remaining.append(f"orphan: {path} was not generated and has no source (move or delete it)")
    # What writing cannot fix still fails the run.
    remaining += [line for line in problems if line.startswith(("unused rule", "missing shim"))]
    print(f"scripts/unasync.py: {written} written, {removed} orphans removed, {len(expected.files)} generated in all")
    for line in remaining:
        print(line, file=sys.stderr)
    return 1 if remaining else 0


if __name__ == "__main__":
    sys.exit(main())
