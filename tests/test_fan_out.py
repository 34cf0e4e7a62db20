"""The fan-out both quorum sides use (``FanOut`` with threads, ``AsyncFanOut`` with tasks): outcomes in order, a
straggler given up on after ``enough`` answers plus its patience, its late outcome handed on with its lane, a
lane's backlog bounded (one waiting call at most, for ``queue``), and a round cancelled or interrupted by
``KeyboardInterrupt`` leaving its calls to finish in their lanes. No server: the calls are plain functions that
sleep or block on an event."""

from __future__ import annotations

import asyncio
import threading
import time
from functools import partial
from typing import Any

import pytest

from hybridlock._async._compat import AsyncFanOut
from hybridlock._sync._compat import FanOut
from tests._interrupts import interrupt_after

pytestmark = pytest.mark.timeout(30)


def test_outcomes_in_order_with_errors_in_place() -> None:
    fan = FanOut("t")
    try:

        def fail() -> None:
            raise KeyError("x")

        outcomes = fan.run([lambda: 1, fail, lambda: None], enough=3)
        assert outcomes[0] == 1
        assert isinstance(outcomes[1], KeyError)
        assert outcomes[2] is None
    finally:
        fan.close()


def test_a_straggler_is_given_up_on_and_its_outcome_comes_late_with_its_lane() -> None:
    fan = FanOut("t")
    wake = threading.Event()
    late: list[tuple[int, Any]] = []
    arrived = threading.Event()

    def hung() -> str:
        wake.wait(10)
        return "late grant"

    def on_late(lane: Any, outcome: Any) -> None:
        late.append((lane, outcome))
        arrived.set()

    try:
        started = time.monotonic()
        outcomes = fan.run([lambda: "a", hung, lambda: "b"], enough=2, patience=0.05, late=on_late, lanes=[4, 7, 9])
        assert time.monotonic() - started < 5  # not the 10 s the straggler would take
        assert outcomes[0::2] == ["a", "b"]
        assert isinstance(outcomes[1], TimeoutError)
        assert not late
        wake.set()
        assert arrived.wait(5)
        assert late == [(7, "late grant")]
    finally:
        wake.set()
        fan.close()


def test_a_busy_lane_takes_no_other_call_until_its_straggler_and_late_handler_are_done() -> None:
    fan = FanOut("t")
    wake, handled = threading.Event(), threading.Event()
    order: list[str] = []

    def hung() -> str:
        wake.wait(10)
        order.append("late call answered")
        return "late"

    def on_late(lane: object, outcome: object) -> None:
        time.sleep(0.05)  # a give-back on its way
        order.append(f"late handler for {lane}")
        handled.set()

    try:
        outcomes = fan.run([hung, lambda: "ok"], enough=1, patience=0.01, late=on_late, lanes=["a", "b"])
        assert isinstance(outcomes[0], TimeoutError)
        started = time.monotonic()
        outcomes = fan.run([lambda: order.append("next call") or "x", lambda: "ok"], enough=1, lanes=["a", "b"])
        assert time.monotonic() - started < 5  # refused at once, not queued behind the hung call
        assert isinstance(outcomes[0], TimeoutError)
        assert "still unanswered" in str(outcomes[0])
        assert outcomes[1] == "ok"
        wake.set()
        assert handled.wait(5)
        until_free = time.monotonic() + 5
        while True:  # the lane frees once the handler has returned
            outcomes = fan.run([lambda: order.append("next call") or "x"], enough=1, lanes=["a"])
            if outcomes == ["x"]:
                break
            assert time.monotonic() < until_free
            time.sleep(0.01)
        assert order == ["late call answered", "late handler for a", "next call"]
    finally:
        wake.set()
        fan.close()


