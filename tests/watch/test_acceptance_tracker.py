"""The tracker's contract after the split of watch/acceptance (issue 12): reads (summary, findings,
window_stats, update_gauges) never change a baseline; update_baseline is the one place the automatic
baseline is captured or refreshed; the gdn_spec_* label sets follow the windows; the per-pod near-zero
check (vllm#49559) as a pure function."""

from __future__ import annotations

import pytest

from gdn_operator import telemetry
from gdn_operator.watch.acceptance import (
    AcceptanceTracker,
    EngineSnapshot,
    WindowStats,
    detect_pod_near_zero,
    detect_resource_anomalies,
)
from gdn_operator.watch.target import EngineTarget


def spec(ts: float, drafts: float, draft_tokens: float, accepted: float) -> EngineSnapshot:
    return EngineSnapshot(
        timestamp=ts,
        num_drafts=drafts,
        num_draft_tokens=draft_tokens,
        num_accepted_tokens=accepted,
        accepted_per_position=(accepted * 0.75, accepted * 0.25),
        engines=1,
    )


def plain(ts: float, gen: float) -> EngineSnapshot:
    """Speculative decoding off: no spec-decode counters at all."""
    return EngineSnapshot(timestamp=ts, generation_tokens=gen, engines=1)


def feed(tr: AcceptanceTracker, key, t0: float, n: int, rate: float, step: float = 15.0) -> float:
    """n scrapes every ``step`` s; per scrape +100 drafts, +200 draft tokens, +200*rate accepted."""
    for i in range(n):
        tr.observe(key, spec(t0 + i * step, 100.0 * i, 200.0 * i, 200.0 * rate * i))
    return t0 + (n - 1) * step


def test_reads_never_capture_a_baseline_update_baseline_does():
    now = [0.0]
    tr = AcceptanceTracker(window=60, clock=lambda: now[0])
    now[0] = feed(tr, (EngineTarget.server("ns", "m"), "p0"), 0.0, 6, rate=0.6)  # 75 s of healthy traffic: a full window
    first = tr.summary(EngineTarget.server("ns", "m"))
    assert first["state"] == "Ok" and first["acceptanceRate"] == pytest.approx(0.6)
    for _ in range(3):
        assert tr.summary(EngineTarget.server("ns", "m")) == first
        assert tr.findings(EngineTarget.server("ns", "m")) == []
        tr.update_gauges(EngineTarget.server("ns", "m"))
        tr.window_stats(EngineTarget.server("ns", "m"))
    assert tr.baseline(EngineTarget.server("ns", "m")) is None and first["baselineAcceptanceRate"] is None
    base = tr.update_baseline(EngineTarget.server("ns", "m"))
    assert base is not None and base is tr.baseline(EngineTarget.server("ns", "m"))
    assert (base.source, base.captured_at) == ("auto", now[0])
    assert base.stats.acceptance_rate == pytest.approx(0.6)
    assert tr.summary(EngineTarget.server("ns", "m"))["baselineAcceptanceRate"] == pytest.approx(0.6)
    tr.forget_resource(EngineTarget.server("ns", "m"))


def test_update_baseline_needs_a_full_healthy_window_with_traffic():
    now = [0.0]
    tr = AcceptanceTracker(window=60, clock=lambda: now[0])
    assert tr.update_baseline(EngineTarget.server("ns", "none")) is None  # nothing observed
    feed(tr, (EngineTarget.server("ns", "short"), "p0"), 0.0, 3, rate=0.6)  # 30 s < 0.9 * 60 s
    assert tr.update_baseline(EngineTarget.server("ns", "short")) is None
    for i in range(6):  # a full window but 10 draft tokens per scrape (< min_draft_tokens over the window)
        tr.observe((EngineTarget.server("ns", "idle"), "p0"), spec(15.0 * i, 5.0 * i, 10.0 * i, 6.0 * i))
    assert tr.window_stats(EngineTarget.server("ns", "idle")).draft_tokens < tr.thresholds.min_draft_tokens
    assert tr.update_baseline(EngineTarget.server("ns", "idle")) is None
    feed(tr, (EngineTarget.server("ns", "broken"), "p0"), 0.0, 6, rate=0.0)  # full window, but a finding (near zero)
    assert [f.reason for f in tr.findings(EngineTarget.server("ns", "broken"))] == ["SpecAcceptanceNearZero"]
    assert tr.update_baseline(EngineTarget.server("ns", "broken")) is None
    # the healthy control: same shape, captured
    feed(tr, (EngineTarget.server("ns", "ok"), "p0"), 0.0, 6, rate=0.6)
    assert tr.update_baseline(EngineTarget.server("ns", "ok")) is not None


