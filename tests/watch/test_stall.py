"""Stall detector (gdn_operator.watch.stall) on the replayed series of tests/fixtures/stall/ (README there):
the real TP=2 stalls are flagged within stallSeconds + one scrape interval of their onset, the real healthy
PIECEWISE run and the idle / long-prefill / slow-decode / restarting shapes never are, at any scrape interval."""

from __future__ import annotations

import json

import pytest
from stall_replay import SERIES_DIR, TP2_LOGS, exposition, load, point_at, series_from_log

from gdn_operator.watch.acceptance import parse_exposition
from gdn_operator.watch.stall import (
    DEFAULT_STALL_SECONDS,
    MIN_STALL_SECONDS,
    StallDetector,
    StallVerdict,
)

#: when the stall of each captured series begins (the last stats line of the load: after it, 8 requests
#: stay "running" at 0-2 tokens/s until the capture ends)
ONSET = {"stalled-fullgraph-tp2": 60.0, "stalled-fullgraph-tp2-1step-per-min": 110.0}
HEALTHY = ("healthy-piecewise-tp2", "idle", "long-prefill", "slow-decode", "restarting")


def replay(name: str, stall_seconds: float, interval: float, t0: float = 1000.0) -> list[tuple[float, StallVerdict]]:
    """Scrape the series every ``interval`` s (what the engine served at that moment) through the text path."""
    points = load(name)["points"]
    det = StallDetector(stall_seconds)
    out = []
    t = 0.0
    while t <= points[-1]["t"]:
        out.append((t, det.observe_text(t0 + t, exposition(point_at(points, t)))))
        t += interval
    return out


@pytest.mark.parametrize("interval", [5.0, 10.0, 15.0])
@pytest.mark.parametrize("name", sorted(ONSET))
def test_captured_stall_is_flagged_within_stall_seconds_plus_one_interval(name, interval):
    verdicts = replay(name, DEFAULT_STALL_SECONDS, interval)
    first = next((t for t, v in verdicts if v.stalled), None)
    assert first is not None, f"{name} never flagged: {[(t, v.reason, v.rate) for t, v in verdicts]}"
    assert ONSET[name] + DEFAULT_STALL_SECONDS - interval <= first <= ONSET[name] + DEFAULT_STALL_SECONDS + interval
    v = dict(verdicts)[first]
    assert v.reason == "Stalled" and v.running in (7, 8) and v.waiting == 0  # one request finished at t=130
    assert v.seconds_without_progress >= DEFAULT_STALL_SECONDS
    assert v.rate is not None and v.rate < 0.2  # what the captures show: 0.04-0.16 tokens/s per request
    assert v.tokens is not None and v.tokens > 0  # the stalled engine still moves: "any advance" would miss it
    assert f"{v.running} running" in v.message and "no progress for" in v.message
    # and it stays flagged, the figure growing, until the capture ends
    after = [v for t, v in verdicts if t >= first]
    assert all(v.stalled for v in after)
    assert after[-1].seconds_without_progress > after[0].seconds_without_progress


@pytest.mark.parametrize("interval", [5.0, 10.0, 15.0, 30.0])
@pytest.mark.parametrize("stall_seconds", [MIN_STALL_SECONDS, 60.0, DEFAULT_STALL_SECONDS, 600.0])
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_idle_prefill_slow_restarting_never_flagged(name, stall_seconds, interval):
    if name in ("long-prefill", "restarting") and stall_seconds < 120:
        pytest.skip("100 s prefills / 90 s frozen spans: a stallSeconds below that is the user's choice to flag them")
    verdicts = replay(name, stall_seconds, interval)
    assert not [(t, v) for t, v in verdicts if v.stalled]


def test_reasons_of_the_no_stall_shapes():
    assert {v.reason for _, v in replay("idle", 120, 15)} == {"Idle"}
    assert {v.reason for _, v in replay("slow-decode", 120, 15)} <= {"Progressing"}
    prefill = [v for _, v in replay("long-prefill", 120, 10)]
    assert max(v.seconds_without_progress for v in prefill) == pytest.approx(100, abs=10)  # seen, not flagged
    assert "NoProgress" in {v.reason for v in prefill}
    assert "EngineRestarted" in {v.reason for _, v in replay("restarting", 120, 10)}


def test_healthy_engine_under_load_is_far_above_the_floor():
    rates = [v.rate for _, v in replay("healthy-piecewise-tp2", 120, 10) if v.rate is not None and v.running >= 8]
    assert rates and min(rates) > 20  # 40+ tokens/s per request: two orders of magnitude above the floor 0.5


