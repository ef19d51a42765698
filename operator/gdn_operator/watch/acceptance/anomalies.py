"""Anomalies: pure functions over :class:`~.window.WindowStats` that return :class:`Finding` s.

* :func:`detect_near_zero_acceptance` — drafts flow, (almost) nothing is accepted (SpecAcceptanceNearZero);
* :func:`detect_acceptance_drop` — acceptance fell sharply against a baseline window (SpecAcceptanceDrop);
* :func:`detect_early_stop_shift` — generations got shorter and end on stop/EOS more often (EarlyStopShift);
* :func:`detect_anomalies` runs all three on one window (pod or resource);
* :func:`detect_pod_near_zero` and :func:`detect_resource_anomalies` add the per-pod near-zero check, so
  one broken pod among healthy ones is not hidden by the resource's aggregate.

Thresholds are :class:`AnomalyThresholds`; nothing here keeps state or reads a clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gdn_operator.watch.acceptance.window import WindowStats

__all__ = [
    "ANOMALY_REASONS",
    "AnomalyThresholds",
    "Finding",
    "REASON_DROP",
    "REASON_EARLY_STOP",
    "REASON_NEAR_ZERO",
    "detect_acceptance_drop",
    "detect_anomalies",
    "detect_early_stop_shift",
    "detect_near_zero_acceptance",
    "detect_pod_near_zero",
    "detect_resource_anomalies",
]


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

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "severity": self.severity, "message": self.message}
        if self.upstream:
            out["upstream"] = list(self.upstream)
        if self.pods:
            out["pods"] = list(self.pods)
        return out


REASON_NEAR_ZERO = "SpecAcceptanceNearZero"
REASON_DROP = "SpecAcceptanceDrop"
REASON_EARLY_STOP = "EarlyStopShift"
ANOMALY_REASONS = (REASON_NEAR_ZERO, REASON_DROP, REASON_EARLY_STOP)


def detect_near_zero_acceptance(stats: WindowStats, thr: AnomalyThresholds = AnomalyThresholds()) -> Finding | None:
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
        evidence.append(f"requests with <= {thr.short_tokens:g} generated tokens {s_base:.0%} -> {s_cur:.0%}")
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


def detect_pod_near_zero(
    pod_stats: Iterable[tuple[str, WindowStats | None]], thr: AnomalyThresholds = AnomalyThresholds()
) -> Finding | None:
    """One finding naming every pod whose own window is near zero (``pod_stats``: (pod, window) pairs,
    a pod without a window yet has ``None``); ``None`` when no pod is."""
    bad = [
        pod
        for pod, s in sorted(pod_stats, key=lambda ps: ps[0])
        if s is not None and detect_near_zero_acceptance(s, thr) is not None
    ]
    if not bad:
        return None
    names = tuple(bad)
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


def detect_resource_anomalies(
    stats: WindowStats,
    pod_stats: Iterable[tuple[str, WindowStats | None]],
    baseline: WindowStats | None = None,
    thr: AnomalyThresholds = AnomalyThresholds(),
) -> list[Finding]:
    """:func:`detect_anomalies` on a resource's summed window, plus :func:`detect_pod_near_zero`
    (listed first) when the sum itself is not near zero."""
    findings = detect_anomalies(stats, baseline, thr)
    if not any(f.reason == REASON_NEAR_ZERO for f in findings):
        pod_nz = detect_pod_near_zero(pod_stats, thr)
        if pod_nz is not None:
            findings.insert(0, pod_nz)
    return findings