def test_failures_do_not_count_toward_enough() -> None:
    fan = FanOut("t")

    def refused() -> str:
        raise ConnectionRefusedError("down")

    def slow() -> str:
        time.sleep(0.3)
        return "slow"

    try:
        # One server down at once, one fast, one slower than the patience: the slow one is still needed.
        outcomes = fan.run([refused, lambda: "fast", slow], enough=2, patience=0.01)
        assert isinstance(outcomes[0], ConnectionRefusedError)
        assert outcomes[1:] == ["fast", "slow"]
    finally:
        fan.close()


def test_more_enough_than_calls_does_not_hang() -> None:
    fan = FanOut("t")
    try:
        assert fan.run([lambda: 1], enough=3, patience=0.01) == [1]
    finally:
        fan.close()


def test_the_async_twin_gives_up_on_a_straggler_and_hands_its_outcome_on() -> None:
    async def scenario() -> None:
        fan = AsyncFanOut("t")
        wake = asyncio.Event()
        late: list[tuple[int, Any]] = []

        async def hung() -> str:
            await wake.wait()
            return "late grant"

        async def quick() -> str:
            return "a"

        async def on_late(lane: Any, outcome: Any) -> None:
            late.append((lane, outcome))

        outcomes = await fan.run([quick, hung, quick], enough=2, patience=0.05, late=on_late, lanes=[0, 5, 2])
        assert outcomes[0::2] == ["a", "a"]
        assert isinstance(outcomes[1], TimeoutError)
        wake.set()
        for _ in range(100):
            if late:
                break
            await asyncio.sleep(0.01)
        assert late == [(5, "late grant")]

        # enough=0: no answer is awaited beyond the patience, even when every call hangs.
        never = asyncio.Event()

        async def hangs() -> str:
            await never.wait()
            return "never"

        started = time.monotonic()
        outcomes = await fan.run([hangs, hangs], enough=0, patience=0.05, lanes=["x", "y"])
        assert time.monotonic() - started < 2
        assert all(isinstance(outcome, TimeoutError) for outcome in outcomes)
        # Their lanes are busy: a burst of calls to them is refused at once, none queued.
        burst = await asyncio.gather(*(fan.run([quick], enough=1, lanes=["x"]) for _ in range(10)))
        assert all(isinstance(outcomes[0], TimeoutError) for outcomes in burst)
        await fan.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 10))


# -- releases wait for a busy lane; a round cut off leaves its calls to finish -----------------------------------------


def test_a_queued_call_waits_for_its_busy_lane_and_follows_the_late_handler() -> None:
    fan = FanOut("t")
    wake = threading.Event()
    order: list[str] = []

    def hung() -> str:
        wake.wait(10)
        order.append("late call answered")
        return "late"

    def on_late(lane: object, outcome: object) -> None:
        time.sleep(0.05)  # a give-back on its way
        order.append(f"late handler for {lane}")

    def queued(name: str) -> str:
        order.append(name)
        return name

    try:
        outcomes = fan.run([hung, lambda: "ok"], enough=1, patience=0.01, late=on_late, lanes=["a", "b"])
        assert isinstance(outcomes[0], TimeoutError)
        # With enough=0 the round does not wait: its call waits for the lane on its own (a straggler).
        first = fan.run([partial(queued, "first queued call")], enough=0, lanes=["a"], queue=True)
        assert isinstance(first[0], TimeoutError)
        # A lane holds one waiting call at most: the next is refused at once, as a call without ``queue`` is.
        started = time.monotonic()
        second = fan.run([partial(queued, "second queued call")], enough=1, lanes=["a"], queue=True)
        unqueued = fan.run([partial(queued, "unqueued call")], enough=1, lanes=["a"])
        assert time.monotonic() - started < 5
        assert isinstance(second[0], TimeoutError)
        assert "still unanswered" in str(second[0])
        assert isinstance(unqueued[0], TimeoutError)
        wake.set()
        deadline = time.monotonic() + 5
        while fan.busy("a"):
            assert time.monotonic() < deadline, order
            time.sleep(0.01)
        assert order == ["late call answered", "late handler for a", "first queued call"]
        # Free again: a queued call is sent at once.
        assert fan.run([partial(queued, "next call")], enough=1, lanes=["a"], queue=True) == ["next call"]
    finally:
        wake.set()
        fan.close()


