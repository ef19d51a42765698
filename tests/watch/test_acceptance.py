"""Acceptance parsing, sliding-window math and anomaly checks, on the REAL captured vLLM 0.32.0 CPU
exposition (../shared/fixtures/vllm-0.32.0-cpu/metrics-mtp2.prom, MTP k=2, dummy weights).

Synthetic points are made by rewriting counter values inside that real exposition, so every test
goes through the same text the engine produces (names, labels, `_created` series, histogram).

Size (~610 lines): one test module per module under test (watch/acceptance), every case on the same real
exposition; split by topic the rewriting helpers at the top would be shared across files for no reader's gain.
"""

from __future__ import annotations

import math
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gdn_operator import telemetry
from gdn_operator.watch.acceptance import (
    AcceptanceTracker,
    AnomalyThresholds,
    EngineSnapshot,
    ExpositionParseError,
    PodWindow,
    WindowStats,
    detect_acceptance_drop,
    detect_anomalies,
    detect_early_stop_shift,
    detect_near_zero_acceptance,
    parse_exposition,
)
from gdn_operator.watch.target import EngineTarget

from paths import CPU_CAPTURES  # noqa: E402

FIXTURE = CPU_CAPTURES / "metrics-mtp2.prom"
TEXT = FIXTURE.read_text()

SPEC_PREFIX = "vllm:spec_decode_num_"


# --------------------------------------------------------------------------------------------------
# helpers: rewrite sample values of the real exposition
# --------------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[^\s{#]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$", re.M)


def rewrite(text: str, values: dict) -> str:
    """values: {(sample_name, frozenset(label items) or None): value | callable(old) -> new}.

    A key with labels None matches the sample name whatever its labels are."""

    def sub(m: re.Match) -> str:
        name, labels = m.group("name"), m.group("labels") or ""
        lab = frozenset(re.findall(r'(\w+)="([^"]*)"', labels))
        for (n, want), v in values.items():
            if n == name and (want is None or want <= lab):
                old = float(m.group("value"))
                new = v(old) if callable(v) else v
                return f"{name}{labels} {float(new)!r}"
        return m.group(0)

    return _SAMPLE.sub(sub, text)


def expo(
    drafts=156,
    draft_tokens=312,
    accepted=0,
    pos=(0, 0),
    gen_tokens=160,
    stop=0,
    length=4,
    hist=None,
    created=None,
    text=TEXT,
) -> str:
    """The fixture with chosen counter values. hist: (cumulative per le (9 values), sum)."""
    v = {
        ("vllm:spec_decode_num_drafts_total", None): drafts,
        ("vllm:spec_decode_num_draft_tokens_total", None): draft_tokens,
        ("vllm:spec_decode_num_accepted_tokens_total", None): accepted,
        ("vllm:generation_tokens_total", None): gen_tokens,
        ("vllm:request_success_total", frozenset({("finished_reason", "stop")})): stop,
        ("vllm:request_success_total", frozenset({("finished_reason", "length")})): length,
    }
    for i, p in enumerate(pos):
        v[("vllm:spec_decode_num_accepted_tokens_per_pos_total", frozenset({("position", str(i))}))] = p
    if hist is not None:
        cum, total = hist
        les = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "+Inf"]
        for le, c in zip(les, cum):
            v[("vllm:request_generation_tokens_bucket", frozenset({("le", le)}))] = c
        v[("vllm:request_generation_tokens_count", None)] = cum[-1]
        v[("vllm:request_generation_tokens_sum", None)] = total
    if created is not None:
        v[("vllm:spec_decode_num_drafts_created", None)] = created
        v[("vllm:generation_tokens_created", None)] = created
    return rewrite(text, v)


def snap(ts: float, **kw) -> EngineSnapshot:
    return parse_exposition(expo(**kw), timestamp=ts)


def full_parse_sum(text: str, sample_name: str, **label_filter) -> float | None:
    """Independent reference: full prometheus_client parse of the whole exposition, summed."""
    total, seen = 0.0, False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in label_filter.items()):
                total += s.value
                seen = True
    return total if seen else None


# --------------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------------


