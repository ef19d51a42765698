"""Speculative-decoding acceptance: parse vLLM /metrics, sliding-window math, anomaly detection.

Three layers, each usable on its own:

1. :func:`parse_exposition` turns one Prometheus text exposition of a vLLM engine into an
   :class:`EngineSnapshot` (counter values summed over the ``engine`` / ``model_name`` label sets of
   that pod). Parsing is done by ``prometheus_client.parser.text_string_to_metric_families``; before
   that, a single regular expression keeps only the lines of the ~10 metric families we use (a vLLM
   exposition has ~100 families and ~600 lines; filtering makes a parse ~10x cheaper, which matters
   when 1000 pods are scraped every 15 s).

   Accepted names (vLLM 0.17 … 0.33, see ../shared/docs/vllm-known-issues.md §6): with or without
   the ``vllm:`` prefix (``vllm_`` too, for relabelled copies), with or without the ``_total``
   suffix that prometheus_client appends to counters:

   ``spec_decode_num_drafts``, ``spec_decode_num_draft_tokens``, ``spec_decode_num_accepted_tokens``,
   ``spec_decode_num_accepted_tokens_per_pos{position}``, ``generation_tokens``,
   ``request_success{finished_reason}``, ``request_generation_tokens`` (histogram),
   ``num_requests_running`` (gauge), and the ``*_created`` timestamps of ``spec_decode_num_drafts``
   and ``generation_tokens`` (used to recognise an engine restart).

2. :class:`PodWindow` keeps a bounded sliding window of snapshots of one pod, with counter-reset
   handling; :class:`AcceptanceTracker` keys those by ``(namespace, name, pod)``, aggregates them per
   resource, evaluates anomalies, renders a CR-status dict (:meth:`AcceptanceTracker.summary`) and
   updates the operator's gauges (:meth:`AcceptanceTracker.update_gauges`).

3. Pure anomaly functions over :class:`WindowStats` returning :class:`Finding` objects:
   :func:`detect_near_zero_acceptance`, :func:`detect_acceptance_drop`,
   :func:`detect_early_stop_shift`, and :func:`detect_anomalies` which runs all of them.

Formulas (the PromQL of vLLM's ``SpecDecodingProm`` docstring, over a window instead of ``rate()``):
    acceptance rate       = Δaccepted_tokens / Δdraft_tokens
    mean accepted length  = 1 + Δaccepted_tokens / Δdrafts
    per-position rate[i]  = Δaccepted_tokens_per_pos[i] / Δdrafts
    drafts per second     = Δdrafts / observed seconds
A figure whose denominator is 0 (no traffic in the window) is ``None``, never 0 and never an error.
A pod without spec-decode counters (speculative decoding off) is "not applicable", not 0.
"""

from __future__ import annotations

import math
import re
import time
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ANOMALY_REASONS",
    "AcceptanceTracker",
    "AnomalyThresholds",
    "Baseline",
    "EngineSnapshot",
    "ExpositionParseError",
    "Finding",
    "GenerationHistogram",
    "PodKey",
    "PodWindow",
    "WindowStats",
    "detect_acceptance_drop",
    "detect_anomalies",
    "detect_early_stop_shift",
    "detect_near_zero_acceptance",
    "parse_exposition",
]


# --------------------------------------------------------------------------------------------------
# 1. Parsing
# --------------------------------------------------------------------------------------------------


class ExpositionParseError(ValueError):
    """The /metrics body is not a valid Prometheus text exposition (for the families we read)."""


# Base names (prefix and `_total` stripped) of what we read.
_DRAFTS = "spec_decode_num_drafts"
_DRAFT_TOKENS = "spec_decode_num_draft_tokens"
_ACCEPTED = "spec_decode_num_accepted_tokens"
_ACCEPTED_POS = "spec_decode_num_accepted_tokens_per_pos"
_GEN_TOKENS = "generation_tokens"
_SUCCESS = "request_success"
_GEN_HIST = "request_generation_tokens"
_RUNNING = "num_requests_running"

# One regex keeps the sample, HELP and TYPE lines of exactly those families (see module docstring).
# It does not parse anything: the kept lines go to prometheus_client's parser unchanged.
# It starts with a literal newline (the body is searched with one prepended) so that `re` can scan for
# line starts quickly: ~0.1 ms on a 55 KB exposition instead of ~0.35 ms with a MULTILINE `^`.
_LINE_FILTER = re.compile(
    rb"\n((?:# (?:HELP|TYPE) )?(?:vllm[:_])?(?:"
    rb"spec_decode_num_(?:drafts|draft_tokens|accepted_tokens|accepted_tokens_per_pos)(?:_total)?"
    rb"|spec_decode_num_drafts_created"
    rb"|generation_tokens(?:_total|_created)?"
    rb"|request_success(?:_total)?"
    rb"|request_generation_tokens(?:_bucket|_count|_sum)?"
    rb"|num_requests_running"
    rb")[ {\t][^\n]*)"
)


