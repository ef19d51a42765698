"""The H100 captures of bench/bench_gpu_tp.py (tests/fixtures/vllm-0.22.0-h100-tp1-matrix) against the rules.

vLLM 0.22.0 from the offline bundle, the trained tiny Qwen3-Next, MTP k=2, TP=1, 32-48 requests in flight
for 90-180 s per configuration; held-out recall answers checked (greedy, exact). What the GPU showed:

* no configuration crashed (vllm#41190's illegal address needs TP >= 2, which no lent machine had);
* MTP with FULL decode CUDA graphs (vLLM's default FULL_AND_PIECEWISE, or FULL_DECODE_ONLY) ends ~99.5 % of
  answers early, silently; PIECEWISE, eager, or the same graphs without MTP are exact — the rule
  gdn-operator/mtp-full-decode-cudagraph (G1) and its mitigation PIECEWISE;
* eager MTP with async scheduling loses a few answers (0.4-1.3 %, a race): vllm#45100 (B2).

Each launch line is read back from the capture with `gdnctl validate`'s reader, so the rules judge exactly
the configuration the GPU ran.
"""

from __future__ import annotations

import json

import pytest
from rules_helpers import rules_of

from gdn_operator.api.enums import CudagraphMode
from gdn_operator.rules import evaluate
from gdn_operator.rules.launchline import parse_launch_line
from gdn_operator.watch.signatures import classify_text
from paths import REPO

CAPTURE = REPO / "tests" / "fixtures" / "vllm-0.22.0-h100-tp1-matrix"
G1 = "gdn-operator/mtp-full-decode-cudagraph"
B2 = "vllm#45100"


def _results() -> list[dict]:
    out = []
    for f in sorted(CAPTURE.glob("bench-gpu-tp-*.json")):
        run = json.loads(f.read_text())
        assert run["vllm_version"] == "0.22.0" and run["tp"] == 1 and "H100" in run["gpus"][0]
        out += [dict(r, run=f.stem) for r in run["results"]]
    return out


RESULTS = _results()


def _evaluate(result: dict):
    line = parse_launch_line(["vllm", "serve", *result["argv"]], vllm_version="0.22.0", architecture="Qwen3NextForCausalLM")
    return line, evaluate(line.spec, overrides=line.overrides, policy="reject", defaults=False)  # as the GPU ran it


def test_capture_has_every_configuration_measured():
    names = {r["config"] for r in RESULTS}
    assert {
        "base",
        "async-on",
        "nomtp-async-on",
        "base-cudagraph",
        "nomtp-cudagraph",
        "base-cg-piecewise",
        "base-cg-full-decode-only",
        "async-on-cudagraph",
    } <= names
    for r in RESULTS:
        assert r["started"] and r["load"]["failed"] == 0 and r["load"]["recall"] >= 500, (r["run"], r["config"])
        assert not r["load"]["crashed"], (r["run"], r["config"])


@pytest.mark.parametrize("result", RESULTS, ids=[f"{r['run']}:{r['config']}" for r in RESULTS])
def test_the_cudagraph_rule_fires_exactly_where_answers_were_cut(result):
    _, ev = _evaluate(result)
    rate = result["load"]["exact_recall_rate"]
    assert (G1 in rules_of(ev, "rejected")) == (rate < 0.9), (result["config"], rate)


@pytest.mark.parametrize("result", RESULTS, ids=[f"{r['run']}:{r['config']}" for r in RESULTS])
def test_every_wrong_answer_is_explained_by_a_rejecting_rule(result):
    """No corruption the rules would have admitted: below 100 % exact, G1 or B2 rejects the configuration."""
    _, ev = _evaluate(result)
    if result["load"]["exact_recall_rate"] < 1.0:
        assert rules_of(ev, "rejected") & {G1, B2}, result["config"]


def test_the_mitigation_was_measured_exact_and_keeps_mtp():
    bad = next(r for r in RESULTS if r["config"] == "base-cudagraph")
    line, _ = _evaluate(bad)
    ev = evaluate(line.spec, overrides=line.overrides, policy="mitigate", defaults=False)
    assert ev.allowed and G1 in rules_of(ev, "mitigated")
    mitigated = ev.mitigated_spec
    assert mitigated is not None and mitigated.cudagraph_mode == CudagraphMode.PIECEWISE
    assert mitigated.speculative_decoding.enabled
    good = next(r for r in RESULTS if r["config"] == "base-cg-piecewise")
    good_line, _ = _evaluate(good)
    assert good_line.spec.speculative_decoding.enabled and good["load"]["exact_recall_rate"] == 1.0
    # what PIECEWISE costs against the default graphs, and gains over eager, in the same kind of load
    assert good["load"]["tokens_per_s"] > max(r["load"]["tokens_per_s"] for r in RESULTS if r["config"] == "base")


@pytest.mark.parametrize("log", ["serve-base-cg-full-decode-only.log", "serve-base-cg-piecewise.log"])
def test_silent_corruption_leaves_no_crash_signature(log):
    """The cut answers come with no error in the engine log: the crash watch cannot see G1, only admission
    (the rule) and the output probes can."""
    text = (CAPTURE / log).read_text()
    assert "Capturing CUDA graphs" in text and "Application startup complete" in text
    assert not classify_text(text).crashed
