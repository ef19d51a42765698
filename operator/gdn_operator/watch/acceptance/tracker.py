"""Tracker: per-pod windows keyed by ``(target, pod)`` (watch/target.py), summed per target (a GDNModelServer or
a guarded workload), with the resource's baseline, its findings, the CR-status dict and the gauges.

What changes the tracker's state, and what only reads it:

* input — :meth:`AcceptanceTracker.observe` / :meth:`~AcceptanceTracker.record_error` /
  :meth:`~AcceptanceTracker.observe_result` (one scrape of one pod);
* forgetting — :meth:`~AcceptanceTracker.retain`, :meth:`~AcceptanceTracker.forget`,
  :meth:`~AcceptanceTracker.forget_resource`, :meth:`~AcceptanceTracker.prune`;
* baselines — :meth:`~AcceptanceTracker.update_baseline` (automatic, once per scrape round, after
  the round's observations) and :meth:`~AcceptanceTracker.mark_baseline` (explicit, e.g. right
  before a rollout);
* gauges — :meth:`~AcceptanceTracker.update_gauges` writes the ``gdn_spec_*`` gauges (``gauges.py``);
* reads, which change nothing — :meth:`~AcceptanceTracker.window_stats`,
  :meth:`~AcceptanceTracker.pod_stats`, :meth:`~AcceptanceTracker.findings`,
  :meth:`~AcceptanceTracker.baseline`, :meth:`~AcceptanceTracker.summary`, ``resources`` / ``pods``.

Findings are a function of the windows and the baseline in force (``anomalies.py``); they are
computed when read, so every read in a round sees the same ones whatever the call order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gdn_operator.watch.acceptance.anomalies import AnomalyThresholds, Finding, detect_resource_anomalies
from gdn_operator.watch.acceptance.gauges import AcceptanceGauges
from gdn_operator.watch.acceptance.parse import EngineSnapshot
from gdn_operator.watch.acceptance.window import PodWindow, WindowStats
from gdn_operator.watch.target import EngineTarget

__all__ = ["AcceptanceTracker", "Baseline", "PodKey"]


class PodKey(NamedTuple):
    target: EngineTarget  # the GDNModelServer or guarded workload
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
    """Sliding-window acceptance per pod, aggregated per target (a GDNModelServer or a guarded workload:
    watch/target.py's EngineTarget, kind included, so same-named targets of two kinds never share windows).

    Usage (one supervisor per operator, see gdn_operator.handlers.engines.acceptance.scrape_round)::

        tracker = AcceptanceTracker(window=300)
        tracker.retain(target, live_pod_names)     # forget pods that disappeared
        for r in await scraper.scrape(targets):
            tracker.observe_result(r)          # or observe(key, snapshot) / record_error(key, ...)
        tracker.update_baseline(target)            # once per round, after its observations
        tracker.update_gauges(target)
        status = tracker.summary(target)           # -> dict for .status.acceptance (a pure read)

    Baselines for the drop / early-stop checks: :meth:`update_baseline` captures the first full
    window with enough traffic and no findings, and refreshes it every ``baseline_max_age`` seconds
    while healthy; :meth:`mark_baseline` captures one explicitly (call it right before a rollout).
    """

    def __init__(
        self,
        window: float = 300.0,
        *,
        max_points: int = 512,
        thresholds: AnomalyThresholds | None = None,
        baseline_max_age: float = 3600.0,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        if window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {window}")
        self.window = float(window)
        self.max_points = max_points
        self.thresholds = thresholds or AnomalyThresholds()
        self.baseline_max_age = baseline_max_age
        self.stale_after = stale_after if stale_after is not None else 2.0 * self.window
        self._clock = clock
        # target -> pod -> state
        self._pods: dict[EngineTarget, dict[str, _PodState]] = {}
        self._baselines: dict[EngineTarget, Baseline] = {}
        self._gauges = AcceptanceGauges()

    # --- input ----------------------------------------------------------------------------------
    def _state(self, key: PodKey) -> _PodState:
        pods = self._pods.setdefault(key.target, {})
        st = pods.get(key.pod)
        if st is None:
            st = pods[key.pod] = _PodState(PodWindow(self.window, self.max_points))
        return st

    def observe(self, key: PodKey | tuple[EngineTarget, str], snapshot: EngineSnapshot) -> None:
        st = self._state(PodKey(*key))
        st.window.observe(snapshot)
        st.error = None
        st.error_message = ""

    def record_error(self, key: PodKey | tuple[EngineTarget, str], reason: str, message: str = "") -> None:
        st = self._state(PodKey(*key))
        st.error = reason
        st.error_message = message
        st.error_at = self._clock()

    def observe_result(self, result: Any) -> None:
        """Feed one ``scraper.ScrapeResult`` (snapshot on success, error reason otherwise)."""
        key = result.target.key
        if result.snapshot is not None:
            self.observe(key, result.snapshot)
        else:
            self.record_error(key, result.error or "connect", result.message)

    # --- forgetting -----------------------------------------------------------------------------
    def forget(self, key: PodKey | tuple[EngineTarget, str]) -> None:
        target, pod = key
        pods = self._pods.get(target)
        if pods is not None:
            pods.pop(pod, None)
            if not pods:
                del self._pods[target]

    def retain(self, target: EngineTarget, pods: Iterable[str]) -> list[str]:
        """Keep only ``pods`` for this resource; returns the pod names forgotten."""
        keep = set(pods)
        cur = self._pods.get(target, {})
        gone = [p for p in cur if p not in keep]
        for p in gone:
            del cur[p]
        if not cur:
            self._pods.pop(target, None)
        return gone

    def forget_resource(self, target: EngineTarget) -> None:
        """Drop all state of a deleted resource, including its gauge label sets."""
        self._pods.pop(target, None)
        self._baselines.pop(target, None)
        self._gauges.clear(target)

    def prune(self, now: float | None = None) -> list[PodKey]:
        """Forget pods with no successful scrape for ``stale_after`` seconds."""
        now = self._clock() if now is None else now
        out = []
        for target, pods in list(self._pods.items()):
            for pod, st in list(pods.items()):
                seen = st.window.last_seen or st.error_at
                if now - seen > self.stale_after:
                    del pods[pod]
                    out.append(PodKey(target, pod))
            if not pods:
                del self._pods[target]
        return out

    def resources(self) -> list[EngineTarget]:
        return list(self._pods)

    def pods(self, target: EngineTarget) -> list[str]:
        return list(self._pods.get(target, {}))

    # --- statistics -----------------------------------------------------------------------------
    def pod_stats(self, key: PodKey | tuple[EngineTarget, str]) -> WindowStats | None:
        target, pod = key
        st = self._pods.get(target, {}).get(pod)
        return None if st is None else st.window.stats()

    def _windows(self, target: EngineTarget) -> tuple[WindowStats | None, list[tuple[str, WindowStats | None]]]:
        """The resource's summed window and its pods' own windows ((pod, stats) pairs)."""
        pod_windows = [(pod, st.window.stats()) for pod, st in self._pods.get(target, {}).items()]
        return WindowStats.combine(s for _, s in pod_windows if s is not None), pod_windows

    def window_stats(self, target: EngineTarget) -> WindowStats | None:
        """Window increases summed over the resource's pods (None until a pod has 2 scrapes)."""
        return self._windows(target)[0]

    def findings(self, target: EngineTarget) -> list[Finding]:
        """The resource's anomalies now: its summed window against its baseline, and each pod's own
        window for near-zero acceptance (``anomalies.detect_resource_anomalies``). Changes nothing."""
        stats, pod_windows = self._windows(target)
        return self._findings(target, stats, pod_windows)

    def _findings(
        self, target: EngineTarget, stats: WindowStats | None, pod_windows: list[tuple[str, WindowStats | None]]
    ) -> list[Finding]:
        if stats is None:
            return []
        base = self._baselines.get(target)
        return detect_resource_anomalies(stats, pod_windows, base.stats if base else None, self.thresholds)

    # --- baselines ------------------------------------------------------------------------------
    def baseline(self, target: EngineTarget) -> Baseline | None:
        return self._baselines.get(target)

    def mark_baseline(self, target: EngineTarget) -> bool:
        """Capture the current window as the baseline (e.g. right before a rollout)."""
        stats = self.window_stats(target)
        if stats is None:
            return False
        self._baselines[target] = Baseline(stats, self._clock(), "manual")
        return True

    def update_baseline(self, target: EngineTarget) -> Baseline | None:
        """Maintain the automatic baseline of a resource; returns the baseline in force.

        The current window becomes the baseline when it covers at least 90 % of ``window`` seconds,
        holds enough traffic (``min_draft_tokens`` draft tokens or ``min_finished_requests`` finished
        requests) and has no findings, and there is no baseline yet or the one in force is an
        automatic one at least ``baseline_max_age`` seconds old (a manual one is kept). Call it once
        per scrape round, after that round's observations.
        """
        key = target
        stats, pod_windows = self._windows(target)
        base = self._baselines.get(key)
        if stats is None or self._findings(target, stats, pod_windows):
            return base
        thr = self.thresholds
        enough = stats.seconds >= 0.9 * self.window and (
            stats.draft_tokens >= thr.min_draft_tokens or (stats.finished_requests or 0.0) >= thr.min_finished_requests
        )
        now = self._clock()
        if enough and (base is None or (base.source == "auto" and now - base.captured_at >= self.baseline_max_age)):
            base = self._baselines[key] = Baseline(stats, now, "auto")
        return base

    # --- status ---------------------------------------------------------------------------------
    def summary(self, target: EngineTarget) -> dict[str, Any]:
        """CR-status dict (camelCase). ``None`` values mean unknown / not applicable. A pure read.

        Keys: state (NoData | WarmingUp | NotApplicable | NoTraffic | Ok | Degraded), window,
        observedSeconds, acceptanceRate, meanAcceptedLength, perPosition, draftsPerSecond, drafts,
        draftTokens, acceptedTokens, meanGenerationLength, stopShare, counterResets, pods{total,
        reporting, specDecode, notApplicable, warmingUp, scrapeErrors, errorsByReason},
        baselineAcceptanceRate, findings[{reason, severity, message, upstream, pods}].
        """
        pods = self._pods.get(target, {})
        counts: dict[str, Any] = {
            "total": len(pods),
            "reporting": 0,
            "specDecode": 0,
            "notApplicable": 0,
            "warmingUp": 0,
            "scrapeErrors": 0,
        }
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
        stats, pod_windows = self._windows(target)
        findings = self._findings(target, stats, pod_windows)
        base = self._baselines.get(target)
        out: dict[str, Any] = {
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
    def update_gauges(self, target: EngineTarget) -> None:
        """Set the gdn_spec_* gauges for this resource from its windows and current findings; removes
        label sets that no longer apply (``gauges.AcceptanceGauges``)."""
        stats, pod_windows = self._windows(target)
        reasons = [f.reason for f in self._findings(target, stats, pod_windows)]
        self._gauges.publish(target, stats, pod_windows, reasons)