def test_parse_real_fixture_matches_full_parse():
    s = parse_exposition(TEXT, timestamp=1.0)
    assert s.timestamp == 1.0
    assert s.spec_decode_enabled
    assert s.num_drafts == full_parse_sum(TEXT, "vllm:spec_decode_num_drafts_total")
    assert s.num_draft_tokens == full_parse_sum(TEXT, "vllm:spec_decode_num_draft_tokens_total")
    assert s.num_accepted_tokens == full_parse_sum(TEXT, "vllm:spec_decode_num_accepted_tokens_total")
    for i, v in enumerate(s.accepted_per_position):
        assert v == full_parse_sum(TEXT, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
    assert len(s.accepted_per_position) == 2  # MTP k=2
    # k=2: every draft proposes 2 tokens
    assert s.num_draft_tokens == 2 * s.num_drafts
    assert s.generation_tokens == full_parse_sum(TEXT, "vllm:generation_tokens_total")
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert s.request_success[reason] == full_parse_sum(TEXT, "vllm:request_success_total", finished_reason=reason)
    h = s.generation_length
    assert h is not None and math.isinf(h.bounds[-1])
    assert h.count == full_parse_sum(TEXT, "vllm:request_generation_tokens_count")
    assert h.sum == full_parse_sum(TEXT, "vllm:request_generation_tokens_sum")
    assert h.cumulative[h.bounds.index(50.0)] == full_parse_sum(TEXT, "vllm:request_generation_tokens_bucket", le="50.0")
    assert s.num_requests_running == full_parse_sum(TEXT, "vllm:num_requests_running")
    assert s.engines == 1 and s.model_names == ("tiny-qwen3-next",)
    assert s.start_time == pytest.approx(full_parse_sum(TEXT, "vllm:spec_decode_num_drafts_created"))


def _strip_types(text: str) -> str:
    return "\n".join(l for l in text.splitlines() if not l.startswith("#")) + "\n"


@pytest.mark.parametrize(
    "variant",
    [
        "no_prefix",  # exporters/relabelling without the "vllm:" namespace
        "underscore_prefix",  # vllm_ (colon replaced)
        "untyped_with_total",  # no HELP/TYPE lines: family names keep _total
        "no_total_suffix",  # counters exposed without _total (older client / relabelled)
    ],
)
def test_name_variants_give_same_snapshot(variant):
    ref = parse_exposition(TEXT, timestamp=5.0)
    if variant == "no_prefix":
        text = TEXT.replace("vllm:", "")
    elif variant == "underscore_prefix":
        text = TEXT.replace("vllm:", "vllm_")
    elif variant == "untyped_with_total":
        text = _strip_types(TEXT)
    else:
        text = re.sub(r"_total([{ ])", r"\1", TEXT)
        # HELP/TYPE must name the family consistently: drop them, leaving untyped samples
        text = _strip_types(text)
    got = parse_exposition(text, timestamp=5.0)
    assert got.counters() == ref.counters()
    assert got.start_time == pytest.approx(ref.start_time)


def test_multiple_engines_are_summed_per_pod():
    # duplicate every spec/generation sample as engine="1" with 10x values (data-parallel engines)
    extra = []
    for line in TEXT.splitlines():
        if (
            line.startswith(("vllm:spec_decode", "vllm:generation_tokens_total", "vllm:request_success_total"))
            and "_created" not in line
        ):
            m = _SAMPLE.match(line)
            extra.append(
                f"{m.group('name')}{m.group('labels').replace(chr(34) + '0' + chr(34), chr(34) + '1' + chr(34), 1)} "
                f"{float(m.group('value')) * 10 + 1}"
            )
    text = TEXT + "\n".join(extra) + "\n"
    ref = parse_exposition(TEXT, 0.0)
    got = parse_exposition(text, 0.0)
    assert got.engines == 2
    assert got.num_drafts == ref.num_drafts * 11 + 1
    assert got.num_draft_tokens == ref.num_draft_tokens * 11 + 1
    assert got.accepted_per_position == tuple(v * 11 + 1 for v in ref.accepted_per_position)
    assert got.request_success["length"] == ref.request_success["length"] * 11 + 1


def test_multiple_model_names_recorded():
    text = TEXT + 'vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 4.0\n'
    # appended samples belong to the already-open family; the parser accepts them
    s = parse_exposition(text, 0.0)
    assert s.model_names == ("other", "tiny-qwen3-next")
    assert s.num_drafts == 160.0


def test_spec_decode_off_is_not_applicable_not_zero():
    text = "\n".join(l for l in TEXT.splitlines() if "spec_decode" not in l) + "\n"
    s = parse_exposition(text, 0.0)
    assert not s.spec_decode_enabled
    assert s.num_drafts is None and s.num_accepted_tokens is None
    assert s.accepted_per_position == ()
    assert s.generation_tokens == 160.0  # the rest still parsed


def test_empty_and_foreign_exposition():
    assert parse_exposition("", 0.0).counters() == {}
    s = parse_exposition("# TYPE python_gc counter\npython_gc_total 3\nup 1\n", 0.0)
    assert not s.spec_decode_enabled and s.counters() == {}


def test_malformed_exposition_raises_parse_error():
    bad = TEXT.replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-qwen3-next"} 156.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-qwen3-next" 156.0',
    )
    with pytest.raises(ExpositionParseError, match="invalid Prometheus exposition"):
        parse_exposition(bad, 0.0)
    bad2 = TEXT.replace('position="1"} 0.0', 'position="x"} 0.0')
    with pytest.raises(ExpositionParseError, match="position"):
        parse_exposition(bad2, 0.0)


