"""@registry.synchronized and registry.execute_locked."""

from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass

import pytest

import hybridlock


@pytest.fixture
def registry(any_registry_factory):
    """A registry on the memory backend, then on a real server."""
    return any_registry_factory()


def _held_keys(reg: hybridlock.LockRegistry) -> list[str]:
    return [lock.key for lock in reg.held_locks()]


def test_function_key_from_arguments_and_metadata_kept(registry):
    seen = []

    @registry.synchronized("order:{order_id}", timeout=5)
    def ship(order_id: int, carrier: str = "dhl") -> str:
        """Ship an order."""
        seen.append(_held_keys(registry))
        return f"{order_id} by {carrier}"

    assert ship(42) == "42 by dhl"
    assert ship(order_id=7, carrier="ups") == "7 by ups"
    assert seen == [["order:42"], ["order:7"]]
    assert _held_keys(registry) == []
    assert ship.__name__ == "ship"
    assert ship.__doc__ == "Ship an order."
    assert str(inspect.signature(ship)) == "(order_id: 'int', carrier: 'str' = 'dhl') -> 'str'"
    assert inspect.signature(ship).parameters.keys() == {"order_id", "carrier"}


@dataclass
class Invoice:
    id: int


def test_methods_classmethods_and_staticmethods(registry):
    record: list[list[str]] = []

    class Shop:
        def __init__(self, name: str) -> None:
            self.name = name

        @registry.synchronized("shop:{self.name}:{invoice.id}")
        def close(self, invoice: Invoice) -> None:
            record.append(_held_keys(registry))

        @registry.synchronized("class:{cls.__name__}:{n}")
        @classmethod
        def count(cls, n: int) -> None:
            record.append(_held_keys(registry))

        @registry.synchronized("static:{x}")
        @staticmethod
        def helper(x: int) -> int:
            record.append(_held_keys(registry))
            return x * 2

    shop = Shop("north")
    shop.close(Invoice(9))
    Shop.close(shop, Invoice(10))  # called through the class
    Shop.count(3)
    shop.count(4)
    assert Shop.helper(5) == 10
    assert shop.helper(6) == 12
    assert record == [
        ["shop:north:9"],
        ["shop:north:10"],
        ["class:Shop:3"],
        ["class:Shop:4"],
        ["static:5"],
        ["static:6"],
    ]


def test_bad_templates_fail_at_decoration_time(registry):
    with pytest.raises(hybridlock.InvalidArgumentError, match="missing"):

        @registry.synchronized("order:{missing}")
        def f(order_id: int) -> None: ...

    with pytest.raises(hybridlock.InvalidArgumentError, match="positions"):

        @registry.synchronized("order:{0}")
        def g(order_id: int) -> None: ...

    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.synchronized("order:{unclosed")

    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.synchronized("")

    # Issue 34: a key with no placeholder that obtain() would refuse at every call is refused when decorating.
    with pytest.raises(hybridlock.InvalidArgumentError, match="must not start with"):
        registry.synchronized("}}static")
    with pytest.raises(hybridlock.InvalidArgumentError, match="UTF-8"):
        registry.runs_once("static:\ud800", at_least_for=1)

    with pytest.raises(hybridlock.InvalidArgumentError, match="async"):

        @registry.synchronized("a:{x}")
        async def h(x: int) -> None: ...


def test_attribute_missing_at_call_time_is_a_clear_error(registry):
    @registry.synchronized("item:{item.sku}")
    def put(item: object) -> None: ...

    with pytest.raises(hybridlock.InvalidArgumentError, match="sku"):
        put(object())


def test_timeout_raises_lock_timeout_error_naming_the_key(registry):
    @registry.synchronized("busy:{n}", timeout=0.2)
    def work(n: int) -> None: ...

    holder_ready, release = threading.Event(), threading.Event()

    def hold() -> None:
        with registry.obtain("busy:1"):
            holder_ready.set()
            release.wait(5)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holder_ready.wait(5)
    started = time.monotonic()
    with pytest.raises(hybridlock.LockTimeoutError) as info:
        work(1)
    assert isinstance(info.value, TimeoutError)
    assert info.value.key == "busy:1"
    assert 0.15 < time.monotonic() - started < 3
    release.set()
    thread.join(5)


def test_execute_locked(registry):
    def add(a: int, b: int) -> list[object]:
        return [a + b, _held_keys(registry)]

    assert registry.execute_locked("sum", add, 2, b=3) == [5, ["sum"]]
    assert _held_keys(registry) == []
    with pytest.raises(hybridlock.InvalidArgumentError):
        registry.execute_locked("sum", "not callable")


def test_decorated_function_excludes_across_threads(registry):
    counter = {"n": 0}

    @registry.synchronized("counter")
    def bump() -> None:
        value = counter["n"]
        time.sleep(0)
        counter["n"] = value + 1

    threads = [threading.Thread(target=lambda: [bump() for _ in range(200)]) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert counter["n"] == 1600
