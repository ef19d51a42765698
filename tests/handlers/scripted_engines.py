"""Engines as a scripted metrics source and the clock the acceptance and stall machinery reads: the run-time watch
(handlers/engines/acceptance.py, stall.py) driven round by round without an engine or a wall clock."""

from __future__ import annotations

from typing import Any

from gdn_operator.watch.acceptance import EngineSnapshot
from gdn_operator.watch.scraper import ScrapeResult

ROUND = 15.0  # seconds between rounds (the default scrape and guard intervals)
ROUNDS = 14  # 210 s: past the guard's default stall_seconds (120) with the 30 s minimum span judged


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def healthy(t: float) -> EngineSnapshot:
    """An engine under load: 4 requests running, 60 output tokens/s per request, 60 % of its draft tokens accepted."""
    k = t - 1000.0
    return EngineSnapshot(
        timestamp=t,
        num_drafts=50.0 * k,
        num_draft_tokens=150.0 * k,
        num_accepted_tokens=90.0 * k,
        generation_tokens=240.0 * k,
        prompt_tokens=100.0 * k,
        num_requests_running=4,
        num_requests_waiting=0,
        engines=1,
        start_time=900.0,
    )


def frozen(t: float) -> EngineSnapshot:
    """An engine holding 8 requests and producing nothing (the G1 stall): its counters stand still."""
    return EngineSnapshot(
        timestamp=t,
        num_drafts=5000.0,
        num_draft_tokens=15000.0,
        num_accepted_tokens=3000.0,
        generation_tokens=40000.0,
        prompt_tokens=130000.0,
        num_requests_running=8,
        num_requests_waiting=0,
        engines=1,
        start_time=900.0,
    )


class Engines:
    """The metrics source: each pod's snapshot at the clock's time, by pod name (names are unique per namespace)."""

    def __init__(self, clock: Clock, behaviour: dict[str, Any]) -> None:
        self.clock, self.behaviour = clock, behaviour

    async def scrape(self, targets: list[Any]) -> list[ScrapeResult]:
        return [ScrapeResult(t, self.behaviour[t.pod](self.clock.t)) for t in targets]

    async def close(self) -> None:
        pass