def test_malformed_foreign_family_is_ignored():
    s = parse_exposition(TEXT + "process_cpu_seconds_total{oops 1\n", 0.0)
    assert s.num_drafts == 156.0


# --------------------------------------------------------------------------------------------------
# sliding window
# --------------------------------------------------------------------------------------------------


def test_window_math_from_two_scaled_fixture_snapshots():
    w = PodWindow(window=300)
    a = parse_exposition(TEXT, timestamp=1000.0)
    # +200 drafts (400 draft tokens), 240 accepted: 150 at position 0, 90 at position 1
    b = snap(1015.0, drafts=156 + 200, draft_tokens=312 + 400, accepted=240, pos=(150, 90))
    w.observe(a)
    assert w.stats() is None  # one point: warming up
    w.observe(b)
    st = w.stats()
    assert st.seconds == 15.0
    assert st.drafts == 200 and st.draft_tokens == 400 and st.accepted == 240
    assert st.acceptance_rate == pytest.approx(240 / 400)
    assert st.mean_accepted_length == pytest.approx(1 + 240 / 200)
    assert st.per_position == pytest.approx((150 / 200, 90 / 200))
    assert st.drafts_per_second == pytest.approx(200 / 15)
    assert st.resets == 0


def test_counter_decrease_is_a_reset_not_a_negative_delta():
    w = PodWindow(window=300)
    w.observe(snap(0.0, drafts=1000, draft_tokens=2000, accepted=800, pos=(500, 300)))
    w.observe(snap(15.0, drafts=1100, draft_tokens=2200, accepted=880, pos=(550, 330)))
    # pod restarted: counters start again from 0 and reached these values
    w.observe(snap(30.0, drafts=50, draft_tokens=100, accepted=10, pos=(8, 2)))
    st = w.stats()
    assert st.resets == 1
    assert st.drafts == 100 + 50
    assert st.draft_tokens == 200 + 100
    assert st.accepted == 80 + 10
    assert st.accepted_per_position == (50 + 8, 30 + 2)
    assert st.acceptance_rate == pytest.approx(90 / 300)
    assert all(v >= 0 for v in (st.drafts, st.draft_tokens, st.accepted))


def test_restart_detected_by_created_timestamp_even_if_counters_grew():
    w = PodWindow(window=300)
    w.observe(snap(0.0, drafts=100, draft_tokens=200, accepted=50, created=1.7e9))
    # restarted engine (new _created) already past the old values
    w.observe(snap(60.0, drafts=300, draft_tokens=600, accepted=90, created=1.7e9 + 55))
    st = w.stats()
    assert st.resets == 1
    assert st.drafts == 300 and st.accepted == 90  # not 200 / 40