@dataclass(frozen=True, slots=True)
class GenerationHistogram:
    """``vllm:request_generation_tokens`` summed over engines: cumulative bucket counts."""

    bounds: tuple[float, ...]  # ascending upper bounds (``le``), the last one is +Inf
    cumulative: tuple[float, ...]  # cumulative counts, same length as bounds
    count: float
    sum: float


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One scrape of one pod: counter values summed over the pod's engines, at ``timestamp``.

    ``None`` means "the engine does not expose this metric" (e.g. spec decoding off), never 0.
    """

    timestamp: float
    num_drafts: float | None = None
    num_draft_tokens: float | None = None
    num_accepted_tokens: float | None = None
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    request_success: Mapping[str, float] = field(default_factory=dict)  # finished_reason -> count
    generation_length: GenerationHistogram | None = None
    num_requests_running: float | None = None
    engines: int = 0
    model_names: tuple[str, ...] = ()
    # Earliest `_created` timestamp of the drafts / generation-token counters: changes when the
    # engine process restarts, which is how a reset is recognised even if counters grew past the
    # previous values between two scrapes.
    start_time: float | None = None

    @property
    def spec_decode_enabled(self) -> bool:
        return (
            self.num_drafts is not None
            and self.num_draft_tokens is not None
            and self.num_accepted_tokens is not None
        )

    def counters(self) -> dict[str, float]:
        """Flat view of every monotonic counter in this snapshot (key -> value).

        Keys: ``drafts``, ``draft_tokens``, ``accepted``, ``pos:<i>``, ``generation_tokens``,
        ``finished:<reason>``, ``gen_le:<bound>``, ``gen_count``, ``gen_sum``.
        """
        out: dict[str, float] = {}
        if self.num_drafts is not None:
            out["drafts"] = self.num_drafts
        if self.num_draft_tokens is not None:
            out["draft_tokens"] = self.num_draft_tokens
        if self.num_accepted_tokens is not None:
            out["accepted"] = self.num_accepted_tokens
        for i, v in enumerate(self.accepted_per_position):
            out[f"pos:{i}"] = v
        if self.generation_tokens is not None:
            out["generation_tokens"] = self.generation_tokens
        for reason, v in self.request_success.items():
            out[f"finished:{reason}"] = v
        h = self.generation_length
        if h is not None:
            for b, c in zip(h.bounds, h.cumulative):
                out[f"gen_le:{_fmt_bound(b)}"] = c
            out["gen_count"] = h.count
            out["gen_sum"] = h.sum
        return out


def _fmt_bound(b: float) -> str:
    return "+Inf" if math.isinf(b) else repr(float(b))


def _base_name(name: str) -> str:
    if name.startswith("vllm:") or name.startswith("vllm_"):
        name = name[5:]
    return name


def parse_exposition(body: str | bytes, timestamp: float | None = None) -> EngineSnapshot:
    """Parse one vLLM /metrics body into an :class:`EngineSnapshot`.

    ``timestamp`` defaults to ``time.time()``. Raises :class:`ExpositionParseError` if the text is
    not a valid exposition for the families read here (lines of other families are not looked at).
    """
    if timestamp is None:
        timestamp = time.time()
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    kept = _LINE_FILTER.findall(b"\n" + body)
    if not kept:
        return EngineSnapshot(timestamp=timestamp)
    try:
        text = b"\n".join(kept).decode("utf-8")
        families = list(text_string_to_metric_families(text + "\n"))
    except (ValueError, TypeError, IndexError, KeyError, UnicodeDecodeError) as exc:
        raise ExpositionParseError(f"invalid Prometheus exposition: {exc}") from exc

    drafts = draft_tokens = accepted = gen_tokens = running = None
    positions: dict[int, float] = {}
    success: dict[str, float] = {}
    buckets: dict[float, float] = {}
    h_count = h_sum = None
    engines: set[str] = set()
    models: set[str] = set()
    created: float | None = None

    for fam in families:
        for s in fam.samples:
            name = _base_name(s.name)
            labels = s.labels
            value = s.value
            if name.endswith("_total"):
                name = name[:-6]
            elif name.endswith("_created"):
                if created is None or value < created:
                    created = value
                continue
            if name == _DRAFTS:
                drafts = (drafts or 0.0) + value
            elif name == _DRAFT_TOKENS:
                draft_tokens = (draft_tokens or 0.0) + value
            elif name == _ACCEPTED:
                accepted = (accepted or 0.0) + value
            elif name == _ACCEPTED_POS:
                try:
                    pos = int(labels["position"])
                except (KeyError, ValueError) as exc:
                    raise ExpositionParseError(
                        f"{s.name}: label 'position' missing or not an integer ({labels})"
                    ) from exc
                if pos < 0 or pos > 64:
                    raise ExpositionParseError(f"{s.name}: position {pos} out of range 0..64")
                positions[pos] = positions.get(pos, 0.0) + value
            elif name == _GEN_TOKENS:
                gen_tokens = (gen_tokens or 0.0) + value
            elif name == _SUCCESS:
                reason = labels.get("finished_reason", "unknown")
                success[reason] = success.get(reason, 0.0) + value
            elif name == _GEN_HIST + "_bucket":
                try:
                    le = float(labels["le"])
                except (KeyError, ValueError) as exc:
                    raise ExpositionParseError(f"{s.name}: bad or missing 'le' label") from exc
                buckets[le] = buckets.get(le, 0.0) + value
            elif name == _GEN_HIST + "_count":
                h_count = (h_count or 0.0) + value
            elif name == _GEN_HIST + "_sum":
                h_sum = (h_sum or 0.0) + value
            elif name == _RUNNING:
                running = (running or 0.0) + value
            else:
                continue
            eng = labels.get("engine")
            if eng is not None:
                engines.add(eng)
            model = labels.get("model_name")
            if model is not None:
                models.add(model)

    hist = None
    if buckets:
        bounds = tuple(sorted(buckets))
        cum = tuple(buckets[b] for b in bounds)
        count = h_count if h_count is not None else (buckets.get(math.inf, cum[-1]))
        hist = GenerationHistogram(bounds=bounds, cumulative=cum, count=count, sum=h_sum or 0.0)

    pos_tuple: tuple[float, ...] = ()
    if positions:
        pos_tuple = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1))

    return EngineSnapshot(
        timestamp=timestamp,
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_position=pos_tuple,
        generation_tokens=gen_tokens,
        request_success=success,
        generation_length=hist,
        num_requests_running=running,
        engines=len(engines) if engines else (1 if (drafts is not None or gen_tokens is not None) else 0),
        model_names=tuple(sorted(models)),
        start_time=created,
    )


# --------------------------------------------------------------------------------------------------
# 2. Window statistics
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Counter increases over a window, for one pod or summed over the pods of a resource."""

    seconds: float  # time covered by the window (last - first observation)
    spec_decode: bool  # spec-decode counters present
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    generation_tokens: float | None = None
    finished: Mapping[str, float] = field(default_factory=dict)  # finished_reason -> Δ requests
    gen_bounds: tuple[float, ...] = ()  # generation-length histogram upper bounds
    gen_buckets: tuple[float, ...] = ()  # Δ cumulative counts per bound
    gen_count: float | None = None
    gen_sum: float | None = None
    drafts_per_second: float | None = None
    pods: int = 1
    resets: int = 0  # engine restarts (counter resets) seen inside the window

    # --- spec decode ------------------------------------------------------------------------
    @property
    def acceptance_rate(self) -> float | None:
        if not self.spec_decode or self.draft_tokens <= 0:
            return None
        return self.accepted / self.draft_tokens

    @property
    def mean_accepted_length(self) -> float | None:
        if not self.spec_decode or self.drafts <= 0:
            return None
        return 1.0 + self.accepted / self.drafts

    @property
    def per_position(self) -> tuple[float, ...] | None:
        if not self.spec_decode or self.drafts <= 0 or not self.accepted_per_position:
            return None
        return tuple(v / self.drafts for v in self.accepted_per_position)

    # --- generation length / finish reasons ---------------------------------------------------
    @property
    def finished_requests(self) -> float | None:
        if self.gen_count is not None:
            return self.gen_count
        if self.finished:
            return sum(self.finished.values())
        return None

    @property
    def mean_generation_length(self) -> float | None:
        if self.gen_count is not None and self.gen_sum is not None and self.gen_count > 0:
            return self.gen_sum / self.gen_count
        n = sum(self.finished.values()) if self.finished else 0.0
        if self.generation_tokens is not None and n > 0:
            return self.generation_tokens / n
        return None

    @property
    def stop_share(self) -> float | None:
        """Share of requests that ended on a stop condition (EOS/stop string) vs. on max length."""
        stop = self.finished.get("stop")
        length = self.finished.get("length")
        if stop is None or length is None or stop + length <= 0:
            return None
        return stop / (stop + length)

    def short_share(self, max_tokens: float) -> float | None:
        """Share of finished requests with at most ``max_tokens`` generated tokens (histogram)."""
        if not self.gen_bounds or not self.gen_count or self.gen_count <= 0:
            return None
        best = None
        for b, c in zip(self.gen_bounds, self.gen_buckets):
            if b <= max_tokens:
                best = c
        if best is None:
            return None
        return best / self.gen_count

    @staticmethod
    def combine(stats: Iterable["WindowStats"]) -> "WindowStats | None":
        """Sum of deltas over pods (acceptance of the sum, not mean of per-pod acceptances)."""
        items = list(stats)
        if not items:
            return None
        spec = [s for s in items if s.spec_decode]
        npos = max((len(s.accepted_per_position) for s in spec), default=0)
        pos = [0.0] * npos
        for s in spec:
            for i, v in enumerate(s.accepted_per_position):
                pos[i] += v
        finished: dict[str, float] = {}
        for s in items:
            for k, v in s.finished.items():
                finished[k] = finished.get(k, 0.0) + v
        gen_tokens = [s.generation_tokens for s in items if s.generation_tokens is not None]
        # The histogram is only summed if every pod exposes it with the same buckets.
        bounds = items[0].gen_bounds
        same = bool(bounds) and all(s.gen_bounds == bounds for s in items)
        gen_buckets: tuple[float, ...] = ()
        gen_count = gen_sum = None
        if same:
            gen_buckets = tuple(sum(col) for col in zip(*(s.gen_buckets for s in items)))
            gen_count = sum(s.gen_count or 0.0 for s in items)
            gen_sum = sum(s.gen_sum or 0.0 for s in items)
        dps = [s.drafts_per_second for s in spec if s.drafts_per_second is not None]
        return WindowStats(
            seconds=max(s.seconds for s in items),
            spec_decode=bool(spec),
            drafts=sum(s.drafts for s in spec),
            draft_tokens=sum(s.draft_tokens for s in spec),
            accepted=sum(s.accepted for s in spec),
            accepted_per_position=tuple(pos),
            generation_tokens=sum(gen_tokens) if gen_tokens else None,
            finished=finished,
            gen_bounds=bounds if same else (),
            gen_buckets=gen_buckets,
            gen_count=gen_count,
            gen_sum=gen_sum,
            drafts_per_second=sum(dps) if dps else None,
            pods=sum(s.pods for s in items),
            resets=sum(s.resets for s in items),
        )


