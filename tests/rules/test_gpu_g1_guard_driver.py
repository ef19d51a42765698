"""bench/bench_gpu_g1_guard.py (issue 33) without a GPU: its log reader on the real H100 probe logs and the gdn-guard
lines as the plugin writes them, and a --dry-run on stand-in engines (tests/gpu/standin_engine.py) for its phases,
argv and output file. The GPU run itself (the served guard proof) is the integrator's; its figures land in a fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "images" / "gdn-guard" / "src"))

import bench_gpu_g1_guard as drv  # noqa: E402

import gdn_guard  # noqa: E402
from gdn_guard.guards import fa3_group_metadata  # noqa: E402

PROBE = REPO / "tests" / "fixtures" / "vllm-0.22.0-h100-g1-probe"


def test_log_facts_on_the_real_probe_logs():
    base = drv.log_facts((PROBE / "g1-base.log").read_text())
    assert base["vllm_version"] == "0.22.0" and base["padding_layers"] == [1]
    assert base["cudagraph_mode"] == "FULL_AND_PIECEWISE" and base["processes_with_guard"] == 0
    assert drv.log_facts((PROBE / "g1-piecewise.log").read_text())["cudagraph_mode"] == "PIECEWISE"


def test_log_facts_counts_the_guard_in_each_process():
    """What two TP workers and EngineCore log when the plugin applies the guard (prefixes as vLLM prints them)."""
    line = gdn_guard.format_log_line("0.26.0", [fa3_group_metadata.NAME], [fa3_group_metadata.PATCH_ID])
    decision = f"gdn-guard {fa3_group_metadata.NAME} (G1): FULL CUDA graphs: every KV-cache group builds its own"
    text = "\n".join(
        [
            f"(EngineCore_DP0 pid=10) INFO 11-28 10:00:00 [plugin.py:120] {line}",
            f"(Worker_TP0 pid=11) INFO 11-28 10:00:01 [plugin.py:120] {line}",
            f"(Worker_TP1 pid=12) INFO 11-28 10:00:01 [plugin.py:120] {line}",
            f"(Worker_TP0 pid=11) INFO 11-28 10:00:09 [fa3_group_metadata.py:66] {decision}",
            f"(Worker_TP1 pid=12) INFO 11-28 10:00:09 [fa3_group_metadata.py:66] {decision}",
        ]
    )
    facts = drv.log_facts(text)
    assert facts["processes_with_guard"] == 3 and facts["guard_decision_lines"] == 2


def test_dry_run_serves_both_variants_with_the_asked_graphs(tmp_path):
    out = tmp_path / "g1"
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_gpu_g1_guard.py"), "--out", str(out), "--dry-run"]
        + ["--until", str(time.time() + 90), "--repeats", "1", "--standin-ready", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((out / "g1-guard.json").read_text())
    assert r["dry_run"] is True and r["variants"] == ["base", "guard"] and r["errors"] == []
    for name, guarded in (("base", False), ("guard", True)):
        e = r["engines"][name]
        argv = e["argv"]
        assert argv[argv.index("--compilation-config") + 1] == '{"cudagraph_mode":"FULL_AND_PIECEWISE"}'
        assert '{"method":"mtp","num_speculative_tokens":2}' in argv and "--no-async-scheduling" in argv
        assert "--enforce-eager" not in argv and "--tensor-parallel-size" in argv
        assert e["env"]["VLLM_USE_V2_MODEL_RUNNER"] == "0" and e["gdn_guard_on_pythonpath"] is guarded
    got = {(x["variant"], x["concurrency"]) for x in r["passes"]}
    assert got == {("base", 8), ("guard", 8), ("base", 32), ("guard", 32)}
    assert all(x["requests"] == r["heldout_requests"] for x in r["passes"])
    assert set(r["summary"]) == {"base", "guard"} and set(r["summary"]["base"]) == {"c=8", "c=32"}
    assert all(x["exit_code_before_stop"] is None for x in r["engines"].values())  # alive until the teardown