def test_no_traffic_gives_none_not_zero_division():
    w = PodWindow(window=300)
    w.observe(parse_exposition(TEXT, 0.0))
    w.observe(parse_exposition(TEXT, 15.0))
    st = w.stats()
    assert st.acceptance_rate is None
    assert st.mean_accepted_length is None
    assert st.per_position is None
    assert st.drafts_per_second == 0.0


def test_window_eviction_and_bounded_memory():
    w = PodWindow(window=300, max_points=64)
    for i in range(200):
        w.observe(snap(i * 15.0, drafts=156 + i * 10, draft_tokens=312 + i * 20, accepted=i * 5, pos=(i * 3, i * 2)))
    assert len(w) <= 300 / 15 + 2
    st = w.stats()
    assert 300 <= st.seconds < 315
    n = st.seconds / 15
    assert st.drafts == pytest.approx(10 * n)
    assert st.acceptance_rate == pytest.approx(5 / 20)
    # max_points caps memory when scraped far more often than the window needs
    w2 = PodWindow(window=10_000, max_points=64)
    for i in range(500):
        w2.observe(snap(float(i), drafts=156 + i, draft_tokens=312 + 2 * i, accepted=i))
    assert len(w2) == 64


def test_out_of_order_and_duplicate_snapshots_ignored():
    w = PodWindow(window=300)
    w.observe(snap(10.0, drafts=100, draft_tokens=200, accepted=10))
    w.observe(snap(25.0, drafts=200, draft_tokens=400, accepted=60))
    w.observe(snap(20.0, drafts=5, draft_tokens=10, accepted=0))  # late: ignored
    w.observe(snap(25.0, drafts=5, draft_tokens=10, accepted=0))  # duplicate ts: ignored
    st = w.stats()
    assert st.resets == 0 and st.drafts == 100 and st.accepted == 50


def test_spec_decode_switched_off_resets_history():
    w = PodWindow(window=300)
    w.observe(snap(0.0))
    w.observe(snap(15.0, drafts=200, draft_tokens=400))
    off = "\n".join(l for l in TEXT.splitlines() if "spec_decode" not in l) + "\n"
    w.observe(parse_exposition(off, 30.0))
    assert w.stats() is None
    w.observe(parse_exposition(off, 45.0))
    st = w.stats()
    assert not st.spec_decode and st.acceptance_rate is None and st.drafts_per_second is None


# --------------------------------------------------------------------------------------------------
# tracker: aggregation, status dict, forgetting, gauges
# --------------------------------------------------------------------------------------------------


def _feed(tr, key, points):
    for ts, kw in points:
        tr.observe(key, snap(ts, **kw))


def test_tracker_aggregates_sum_of_deltas_over_pods():
    tr = AcceptanceTracker(window=300)
    _feed(
        tr,
        (EngineTarget.server("ns", "m"), "p0"),
        [(0, {}), (15, dict(drafts=156 + 100, draft_tokens=312 + 200, accepted=180, pos=(100, 80)))],
    )
    _feed(
        tr,
        (EngineTarget.server("ns", "m"), "p1"),
        [(0, {}), (30, dict(drafts=156 + 300, draft_tokens=312 + 600, accepted=60, pos=(50, 10)))],
    )
    st = tr.window_stats(EngineTarget.server("ns", "m"))
    assert st.pods == 2
    assert st.acceptance_rate == pytest.approx((180 + 60) / (200 + 600))  # not mean of 0.9 and 0.1
    assert st.mean_accepted_length == pytest.approx(1 + 240 / 400)
    assert st.per_position == pytest.approx((150 / 400, 90 / 400))
    assert st.drafts_per_second == pytest.approx(100 / 15 + 300 / 30)
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["acceptanceRate"] == pytest.approx(240 / 800, abs=1e-4)
    assert s["meanAcceptedLength"] == pytest.approx(1.6, abs=1e-4)
    assert s["perPosition"] == pytest.approx([0.375, 0.225], abs=1e-4)
    assert s["draftsPerSecond"] == pytest.approx(100 / 15 + 10, abs=1e-3)
    assert s["pods"]["total"] == 2 and s["pods"]["specDecode"] == 2
    assert s["window"] == "300s" and s["state"] in ("Ok", "Degraded")
    assert (s["drafts"], s["draftTokens"], s["acceptedTokens"]) == (400, 800, 240)
    # another resource is untouched
    assert tr.summary(EngineTarget.server("ns", "other"))["state"] == "NoData"