class _Point(NamedTuple):
    ts: float
    adjusted: array  # reset-adjusted cumulative counters, indexed by PodWindow._index
    restarted: bool


class PodWindow:
    """Sliding window over the snapshots of one pod, with counter-reset handling.

    Internally every counter is turned into a reset-adjusted cumulative value ("increase since
    tracking began"): when a counter goes down or the engine's ``_created`` timestamp changes, the
    engine restarted and the new raw value counts as the increase since the restart. The window
    increase is then ``adjusted[last] - adjusted[first]``: O(1), never negative. Memory per pod is
    bounded by ``max_points`` points of one ``array('d')`` each.
    """

    __slots__ = ("window", "_points", "_index", "_prev_raw", "_prev_start", "_spec", "last",
                 "last_seen", "_stats")

    def __init__(self, window: float, max_points: int = 512):
        if window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        self.window = float(window)
        self._points: deque[_Point] = deque(maxlen=max(2, int(max_points)))
        self._index: dict[str, int] = {}
        self._prev_raw: dict[str, float] = {}
        self._prev_start: float | None = None
        self._spec: bool | None = None
        self.last: EngineSnapshot | None = None
        self.last_seen: float = 0.0
        self._stats: WindowStats | None = None  # cache, cleared by observe()

    def __len__(self) -> int:
        return len(self._points)

    def reset(self) -> None:
        self._stats = None
        self._points.clear()
        self._index.clear()
        self._prev_raw = {}
        self._prev_start = None

    def observe(self, snap: EngineSnapshot) -> None:
        """Add one snapshot. Out-of-order or duplicate timestamps are ignored."""
        if self._points and snap.timestamp <= self._points[-1].ts:
            return
        self._stats = None
        spec = snap.spec_decode_enabled
        if self._spec is not None and spec != self._spec:
            # spec decoding switched on/off (new config): old history is not comparable.
            self.reset()
        self._spec = spec
        raw = snap.counters()
        prev = self._prev_raw
        restarted = False
        if self._points:
            if (
                snap.start_time is not None
                and self._prev_start is not None
                and abs(snap.start_time - self._prev_start) > 1e-3
            ):
                restarted = True
            else:
                for k, v in raw.items():
                    p = prev.get(k)
                    if p is not None and v < p:
                        restarted = True
                        break
        index = self._index
        for k in raw:
            if k not in index:
                index[k] = len(index)
        if self._points:
            last_adj = self._points[-1].adjusted
            adj = array("d", last_adj)
            if len(adj) < len(index):
                adj.extend([0.0] * (len(index) - len(adj)))
            for k, v in raw.items():
                i = index[k]
                if restarted:
                    adj[i] += v
                else:
                    p = prev.get(k)
                    if p is not None:
                        adj[i] += v - p
                    # a key seen for the first time without a restart starts at 0 increase
        else:
            adj = array("d", [0.0] * len(index))
        self._points.append(_Point(snap.timestamp, adj, restarted))
        self._prev_raw = raw
        self._prev_start = snap.start_time
        self.last = snap
        self.last_seen = snap.timestamp
        # Evict: keep the newest point at or before the window start as the baseline point.
        cutoff = snap.timestamp - self.window
        pts = self._points
        while len(pts) > 1 and pts[1].ts <= cutoff:
            pts.popleft()

    def stats(self) -> WindowStats | None:
        """Increases over the window; ``None`` until two snapshots have been observed."""
        if self._stats is None:
            self._stats = self._compute()
        return self._stats

    def _compute(self) -> WindowStats | None:
        pts = self._points
        if len(pts) < 2:
            return None
        first, last = pts[0], pts[-1]
        fa, la = first.adjusted, last.adjusted
        nfa = len(fa)

        def d(key: str) -> float | None:
            i = self._index.get(key)
            if i is None:
                return None
            return la[i] - (fa[i] if i < nfa else 0.0)

        seconds = last.ts - first.ts
        resets = sum(1 for p in list(pts)[1:] if p.restarted)
        snap = self.last
        assert snap is not None
        spec = self._spec is True
        drafts = d("drafts") or 0.0
        npos = len(snap.accepted_per_position)
        pos = tuple((d(f"pos:{i}") or 0.0) for i in range(npos))
        finished = {r: (d(f"finished:{r}") or 0.0) for r in snap.request_success}
        h = snap.generation_length
        gen_bounds: tuple[float, ...] = ()
        gen_buckets: tuple[float, ...] = ()
        gen_count = gen_sum = None
        if h is not None:
            gen_bounds = h.bounds
            gen_buckets = tuple((d(f"gen_le:{_fmt_bound(b)}") or 0.0) for b in h.bounds)
            gen_count = d("gen_count")
            gen_sum = d("gen_sum")
        return WindowStats(
            seconds=seconds,
            spec_decode=spec,
            drafts=drafts if spec else 0.0,
            draft_tokens=(d("draft_tokens") or 0.0) if spec else 0.0,
            accepted=(d("accepted") or 0.0) if spec else 0.0,
            accepted_per_position=pos if spec else (),
            generation_tokens=d("generation_tokens"),
            finished=finished,
            gen_bounds=gen_bounds,
            gen_buckets=gen_buckets,
            gen_count=gen_count,
            gen_sum=gen_sum,
            drafts_per_second=(drafts / seconds) if spec and seconds > 0 else None,
            pods=1,
            resets=resets,
        )