def test_failed_scrapes_are_not_a_stall_and_do_not_hide_one():
    det = StallDetector(60)
    text = exposition({"running": 8, "waiting": 0, "generation_tokens": 500, "prompt_tokens": 900, "draft_tokens": 300})
    v = det.observe_text(0, text)
    for t in range(10, 200, 10):  # the pod's /metrics stops answering: never a stall
        v = det.observe_text(t, None)
        assert not v.stalled and v.reason == "NoMetrics" and not v.known
    assert not det.observe_text(200, "this is not { an exposition").known
    # it answers again with the same counters: the gap is judged on the cumulative counters
    v = det.observe_text(210, text)
    assert v.stalled and v.seconds_without_progress == pytest.approx(210)


def test_progress_after_a_stall_clears_it():
    det = StallDetector(60)
    pt = {"running": 8, "waiting": 0, "generation_tokens": 500, "prompt_tokens": 900, "draft_tokens": 300}
    for t in range(0, 80, 10):
        v = det.observe_text(t, exposition(pt))
    assert v.stalled
    pt["generation_tokens"] += 8 * 30 * 10  # 30 tokens/s per request for the last 10 s
    v = det.observe_text(80, exposition(pt))
    assert not v.stalled and v.reason == "Progressing" and v.seconds_without_progress == 0


def test_waiting_only_engine_that_schedules_nothing_is_stalled():
    det = StallDetector(30)
    pt = {"running": 0, "waiting": 5, "generation_tokens": 10, "prompt_tokens": 10, "draft_tokens": 0}
    verdicts = [det.observe_text(t, exposition(pt)) for t in range(0, 50, 10)]
    assert verdicts[-1].stalled and verdicts[-1].waiting == 5 and verdicts[-1].running == 0


def test_counter_reset_without_a_new_created_time_restarts_history():
    det = StallDetector(30)
    pt = {"running": 8, "waiting": 0, "generation_tokens": 500, "prompt_tokens": 900, "draft_tokens": 300}
    for t in (0, 10, 20):
        det.observe_text(t, exposition(pt))
    v = det.observe_text(25, exposition(dict(pt, generation_tokens=3, prompt_tokens=8)))
    assert v.reason == "EngineRestarted" and not v.stalled
    assert not det.observe_text(40, exposition(dict(pt, generation_tokens=3, prompt_tokens=8))).stalled


def test_no_vllm_counters_is_not_a_verdict():
    v = StallDetector(60).observe_text(0, "# HELP up x\n# TYPE up gauge\nup 1\n")
    assert v.reason == "NoCounters" and not v.known and not v.stalled


@pytest.mark.parametrize("bad", [0, -5, float("nan")])
def test_stall_seconds_must_be_positive(bad):
    with pytest.raises(ValueError, match="stall_seconds"):
        StallDetector(bad)


def test_observe_on_a_parsed_snapshot_equals_the_text_path():
    points = load("stalled-fullgraph-tp2")["points"]
    a, b = StallDetector(120), StallDetector(120)
    for p in points:
        text = exposition(p)
        va = a.observe_text(p["t"], text)
        vb = b.observe(p["t"], parse_exposition(text, timestamp=p["t"]))
        assert va == vb


def test_parser_reads_the_progress_families_of_real_expositions():
    from paths import REPO, SHARED_FIXTURES

    snap = parse_exposition((REPO / "tests/fixtures/vllm-0.22.0-h200-trained/metrics-rendered.prom").read_bytes())
    assert (snap.prompt_tokens, snap.generation_tokens, snap.engine_steps, snap.num_requests_waiting) == (1793, 1793, 111, 0)
    cpu = SHARED_FIXTURES / "vllm-0.32.0-cpu" / "metrics-mtp2.prom"
    if cpu.exists():
        snap = parse_exposition(cpu.read_bytes())
        assert (snap.prompt_tokens, snap.generation_tokens, snap.engine_steps) == (28, 160, 160)


@pytest.mark.parametrize("name", sorted(p.stem for p in SERIES_DIR.glob("*.json")))
def test_derived_series_match_their_logs(name):
    data = load(name)
    if data["source"] == "hand-made":
        assert data["note"]
        return
    log = TP2_LOGS / data["source"].split("/", 1)[1]
    derived = series_from_log(log)
    assert len(derived) >= 9
    assert data["points"][: len(derived)] == json.loads(json.dumps(derived))