def test_summary_states():
    tr = AcceptanceTracker(window=300)
    tr.observe((EngineTarget.server("ns", "m"), "p0"), snap(0.0))
    assert tr.summary(EngineTarget.server("ns", "m"))["state"] == "WarmingUp"
    tr.observe((EngineTarget.server("ns", "m"), "p0"), snap(15.0))
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["state"] == "NoTraffic" and s["acceptanceRate"] is None and s["findings"] == []
    off = "\n".join(l for l in TEXT.splitlines() if "spec_decode" not in l) + "\n"
    tr.observe((EngineTarget.server("ns", "n"), "p0"), parse_exposition(off, 0.0))
    tr.observe((EngineTarget.server("ns", "n"), "p0"), parse_exposition(off, 15.0))
    s = tr.summary(EngineTarget.server("ns", "n"))
    assert s["state"] == "NotApplicable" and s["acceptanceRate"] is None
    assert s["pods"]["notApplicable"] == 1


def test_tracker_scrape_errors_counted_and_forgetting():
    tr = AcceptanceTracker(window=300, clock=lambda: 1000.0)
    _feed(tr, (EngineTarget.server("ns", "m"), "p0"), [(900, {}), (915, dict(drafts=400, draft_tokens=800, accepted=200))])
    tr.record_error((EngineTarget.server("ns", "m"), "p1"), "timeout", "no complete response within 5s")
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["pods"]["total"] == 2 and s["pods"]["scrapeErrors"] == 1
    assert s["pods"]["errorsByReason"] == {"timeout": 1}
    assert tr.retain(EngineTarget.server("ns", "m"), ["p1"]) == ["p0"]
    assert tr.pods(EngineTarget.server("ns", "m")) == ["p1"]
    assert tr.window_stats(EngineTarget.server("ns", "m")) is None
    # stale pods are pruned
    tr2 = AcceptanceTracker(window=60, clock=lambda: 10_000.0)
    _feed(tr2, (EngineTarget.server("ns", "m"), "old"), [(0, {}), (15, {})])
    _feed(tr2, (EngineTarget.server("ns", "m"), "new"), [(9_990, {}), (9_995, {})])
    assert [k.pod for k in tr2.prune()] == ["old"]
    assert tr2.pods(EngineTarget.server("ns", "m")) == ["new"]


def test_update_gauges_sets_and_removes_label_sets():
    reg = telemetry.METRICS_REGISTRY
    tr = AcceptanceTracker(window=300)
    _feed(
        tr,
        (EngineTarget.server("g-ns", "g-m"), "p0"),
        [(0, {}), (15, dict(drafts=356, draft_tokens=712, accepted=240, pos=(150, 90)))],
    )
    tr.update_gauges(EngineTarget.server("g-ns", "g-m"))
    lab = {"namespace": "g-ns", "server": "g-m"}
    res = {**lab, "kind": "GDNModelServer"}  # the series that hold one value per target carry its kind
    assert reg.get_sample_value("gdn_spec_acceptance_rate", res) == pytest.approx(0.6)
    assert reg.get_sample_value("gdn_spec_mean_accepted_length", res) == pytest.approx(2.2)
    assert reg.get_sample_value("gdn_spec_drafts_per_second", res) == pytest.approx(200 / 15)
    assert reg.get_sample_value("gdn_spec_acceptance_per_position", {**res, "position": "1"}) == pytest.approx(0.45)
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {**lab, "pod": "p0"}) == pytest.approx(0.6)
    tr.forget_resource(EngineTarget.server("g-ns", "g-m"))
    assert reg.get_sample_value("gdn_spec_acceptance_rate", res) is None
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {**lab, "pod": "p0"}) is None
    assert reg.get_sample_value("gdn_spec_acceptance_per_position", {**res, "position": "0"}) is None


