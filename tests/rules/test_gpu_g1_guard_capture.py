"""Served GPU captures of bench/bench_gpu_g1_guard.py (issue 33 item 2), committed as
tests/fixtures/vllm-<version>-<gpu>-g1-guard*/g1-guard.json (one folder per run: TP=1, TP=2, ...). Skipped while
none is committed. What each must show: the tiny model's attention layers split (vLLM's padding line), both
engines ran vLLM's FULL_AND_PIECEWISE graphs with the same launch line, the gdn-guard guard applied in the guarded
engine's processes only and turned the reuse off there, and every held-out answer of the guarded engine exact at
every concurrency with no request left waiting (no stall).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPTURES = sorted(REPO.glob("tests/fixtures/vllm-*-g1-guard*/g1-guard.json"))


@pytest.mark.skipif(not CAPTURES, reason="no served G1 guard capture committed yet (bench/bench_gpu_g1_guard.py)")
@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.parent.name)
def test_served_guard_capture(path):
    r = json.loads(path.read_text())
    assert r["dry_run"] is False and {"base", "guard"} <= set(r["variants"])
    base, guard = r["engines"]["base"], r["engines"]["guard"]
    assert base["argv"][: base["argv"].index("--port")] == guard["argv"][: guard["argv"].index("--port")]
    for e in (base, guard):
        assert e["ready_s"] is not None and e["log"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
        assert e["log"]["padding_layers"] and e["log"]["tracebacks"] == 0
        assert e["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert base["log"]["processes_with_guard"] == 0 and base["log"]["guard_decision_lines"] == 0
    assert guard["log"]["processes_with_guard"] >= 1 + r["tp"]  # EngineCore / API server and every TP worker
    assert guard["log"]["guard_decision_lines"] >= r["tp"]  # a FULL-graph builder changed on each rank
    levels = set(r["concurrency"])
    assert levels >= {8, 32}
    for conc in levels:
        s = r["summary"]["guard"][f"c={conc}"]
        assert s["requests"] >= r["heldout_requests"] and s["unsent"] == 0 and s["errors"] == 0
        assert s["exact"] == s["requests"], (conc, s)
