"""The fan-out both quorum sides use (``FanOut`` with threads, ``AsyncFanOut`` with tasks): outcomes in order, a
straggler given up on after ``enough`` answers plus its patience, its late outcome handed on with its lane, and a
lane's backlog bounded. No server: the calls are plain functions that sleep or block on an event."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from hybridlock._async._compat import AsyncFanOut
from hybridlock._sync._compat import FanOut

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