def test_auto_baseline_refreshed_after_max_age_manual_one_kept():
    now = [100.0]
    tr = AcceptanceTracker(window=60, baseline_max_age=600, clock=lambda: now[0])
    key = (EngineTarget.server("ns", "m"), "p0")
    feed(tr, key, 0.0, 6, rate=0.6)
    first = tr.update_baseline(EngineTarget.server("ns", "m"))
    assert first is not None and first.captured_at == 100.0
    now[0] = 699.0  # 599 s later: kept
    assert tr.update_baseline(EngineTarget.server("ns", "m")) is first
    now[0] = 700.0  # 600 s: refreshed from the current window
    second = tr.update_baseline(EngineTarget.server("ns", "m"))
    assert second is not first and (second.source, second.captured_at) == ("auto", 700.0)
    assert tr.mark_baseline(EngineTarget.server("ns", "m"))
    manual = tr.baseline(EngineTarget.server("ns", "m"))
    now[0] = 10_000.0
    assert tr.update_baseline(EngineTarget.server("ns", "m")) is manual and manual.source == "manual"


def test_gauges_of_a_resource_removed_when_speculative_decoding_switches_off():
    reg = telemetry.METRICS_REGISTRY
    tr = AcceptanceTracker(window=300)
    key = (EngineTarget.server("off-ns", "m"), "p0")
    lab = {"namespace": "off-ns", "server": "m"}
    res = {**lab, "kind": "GDNModelServer"}  # the series that hold one value per target carry its kind
    feed(tr, key, 0.0, 2, rate=0.6)
    tr.update_gauges(EngineTarget.server("off-ns", "m"))
    assert reg.get_sample_value("gdn_spec_acceptance_rate", res) == pytest.approx(0.6)
    assert reg.get_sample_value("gdn_spec_drafts_per_second", res) == pytest.approx(100 / 15)
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceDrop"}) == 0.0
    assert reg.get_sample_value("gdn_spec_acceptance_per_position", {**res, "position": "0"}) == pytest.approx(0.9)
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {**lab, "pod": "p0"}) == pytest.approx(0.6)
    # the engine comes back without MTP: two plain scrapes make a window again, not applicable
    tr.observe(key, plain(30.0, 100.0))
    tr.observe(key, plain(45.0, 400.0))
    assert tr.summary(EngineTarget.server("off-ns", "m"))["state"] == "NotApplicable"
    tr.update_gauges(EngineTarget.server("off-ns", "m"))
    assert reg.get_sample_value("gdn_spec_acceptance_rate", res) is None
    assert reg.get_sample_value("gdn_spec_mean_accepted_length", res) is None
    assert reg.get_sample_value("gdn_spec_drafts_per_second", res) is None
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceDrop"}) is None
    assert reg.get_sample_value("gdn_spec_acceptance_per_position", {**res, "position": "0"}) is None
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {**lab, "pod": "p0"}) is None
    tr.forget_resource(EngineTarget.server("off-ns", "m"))


def _window(accepted: float, draft_tokens: float = 2000.0) -> WindowStats:
    return WindowStats(seconds=60.0, spec_decode=True, drafts=draft_tokens / 2, draft_tokens=draft_tokens, accepted=accepted)


def test_pod_near_zero_names_the_broken_pods_sorted_and_capped():
    pods = [(f"bad-{i:02d}", _window(0.0)) for i in range(25)] + [("good", _window(1200.0)), ("new", None)]
    f = detect_pod_near_zero(reversed(pods))
    assert f is not None and f.reason == "SpecAcceptanceNearZero" and f.upstream == ("vllm#49559",)
    assert f.pods == tuple(f"bad-{i:02d}" for i in range(20))
    assert f.message.startswith("25 pod(s) accept (almost) no draft tokens")
    assert "bad-00, bad-01, bad-02, bad-03, bad-04 and 20 more" in f.message
    assert detect_pod_near_zero([("good", _window(1200.0)), ("new", None)]) is None


def test_resource_anomalies_add_the_pod_check_only_when_the_sum_is_not_near_zero():
    good, bad = _window(1800.0), _window(0.0)
    agg = WindowStats.combine([good] * 9 + [bad])
    found = detect_resource_anomalies(agg, [("bad", bad), ("good", good)])
    assert [(f.reason, f.pods) for f in found] == [("SpecAcceptanceNearZero", ("bad",))]
    # the sum itself near zero: one resource-wide finding (no pods), not a second per-pod one
    found = detect_resource_anomalies(bad, [("bad", bad)])
    assert [(f.reason, f.pods) for f in found] == [("SpecAcceptanceNearZero", ())]
    assert detect_resource_anomalies(good, [("good", good)]) == []
