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

    def on_late(lane: int, outcome: Any) -> None:
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


def test_a_hung_lane_takes_no_more_than_its_backlog_and_delays_no_other_lane() -> None:
    fan = FanOut("t", max_backlog=3)
    wake = threading.Event()
    try:
        for _ in range(3):
            started = time.monotonic()
            outcomes = fan.run([lambda: wake.wait(10), lambda: "ok"], enough=1, patience=0.01)
            assert outcomes[1] == "ok"
            assert isinstance(outcomes[0], TimeoutError)
            assert time.monotonic() - started < 5
        outcomes = fan.run([lambda: wake.wait(10), lambda: "ok"], enough=1, patience=0.01)
        assert isinstance(outcomes[0], TimeoutError)
        assert "unanswered" in str(outcomes[0])  # refused at once: three calls still wait there
    finally:
        wake.set()
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

        async def on_late(lane: int, outcome: Any) -> None:
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
        await fan.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 10))
