"""(c) The V2 model runner with a hybrid model at vLLM 0.22.0 is refused at config time (B3, vllm#38041),
the operator refuses the spec up front, and `gdnctl classify-log` names vllm#38041 from the real log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import harness
from waiting import poll

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render.engine import engine_env, vllm_args
from gdn_operator.rules import evaluate


def test_v2_runner_hybrid_refused_and_classified(gpu_site, workdir, artifacts, engines):
    spec_dict = dict(harness.adapted_manifest(policy="reject")["spec"], modelRunner="v2")
    spec = GDNModelServerSpec.model_validate(spec_dict)
    ev = evaluate(spec, default_policy="reject")
    assert not ev.allowed and "vllm#38041" in [f.rule for f in ev.findings if f.action == "rejected"]

    # What the renderer emits for this spec if admission let it through: its argv and env.
    env = {e["name"]: e["value"] for e in engine_env(spec) if "value" in e}
    assert env.get("VLLM_USE_V2_MODEL_RUNNER") == "1"
    rendered = harness.Rendered(vllm_args("tiny-recall", spec), env, [])
    eng = harness.start("v2-runner", rendered, workdir / "engines", site_path=gpu_site)
    try:
        poll(eng.proc.poll, until=lambda rc: rc is not None, timeout=300, interval=1)
        assert eng.proc.returncode not in (None, 0), "the V2 runner engine did not exit within 300 s"
    finally:
        harness.stop(eng)
    shutil.copyfile(eng.log, artifacts / "serve-v2-runner-0.22.0.log")
    assert "VLLM_USE_V2_MODEL_RUNNER does not yet support: hybrid/mamba models" in eng.log_text()
    p = subprocess.run(
        [harness.PYTHON, "-m", "gdn_operator.cli", "classify-log", str(eng.log), "--output", "json"],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr  # 0: a crash was found
    doc = json.loads(p.stdout)
    assert doc["crashed"] and doc["upstream"] == "vllm#38041", doc
