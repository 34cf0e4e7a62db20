"""Every message names the API of its own side: the asyncio code speaks of tasks, ``AsyncLockRegistry`` and
``async with``, the thread code of threads, ``LockRegistry`` and ``with``.

The thread code is generated from the asyncio code by renames (``scripts/unasync.py``), so a message written
in the asyncio source that names the other side's API comes out wrong on one side or the other. The first test
reads every message both packages can produce (the text of every raised or constructed error and warning, every
log line, every repr and every module constant of text) and fails on one that names the other side; the others
check the main paths by behaviour, on both sides.
"""

from __future__ import annotations

import ast
import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import hybridlock

ROOT = Path(__file__).resolve().parent.parent / "hybridlock"

# What a message of each side must not say, as (pattern, what it means). Whole words: "AsyncLockRegistry" does not
# match "LockRegistry".
_SYNC_NAMES = (
    "HybridLock|JavaStyleLock|ReadWriteLock|ReadLock|WriteLock|MultiLock|LockRegistry|LocalLockRegistry|"
    "QuorumLockRegistry|LockBackend|MemoryBackend|RedisBackend|RedisClusterBackend|QuorumBackend"
)
WRONG_ON_THE_ASYNC_SIDE = [
    (r"\bthreads?\b", "a thread (the asyncio API's owners are tasks)"),
    (rf"(?<![\w.])({_SYNC_NAMES})\b", "a class of the thread API"),
    (r"\bis_held_by_current_thread\b", "the thread API's is_held_by_current_thread"),
    (r"(?<!async )\bwith [\w.()\[\]]+:", "a `with` statement (the asyncio API needs `async with`)"),
    (r"\bredis\.Redis\b", "the blocking client"),
]
WRONG_ON_THE_SYNC_SIDE = [
    (r"\btasks?\b", "a task (the thread API's owners are threads)"),
    (r"\bAsync[A-Z]\w*", "a class of the asyncio API"),
    (r"\bis_held_by_current_task\b", "the asyncio API's is_held_by_current_task"),
    (r"\basync with\b|\bawait\b|\basync def\b", "asyncio syntax"),
    (r"\bredis\.asyncio\b", "the asyncio client"),
]

# Messages that name the other side on purpose, each with why: (side's tree, enclosing function or constant).
MEANT_FOR_THE_OTHER_SIDE = {
    # A thread lock called from an event loop points its caller to the asyncio API.
    ("_sync", "refuse_in_event_loop"),
    # The name the shared code uses for the other side's registry ("is an async function ... decorate it with").
    ("_sync", "OTHER_API_REGISTRY"),
    ("_async", "OTHER_API_REGISTRY"),
}

_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log", "warn"}


@dataclass(frozen=True)
class Message:
    path: str
    line: int
    where: str  # the enclosing function (or the constant's name)
    text: str


