"""The documentation's examples run as written, and the guides do not call a feature that exists missing.

The getting-started guide promises that its Python blocks, run in order, are one working program. This test runs
exactly that program, extracted from the page, in a fresh interpreter against a real server the suite starts
(the program reads the server's URL from ``REDIS_URL``), and runs the page's shell steps too: the server it says
to start, the line that server prints, the program, and closing the server's terminal. The README's examples (one
for threads, one for asyncio, one for the command line) run the same way, each a program of its own; so do the
docs index's and the quorum page's. The migration guide's hybridlock examples run too, each with a client, a URL
and a ``ship`` function given. The site itself is built with ``mkdocs build --strict``,
which fails on broken links and references, by ``.ci/run`` and by tests/test_docs_site.py (which needs the ``docs``
extra, and is skipped without it).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hybridlock.testing.server import EmbeddedServer
from tests._examples import checkout_env, run_program
from tests._extras import INTEGRATIONS, SET_UP_INSTALL

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

# A fenced block at the start of a line: ```python ... ```, with no indentation (the tabbed examples of other
# pages are indented and are not meant to run).
_PYTHON_BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    return _PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))


def test_the_getting_started_page_has_examples() -> None:
    blocks = python_blocks(DOCS / "getting-started.md")
    assert len(blocks) >= 8, "the extraction found too few blocks: has the page's code fence style changed?"
    assert "REDIS_URL" in blocks[0]


@pytest.mark.server
def test_the_getting_started_examples_run_as_one_program(
    server: EmbeddedServer, redis_client: object, tmp_path: Path
) -> None:
    program = tmp_path / "getting_started.py"
    program.write_text("\n\n".join(python_blocks(DOCS / "getting-started.md")), encoding="utf-8")
    # The suite's own strictness: a warning the example draws (a ResourceWarning from an unclosed client, a
    # ClientSettingsWarning) is a fault of the documentation.
    env = checkout_env(REDIS_URL=server.url, PYTHONDEVMODE="1")
    run = subprocess.run(
        [sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "holding orders:42 with fencing token" in run.stdout


_SH_BLOCK = re.compile(r"^```sh[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_INSTALL = re.compile(r"^pip install -e '\.\[([a-z,]+)\]'", re.MULTILINE)
_SERVER = "hybridlock server"


def sh_blocks(page: Path) -> list[str]:
    return _SH_BLOCK.findall(page.read_text(encoding="utf-8"))


def _set_up_block(page: Path) -> str:
    """The page's set-up: the shell block that starts the throw-away server (``hybridlock server``)."""
    blocks = [block for block in sh_blocks(page) if _SERVER in block.splitlines()]
    assert len(blocks) == 1, f"{page.name} should have one shell step that starts a server"
    return str(blocks[0])


def _server_step(page: Path) -> str:
    """The page's set-up as written, but for its install line (the package is installed already, in this
    environment; tests/test_docs.py::test_the_readme_install_line_brings_what_every_test_needs checks that line)."""
    lines = _set_up_block(page).splitlines()
    assert lines[0].startswith("pip install -e '.[test"), f"{page.name} should say how to install, first"
    return "\n".join(lines[1:]) + "\n"


def _after_the_server(page: Path, tmp_path: Path) -> list[str]:
    """What the reader runs, in the terminal where the server's URL is exported, after starting the server: the
    getting-started page's Python blocks as one program; each of the README's Python blocks as a program of its
    own, and its other shell steps (the install and the server's excepted) as written."""
    if page.name == "getting-started.md":
        program = tmp_path / "getting_started.py"
        program.write_text("\n\n".join(python_blocks(page)), encoding="utf-8")
        return [f"python {program}"]
    steps = []
    for number, block in enumerate(python_blocks(page)):
        program = tmp_path / f"example_{number}.py"
        program.write_text(block, encoding="utf-8")
        steps.append(f"python {program}")
    return steps + [
        block
        for block in sh_blocks(page)
        if not block.startswith("pip install") and _SERVER not in block.splitlines() and block != f"{TEST_COMMAND}\n"
    ]