# --------------------------------------------------------------------------------------------------
# 3. Anomalies (pure functions)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnomalyThresholds:
    """Thresholds for :func:`detect_anomalies`. Defaults are documented per field.

    The ``min_*`` guards keep idle or lightly loaded engines from alarming: a check only runs when
    the window holds at least that much traffic (in the current window and in the baseline).
    """

    # Acceptance checks run only with >= this many draft tokens in the window (and in the baseline).
    min_draft_tokens: float = 200.0
    # "Near zero": acceptance rate at or below this while drafts flow (random draft head ≈ 1/vocab).
    near_zero_rate: float = 0.02
    # "Sharp drop": current < baseline * (1 - drop_relative) AND baseline - current >= drop_absolute.
    drop_relative: float = 0.35
    drop_absolute: float = 0.10
    # Early-stop checks run only with >= this many finished requests (window and baseline).
    min_finished_requests: float = 50.0
    # Length evidence: mean generated length <= length_ratio * baseline mean, OR the share of
    # requests with <= short_tokens generated tokens (histogram) grew by >= short_share_increase.
    length_ratio: float = 0.6
    short_tokens: float = 20.0
    short_share_increase: float = 0.20
    # Stop evidence (when finished_reason counters are exposed): stop/(stop+length) grew by >= this.
    stop_share_increase: float = 0.15


