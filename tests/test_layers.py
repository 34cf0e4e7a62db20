"""The package's import layers, enforced (see ``../shared/DESIGN.md`` and the layout in docs/development.md).

Each module imports only modules of its own layer or the layers below it; the pure layers (``_core``,
``_protocol``) import no threads, event loop, clock, socket or client library; no module imports the registry (the
registry hands every lock what it needs); and imports form no cycle, those under ``if TYPE_CHECKING:`` included
(a module that needs a type from above it is given a narrow protocol below it instead). Imports under
``if TYPE_CHECKING:`` are annotations only: they may otherwise point anywhere except up into the registry.
"""

from __future__ import annotations

import ast
import sys
import threading
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "hybridlock"

#: Bottom to top: (layer, module-name prefixes). A module belongs to the first layer with a matching prefix.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("hybridlock.errors",)),
    ("core", ("hybridlock._core",)),
    ("protocol", ("hybridlock._protocol",)),
    # The paired shims import nothing of hybridlock: the backends and the locks both build on them.
    ("shims", ("hybridlock._async._compat", "hybridlock._sync._compat")),
    ("backends", ("hybridlock.backends", "hybridlock._async.backends", "hybridlock._sync.backends")),
    ("fencing", ("hybridlock.fencing",)),
    # The observer protocol's public face and its exporters (third-party metrics libraries, imported on demand).
    ("metrics", ("hybridlock.metrics",)),
    ("locks", ("hybridlock._async", "hybridlock._sync")),
    ("registry", ("hybridlock._sync.registry", "hybridlock._async.registry")),
    ("faces", ("hybridlock.__init__", "hybridlock.testing", "hybridlock.templates")),
    ("cli", ("hybridlock._cli", "hybridlock.__main__")),
    # The framework integrations (hybridlock.contrib.*): leaves over the public API, each behind its extra.
    ("integrations", ("hybridlock.contrib",)),
]

PURE_LAYERS = {"errors", "core", "protocol"}
#: What a pure module may not import: anything that waits, reads a clock, does I/O or talks to a server.
IMPURE = {
    "threading",
    "asyncio",
    "time",
    "socket",
    "subprocess",
    "select",
    "redis",
    "valkey",
    "anyio",
    "trio",
    "os",
    "logging",
}

#: Modules below the registry allowed to import it: none (locks are handed a LockContext instead).
REGISTRY_IMPORTERS_ALLOWED: set[str] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts)


def _layer(module: str) -> int:
    # The most specific prefix wins (``hybridlock._sync.registry`` over ``hybridlock._sync``).
    best: tuple[int, int] | None = None
    for index, (_name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    if best is not None:
        return best[0]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in tests/test_layers.py")


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, only for type checking) for every import in the file, relative ones resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = typing_only or _is_type_checking_block(child)
            if isinstance(child, ast.Import):
                found.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                found.append((target, inner))
                # ``from . import x`` and ``from .pkg import mod`` may name submodules.
                for alias in child.names:
                    candidate = f"{target}.{alias.name}"
                    if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists():
                        found.append((candidate, inner))
            visit(child, inner)

    visit(tree, False)
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def _internal(target: str) -> str | None:
    """The hybridlock module ``target`` names (a package resolves to its ``__init__``), or None."""
    if target != "hybridlock" and not target.startswith("hybridlock."):
        return None
    path = PACKAGE.parent / Path(*target.split("."))
    if path.is_dir():
        return f"{target}.__init__"
    return target


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_imports_point_down(path: Path) -> None:
    module = _module_name(path)
    layer = _layer(module)
    for target, typing_only in _imports(path):
        internal = _internal(target)
        if internal is None:
            if LAYERS[layer][0] in PURE_LAYERS:
                assert target.split(".")[0] not in IMPURE, f"{module} is pure but imports {target}"
            continue
        if _layer(internal) == _layer("hybridlock._sync.registry"):
            registry_layer = _layer("hybridlock._sync.registry")
            assert layer >= registry_layer or module in REGISTRY_IMPORTERS_ALLOWED, f"{module} imports the registry"
            continue
        if typing_only:
            continue  # annotations may name any layer but the registry's
        if LAYERS[layer][0] == "integrations":  # leaves over the public API: no private module (``_sync``, ...)
            private = [part for part in internal.split(".") if part.startswith("_") and part != "__init__"]
            assert not private, f"{module} imports {target}, which is not public API"
        assert _layer(internal) <= layer, f"{module} ({LAYERS[layer][0]}) imports {target} from a layer above it"


@pytest.mark.parametrize("with_typing", [False, True], ids=["runtime", "with-type-checking"])
def test_imports_form_no_cycle(with_typing: bool) -> None:
    """No cycle among the package's imports: not at run time, and not counting the imports made only for type
    checking either (a circle of annotations is still a circle of knowledge: neither module can be read alone)."""
    graph: dict[str, set[str]] = {}
    for path in MODULES:
        module = _module_name(path)
        graph[module] = set()
        for target, typing_only in _imports(path):
            internal = _internal(target)
            if internal is not None and (with_typing or not typing_only) and internal != module:
                graph[module].add(internal)
    # A package's __init__ imported from inside the package is the parent's job, not a cycle through it.
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not (t.endswith(".__init__") and module.startswith(t[:-9] + "."))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_pure_bound_on_durations_is_threadings() -> None:
    from hybridlock._core.config import MAX_SECONDS

    assert threading.TIMEOUT_MAX == MAX_SECONDS, sys.platform