def _readme_test_command() -> str:
    """The one command of the README's Tests section."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").partition("\n## Tests\n")[2].partition("\n## ")[0]
    blocks = _SH_BLOCK.findall(section)
    assert len(blocks) == 1, "the README's Tests section should give one shell block"
    assert blocks[0].count("\n") == 1, "the README's test command should be one line"
    return str(blocks[0].strip())


TEST_COMMAND = _readme_test_command()


def test_ci_runs_the_readme_test_command_as_written() -> None:
    """The command a new user reads is the one CI runs, character for character, against each server."""
    assert TEST_COMMAND.startswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci.count(TEST_COMMAND) == 2, "CI should run the README's test command once per server, as a line of its own"


def _extras_of(line: str) -> set[str]:
    found = _INSTALL.match(line)
    assert found, line
    return set(found[1].split(","))


def test_the_readme_install_line_brings_what_every_test_needs() -> None:
    """Issue 34: the README's set-up installed the test extra only, and the Celery, Django and FastAPI test
    modules were skipped at collection. The install line (not run here: it would reinstall this environment's
    package) brings every integration's extra, CI installs at least as much, and the skip reasons name that line."""
    readme = _set_up_block(ROOT / "README.md").splitlines()[0]
    assert readme.partition("#")[0].strip() == SET_UP_INSTALL
    extras = _extras_of(readme)
    assert {"test", *INTEGRATIONS} <= extras
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    installs = [line.split(" -e ", 1)[1] for line in ci if "pip install" in line and " -e " in line]
    assert len(installs) == 1, installs
    assert extras <= _extras_of(f"pip install -e {installs[0]}")


_HIDE_CELERY = """
import sys


class _Hidden:
    # As if celery were not installed: its import fails as a missing module's does.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "celery":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Hidden())
"""


def test_a_run_without_an_integrations_extra_says_which_tests_it_skips_and_the_line_that_runs_them(
    tmp_path: Path,
) -> None:
    """Issue 34: the Celery, Django and FastAPI modules (88 tests) were skipped silently at collection: one "could
    not import" skip per module, and nothing at the start of the run."""
    (tmp_path / "sitecustomize.py").write_text(_HIDE_CELERY, encoding="utf-8")
    env = checkout_env(warnings=None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_celery.py", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # (5: no test ran, the only module given being skipped; in the whole suite the others run.)
    assert run.returncode == 5, run.stdout[-3000:] + run.stderr[-3000:]
    header = run.stdout.partition("collected")[0]
    assert f"hybridlock: celery not installed: their integration tests are skipped; {SET_UP_INSTALL}" in header
    assert f"celery is not installed (the celery extra): {SET_UP_INSTALL} installs it" in run.stdout
    assert "1 skipped" in run.stdout


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 0.5).close()
    except OSError:
        return True
    return False


def test_the_readme_shows_each_kind_of_example() -> None:
    readme = ROOT / "README.md"
    blocks = python_blocks(readme)
    assert any("threading.Thread" in block for block in blocks)
    assert any("AsyncLockRegistry" in block for block in blocks)
    assert any("hybridlock run" in block for block in sh_blocks(readme))


