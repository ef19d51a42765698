"""The TP=2 stall on real GPUs as the operator's stall detector saw it (issue 24 item 5): the capture of
``hack/gpu/session.sh stall`` (bench/bench_gpu_stall.py) in tests/fixtures/vllm-0.22.0-h100x2-stall-detect.

Committed after the GPU run; a missing folder fails the tests. Checks, per engine, the
result JSON against the recorded /metrics series: the series replayed through a fresh detector gives the
same first verdict, the FULL-graph engine's flagged span is a real stall by the raw counters (requests in
flight, output below the floor per running request over every 30 s window) while /health answered 200,
detection came within stallSeconds + two scrape intervals of the last 30 s window with progress, and the
PIECEWISE engine under the same load drained, answered exactly and was never flagged by any threshold.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gdn_operator.watch.stall import DEFAULT_FLOOR, MIN_SPAN_SECONDS, StallDetector

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "fixtures" / "vllm-0.22.0-h100x2-stall-detect"
sys.path.insert(0, str(ROOT / "gpu"))
import metricswatch  # noqa: E402  (stdlib-only reader of the series format)

FULL, PIECEWISE = "full", "piecewise"
CONFIG = {FULL: "base-cudagraph", PIECEWISE: "base-cg-piecewise"}


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads((CAPTURE / "stall.json").read_text())


def _series(which: str) -> list[dict]:
    return [json.loads(ln) for ln in (CAPTURE / f"stall-{which}.metrics.jsonl").read_text().splitlines() if ln.strip()]


def _raw(lines: list[dict]) -> list[tuple[float, dict[str, float]]]:
    """(t, full state) per sample with metrics, rebuilt from the deltas without project code."""
    state: dict[str, float] = {}
    out = []
    for rec in lines:
        if "t" in rec and "mark" not in rec and rec.get("set") is not None:
            state.update(rec["set"])
            out.append((rec["t"], dict(state)))
    return out


def _sum(state: dict[str, float], name: str) -> float:
    return sum(v for k, v in state.items() if k.split("{", 1)[0] == name)


def _mark(lines: list[dict], label: str) -> float:
    return next(r["t"] for r in lines if r.get("mark") == label)


def test_capture_is_tp2_with_the_operators_detector_settings(result):
    assert result["tp"] == 2 and result["vllm_version"] == "0.22.0"
    assert set(CONFIG.values()) <= set(result["engines"])
    full_argv = result["engines"][CONFIG[FULL]]["argv"]
    pw_argv = result["engines"][CONFIG[PIECEWISE]]["argv"]
    assert "--enforce-eager" not in full_argv and "--compilation-config" not in full_argv  # vLLM's default graphs
    assert '{"cudagraph_mode":"PIECEWISE"}' in pw_argv
    for argv in (full_argv, pw_argv):
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2" and '"num_speculative_tokens":2' in " ".join(argv)


@pytest.mark.parametrize("which", [FULL, PIECEWISE])
def test_replayed_series_gives_the_recorded_verdicts(result, which):
    lines = _series(which)
    header = lines[0]
    det = StallDetector(header["stall_seconds"])
    recorded = [r for r in lines if "t" in r and "mark" not in r]
    replayed = metricswatch.replay(lines)
    assert len(recorded) == len(replayed) >= 20
    first = None
    for (t, text), rec in zip(replayed, recorded):
        if rec.get("verdict") is None:
            continue
        v = det.observe_text(t, text)
        assert (v.stalled, v.reason) == (rec["verdict"]["stalled"], rec["verdict"]["reason"]), t
        if v.stalled and first is None:
            first = t
    assert first == result["engines"][CONFIG[which]]["watch"]["first_stalled_t"]


def test_full_graph_engine_stalls_and_is_flagged_while_health_is_200(result):
    r = result["engines"][CONFIG[FULL]]
    assert r["flagged"] and r["load"]["sent"] > 0
    assert set(r["health_while_flagged"]) == {"200"}  # /health cannot see it
    lines = _series(FULL)
    raw = _raw(lines)
    first = r["watch"]["first_stalled_t"]
    t_end = _mark(lines, "load_end")
    assert first > t_end
    # raw counters: from the first flag on, requests in flight and output below the floor per running request
    flagged = [(t, s) for t, s in raw if t >= first]
    assert flagged and all(_sum(s, "vllm:num_requests_running") >= 1 for _, s in flagged)
    for t, s in flagged:
        base = [(t0, s0) for t0, s0 in raw if t0 <= t - MIN_SPAN_SECONDS]
        if not base:
            continue
        t0, s0 = base[-1]
        out = (
            _sum(s, "vllm:generation_tokens_total")
            + _sum(s, "vllm:prompt_tokens_total")
            - _sum(s0, "vllm:generation_tokens_total")
            - _sum(s0, "vllm:prompt_tokens_total")
        )
        assert out < DEFAULT_FLOOR * _sum(s, "vllm:num_requests_running") * (t - t0), t
    # detection within stallSeconds + two scrape intervals of the last 30 s window that kept the floor
    header = lines[0]
    progressing = []
    for t, s in raw:
        base = [(t0, s0) for t0, s0 in raw if t0 <= t - MIN_SPAN_SECONDS]
        running = _sum(s, "vllm:num_requests_running")
        if base and running:
            t0, s0 = base[-1]
            out = _sum(s, "vllm:generation_tokens_total") - _sum(s0, "vllm:generation_tokens_total")
            if out >= DEFAULT_FLOOR * running * (t - t0):
                progressing.append(t)
    onset = max(t for t in progressing if t < first)
    assert first - onset <= header["stall_seconds"] + 2 * header["interval_s"] + MIN_SPAN_SECONDS


def test_piecewise_engine_drains_exactly_and_is_never_flagged(result):
    r = result["engines"][CONFIG[PIECEWISE]]
    assert r["started"] and not r["flagged"] and r["watch"]["flagged_samples"] == 0
    assert all(v is None for v in r["also_detect_s_from_load_start"].values())  # nor by the shorter thresholds
    assert r["drained_s_after_load_end"] is not None
    assert r["load"]["recall"] > 0 and r["load"]["recall_exact"] == r["load"]["recall"]
    assert r["load"]["timed_out"] == 0 and r["load"]["failed"] == 0
    raw = _raw(_series(PIECEWISE))
    assert _sum(raw[-1][1], "vllm:num_requests_running") == 0


def test_neither_log_is_a_crash_and_the_series_stay_small(result):
    for n in CONFIG.values():
        assert not result["engines"][n]["classification"]["crashed"], n
    for which in (FULL, PIECEWISE):
        assert (CAPTURE / f"stall-{which}.metrics.jsonl").stat().st_size < 2_000_000
