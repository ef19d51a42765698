"""vLLM 0.34.0 in the catalogue (issue 46), every fact read in the 0.34.0 wheel (docs/safe-defaults.md):

- the V1 model runner is gone (platforms/interface.py refuses VLLM_USE_V2_MODEL_RUNNER other than 1): modelRunner v1
  is refused with why and what to do; the rules that needed V1 end at 0.33.x (ends_in), their defaults with them;
- async scheduling: vllm#51508's cause (a zero accepted count) is not reachable on the V2 runner, so an unset
  asyncScheduling renders nothing from 0.34.0 (vLLM's default, on for every generative model);
- every default the rules still force at 0.34.0 names the 0.34.0 source it was read in;
- breakable CUDA graphs: vLLM's default for the Qwen3.5 classes from 0.34.0, not for Qwen3-Next; the spec field
  spec.cudagraphImplementation picks it, refused where breakable graphs do not break at the GDN core (< 0.30.0).
"""

from __future__ import annotations

import pytest
from rules_helpers import TINY_MODEL, mk, rules_of

from gdn_operator.render.engine import engine_env, vllm_args
from gdn_operator.rules import evaluate, load_rules
from gdn_operator.rules.effective import effective_config
from gdn_operator.versions import require_version

V34 = "0.34.0"


def test_modelrunner_v1_is_refused_at_0_34_with_why_and_what_to_do():
    ev = evaluate(mk(V34, modelRunner="v1"))
    assert not ev.allowed
    [f] = [f for f in ev.findings if f.rule == "vllm-config/v1-runner-removed"]
    assert f.action == "rejected" and f.kind == "startup-crash"
    # why: the runner is gone; what to do: drop the field or pin <= 0.33.x
    assert "V1 model runner was removed in vLLM 0.34.0" in f.message
    assert "Drop spec.modelRunner" in f.message and "0.33.x" in f.message
    assert "spec.modelRunner" in f.fields
    # under the mitigate policy the server runs V2 (unset), never VLLM_USE_V2_MODEL_RUNNER=0
    mit = evaluate(mk(V34, modelRunner="v1"), default_policy="mitigate")
    assert mit.allowed and mit.run_spec.model_runner == "auto"
    assert not any(e["name"] == "VLLM_USE_V2_MODEL_RUNNER" for e in engine_env(mit.run_spec))


@pytest.mark.parametrize("runner, refused", [("v1", False), ("auto", False), ("v2", False)])
def test_modelrunner_is_left_alone_before_0_34(runner, refused):
    ev = evaluate(mk("0.33.0", modelRunner=runner))
    assert ("vllm-config/v1-runner-removed" in rules_of(ev)) is refused


def test_the_runner_resolves_to_v2_only_without_the_v1_fallback_note():
    eff = effective_config(mk(V34))
    assert eff.model_runner == "v2" and "only runner" in eff.sources["model_runner"]
    assert not any("falls back to V1" in n for n in eff.notes)
    assert any("falls back to V1" in n for n in effective_config(mk("0.33.0")).notes)


@pytest.mark.parametrize("rule", ["vllm#51571", "vllm#44697", "gdn-operator/mtp-full-decode-cudagraph", "vllm#51508"])
def test_the_rules_that_need_the_v1_runner_end_at_0_33(rule):
    r = load_rules().rule(rule)
    assert r is not None and r.ends_in == V34 and r.fixed_in is None
    assert not r.range.contains(require_version(V34)) and r.range.contains(require_version("0.33.0"))
    assert "removed" in r.ends_why or "V2 runner" in r.ends_why


def test_an_unset_asyncscheduling_renders_nothing_from_0_34():
    ev = evaluate(mk(V34))
    assert ev.allowed and "asyncScheduling" not in {d.field for d in ev.defaults}
    argv = vllm_args("m", ev.run_spec)
    assert "--no-async-scheduling" not in argv and "--async-scheduling" not in argv
    assert ev.effective.async_scheduling is True  # vLLM's own default, read in config/vllm.py
    # set by the user, it renders as it always did
    assert "--no-async-scheduling" in vllm_args("m", evaluate(mk(V34, asyncScheduling=False)).run_spec)
    # 0.33.0 keeps its default (modelRunner v1 still exists there)
    assert ("asyncScheduling", False, "vllm#51508") in [(d.field, d.value, d.rule) for d in evaluate(mk("0.33.0")).defaults]


def test_async_scheduling_resolves_on_without_speculative_decoding_from_0_34():
    eff = effective_config(mk(V34, speculativeDecoding={"enabled": False}))
    assert eff.async_scheduling is True and "0.34.0" in eff.sources["async_scheduling"]
    assert effective_config(mk("0.33.0", speculativeDecoding={"enabled": False})).async_scheduling is None


@pytest.mark.parametrize("model", ["hf://Qwen/Qwen3.5-27B", TINY_MODEL, "hf://Qwen/Qwen3.5-397B-A17B"])
def test_every_default_forced_at_0_34_names_a_cause_read_in_the_0_34_source(model):
    ev = evaluate(mk(V34, model=model))
    assert ev.allowed and ev.defaults
    rules = load_rules()
    for d in ev.defaults:
        r = rules.rule(d.rule)
        assert r is not None
        text = " ".join(filter(None, (r.evidence, r.notes)))
        assert "0.34.0" in text, (d.rule, "no 0.34.0 reading in its evidence or notes")


def test_the_breakable_default_follows_the_architecture_list_of_0_34():
    qwen35 = effective_config(mk(V34))
    assert qwen35.cudagraph_implementation == "breakable" and qwen35.cudagraph_implementation_set is None
    assert effective_config(mk("0.33.0")).cudagraph_implementation == "compiled"
    nxt = effective_config(mk(V34, model="hf://Qwen/Qwen3-Next-80B-A3B-Instruct"))
    assert nxt.architecture == "Qwen3NextForCausalLM" and nxt.cudagraph_implementation == "compiled"
    assert effective_config(mk(V34, enforceEager=True)).cudagraph_implementation is None
    chosen = effective_config(mk(V34, cudagraphImplementation="compiled"))
    assert chosen.cudagraph_implementation == chosen.cudagraph_implementation_set == "compiled"
    assert evaluate(mk(V34)).effective.cudagraph_implementation == "breakable"  # status.effective


@pytest.mark.parametrize(
    "version, value, refused",
    [("0.29.0", "breakable", True), ("0.29.0", "compiled", True), ("0.30.0", "breakable", False), (V34, "compiled", False)],
)
def test_cudagraph_implementation_is_refused_where_breakable_graphs_do_not_break_at_the_gdn_core(version, value, refused):
    ev = evaluate(mk(version, cudagraphImplementation=value))
    assert ev.allowed is not refused
    if refused:
        [f] = [f for f in ev.findings if f.rule == "vllm-config/cudagraph-implementation-unsupported"]
        assert "needs vLLM 0.30.0 or newer" in f.message and "Unset spec.cudagraphImplementation" in f.message


def test_g1_is_not_forced_at_0_34_and_its_breakable_question_is_open_with_a_named_evidence_slot():
    ev = evaluate(mk(V34, model=TINY_MODEL))
    assert "gdn-operator/mtp-full-decode-cudagraph" not in rules_of(ev) and ev.run_spec.cudagraph_mode is None
    r = load_rules().rule("gdn-operator/mtp-full-decode-cudagraph")
    assert r is not None and "breakable" in r.notes and "GPU evidence: pending, issue 46 item 4" in r.notes