def test_update_gauges_drops_forgotten_pod():
    reg = telemetry.METRICS_REGISTRY
    tr = AcceptanceTracker(window=300)
    for pod in ("a", "b"):
        _feed(tr, (EngineTarget.server("g2", "m"), pod), [(0, {}), (15, dict(drafts=356, draft_tokens=712, accepted=100))])
    tr.update_gauges(EngineTarget.server("g2", "m"))
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {"namespace": "g2", "server": "m", "pod": "b"}) is not None
    tr.retain(EngineTarget.server("g2", "m"), ["a"])
    tr.update_gauges(EngineTarget.server("g2", "m"))
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {"namespace": "g2", "server": "m", "pod": "b"}) is None
    assert reg.get_sample_value("gdn_spec_pod_acceptance_rate", {"namespace": "g2", "server": "m", "pod": "a"}) is not None


# --------------------------------------------------------------------------------------------------
# anomalies
# --------------------------------------------------------------------------------------------------


def _stats(a: EngineSnapshot, b: EngineSnapshot) -> WindowStats:
    w = PodWindow(window=1e9)
    w.observe(a)
    w.observe(b)
    return w.stats()


def test_near_zero_fires_on_real_fixture_counters():
    """Broken/mismatched draft head (vllm#49559 class: ~0 % acceptance while drafting)."""
    # from zero to the captured counters: 312 draft tokens, 0 accepted (dummy MTP weights)
    zero = snap(0.0, drafts=0, draft_tokens=0, accepted=0, pos=(0, 0), gen_tokens=0, length=0)
    st = _stats(zero, parse_exposition(TEXT, 60.0))
    assert st.draft_tokens == 312 and st.acceptance_rate == 0.0
    f = detect_near_zero_acceptance(st)
    assert f is not None and f.reason == "SpecAcceptanceNearZero"
    assert "0.0%" in f.message and "312" in f.message
    assert "vllm#49559" in f.upstream
    # min-sample guard: the same window does not alarm with a higher floor
    assert detect_near_zero_acceptance(st, AnomalyThresholds(min_draft_tokens=1000)) is None
    # healthy acceptance does not fire
    ok = _stats(zero, snap(60.0, accepted=150, pos=(100, 50)))
    assert detect_near_zero_acceptance(ok) is None


def test_near_zero_idle_engine_does_not_alarm():
    st = _stats(parse_exposition(TEXT, 0.0), parse_exposition(TEXT, 300.0))
    assert detect_anomalies(st) == []


def _window(drafts, draft_tokens, accepted, seconds=300.0, **kw):
    return WindowStats(seconds=seconds, spec_decode=True, drafts=drafts, draft_tokens=draft_tokens, accepted=accepted, **kw)


def test_acceptance_drop_vs_baseline():
    """E.g. after a rollout that turns on prefix caching with MTP (vllm#43559, vllm#53912)."""
    base = _window(1000, 2000, 1200)  # 60 %
    assert detect_acceptance_drop(_window(1000, 2000, 600), base).reason == "SpecAcceptanceDrop"  # 30 %
    assert detect_acceptance_drop(_window(1000, 2000, 1100), base) is None  # 55 %: small dip
    assert detect_acceptance_drop(_window(1000, 2000, 600), None) is None  # no baseline
    assert detect_acceptance_drop(_window(50, 100, 10), base) is None  # too few samples
    # low baseline: relative drop large but absolute drop below 0.10
    low = _window(1000, 2000, 200)  # 10 %
    assert detect_acceptance_drop(_window(1000, 2000, 60), low) is None
    thr = AnomalyThresholds(drop_absolute=0.05)
    assert detect_acceptance_drop(_window(1000, 2000, 60), low, thr) is not None


