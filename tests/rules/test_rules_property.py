"""Property-based: over random valid specs the evaluator never raises, is deterministic, its verdict is
consistent, and a mitigated spec is a fixed point (re-evaluating it under reject refuses nothing)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from rules_helpers import apply_json_patch

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import get_path, user_set
from gdn_operator.rules.matching import keeps_spec_decoding
from gdn_operator.rules import effective_config, evaluate, load_rules

CAT = load_rules()
VERSIONS = list(CAT.releases) + [
    "0.19.2rc1.dev226+g53b9640fb",
    "0.17.1rc1",
    "v0.26.0",
    "0.35.0",  # newer than the catalogue
    "0.16.0",
    "latest",
    "0.33.0rc1",
    "1!2",
    "0.25",
]
MODELS = [
    "hf://Qwen/Qwen3.5-27B",
    "hf://Qwen/Qwen3.6-35B-A3B",
    "hf://Qwen/Qwen3-Next-80B-A3B-Instruct",
    "hf://Qwen/Qwen3.8-27B",
    "pvc://models/qwen3_5-9b",
    "hf://Qwen/Qwen3-8B",
    "hf://acme/finetune",
]
ARCHS = [None, "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM"]
PATCHES = list(CAT.patch_ids) + ["gdn-guard/vllm-1", "vendor/thing"]

opt_bool = st.sampled_from([None, True, False])


@st.composite
def spec_dicts(draw):
    model = {"uri": draw(st.sampled_from(MODELS))}
    arch = draw(st.sampled_from(ARCHS))
    if arch:
        model["architecture"] = arch
    version = draw(st.sampled_from(VERSIONS))
    d = {
        "model": model,
        "image": {"tag": "t", "vllmVersion": version, "patches": draw(st.lists(st.sampled_from(PATCHES), max_size=3))},
        "tensorParallelSize": draw(st.sampled_from([1, 2, 4, 8])),
        "speculativeDecoding": {
            "enabled": draw(st.booleans()),
            "method": draw(st.sampled_from(["mtp", "qwen3_next_mtp", "qwen3_5_mtp"])),
            "numSpeculativeTokens": draw(st.integers(1, 16)),
        },
    }
    for key in ("asyncScheduling", "prefixCaching", "chunkedPrefill"):
        v = draw(opt_bool)
        if v is not None:
            d[key] = v
    for key, choices in (
        ("modelRunner", ["auto", "v1", "v2"]),
        ("attentionBackend", ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"]),
        ("gdnPrefillBackend", ["flashinfer", "triton", "cutedsl", "aiter_flydsl", "sycl"]),
        ("cudagraphMode", ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY"]),
        ("admissionPolicy", ["reject", "mitigate", "warn"]),
    ):
        if draw(st.booleans()):
            d[key] = draw(st.sampled_from(choices))
    if draw(st.booleans()):
        d["enforceEager"] = draw(st.booleans())
    for key, lo, hi in (("maxNumSeqs", 1, 2048), ("maxNumBatchedTokens", 1, 65536), ("maxModelLen", 16, 262144)):
        if draw(st.booleans()):
            d[key] = draw(st.integers(lo, hi))
    if draw(st.booleans()):
        d["env"] = [{"name": "NCCL_P2P_DISABLE", "value": draw(st.sampled_from(["0", "1"]))}]
    return d


def _valid(d):
    try:
        return GDNModelServerSpec.model_validate(d)
    except ValidationError:
        assume(False)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_dicts(), st.sampled_from(["reject", "mitigate", "warn"]))
def test_evaluator_never_raises_and_is_consistent(d, default_policy):
    spec = _valid(d)
    ev = evaluate(spec, default_policy=default_policy)
    again = evaluate(GDNModelServerSpec.model_validate(d), default_policy=default_policy)
    assert json.dumps(ev.to_dict(), sort_keys=True) == json.dumps(again.to_dict(), sort_keys=True)

    assert ev.allowed == (not ev.rejected)
    assert ev.exit_code == (0 if ev.allowed and not ev.changed else 1)
    assert bool(ev.patch) <= ev.changed  # a patch only with a mitigated spec
    if not ev.allowed:
        assert ev.mitigated_spec is None and ev.patch == [] and ev.denial_message()
    # silent corruption from an enforced rule is never merely warned
    for f in ev.findings:
        rule = CAT.rule(f.rule)
        if rule is not None and rule.kind == "silent-corruption" and rule.action == "enforce":
            assert f.action in ("rejected", "mitigated")
        if rule is not None and rule.action == "warn" and rule.escalate_if is None:
            assert f.action in ("warned", "advisory")
            assert (f.action == "warned") == bool(rule.mitigation and keeps_spec_decoding(rule.mitigation_patch))
    # safe defaults: only fields left unset, never speculative decoding off, each value in the spec
    # that runs, each from a rule with that very mitigation
    for dflt in ev.defaults:
        # (or one the policy's mitigation unset: it then takes its safe default, as if submitted unset)
        assert not user_set(spec, dflt.field) or (dflt.field, None) in ev.change.changes
        assert not dflt.field.startswith("speculativeDecoding.enabled")
        assert CAT.rule(dflt.rule).mitigation[dflt.field] == dflt.value
        if ev.allowed:
            assert get_path(ev.run_spec.model_dump(by_alias=True, mode="json"), dflt.field)[1] == dflt.value
    if ev.allowed and not ev.changed:  # (a mitigation under the user's policy may turn it off, e.g. vllm#36917)
        assert ev.run_spec.speculative_decoding.enabled == spec.speculative_decoding.enabled
    # under reject nothing is ever changed
    if ev.policy == "reject":
        assert not ev.changed and not ev.mitigated
    if ev.changed:
        # fixed point: the mitigated spec needs no further change under the same policy ...
        same = evaluate(ev.mitigated_spec, policy=ev.policy)
        assert same.allowed and not same.changed, [f.message for f in same.findings if f.action != "warned"]
        # ... and none of the mitigated rules fires on it any more
        assert not ({f.rule for f in ev.mitigated} & {f.rule for f in same.findings})
        if ev.policy == "mitigate":  # every enforced rule was handled: reject admits the result
            final = evaluate(ev.mitigated_spec, policy="reject")
            assert final.allowed, [f.message for f in final.rejected]
        # the webhook patch turns the submitted object into the mitigated spec
        obj = {"spec": spec.model_dump(by_alias=True, exclude_unset=True, mode="json")}
        patched = apply_json_patch(obj, ev.patch)
        again = evaluate(GDNModelServerSpec.model_validate(patched["spec"]), policy=ev.policy)
        assert again.run_spec.model_dump(mode="json") == ev.mitigated_spec.model_dump(mode="json")


@settings(max_examples=300, deadline=None)
@given(spec_dicts(), st.sampled_from(VERSIONS + [None]))
def test_effective_config_total(d, version):
    spec = _valid(d)
    eff = effective_config(spec, version)
    status = eff.to_status()
    assert status.vllm_version == (version if version is not None else spec.image.vllm_version)
    if eff.values["gdn_hybrid"] and eff.version is not None and eff.prefix_caching is not None:
        assert eff.mamba_cache_mode == ("align" if eff.prefix_caching else "none")
    json.dumps(eff.as_dict())


def _hits(hits):
    return [
        (h.ref, h.kind, h.severity, h.enforced, h.fields, h.mitigation, h.detail, h.order, h.advisory, h.keeps_spec) for h in hits
    ]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_dicts(), spec_dicts(), st.sampled_from(VERSIONS))
def test_rematch_equals_a_full_match(d1, d2, version):
    """rules.matching.rematch (the defaults fixpoint re-evaluates only the rules reading a changed value) gives
    exactly match_rules' hits, details included, for any two configurations of one vLLM version."""
    from gdn_operator.rules.matching import match_rules, rematch

    e1 = effective_config(_valid(d1), version)
    e2 = effective_config(_valid(d2), version)
    assert _hits(rematch(CAT, e2, e1, match_rules(CAT, e1))) == _hits(match_rules(CAT, e2))
    for h in CAT.rules:  # each rule's own mitigation applied to the first: the step the defaults take
        if h.mitigation_patch is None:
            continue
        try:
            s3 = GDNModelServerSpec.model_validate(h.mitigation_patch.apply(d1))
        except ValidationError:
            continue
        e3 = effective_config(s3, version)
        assert _hits(rematch(CAT, e3, e1, match_rules(CAT, e1))) == _hits(match_rules(CAT, e3)), h.id


def test_rule_reads_cover_every_predicate_operator():
    from gdn_operator.rules.predicates import referenced_fields

    pred = {
        "all": [
            {"has_arg": "--x"},
            {"has_patch": "p"},
            {"version": "<1"},
            {"not": {"eq": {"env.A": "1"}}},
            {"any": [{"in": {"spec_method": ["mtp"]}}, {"gte": {"max_num_seqs": 1}}]},
        ]
    }
    assert referenced_fields(pred) == {"extra_args_flags", "patches", "vllm_version", "env.A", "spec_method", "max_num_seqs"}
    assert all(r.reads >= ({"patches"} if r.patches else set()) for r in CAT.rules)
