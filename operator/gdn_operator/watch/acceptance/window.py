"""Windows: counter increases of one pod over a sliding time window, and their sums over pods.

:class:`PodWindow` keeps a bounded sliding window of the :class:`~.parse.EngineSnapshot` s of one pod,
with counter-reset handling (an engine restart), and yields a :class:`WindowStats`: the increase of
every counter over the window, plus the figures derived from them. :meth:`WindowStats.combine` sums
the windows of a resource's pods (acceptance of the sum, not the mean of per-pod acceptances).

Formulas (the PromQL of vLLM's ``SpecDecodingProm`` docstring, over a window instead of ``rate()``):
    acceptance rate       = Δaccepted_tokens / Δdraft_tokens
    mean accepted length  = 1 + Δaccepted_tokens / Δdrafts
    per-position rate[i]  = Δaccepted_tokens_per_pos[i] / Δdrafts
    drafts per second     = Δdrafts / observed seconds
A figure whose denominator is 0 (no traffic in the window) is ``None``, never 0 and never an error.
A pod without spec-decode counters (speculative decoding off) is "not applicable", not 0.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gdn_operator.watch.acceptance.parse import EngineSnapshot, bucket_key, finished_key, position_key

__all__ = ["PodWindow", "WindowStats", "window_since_start"]


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
        for b, c in zip(self.gen_bounds, self.gen_buckets, strict=True):
            if b <= max_tokens:
                best = c
        if best is None:
            return None
        return best / self.gen_count

    @staticmethod
    def combine(stats: Iterable[WindowStats]) -> WindowStats | None:
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
            gen_buckets = tuple(sum(col) for col in zip(*(s.gen_buckets for s in items), strict=True))
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
    adjusted: array[float]  # reset-adjusted cumulative counters, indexed by PodWindow._index
    restarted: bool


class PodWindow:
    """Sliding window over the snapshots of one pod, with counter-reset handling.

    Internally every counter is turned into a reset-adjusted cumulative value ("increase since
    tracking began"): when a counter goes down or the engine's ``_created`` timestamp changes, the
    engine restarted and the new raw value counts as the increase since the restart. The window
    increase is then ``adjusted[last] - adjusted[first]``: O(1), never negative. Memory per pod is
    bounded by ``max_points`` points of one ``array('d')`` each.
    """

    __slots__ = ("window", "_points", "_index", "_prev_raw", "_prev_start", "_spec", "last", "last_seen", "_stats")

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
            if snap.start_time is not None and self._prev_start is not None and abs(snap.start_time - self._prev_start) > 1e-3:
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
        snap = self.last  # set by every observe() that added a point
        if len(pts) < 2 or snap is None:
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
        spec = self._spec is True
        drafts = d("drafts") or 0.0
        npos = len(snap.accepted_per_position)
        pos = tuple((d(position_key(i)) or 0.0) for i in range(npos))
        finished = {r: (d(finished_key(r)) or 0.0) for r in snap.request_success}
        h = snap.generation_length
        gen_bounds: tuple[float, ...] = ()
        gen_buckets: tuple[float, ...] = ()
        gen_count = gen_sum = None
        if h is not None:
            gen_bounds = h.bounds
            gen_buckets = tuple((d(bucket_key(b)) or 0.0) for b in h.bounds)
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


def window_since_start(snap: EngineSnapshot, window: float = 3600.0) -> PodWindow:
    """The window from an engine that had served nothing until `snap` (a zero snapshot of the same process at
    t=0, then `snap`): its figures are `snap`'s raw counters. For captures read after the fact (GPU benches,
    their CPU tests), where no earlier scrape exists."""
    w = PodWindow(window=window)
    w.observe(
        EngineSnapshot(
            timestamp=0.0,
            num_drafts=0.0,
            num_draft_tokens=0.0,
            num_accepted_tokens=0.0,
            accepted_per_position=(0.0,) * len(snap.accepted_per_position),
            generation_tokens=0.0,
            start_time=snap.start_time,
            engines=1,
        )
    )
    w.observe(snap)
    return w
