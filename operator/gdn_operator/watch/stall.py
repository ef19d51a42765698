"""Stall detection: an engine with requests in flight whose output (nearly) stopped, while /health says 200.

    det = StallDetector(stall_seconds=120)
    v = det.observe_text(now, metrics_text)   # one vLLM /metrics body; None when the scrape failed
    v = det.observe(now, snapshot)            # the same, on a parsed EngineSnapshot (parsed once per scrape)
    v.stalled, v.seconds_without_progress, v.running, v.waiting, v.reason

Pure: no Kubernetes, no I/O, no clock (``now`` is passed in). One detector per engine pod (the leader of a
multi-node group: it alone serves /metrics, and its verdict is the group's).

What counts as progress (evidence: ``tests/fixtures/vllm-0.22.0-h100x2-tp2/``, vLLM 0.22.0, TP=2, MTP k=2,
FULL decode CUDA graphs). The stalled engines do not freeze outright: they make one engine step every
20–70 s, each giving the 7–8 requests left "running" 2–3 tokens, so generation tokens, drafts and engine
steps all still advance — "any counter moved = progress" never flags them. What they cannot do is keep a
rate: 0.04–0.16 tokens per running request per second over any 30 s, against 14–44 for the same engines
(and the healthy PIECEWISE engine) under load, and 88 for PIECEWISE's last lone request. So progress is a
**rate**: output tokens (generation + prompt) per *running request* per second, over the whole trailing
span, against :data:`DEFAULT_FLOOR` (0.5). Only spans of at least :data:`MIN_SPAN_SECONDS` (30 s) are
judged, so one burst step of a stalled engine (k+1 tokens per request at once) cannot read as progress,
for k up to 14.

Prompt tokens count because vLLM counts a prompt when its prefill completes (v1 ``IterationStats``: the
engine core emits no output for a partial prefill). So a *lone* prefill longer than ``stall_seconds``, with
nothing else running, shows no advance until it ends; the default :data:`DEFAULT_STALL_SECONDS` (120 s) is
far beyond a prefill on the hardware this operator serves, and long prefills among other traffic are
covered by the others' decode tokens. Spec-decode draft tokens and engine steps are reported (the message
says how many steps the span had) but are not progress: every step makes at least one output token per
running request, and drafts are not output.

Why 120 s by default: PIECEWISE drained the same load in under 30 s, and the slowest stalled engine stepped
once in ~70 s; 120 s spans at least one step gap of every capture yet detects within 2.5 minutes at the
default 15 s scrape interval. Bounds: :data:`MIN_STALL_SECONDS` … :data:`MAX_STALL_SECONDS` (the spec
validates them).

Never a stall:

* **idle** — no request running or waiting: the history restarts there (a stall needs requests in flight at
  every sample of its span);
* **engine restart** — a counter going down, or a counter's ``_created`` time changing: history restarts;
* **missing scrape** (``None`` / unparsable text) — verdict ``NoMetrics``, ``known`` false, history kept
  (that is ``MetricsAvailable=False``; counters are cumulative, so the next good scrape judges the gap);
* **no vLLM counters** in the text — verdict ``NoCounters``.

Waiting-only engines (nothing running, requests waiting) count as one running request: nothing scheduled
for ``stall_seconds`` while requests wait is a stall.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gdn_operator.watch.acceptance.parse import EngineSnapshot, ExpositionParseError, parse_exposition

__all__ = [
    "DEFAULT_FLOOR",
    "DEFAULT_STALL_SECONDS",
    "MAX_STALL_SECONDS",
    "MIN_SPAN_SECONDS",
    "MIN_STALL_SECONDS",
    "REASONS",
    "StallDetector",
    "StallVerdict",
]

DEFAULT_STALL_SECONDS = 120.0
MIN_STALL_SECONDS = 30.0
MAX_STALL_SECONDS = 3600.0
#: output tokens per running request per second below which a span makes no progress
DEFAULT_FLOOR = 0.5
#: shortest span judged (one step's burst of tokens must not read as a rate)
MIN_SPAN_SECONDS = 30.0
#: samples kept per pod (bounds memory at very short scrape intervals)
MAX_SAMPLES = 256

REASON_IDLE = "Idle"
REASON_PROGRESSING = "Progressing"
REASON_SLOW = "NoProgress"  # below the floor, for less than stall_seconds so far
REASON_STALLED = "Stalled"
REASON_NO_METRICS = "NoMetrics"
REASON_NO_COUNTERS = "NoCounters"
REASON_RESTARTED = "EngineRestarted"
REASONS = (REASON_IDLE, REASON_PROGRESSING, REASON_SLOW, REASON_STALLED, REASON_NO_METRICS, REASON_NO_COUNTERS, REASON_RESTARTED)


@dataclass(frozen=True, slots=True)
class StallVerdict:
    stalled: bool
    seconds_without_progress: float
    running: int
    waiting: int
    reason: str
    #: output tokens per running request per second over the judged span (None when no span was judged)
    rate: float | None = None
    #: engine steps (iteration_tokens_total_count) over that span, when the engine exposes them
    steps: float | None = None
    #: output tokens over that span
    tokens: float | None = None

    @property
    def known(self) -> bool:
        """False when this round says nothing about the engine (scrape failed, no vLLM counters)."""
        return self.reason not in (REASON_NO_METRICS, REASON_NO_COUNTERS)

    @property
    def message(self) -> str:
        """One line for status and Events."""
        if self.stalled or self.reason == REASON_SLOW:
            head = f"{self.running} running, {self.waiting} waiting, no progress for {self.seconds_without_progress:.0f}s"
            bits = []
            if self.tokens is not None:
                bits.append(f"{self.tokens:.0f} tokens")
            if self.steps is not None:
                bits.append(f"{self.steps:.0f} engine steps")
            if self.rate is not None:
                bits.append(f"{self.rate:.2f} tokens/s per running request")
            return head + (f" ({', '.join(bits)})" if bits else "")
        return {
            REASON_IDLE: "no requests in flight",
            REASON_NO_METRICS: "no /metrics this round",
            REASON_NO_COUNTERS: "no vLLM progress counters in /metrics",
            REASON_RESTARTED: "engine restarted (counters reset)",
        }.get(self.reason, f"{self.running} running, {self.waiting} waiting, progressing")


@dataclass(frozen=True, slots=True)
class _Sample:
    t: float
    tokens: float  # generation + prompt tokens (cumulative)
    steps: float | None
    running: int
    waiting: int
    occupancy: float  # cumulative running-request-seconds (at least one while anything is in flight)


class StallDetector:
    """Per-pod stall verdicts from successive /metrics scrapes (see the module docstring)."""

    __slots__ = ("stall_seconds", "floor", "min_span", "_samples", "_start_time", "_since", "_last")

    def __init__(
        self, stall_seconds: float = DEFAULT_STALL_SECONDS, *, floor: float = DEFAULT_FLOOR, min_span: float = MIN_SPAN_SECONDS
    ):
        stall_seconds = float(stall_seconds)
        if not stall_seconds > 0:
            raise ValueError(f"stall_seconds must be > 0, got {stall_seconds}")
        if not floor > 0:
            raise ValueError(f"floor must be > 0 tokens/s per request, got {floor}")
        self.stall_seconds = stall_seconds
        self.floor = float(floor)
        self.min_span = min(float(min_span), stall_seconds)
        self._samples: deque[_Sample] = deque(maxlen=MAX_SAMPLES)
        self._start_time: float | None = None
        self._since: float | None = None  # start of the current no-progress span
        self._last = StallVerdict(False, 0.0, 0, 0, REASON_NO_METRICS)

    @property
    def last(self) -> StallVerdict:
        return self._last

    def reset(self) -> None:
        """Forget the history (e.g. the pod was replaced)."""
        self._samples.clear()
        self._start_time = None
        self._since = None

    def observe_text(self, now: float, metrics_text: str | bytes | None) -> StallVerdict:
        """One scrape as /metrics text (None: the scrape failed)."""
        if metrics_text is None:
            return self.observe(now, None)
        try:
            snapshot = parse_exposition(metrics_text, timestamp=now)
        except ExpositionParseError:
            snapshot = None
        return self.observe(now, snapshot)

    def observe(self, now: float, sample: EngineSnapshot | None) -> StallVerdict:
        """One scrape as a parsed snapshot (None: the scrape failed)."""
        v = self._observe(float(now), sample)
        self._last = v
        return v

    def _observe(self, now: float, snap: EngineSnapshot | None) -> StallVerdict:
        last = self._last
        if snap is None:
            return StallVerdict(False, 0.0, last.running, last.waiting, REASON_NO_METRICS)
        if snap.generation_tokens is None and snap.num_requests_running is None:
            return StallVerdict(False, 0.0, 0, 0, REASON_NO_COUNTERS)
        running = int(snap.num_requests_running or 0)
        waiting = int(snap.num_requests_waiting or 0)
        tokens = (snap.generation_tokens or 0.0) + (snap.prompt_tokens or 0.0)
        steps = snap.engine_steps
        samples = self._samples
        prev = samples[-1] if samples else None
        restarted = prev is not None and (
            tokens < prev.tokens
            or (steps is not None and prev.steps is not None and steps < prev.steps)
            or (snap.start_time is not None and self._start_time is not None and abs(snap.start_time - self._start_time) > 1e-3)
            or now < prev.t
        )
        self._start_time = snap.start_time
        if restarted or prev is None or (running + waiting) == 0:
            samples.clear()
            self._since = None
            samples.append(_Sample(now, tokens, steps, running, waiting, 0.0))
            if restarted:
                return StallVerdict(False, 0.0, running, waiting, REASON_RESTARTED)
            if running + waiting == 0:
                return StallVerdict(False, 0.0, 0, 0, REASON_IDLE)
            return StallVerdict(False, 0.0, running, waiting, REASON_PROGRESSING)
        # running-request-seconds since prev: the fewer of the two counts (the conservative side), at least 1
        occ = prev.occupancy + max(min(prev.running, running), 1) * (now - prev.t)
        cur = _Sample(now, tokens, steps, running, waiting, occ)
        samples.append(cur)
        while len(samples) > 2 and samples[1].t <= now - 2.0 * self.stall_seconds:
            samples.popleft()  # the oldest kept is the base of the longest span judged
        return self._judge(cur)

    def _judge(self, cur: _Sample) -> StallVerdict:
        """Walk back over spans ending now, newest first, from the first at least ``min_span`` long; the
        no-progress span is the longest run of spans all below the floor."""
        start: _Sample | None = None
        judged: _Sample | None = None
        broke = False
        for s in reversed(self._samples):
            span = cur.t - s.t
            if span < self.min_span:
                continue
            rs = cur.occupancy - s.occupancy
            if rs <= 0:
                continue
            below = (cur.tokens - s.tokens) < self.floor * rs
            if judged is None:
                judged = s
            if not below:
                broke = True
                break
            start = s
        if start is None:
            self._since = None
            rate = steps = tokens = None
            if judged is not None:
                rate, steps, tokens = self._figures(judged, cur)
            return StallVerdict(False, 0.0, cur.running, cur.waiting, REASON_PROGRESSING, rate, steps, tokens)
        # every kept span back to the oldest was below the floor: the stall may have begun before it
        since = start.t
        if not broke and self._since is not None and self._since < since:
            since = self._since
        self._since = since
        seconds = cur.t - since
        rate, steps, tokens = self._figures(start, cur)
        stalled = seconds >= self.stall_seconds
        return StallVerdict(
            stalled, seconds, cur.running, cur.waiting, REASON_STALLED if stalled else REASON_SLOW, rate, steps, tokens
        )

    @staticmethod
    def _figures(a: _Sample, b: _Sample) -> tuple[float | None, float | None, float]:
        rs = b.occupancy - a.occupancy
        tokens = b.tokens - a.tokens
        rate = round(tokens / rs, 4) if rs > 0 else None
        steps = (b.steps - a.steps) if (a.steps is not None and b.steps is not None) else None
        return rate, steps, tokens