def test_an_interrupted_round_leaves_its_calls_to_finish_and_hands_their_outcomes_to_late() -> None:
    """A KeyboardInterrupt in the calling thread: the calls already sent finish in their lanes, their outcomes go
    to ``late`` (a quorum gives the grants back), and a call queued on the lane meanwhile runs after both."""
    fan = FanOut("t")
    wake = threading.Event()
    order: list[str] = []
    late: list[tuple[Any, Any]] = []

    def grant() -> str:
        wake.wait(10)
        return "grant"

    def on_late(lane: Any, outcome: Any) -> None:
        late.append((lane, outcome))
        order.append(f"late handler for {lane}")

    try:
        with interrupt_after(0.1), pytest.raises(KeyboardInterrupt):
            fan.run([grant, grant], enough=2, late=on_late, lanes=["a", "b"])
        assert fan.busy("a"), "the calls on the wire were dropped"
        assert fan.busy("b"), "the calls on the wire were dropped"
        threading.Timer(0.1, wake.set).start()
        released = fan.run([lambda: order.append("release") or "released"], enough=1, lanes=["a"], queue=True)
        assert released == ["released"]
        assert order.index("release") > order.index("late handler for a")
        deadline = time.monotonic() + 5
        while len(late) < 2:
            assert time.monotonic() < deadline, f"late outcomes not handed on: {late}"
            time.sleep(0.01)
        assert sorted(late) == [("a", "grant"), ("b", "grant")]
    finally:
        wake.set()
        fan.close()


def test_the_async_twin_lets_a_cancelled_round_s_calls_finish_and_queues_behind_them() -> None:
    async def scenario() -> None:
        fan = AsyncFanOut("t")
        wake = asyncio.Event()
        order: list[str] = []
        late: list[tuple[Any, Any]] = []

        async def grant() -> str:
            await wake.wait()
            order.append("grant answered")
            return "grant"

        async def on_late(lane: Any, outcome: Any) -> None:
            await asyncio.sleep(0.01)  # a give-back on its way
            late.append((lane, outcome))
            order.append(f"late handler for {lane}")

        async def release() -> str:
            order.append("release")
            return "released"

        round_ = asyncio.ensure_future(fan.run([grant, grant], enough=2, late=on_late, lanes=["a", "b"]))
        await asyncio.sleep(0.01)
        round_.cancel()
        with pytest.raises(asyncio.CancelledError):
            await round_
        assert fan.busy("a"), "the calls on the wire were cancelled"
        assert fan.busy("b"), "the calls on the wire were cancelled"
        queued = asyncio.ensure_future(fan.run([release], enough=1, lanes=["a"], queue=True))
        await asyncio.sleep(0.01)
        assert not queued.done(), "the release was refused (or sent) instead of waiting for its lane"
        refused = await fan.run([release], enough=1, lanes=["a"], queue=True)  # one waiting call per lane
        assert isinstance(refused[0], TimeoutError)
        wake.set()
        assert await asyncio.wait_for(queued, 5) == ["released"]
        assert order.index("release") > order.index("late handler for a")
        for _ in range(100):
            if len(late) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted(late) == [("a", "grant"), ("b", "grant")]
        assert not fan.busy("a")
        assert not fan.busy("b")

        # aclose cancels a straggler with a call waiting behind it: both end, and the lane is free.
        never = asyncio.Event()

        async def hangs() -> str:
            await never.wait()
            return "never"

        await fan.run([hangs], enough=0, lanes=["c"])
        await fan.run([release], enough=0, lanes=["c"], queue=True)
        await fan.aclose()
        assert not fan.busy("c")

    asyncio.run(asyncio.wait_for(scenario(), 10))