def _gen_window(n, stop, length, mean_len, short=0.0, hist=True):
    """n finished requests; `short` = share with <= 20 tokens; others spread to le=50/100."""
    finished = {"stop": float(stop), "length": float(length), "abort": 0.0}
    kw = dict(finished=finished, generation_tokens=n * mean_len)
    if hist:
        bounds = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, math.inf)
        s = n * short
        cum = (0, 0, 0, 0, s, s + (n - s) / 2, n, n, n)
        kw.update(gen_bounds=bounds, gen_buckets=tuple(float(c) for c in cum), gen_count=float(n), gen_sum=n * mean_len)
    return _window(500, 1000, 600, **kw)


def test_early_stop_shift_fires_on_shorter_generations_ending_on_stop():
    """Silent corruption signature of vllm PR #45100 (async spec-decode race) / vllm#43559
    (prefix caching + MTP on GDN): requests end early on EOS."""
    base = _gen_window(200, stop=40, length=160, mean_len=48.0, short=0.05)
    bad = _gen_window(200, stop=170, length=30, mean_len=14.0, short=0.7)
    f = detect_early_stop_shift(bad, base)
    assert f is not None and f.reason == "EarlyStopShift"
    assert "vllm#45100" in f.upstream
    assert "48.0 -> 14.0" in f.message and "20% -> 85%" in f.message
    # same lengths: nothing
    assert detect_early_stop_shift(_gen_window(200, 40, 160, 47.0, 0.06), base) is None
    # shorter but NOT more stops (clients lowered max_tokens): not the corruption signature
    assert detect_early_stop_shift(_gen_window(200, 40, 160, 14.0, 0.7), base) is None
    # min-sample guard
    assert detect_early_stop_shift(_gen_window(20, 17, 3, 14.0, 0.7), base) is None
    assert detect_early_stop_shift(bad, None) is None


def test_early_stop_shift_without_histogram_uses_generation_tokens():
    base = _gen_window(200, stop=40, length=160, mean_len=48.0, hist=False)
    bad = _gen_window(200, stop=170, length=30, mean_len=14.0, hist=False)
    assert base.mean_generation_length == pytest.approx(48.0)
    assert detect_early_stop_shift(bad, base) is not None


def test_early_stop_from_real_histogram_text():
    # baseline window: 100 requests of ~40 tokens ending on length; then 100 short ones ending on stop
    t0 = snap(0.0, gen_tokens=160, stop=0, length=4, hist=((0, 0, 0, 0, 0, 4, 4, 4, 4), 160))
    t1 = snap(300.0, gen_tokens=4160, stop=5, length=99, hist=((0, 0, 0, 0, 0, 104, 104, 104, 104), 4160))
    t2 = snap(
        600.0, gen_tokens=4160 + 800, stop=5 + 90, length=99 + 10, hist=((0, 0, 10, 60, 100, 204, 204, 204, 204), 4160 + 800)
    )
    base = _stats(t0, t1)
    cur = _stats(t1, t2)
    assert base.gen_count == 100 and base.mean_generation_length == pytest.approx(40.0)
    assert cur.mean_generation_length == pytest.approx(8.0)
    assert cur.short_share(20) == pytest.approx(1.0)
    f = detect_early_stop_shift(cur, base)
    assert f is not None and f.reason == "EarlyStopShift"


def test_tracker_auto_baseline_then_drop_degrades():
    now = [0.0]
    tr = AcceptanceTracker(window=60, clock=lambda: now[0])
    key = (EngineTarget.server("ns", "m"), "p0")
    d = dt = a = 0
    ts = 0.0
    # 2 healthy minutes at 60 % acceptance
    for _ in range(9):
        tr.observe(key, snap(ts, drafts=d, draft_tokens=dt, accepted=a))
        now[0] = ts
        tr.update_baseline(EngineTarget.server("ns", "m"))  # once per round, as handlers/acceptance.scrape_round does
        tr.summary(EngineTarget.server("ns", "m"))
        d, dt, a, ts = d + 100, dt + 200, a + 120, ts + 15
    assert tr.baseline(EngineTarget.server("ns", "m")) is not None
    assert tr.baseline(EngineTarget.server("ns", "m")).stats.acceptance_rate == pytest.approx(0.6)
    # acceptance collapses to 20 %
    for _ in range(6):
        tr.observe(key, snap(ts, drafts=d, draft_tokens=dt, accepted=a))
        now[0] = ts
        d, dt, a, ts = d + 100, dt + 200, a + 40, ts + 15
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["state"] == "Degraded"
    assert [f["reason"] for f in s["findings"]] == ["SpecAcceptanceDrop"]
    assert s["baselineAcceptanceRate"] == pytest.approx(0.6)
    assert s["acceptanceRate"] == pytest.approx(0.2)