def _text(node: ast.AST) -> str:
    """The literal text of a message expression; each interpolated part is shown as ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(value) if isinstance(value, ast.Constant) else "{}" for value in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " | " + _text(node.orelse)
    return ""


def _is_message_call(call: ast.Call) -> bool:
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if name.endswith(("Error", "Warning", "Exception", "Exit")) or name == "warn":
        return True
    # logger.warning(...), logging.getLogger(...).info(...)
    return isinstance(func, ast.Attribute) and name in _LOG_METHODS and "log" in ast.unparse(func.value).lower()


def messages(tree: str) -> list[Message]:
    """Every message text in ``hybridlock/<tree>``."""
    found: list[Message] = []
    for path in sorted((ROOT / tree).rglob("*.py")):
        module = ast.parse(path.read_text(encoding="utf-8"))
        relative = path.relative_to(ROOT).as_posix()

        def visit(node: ast.AST, where: str, in_repr: bool, path: str = relative) -> None:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where, in_repr = node.name, node.name in ("__repr__", "__str__")
            if isinstance(node, ast.Call) and _is_message_call(node):
                for argument in [*node.args, *(k.value for k in node.keywords if k.arg in ("message", "msg"))]:
                    text = _text(argument)
                    if text:
                        found.append(Message(path, node.lineno, where, text))
            elif isinstance(node, ast.Return) and in_repr and node.value is not None:
                text = _text(node.value)
                if text:
                    found.append(Message(path, node.lineno, where, text))
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1) or (
                isinstance(node, ast.AnnAssign) and node.value is not None
            ):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                name = target.id if isinstance(target, ast.Name) else ""
                text = _text(node.value) if node.value is not None else ""
                # Module constants of text (READ_WRITE_REFUSED), and text kept for a message in a local variable.
                if text and (name.isupper() or in_repr or " " in text.strip()):
                    found.append(Message(path, node.lineno, name if name.isupper() else where, text))
            for child in ast.iter_child_nodes(node):
                visit(child, where, in_repr)

        visit(module, "<module>", False)
    return found


def _wrong(tree: str, rules: list[tuple[str, str]]) -> list[str]:
    problems = []
    for message in messages(tree):
        if (tree, message.where) in MEANT_FOR_THE_OTHER_SIDE:
            continue
        for pattern, meaning in rules:
            if re.search(pattern, message.text):
                problems.append(f"{message.path}:{message.line} ({message.where}) names {meaning}: {message.text!r}")
    return problems


def test_the_message_collector_finds_the_messages_of_both_sides() -> None:
    """The walk below is only worth what it reads: it must find the messages we know of, on each side."""
    async_texts = {message.text for message in messages("_async")}
    sync_texts = {message.text for message in messages("_sync")}
    assert len(async_texts) > 60
    assert len(sync_texts) > 60
    assert "cannot release a lock this task does not hold" in async_texts
    assert "cannot release a lock this thread does not hold" in sync_texts
    assert any("held by this task" in text for text in async_texts)  # a repr
    assert any(text.startswith("hybridlock: could not give back the idle lease") for text in async_texts)  # a log
    assert any("EventLoopBlockedError" in m.text or m.where == "refuse_in_event_loop" for m in messages("_sync"))


def test_no_async_message_names_the_thread_api() -> None:
    assert _wrong("_async", WRONG_ON_THE_ASYNC_SIDE) == []


def test_no_thread_message_names_the_asyncio_api() -> None:
    assert _wrong("_sync", WRONG_ON_THE_SYNC_SIDE) == []


def test_the_check_catches_a_message_written_for_the_wrong_side(tmp_path: Path) -> None:
    """What the issue found: the generated side saying "this thread" on asyncio, and the reverse."""
    assert re.search(WRONG_ON_THE_ASYNC_SIDE[0][0], "cannot release a lock this thread does not hold")
    assert re.search(WRONG_ON_THE_ASYNC_SIDE[1][0], "decorate it with LockRegistry.synchronized")
    assert not re.search(WRONG_ON_THE_ASYNC_SIDE[1][0], "decorate it with AsyncLockRegistry.synchronized")
    assert re.search(WRONG_ON_THE_SYNC_SIDE[1][0], "use AsyncRedisBackend for one server")
    assert re.search(WRONG_ON_THE_ASYNC_SIDE[3][0], "use `with lock:`")
    assert not re.search(WRONG_ON_THE_ASYNC_SIDE[3][0], "use `async with lock:`")


# -- the main paths, by behaviour --------------------------------------------------------------------------------------


def test_decorating_a_coroutine_function_for_threads_names_the_asyncio_registry() -> None:
    with hybridlock.LocalLockRegistry() as registry, pytest.raises(hybridlock.InvalidArgumentError) as caught:

        @registry.synchronized("k")
        async def job() -> None: ...

    message = str(caught.value)
    assert "decorate it with AsyncLockRegistry.synchronized" in message
    assert "LocalLockRegistry.synchronized cannot run" in message


def test_decorating_a_plain_function_for_tasks_names_the_thread_registry() -> None:
    async def main() -> str:
        async with hybridlock.AsyncLocalLockRegistry() as registry:
            with pytest.raises(hybridlock.InvalidArgumentError) as caught:

                @registry.synchronized("k")
                def job() -> None: ...

            return str(caught.value)

    message = asyncio.run(main())
    assert "decorate it with LockRegistry.synchronized" in message
    assert "AsyncLocalLockRegistry.synchronized cannot run" in message


def test_tasks_ask_is_held_by_current_task_and_threads_is_held_by_current_thread() -> None:
    for lock_class in (hybridlock.AsyncHybridLock, hybridlock.AsyncReadLock, hybridlock.AsyncMultiLock):
        assert hasattr(lock_class, "is_held_by_current_task")
        assert not hasattr(lock_class, "is_held_by_current_thread")
    for lock_class in (hybridlock.HybridLock, hybridlock.ReadLock, hybridlock.MultiLock):
        assert hasattr(lock_class, "is_held_by_current_thread")
        assert not hasattr(lock_class, "is_held_by_current_task")