@dataclass(frozen=True, slots=True)
class Finding:
    """One anomaly. ``reason`` is a stable CamelCase code, ``message`` a one-line explanation."""

    reason: str
    message: str
    severity: str = "Warning"
    upstream: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()  # empty: the whole resource

    def as_dict(self) -> dict:
        out: dict = {"reason": self.reason, "severity": self.severity, "message": self.message}
        if self.upstream:
            out["upstream"] = list(self.upstream)
        if self.pods:
            out["pods"] = list(self.pods)
        return out


REASON_NEAR_ZERO = "SpecAcceptanceNearZero"
REASON_DROP = "SpecAcceptanceDrop"
REASON_EARLY_STOP = "EarlyStopShift"
ANOMALY_REASONS = (REASON_NEAR_ZERO, REASON_DROP, REASON_EARLY_STOP)


def detect_near_zero_acceptance(
    stats: WindowStats, thr: AnomalyThresholds = AnomalyThresholds()
) -> Finding | None:
    """Drafts flow but (almost) nothing is accepted: the draft/MTP head is broken or mismatched
    (wrong or missing MTP weights, a draft head from another checkpoint, a broken drafter path —
    e.g. vllm#49559: a DFlash drafter on Qwen3.6 with the V2 model runner in 0.25.1 accepts ~0 %).
    The CPU engine with dummy weights shows exactly this (acceptance 0 with MTP k=2)."""
    rate = stats.acceptance_rate
    if rate is None or stats.draft_tokens < thr.min_draft_tokens:
        return None
    if rate > thr.near_zero_rate:
        return None
    return Finding(
        reason=REASON_NEAR_ZERO,
        message=(
            f"speculative decoding accepts {rate:.1%} of {int(stats.draft_tokens)} draft tokens "
            f"(threshold {thr.near_zero_rate:.1%}): the MTP/draft head looks broken or does not "
            "match the target weights; drafting only costs compute, disable speculative decoding "
            "or fix the draft weights"
        ),
        upstream=("vllm#49559",),
    )


def detect_acceptance_drop(
    stats: WindowStats, baseline: WindowStats | None, thr: AnomalyThresholds = AnomalyThresholds()
) -> Finding | None:
    """Acceptance fell sharply compared with a baseline window (before a rollout, or earlier)."""
    if baseline is None:
        return None
    cur, base = stats.acceptance_rate, baseline.acceptance_rate
    if cur is None or base is None:
        return None
    if stats.draft_tokens < thr.min_draft_tokens or baseline.draft_tokens < thr.min_draft_tokens:
        return None
    if cur >= base * (1.0 - thr.drop_relative) or (base - cur) < thr.drop_absolute:
        return None
    return Finding(
        reason=REASON_DROP,
        message=(
            f"speculative-decoding acceptance dropped from {base:.1%} (baseline) to {cur:.1%} "
            f"over the last {stats.seconds:.0f}s; a changed image, draft head or config "
            "(e.g. prefix caching with MTP on a GDN hybrid) can corrupt drafting"
        ),
        upstream=("vllm#43559", "vllm#53912"),
    )


def detect_early_stop_shift(
    stats: WindowStats, baseline: WindowStats | None, thr: AnomalyThresholds = AnomalyThresholds()
) -> Finding | None:
    """Silent-corruption signal: generations got shorter and end on EOS/stop more often.

    The async spec-decode race (vllm PR #45100) and prefix caching + MTP on GDN hybrids
    (vllm#43559) corrupt the recurrent state without any error; the visible effect is requests that
    "end quickly with garbled text plus EOS". Needs a baseline window; both windows need
    ``min_finished_requests``. Fires when there is length evidence (mean length ratio or short-share
    increase) and, if finish reasons are exposed, stop evidence (stop share increase).
    """
    if baseline is None:
        return None
    n_cur, n_base = stats.finished_requests, baseline.finished_requests
    if not n_cur or not n_base:
        return None
    if n_cur < thr.min_finished_requests or n_base < thr.min_finished_requests:
        return None
    evidence: list[str] = []
    length_ok = False
    m_cur, m_base = stats.mean_generation_length, baseline.mean_generation_length
    if m_cur is not None and m_base is not None and m_base > 0 and m_cur <= thr.length_ratio * m_base:
        length_ok = True
        evidence.append(f"mean generated length {m_base:.1f} -> {m_cur:.1f} tokens")
    s_cur, s_base = stats.short_share(thr.short_tokens), baseline.short_share(thr.short_tokens)
    if s_cur is not None and s_base is not None and s_cur - s_base >= thr.short_share_increase:
        length_ok = True
        evidence.append(
            f"requests with <= {thr.short_tokens:g} generated tokens {s_base:.0%} -> {s_cur:.0%}"
        )
    if not length_ok:
        return None
    st_cur, st_base = stats.stop_share, baseline.stop_share
    if st_cur is not None and st_base is not None:
        if st_cur - st_base < thr.stop_share_increase:
            return None
        evidence.append(f"finished on stop/EOS {st_base:.0%} -> {st_cur:.0%}")
    return Finding(
        reason=REASON_EARLY_STOP,
        message=(
            "generation shifted toward early stops (" + "; ".join(evidence) + "): possible silent "
            "state corruption in spec decode on a GDN hybrid; compare outputs, try "
            "--no-async-scheduling or disable MTP"
        ),
        upstream=("vllm#45100", "vllm#43559"),
    )