def test_tracker_per_pod_near_zero_visible_in_healthy_aggregate():
    tr = AcceptanceTracker(window=300)
    for p in range(9):
        _feed(
            tr, (EngineTarget.server("ns", "m"), f"good-{p}"), [(0, {}), (15, dict(drafts=656, draft_tokens=1312, accepted=700))]
        )
    _feed(tr, (EngineTarget.server("ns", "m"), "bad-0"), [(0, {}), (15, dict(drafts=656, draft_tokens=1312, accepted=0))])
    s = tr.summary(EngineTarget.server("ns", "m"))
    assert s["acceptanceRate"] == pytest.approx(0.63, abs=1e-4)
    nz = [f for f in s["findings"] if f["reason"] == "SpecAcceptanceNearZero"]
    assert nz and nz[0]["pods"] == ["bad-0"]


def test_manual_baseline_before_rollout():
    tr = AcceptanceTracker(window=300)
    key = (EngineTarget.server("ns", "m"), "p0")
    _feed(tr, key, [(0, {}), (300, dict(drafts=1156, draft_tokens=2312, accepted=1400))])
    assert tr.mark_baseline(EngineTarget.server("ns", "m"))
    assert tr.baseline(EngineTarget.server("ns", "m")).source == "manual"
    assert not tr.mark_baseline(EngineTarget.server("ns", "absent"))


def test_anomaly_gauge_follows_findings():
    reg = telemetry.METRICS_REGISTRY
    tr = AcceptanceTracker(window=300)
    key = (EngineTarget.server("an-ns", "m"), "p0")
    _feed(tr, key, [(0, {}), (15, dict(drafts=656, draft_tokens=1312, accepted=0))])
    tr.summary(EngineTarget.server("an-ns", "m"))
    tr.update_gauges(EngineTarget.server("an-ns", "m"))
    lab = {"namespace": "an-ns", "server": "m"}
    res = {**lab, "kind": "GDNModelServer"}  # the series that hold one value per target carry its kind
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceNearZero"}) == 1.0
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceDrop"}) == 0.0
    # acceptance recovers (new window) → 0
    _feed(tr, key, [(400, dict(drafts=1656, draft_tokens=3312, accepted=1200))])
    s = tr.summary(EngineTarget.server("an-ns", "m"))
    assert s["findings"] == [] and s["acceptanceRate"] == pytest.approx(0.6)
    tr.update_gauges(EngineTarget.server("an-ns", "m"))
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceNearZero"}) == 0.0
    tr.forget_resource(EngineTarget.server("an-ns", "m"))
    assert reg.get_sample_value("gdn_spec_anomaly", {**res, "reason": "SpecAcceptanceNearZero"}) is None


def test_anomaly_gauge_current_when_update_gauges_called_before_summary():
    reg = telemetry.METRICS_REGISTRY
    tr = AcceptanceTracker(window=300)
    key = (EngineTarget.server("order-ns", "m"), "p0")
    _feed(tr, key, [(0, {}), (15, dict(drafts=656, draft_tokens=1312, accepted=0))])
    tr.update_gauges(EngineTarget.server("order-ns", "m"))  # no summary() yet this round
    lab = {"namespace": "order-ns", "server": "m", "kind": "GDNModelServer", "reason": "SpecAcceptanceNearZero"}
    assert reg.get_sample_value("gdn_spec_anomaly", lab) == 1.0
    assert [f.reason for f in tr.findings(EngineTarget.server("order-ns", "m"))] == ["SpecAcceptanceNearZero"]