@pytest.mark.server
@pytest.mark.parametrize("page", [ROOT / "README.md", DOCS / "getting-started.md"], ids=lambda page: page.name)
def test_the_set_up_steps_and_examples_run_as_written_in_a_shell(page: Path, tmp_path: Path) -> None:
    # What a reader does: start the server in one terminal, run the line it prints in another, then the examples;
    # closing the first terminal (SIGHUP to its process group) must stop the server.
    # The suite's own strictness: a warning an example draws is a fault of the documentation.
    env = checkout_env(PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    for name in ("REDIS_URL", "HYBRIDLOCK_SERVER_URL"):
        env.pop(name, None)
    terminal = subprocess.Popen(
        ["bash", "-c", _server_step(page)], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert terminal.stdout is not None
        export = terminal.stdout.readline().strip()
        assert re.fullmatch(r"export REDIS_URL=(redis://127\.0\.0\.1:\d+/0) HYBRIDLOCK_SERVER_URL=\1", export), export
        port = int(export.rsplit(":", 1)[1].split("/")[0])
        for step in _after_the_server(page, tmp_path):
            run = subprocess.run(
                ["bash", "-e", "-c", f"{export}\n{step}"],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90,
            )  # fmt: skip
            assert run.returncode == 0, f"{step}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
            if page.name == "getting-started.md":
                assert "holding orders:42 with fencing token" in run.stdout
        os.killpg(terminal.pid, signal.SIGHUP)  # the terminal closes
        terminal.wait(timeout=15)
        deadline = time.monotonic() + 10
        while not _refuses(port):
            assert time.monotonic() < deadline, "the server outlived its terminal"
            time.sleep(0.05)
    finally:
        if terminal.poll() is None:
            os.killpg(terminal.pid, signal.SIGKILL)
            terminal.wait(timeout=10)
        assert terminal.stdout is not None
        terminal.stdout.close()


@pytest.mark.server
def test_the_docs_index_example_runs(server: EmbeddedServer) -> None:
    blocks = python_blocks(DOCS / "index.md")
    assert len(blocks) == 1
    run_program(blocks[0], checkout_env(REDIS_URL=server.url))


@pytest.mark.server
def test_the_quorum_pages_example_runs(quorum_urls: list[str]) -> None:
    blocks = python_blocks(DOCS / "quorum.md")
    assert len(blocks) == 1
    env = checkout_env(QUORUM_URLS=" ".join(quorum_urls))
    stdout = run_program(blocks[0], env)
    assert "holding orders:42 with fencing token" in stdout


@pytest.mark.server
def test_the_lost_work_pages_examples_run_as_one_program(server: EmbeddedServer, redis_client: object) -> None:
    blocks = python_blocks(DOCS / "lost-work.md")
    assert len(blocks) == 2
    env = checkout_env(REDIS_URL=server.url, PYTHONDEVMODE="1")
    program = "\n\n".join(blocks)
    stdout = run_program(program, env)
    assert "the lease of reports:nightly was lost" in stdout
    assert "cancelled: the lease of reports:async was lost" in stdout


@pytest.mark.server
def test_the_semaphore_pages_example_runs(server: EmbeddedServer) -> None:
    blocks = python_blocks(DOCS / "semaphore.md")
    assert len(blocks) == 1
    env = checkout_env(REDIS_URL=server.url)
    stdout = run_program(blocks[0], env)
    assert "holding a permit of rate-limited-api, token" in stdout
    assert "free now: True" in stdout


# A tab of the migration guide: `=== "hybridlock"`, then its indented ```python block.
_HYBRIDLOCK_TAB = re.compile(r'^=== "hybridlock"\n\n    ```python\n(.*?)^    ```', re.MULTILINE | re.DOTALL)

# What the migration examples take as given: a client, a URL, and the work to do under the lock.
_MIGRATION_PRELUDE = """
import hybridlock
import redis

url = os.environ["REDIS_URL"]
client = redis.Redis.from_url(url)
shipped = []


def ship(order_id):
    shipped.append(order_id)
"""


def test_the_migration_guide_has_a_hybridlock_example_per_library() -> None:
    assert len(_HYBRIDLOCK_TAB.findall((DOCS / "migrating.md").read_text(encoding="utf-8"))) == 4


@pytest.mark.server
def test_the_migration_guides_hybridlock_examples_run(server: EmbeddedServer, redis_client: object) -> None:
    tabs = _HYBRIDLOCK_TAB.findall((DOCS / "migrating.md").read_text(encoding="utf-8"))
    program = "import os\n" + _MIGRATION_PRELUDE
    for number, tab in enumerate(tabs):
        # Each example runs in a namespace of its own, as the separate programs they stand for.
        program += (
            f"\nbefore = len(shipped)\n"
            f"exec(compile({textwrap.dedent(tab)!r}, 'migrating example {number}', 'exec'), dict(globals()))\n"
            f"assert len(shipped) > before, 'example {number} shipped nothing'\n"
        )
    run_program(program, checkout_env(warnings=None, REDIS_URL=server.url))


# Claims that a feature is missing: the future-tense ones ("not supported yet", "stay with X for now") and the plain
# ones ("not supported", "does not support").
_NOT_YET = re.compile(
    r"not (?:yet )?(?:supported|implemented|available|possible) yet"
    r"|not yet (?:supported|implemented|available|possible)"
    r"|coming soon|in a (?:future|later) (?:release|version)|\bstay with\b|\bplanned\b|\bfor now\b",
    re.IGNORECASE,
)
_NOT_SUPPORTED = re.compile(r"not supported|unsupported|does not support|no support for|cannot be used", re.IGNORECASE)

# The features a guide may talk about without naming the class that gives them, each with the public name that
# gives it: a claim that one of them does not exist yet is wrong while that name does.
_FEATURES = {
    r"\bquorum|\bredlock|multi-master|several (?:independent )?(?:servers|masters)": "hybridlock:QuorumLockRegistry",
    r"\bsentinel": "hybridlock.testing:SentinelService",
    r"\bcluster\b": "hybridlock.backends:RedisClusterBackend",
    r"\basyncio\b|\basync\b": "hybridlock:AsyncLockRegistry",
    r"read-write|readers and writers|\brwlock": "hybridlock:ReadWriteLock",
    r"multi-key|several keys|obtain_many": "hybridlock:MultiLock",
    r"\bsemaphore": "hybridlock:Semaphore",
    r"\bfencing": "hybridlock.fencing:fenced_set",
    r"\bprometheus": "hybridlock.metrics.prometheus:PrometheusObserver",
    r"\bopentelemetry": "hybridlock.metrics.opentelemetry:OpenTelemetryObserver",
    r"\bobserver|\bmetrics": "hybridlock.metrics:LockObserver",
    r"\bcommand line|\bCLI\b": "hybridlock.__main__:main",
}


def _public_names() -> set[str]:
    import hybridlock
    import hybridlock.backends
    import hybridlock.fencing
    import hybridlock.metrics
    import hybridlock.testing

    modules = (hybridlock, hybridlock.backends, hybridlock.fencing, hybridlock.metrics, hybridlock.testing)
    return {name for module in modules for name in module.__all__ if not name.startswith("_")}


def _claims(text: str) -> list[str]:
    """The units a claim is made in: each table row, and each sentence of the prose (code blocks left out)."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.MULTILINE | re.DOTALL)
    units = []
    for paragraph in re.split(r"\n\s*\n", text):
        rows = [line for line in paragraph.splitlines() if line.lstrip().startswith("|")]
        units += rows
        prose = " ".join(line.strip() for line in paragraph.splitlines() if not line.lstrip().startswith("|"))
        units += re.split(r"(?<=[.!?])\s+(?=[A-Z`*])", prose)
    return [unit for unit in units if unit.strip()]


def _guides() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_every_feature_the_docs_consistency_check_knows_exists() -> None:
    import importlib

    for provider in _FEATURES.values():
        module, name = provider.split(":")
        assert hasattr(importlib.import_module(module), name), f"{provider} is gone: update _FEATURES"


def test_the_guides_do_not_say_a_feature_that_exists_is_missing() -> None:
    names = _public_names()
    wrong = []
    for page in _guides():
        for unit in _claims(page.read_text(encoding="utf-8")):
            if _NOT_YET.search(unit):
                # "Not yet" about anything the library has is stale, whatever words it uses for it.
                wrong += [
                    f"{page.relative_to(ROOT)}: says {provider.split(':')[1]}'s feature is missing: {unit.strip()}"
                    for feature, provider in _FEATURES.items()
                    if re.search(feature, unit, re.IGNORECASE)
                ]
            if _NOT_YET.search(unit) or _NOT_SUPPORTED.search(unit):
                named = set(re.findall(r"`(?:hybridlock\.)?([A-Za-z_]\w*)", unit)) & names
                wrong += [f"{page.relative_to(ROOT)}: calls {name} missing: {unit.strip()}" for name in sorted(named)]
    assert not wrong, "\n".join(wrong)