def detect_anomalies(
    stats: WindowStats,
    baseline: WindowStats | None = None,
    thr: AnomalyThresholds = AnomalyThresholds(),
) -> list[Finding]:
    """All checks on one window (pod or resource). Near-zero supersedes the drop check."""
    out: list[Finding] = []
    nz = detect_near_zero_acceptance(stats, thr)
    if nz is not None:
        out.append(nz)
    else:
        drop = detect_acceptance_drop(stats, baseline, thr)
        if drop is not None:
            out.append(drop)
    es = detect_early_stop_shift(stats, baseline, thr)
    if es is not None:
        out.append(es)
    return out


# --------------------------------------------------------------------------------------------------
# 4. Tracker (per pod windows, per resource aggregation, CR status, gauges)
# --------------------------------------------------------------------------------------------------


class PodKey(NamedTuple):
    namespace: str
    name: str  # the GDNModelServer
    pod: str


@dataclass(frozen=True, slots=True)
class Baseline:
    stats: WindowStats
    captured_at: float
    source: str  # "auto" or "manual"


@dataclass(slots=True)
class _PodState:
    window: PodWindow
    error: str | None = None  # last scrape error reason (timeout/connect/http/parse)
    error_message: str = ""
    error_at: float = 0.0


def _r(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


class AcceptanceTracker:
    """Sliding-window acceptance per pod, aggregated per GDNModelServer.

    Usage (one timer per operator, see gdn_operator.watch.scraper)::

        tracker = AcceptanceTracker(window=300)
        for r in await scrape_many(targets, timeout=5, concurrency=64):
            tracker.observe_result(r)          # or observe(key, snapshot) / record_error(key, ...)
        tracker.retain(ns, name, live_pod_names)   # forget pods that disappeared
        status = tracker.summary(ns, name)         # -> dict for .status.acceptance
        tracker.update_gauges(ns, name)

    Baselines for the drop / early-stop checks: the first full window with enough traffic and no
    findings is captured automatically and refreshed every ``baseline_max_age`` seconds while
    healthy; :meth:`mark_baseline` captures one explicitly (call it right before a rollout).
    """

    def __init__(
        self,
        window: float = 300.0,
        *,
        max_points: int = 512,
        thresholds: AnomalyThresholds | None = None,
        baseline_max_age: float = 3600.0,
        stale_after: float | None = None,
        clock=time.time,
    ):
        if window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        self.window = float(window)
        self.max_points = max_points
        self.thresholds = thresholds or AnomalyThresholds()
        self.baseline_max_age = baseline_max_age
        self.stale_after = stale_after if stale_after is not None else 2.0 * self.window
        self._clock = clock
        # (namespace, name) -> pod -> state
        self._pods: dict[tuple[str, str], dict[str, _PodState]] = {}
        self._baselines: dict[tuple[str, str], Baseline] = {}
        self._gauge_labels: dict[tuple[str, str], dict[str, set]] = {}
        self._findings: dict[tuple[str, str], list[Finding]] = {}
        self._evaluated: set[tuple[str, str]] = set()  # findings current (no observation since)

    # --- input ----------------------------------------------------------------------------------
    def _state(self, key: PodKey) -> _PodState:
        pods = self._pods.setdefault((key[0], key[1]), {})
        st = pods.get(key[2])
        if st is None:
            st = pods[key[2]] = _PodState(PodWindow(self.window, self.max_points))
        return st

    def observe(self, key: PodKey | tuple[str, str, str], snapshot: EngineSnapshot) -> None:
        st = self._state(PodKey(*key))
        st.window.observe(snapshot)
        self._evaluated.discard((key[0], key[1]))
        st.error = None
        st.error_message = ""

    def record_error(self, key: PodKey | tuple[str, str, str], reason: str, message: str = "") -> None:
        st = self._state(PodKey(*key))
        st.error = reason
        st.error_message = message
        st.error_at = self._clock()

    def observe_result(self, result) -> None:
        """Feed one ``scraper.ScrapeResult`` (snapshot on success, error reason otherwise)."""
        key = result.target.key
        if result.snapshot is not None:
            self.observe(key, result.snapshot)
        else:
            self.record_error(key, result.error or "connect", result.message)

    # --- forgetting -----------------------------------------------------------------------------
    def forget(self, key: PodKey | tuple[str, str, str]) -> None:
        ns, name, pod = key
        pods = self._pods.get((ns, name))
        self._evaluated.discard((ns, name))
        if pods is not None:
            pods.pop(pod, None)
            if not pods:
                del self._pods[(ns, name)]

    def retain(self, namespace: str, name: str, pods: Iterable[str]) -> list[str]:
        """Keep only ``pods`` for this resource; returns the pod names forgotten."""
        keep = set(pods)
        cur = self._pods.get((namespace, name), {})
        gone = [p for p in cur if p not in keep]
        if gone:
            self._evaluated.discard((namespace, name))
        for p in gone:
            del cur[p]
        if not cur:
            self._pods.pop((namespace, name), None)
        return gone

    def forget_resource(self, namespace: str, name: str) -> None:
        """Drop all state of a deleted resource, including its gauge label sets."""
        self._pods.pop((namespace, name), None)
        self._findings.pop((namespace, name), None)
        self._evaluated.discard((namespace, name))
        self._baselines.pop((namespace, name), None)
        self._clear_gauges(namespace, name)

    def prune(self, now: float | None = None) -> list[PodKey]:
        """Forget pods with no successful scrape for ``stale_after`` seconds."""
        now = self._clock() if now is None else now
        out = []
        for (ns, name), pods in list(self._pods.items()):
            for pod, st in list(pods.items()):
                seen = st.window.last_seen or st.error_at
                if now - seen > self.stale_after:
                    del pods[pod]
                    self._evaluated.discard((ns, name))
                    out.append(PodKey(ns, name, pod))
            if not pods:
                del self._pods[(ns, name)]
        return out

    def resources(self) -> list[tuple[str, str]]:
        return list(self._pods)

    def pods(self, namespace: str, name: str) -> list[str]:
        return list(self._pods.get((namespace, name), {}))

    # --- statistics -----------------------------------------------------------------------------
    def pod_stats(self, key: PodKey | tuple[str, str, str]) -> WindowStats | None:
        ns, name, pod = key
        st = self._pods.get((ns, name), {}).get(pod)
        return None if st is None else st.window.stats()

    def window_stats(self, namespace: str, name: str) -> WindowStats | None:
        """Window increases summed over the resource's pods (None until a pod has 2 scrapes)."""
        pods = self._pods.get((namespace, name), {})
        return WindowStats.combine(
            s for s in (st.window.stats() for st in pods.values()) if s is not None
        )

    def baseline(self, namespace: str, name: str) -> Baseline | None:
        return self._baselines.get((namespace, name))

    def mark_baseline(self, namespace: str, name: str) -> bool:
        """Capture the current window as the baseline (e.g. right before a rollout)."""
        stats = self.window_stats(namespace, name)
        if stats is None:
            return False
        self._baselines[(namespace, name)] = Baseline(stats, self._clock(), "manual")
        return True

    def _pod_near_zero(self, namespace: str, name: str) -> Finding | None:
        bad: list[tuple[str, WindowStats]] = []
        for pod, st in sorted(self._pods.get((namespace, name), {}).items()):
            s = st.window.stats()
            if s is not None and detect_near_zero_acceptance(s, self.thresholds) is not None:
                bad.append((pod, s))
        if not bad:
            return None
        names = tuple(p for p, _ in bad)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return Finding(
            reason=REASON_NEAR_ZERO,
            message=(
                f"{len(names)} pod(s) accept (almost) no draft tokens while drafting ({shown}): "
                "their MTP/draft head looks broken or mismatched"
            ),
            upstream=("vllm#49559",),
            pods=names[:20],
        )

    def evaluate(self, namespace: str, name: str) -> list[Finding]:
        """Run the anomaly checks for a resource; maintains the automatic baseline."""
        stats = self.window_stats(namespace, name)
        key = (namespace, name)
        if stats is None:
            self._findings.pop(key, None)
            self._evaluated.add(key)
            return []
        base = self._baselines.get(key)
        findings = detect_anomalies(stats, base.stats if base else None, self.thresholds)
        if not any(f.reason == REASON_NEAR_ZERO for f in findings):
            pod_nz = self._pod_near_zero(namespace, name)
            if pod_nz is not None:
                findings.insert(0, pod_nz)
        now = self._clock()
        thr = self.thresholds
        enough = (
            stats.seconds >= 0.9 * self.window
            and (
                stats.draft_tokens >= thr.min_draft_tokens
                or (stats.finished_requests or 0.0) >= thr.min_finished_requests
            )
        )
        if not findings and enough and (
            base is None or (base.source == "auto" and now - base.captured_at >= self.baseline_max_age)
        ):
            self._baselines[key] = Baseline(stats, now, "auto")
        self._findings[key] = findings
        self._evaluated.add(key)
        return findings

    def last_findings(self, namespace: str, name: str) -> list[Finding]:
        """Findings of the last :meth:`evaluate` / :meth:`summary` call (no re-evaluation)."""
        return list(self._findings.get((namespace, name), ()))

    def summary(self, namespace: str, name: str) -> dict:
        """CR-status dict (camelCase). ``None`` values mean unknown / not applicable.

        Keys: state (NoData | WarmingUp | NotApplicable | NoTraffic | Ok | Degraded), window,
        observedSeconds, acceptanceRate, meanAcceptedLength, perPosition, draftsPerSecond, drafts,
        draftTokens, acceptedTokens, meanGenerationLength, stopShare, counterResets, pods{total,
        reporting, specDecode, notApplicable, warmingUp, scrapeErrors, errorsByReason},
        baselineAcceptanceRate, findings[{reason, severity, message, upstream, pods}].
        """
        pods = self._pods.get((namespace, name), {})
        counts: dict[str, Any] = {"total": len(pods), "reporting": 0, "specDecode": 0, "notApplicable": 0,
                  "warmingUp": 0, "scrapeErrors": 0}
        errors: dict[str, int] = {}
        for st in pods.values():
            if st.error is not None:
                counts["scrapeErrors"] += 1
                errors[st.error] = errors.get(st.error, 0) + 1
            w = st.window
            if w.last is None:
                continue
            if len(w) < 2:
                counts["warmingUp"] += 1
                continue
            counts["reporting"] += 1
            if w.last.spec_decode_enabled:
                counts["specDecode"] += 1
            else:
                counts["notApplicable"] += 1
        counts["errorsByReason"] = errors
        stats = self.window_stats(namespace, name)
        findings = self.evaluate(namespace, name)
        base = self._baselines.get((namespace, name))
        out: dict = {
            "window": f"{self.window:g}s",
            "observedSeconds": _r(stats.seconds, 1) if stats else None,
            "acceptanceRate": None,
            "meanAcceptedLength": None,
            "perPosition": None,
            "draftsPerSecond": None,
            "drafts": None,
            "draftTokens": None,
            "acceptedTokens": None,
            "meanGenerationLength": _r(stats.mean_generation_length, 2) if stats else None,
            "stopShare": _r(stats.stop_share) if stats else None,
            "counterResets": stats.resets if stats else 0,
            "pods": counts,
            "baselineAcceptanceRate": _r(base.stats.acceptance_rate) if base else None,
            "findings": [f.as_dict() for f in findings],
        }
        if stats is None:
            out["state"] = "WarmingUp" if counts["warmingUp"] else "NoData"
            return out
        if not stats.spec_decode:
            out["state"] = "NotApplicable"
            return out
        pp = stats.per_position
        out.update(
            acceptanceRate=_r(stats.acceptance_rate),
            meanAcceptedLength=_r(stats.mean_accepted_length),
            perPosition=[_r(v) for v in pp] if pp is not None else None,
            draftsPerSecond=_r(stats.drafts_per_second, 3),
            drafts=int(stats.drafts),
            draftTokens=int(stats.draft_tokens),
            acceptedTokens=int(stats.accepted),
        )
        if findings:
            out["state"] = "Degraded"
        elif stats.draft_tokens <= 0:
            out["state"] = "NoTraffic"
        else:
            out["state"] = "Ok"
        return out

    # --- telemetry ------------------------------------------------------------------------------
    def update_gauges(self, namespace: str, name: str) -> None:
        """Set gdn_spec_* gauges for this resource; removes label sets that no longer apply.

        ``gdn_spec_anomaly{reason}`` is 0/1 per known reason; findings are (re-)evaluated here if
        an observation arrived since the last :meth:`summary` / :meth:`evaluate`, so the call
        order within a round does not matter.
        """
        from gdn_operator import telemetry as t

        if (namespace, name) not in self._evaluated:
            self.evaluate(namespace, name)
        seen: dict[str, set] = {"pos": set(), "pod": set(), "res": set(), "anomaly": set()}
        stats = self.window_stats(namespace, name)
        if stats is not None and stats.spec_decode:
            active = {f.reason for f in self._findings.get((namespace, name), ())}
            for reason in ANOMALY_REASONS:
                t.SPEC_ANOMALY.labels(namespace, name, reason).set(1.0 if reason in active else 0.0)
                seen["anomaly"].add(reason)
            for gauge, val in (
                (t.ACCEPTANCE_RATE, stats.acceptance_rate),
                (t.MEAN_ACCEPTED_LENGTH, stats.mean_accepted_length),
                (t.DRAFTS_PER_SECOND, stats.drafts_per_second),
            ):
                if val is not None:
                    gauge.labels(namespace, name).set(val)
                    seen["res"].add(gauge._name)
            for i, v in enumerate(stats.per_position or ()):
                t.ACCEPTANCE_PER_POSITION.labels(namespace, name, str(i)).set(v)
                seen["pos"].add(str(i))
        for pod, st in self._pods.get((namespace, name), {}).items():
            s = st.window.stats()
            rate = s.acceptance_rate if s is not None else None
            if rate is not None:
                t.POD_ACCEPTANCE_RATE.labels(namespace, name, pod).set(rate)
                seen["pod"].add(pod)
        prev = self._gauge_labels.get(
            (namespace, name), {"pos": set(), "pod": set(), "res": set(), "anomaly": set()})
        for r in prev["anomaly"] - seen["anomaly"]:
            _remove(t.SPEC_ANOMALY, namespace, name, r)
        for gauge in (t.ACCEPTANCE_RATE, t.MEAN_ACCEPTED_LENGTH, t.DRAFTS_PER_SECOND):
            if gauge._name in prev["res"] and gauge._name not in seen["res"]:
                _remove(gauge, namespace, name)
        for p in prev["pos"] - seen["pos"]:
            _remove(t.ACCEPTANCE_PER_POSITION, namespace, name, p)
        for p in prev["pod"] - seen["pod"]:
            _remove(t.POD_ACCEPTANCE_RATE, namespace, name, p)
        self._gauge_labels[(namespace, name)] = seen

    def _clear_gauges(self, namespace: str, name: str) -> None:
        from gdn_operator import telemetry as t

        prev = self._gauge_labels.pop((namespace, name), None)
        if not prev:
            return
        for gauge in (t.ACCEPTANCE_RATE, t.MEAN_ACCEPTED_LENGTH, t.DRAFTS_PER_SECOND):
            if gauge._name in prev["res"]:
                _remove(gauge, namespace, name)
        for p in prev["pos"]:
            _remove(t.ACCEPTANCE_PER_POSITION, namespace, name, p)
        for p in prev["pod"]:
            _remove(t.POD_ACCEPTANCE_RATE, namespace, name, p)
        for r in prev["anomaly"]:
            _remove(t.SPEC_ANOMALY, namespace, name, r)


def _remove(gauge, *labels: str) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
