"""Admission policy: reject / mitigate / warn, silent corruption never silently admitted, mitigations
iterate to a fixed point, JSON patch for the mutating webhook, denial text, version findings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from rules_helpers import TINY_MODEL, apply_json_patch, mk, rules_of

from gdn_operator.api.load import load_file
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch, set_path
from gdn_operator.api.status import RuleFinding
from gdn_operator.api.vllm_args import table_versions
from gdn_operator.versions import require_version
from gdn_operator.rules import evaluate, load_rules
from gdn_operator.rules import evaluator as evaluator_mod
from gdn_operator.rules.rulefile import default_rule_file, parse_rule_file
from gdn_operator.rules.effective import LaunchOverrides

ROOT = Path(__file__).resolve().parents[2]
DENIED = ROOT / "examples" / "denied-qwen3.6-prefix-caching-mtp.yaml"


def _denied_spec() -> GDNModelServerSpec:
    return load_file(str(DENIED))[0].spec


def test_reject_policy_denies_vllm_43559_example():
    spec = _denied_spec()  # admissionPolicy: reject, vLLM 0.28.0, prefixCaching: true SET by the user
    ev = evaluate(spec, default_policy="mitigate")  # the spec's own policy wins over the default
    assert ev.policy == "reject"
    assert not ev.allowed and ev.exit_code == 1 and ev.run_spec is None
    assert ev.mitigated_spec is None and ev.patch == []
    assert rules_of(ev, "rejected") == {"vllm#43559"}
    # vllm#51571 (align + async, V1) is avoided by the unset asyncScheduling's safe default, not rejected
    assert [(d.field, d.value, d.rule) for d in ev.defaults if d.field == "asyncScheduling"] == [
        ("asyncScheduling", False, "vllm#51571")
    ]
    msg = ev.denial_message()
    assert msg.splitlines()[0].startswith("GDNModelServer refused by 1 known-crash rule ")
    for needle in ("vllm#43559", "spec.prefixCaching", "prefixCaching: false", "0.28.0"):
        assert needle in msg
    assert all(isinstance(f, RuleFinding) for f in ev.findings)


def test_mitigate_policy_applies_minimal_change_vllm_43559():
    spec = _denied_spec().model_copy(update={"admission_policy": None})
    ev = evaluate(spec, default_policy="mitigate")
    assert ev.allowed and ev.changed and ev.exit_code == 1
    assert rules_of(ev, "mitigated") == {"vllm#43559"}  # prefix caching off also cures vllm#51571
    assert "vllm#51571" not in rules_of(ev)
    assert ev.patch == [{"op": "replace", "path": "/spec/prefixCaching", "value": False}]
    assert ev.mitigated_spec.prefix_caching is False
    assert ev.effective.prefix_caching is False and ev.effective.mamba_cache_mode == "none"
    assert ev.original_detail.prefix_caching is True
    f = next(f for f in ev.findings if f.rule == "vllm#43559")
    assert f.mitigation == {"prefixCaching": False} and "Applied: prefixCaching: false" in f.message
    assert ev.denial_message() == ""


def test_mitigations_chain_to_a_fixed_point_vllm_43559_then_45100():
    # 0.20.0 + explicit prefix caching and async scheduling: #43559 -> prefixCaching false -> non-align V1
    # async -> #45100 -> async off (both values are the user's, so the policy changes them, no default does)
    spec = mk("0.20.0", prefixCaching=True, asyncScheduling=True)
    ev = evaluate(spec, default_policy="mitigate")
    assert ev.allowed
    assert rules_of(ev, "mitigated") == {"vllm#43559", "vllm#45100"}
    assert ev.patch == [
        {"op": "replace", "path": "/spec/prefixCaching", "value": False},
        {"op": "replace", "path": "/spec/asyncScheduling", "value": False},
    ]
    again = evaluate(ev.mitigated_spec, default_policy="reject")
    assert again.allowed and not again.rejected


def test_warn_policy_mitigates_silent_corruption_but_warns_crashes():
    ev = evaluate(mk("0.17.1", prefixCaching=True, admissionPolicy="warn"))
    # vllm#36917 is a runtime crash -> warned; vllm#43559 is silent corruption -> mitigated, never just warned
    assert "vllm#36917" in rules_of(ev, "warned")
    assert "vllm#43559" in rules_of(ev, "mitigated")
    for f in ev.findings:
        if f.kind == "silent-corruption" and load_rules().rule(f.rule).action == "enforce":
            assert f.action != "warned"


def _catalogue_without_mitigation(rule_id: str):
    raw = yaml.safe_load(default_rule_file().read_text())
    for r in raw["rules"]:
        if r["id"] == rule_id:
            r.pop("mitigation", None)
    return parse_rule_file(yaml.safe_dump(raw), "test")


def test_warn_policy_rejects_silent_corruption_without_mitigation(monkeypatch):
    cat = _catalogue_without_mitigation("vllm#43559")
    monkeypatch.setattr(evaluator_mod, "load_rules", lambda: cat)
    ev = evaluate(mk("0.33.0"), default_policy="warn")
    assert "vllm#43559" in rules_of(ev, "rejected")
    assert not ev.allowed


def test_mitigate_policy_rejects_rules_without_mitigation():
    # vllm#50708 (budget) has no automatic mitigation
    ov = LaunchOverrides(spec_method="dflash", num_speculative_tokens=16)
    ev = evaluate(mk("0.26.0", prefixCaching=False), default_policy="mitigate", overrides=ov)
    assert "vllm#50708" in rules_of(ev, "rejected") and not ev.allowed
    assert ev.patch == [] and ev.mitigated_spec is None


def _with_rules(monkeypatch, *extra):
    raw = yaml.safe_load(default_rule_file().read_text())
    base = {
        "bug": "test",
        "kind": "runtime-crash",
        "severity": "critical",
        "versions": "*",
        "workaround": "synthetic workaround",
        "evidence": "synthetic test rule",
    }
    raw["rules"] += [{**base, **r} for r in extra]
    cat = parse_rule_file(yaml.safe_dump(raw), "test")
    monkeypatch.setattr(evaluator_mod, "load_rules", lambda: cat)
    return cat


def test_mitigation_that_triggers_another_reject_is_not_applied(monkeypatch):
    # rule X's mitigation (enforceEager: true) walks into rule Y, which has no mitigation
    _with_rules(
        monkeypatch,
        {
            "id": "vllm#99998",
            "title": "synthetic X",
            "when": {"eq": {"gdn_hybrid": True, "enforce_eager": False}},
            "fields": ["spec.enforceEager"],
            "mitigation": {"enforceEager": True},
        },
        {"id": "vllm#99997", "title": "synthetic Y", "when": {"eq": {"enforce_eager": True}}, "fields": ["spec.enforceEager"]},
    )
    ev = evaluate(mk("0.33.0", prefixCaching=False), default_policy="mitigate")
    f = next(f for f in ev.findings if f.rule == "vllm#99998")
    assert f.action == "rejected" and "would trigger vllm#99997" in f.message
    assert not ev.allowed and ev.patch == [] and ev.mitigated_spec is None


def test_chained_mitigation_that_cannot_finish_is_refused_as_a_whole(monkeypatch):
    # X's mitigation (gdnPrefillBackend: triton) on 0.17.1 triggers the real
    # vllm-config/gdn-prefill-backend-unsupported, whose own mitigation (unset) would undo X's: a loop
    _with_rules(
        monkeypatch,
        {
            "id": "vllm#99999",
            "title": "synthetic X",
            "when": {"all": [{"eq": {"gdn_hybrid": True, "mtp": True}}, {"ne": {"gdn_prefill_backend": "triton"}}]},
            "fields": ["spec.gdnPrefillBackend"],
            "mitigation": {"gdnPrefillBackend": "triton"},
        },
    )
    ev = evaluate(mk("0.17.1", asyncScheduling=False, patches=["gdn-guard/vllm-36917"]), default_policy="mitigate")
    assert not ev.allowed and ev.patch == [] and ev.mitigated_spec is None
    assert "vllm#99999" in rules_of(ev, "rejected")
    assert any("loop" in f.message for f in ev.rejected)
    assert not any("Applied:" in f.message for f in ev.findings)
    # on 0.18.0 the same value is fine: the unset field resolves to it (a safe default, no mitigation)
    ev = evaluate(mk("0.18.0", asyncScheduling=False), default_policy="mitigate")
    assert "vllm#99999" not in rules_of(ev) and ev.allowed and not ev.changed
    assert ("gdnPrefillBackend", "triton", "vllm#99999") in [(d.field, d.value, d.rule) for d in ev.defaults]
    # set by the user, the policy judges it
    ev = evaluate(mk("0.18.0", asyncScheduling=False, gdnPrefillBackend="flashinfer"), default_policy="mitigate")
    assert "vllm#99999" in rules_of(ev, "mitigated") and ev.allowed


def test_mitigation_loop_is_detected(monkeypatch):
    _with_rules(
        monkeypatch,
        {
            "id": "vllm#99991",
            "title": "eager is bad",
            "when": {"eq": {"enforce_eager": True}},
            "fields": ["spec.enforceEager"],
            "mitigation": {"enforceEager": False},
        },
        {
            "id": "vllm#99992",
            "title": "graphs are bad",
            "when": {"eq": {"enforce_eager": False}},
            "fields": ["spec.enforceEager"],
            "mitigation": {"enforceEager": True},
        },
    )
    ev = evaluate(mk("0.33.0", prefixCaching=False), default_policy="mitigate")
    assert not ev.allowed  # the evaluator stops instead of oscillating
    assert any("loop" in f.message for f in ev.rejected)


def test_advisory_rules_stay_warnings_under_every_policy():
    for policy in ("reject", "mitigate", "warn"):
        ev = evaluate(mk("0.25.0", prefixCaching=False, asyncScheduling=True, gdnPrefillBackend="flashinfer"), policy=policy)
        # vllm#53962 (0.25-0.28 async + spec) and flashinfer#3329 are warn rules: values the user SET are
        # warned (with the field and value that avoid them), never changed under any policy
        assert {"vllm#53962", "flashinfer#3329"} <= rules_of(ev, "warned")
        assert ev.mitigated_spec is None and ev.run_spec.gdn_prefill_backend == "flashinfer"
        f = next(f for f in ev.findings if f.rule == "flashinfer#3329")
        assert "Set gdnPrefillBackend: triton." in f.message
        # advisories (no MTP-keeping value avoids them) are listed apart, never as warnings
        assert "vllm#51562" in rules_of(ev, "advisory") and "vllm#51562" not in rules_of(ev, "warned")


def test_escalation_turns_an_advisory_rule_into_an_enforced_one_vllm_37035():
    warned = evaluate(mk("0.33.0", prefixCaching=False, speculativeDecoding={"numSpeculativeTokens": 5}))
    assert "vllm#37035" in rules_of(warned, "warned") and warned.allowed
    spec = mk(
        "0.33.0",
        prefixCaching=False,
        attentionBackend="FLASHINFER",
        speculativeDecoding={"method": "qwen3_next_mtp", "numSpeculativeTokens": 5},
    )
    assert "vllm#37035" in rules_of(evaluate(spec), "rejected")
    ev = evaluate(spec, default_policy="mitigate")
    assert ev.allowed and ev.mitigated_spec.speculative_decoding.num_speculative_tokens == 4
    assert ev.patch == [{"op": "replace", "path": "/spec/speculativeDecoding/numSpeculativeTokens", "value": 4}]


def test_patch_adds_missing_parent_objects_and_removes_unset_fields():
    assert SpecPatch.of([("speculativeDecoding.numSpeculativeTokens", 4)]).json_patch({}) == [
        {"op": "add", "path": "/spec/speculativeDecoding", "value": {"numSpeculativeTokens": 4}}
    ]
    assert SpecPatch.of([("gdnPrefillBackend", None)]).json_patch({"gdnPrefillBackend": "cutedsl"}) == [
        {"op": "remove", "path": "/spec/gdnPrefillBackend"}
    ]
    assert SpecPatch.of([("gdnPrefillBackend", None)]).json_patch({}) == []


def test_unset_mitigation_gdn_prefill_backend_on_0_17():
    ev = evaluate(mk("0.17.1", gdnPrefillBackend="triton", speculativeDecoding={"enabled": False}), default_policy="mitigate")
    assert "vllm-config/gdn-prefill-backend-unsupported" in rules_of(ev, "mitigated")
    assert {"op": "remove", "path": "/spec/gdnPrefillBackend"} in ev.patch
    assert ev.mitigated_spec.gdn_prefill_backend is None


def test_patch_applied_to_the_object_gives_the_mitigated_spec():
    spec = mk("0.20.0", prefixCaching=True, speculativeDecoding={"numSpeculativeTokens": 6}, attentionBackend="FLASHINFER")
    ev = evaluate(spec, default_policy="mitigate")
    assert ev.allowed and ev.changed
    obj = {"spec": spec.model_dump(by_alias=True, exclude_unset=True, mode="json")}
    patched = apply_json_patch(obj, ev.patch)
    # the patch carries the mitigations only; the safe defaults are computed again from the patched spec
    again = evaluate(GDNModelServerSpec.model_validate(patched["spec"]))
    assert again.allowed and not again.changed
    assert again.run_spec.model_dump(mode="json") == ev.run_spec.model_dump(mode="json")


@pytest.mark.parametrize("bad", ["deny", "", "REJECT"])
def test_bad_default_policy_is_a_caller_error(bad):
    with pytest.raises(ValueError):
        evaluate(mk(), default_policy=bad)


def test_unparseable_version_is_a_finding_not_a_crash():
    ev = evaluate(mk("latest"))
    assert [f.rule for f in ev.findings] == ["gdn-operator/unparseable-version"]
    assert ev.findings[0].action == "rejected" and "spec.image.vllmVersion" in ev.findings[0].fields
    assert evaluate(mk("latest", admissionPolicy="warn")).allowed


def test_nightly_version_parses_as_prerelease():
    ev = evaluate(mk("0.19.2rc1.dev226+g53b9640fb", tensorParallelSize=2, prefixCaching=False))
    assert "gdn-operator/unparseable-version" not in rules_of(ev)
    assert "vllm#41190" in rules_of(ev, "advisory")  # the report's own build
    assert "vllm#36917" not in rules_of(ev)  # fixed in 0.18.0
    # < 0.24.0: vllm#45100 matches vLLM's default async scheduling, so the unset field resolves to off
    assert "vllm#45100" not in rules_of(ev)
    assert ("asyncScheduling", False, "vllm#45100") in [(d.field, d.value, d.rule) for d in ev.defaults]
    assert "vllm#45100" in rules_of(
        evaluate(mk("0.19.2rc1.dev226+g53b9640fb", prefixCaching=False, asyncScheduling=True)), "rejected"
    )


@pytest.mark.parametrize("version", ["0.35.0", "0.34.1rc1", "1.0.0"])
def test_newer_than_catalogue_is_a_warning_naming_what_is_unchecked_and_open_bugs_still_apply(version):
    """Issue 46 item 3: a release newer than the catalogue keeps the newest release's rules, and the admission
    warning (status.findings) names what nobody checked for it."""
    ev = evaluate(mk(version))
    f = next(f for f in ev.findings if f.rule == "gdn-operator/version-not-in-catalogue")
    assert f.action == "warned" and f.severity == "info" and "not in the catalogue" in f.message
    assert "the rules of 0.34.0 were applied" in f.message
    table = max((require_version(t) for t in table_versions()), key=lambda v: v.key)  # the newest: all are below
    for unchecked in ("open bugs it fixes", "vllm#43559", "async scheduling, prefix caching, model runner, CUDA graphs",
                      "KV-cache sizing", f"extraArgs read with the vLLM {table} option table", "crash signatures"):  # fmt: skip
        assert unchecked in f.message, (unchecked, f.message)
    assert "vllm-config/" not in f.message.split("assumed present:")[1].split(")")[0]  # config checks are not bugs
    assert ev.allowed  # admitted: a warning, not a refusal
    # open bug, prefix caching on by default: still applies, so the unset field resolves to off
    assert ("prefixCaching", False, "vllm#43559") in [(d.field, d.value, d.rule) for d in ev.defaults]
    assert "vllm#43559" in rules_of(evaluate(mk(version, prefixCaching=True)), "rejected")


def test_catalogue_version_prereleases_are_not_newer():
    assert "gdn-operator/version-not-in-catalogue" not in rules_of(evaluate(mk("0.34.0rc2")))
    assert "gdn-operator/version-not-in-catalogue" not in rules_of(evaluate(mk("0.34.0")))
    assert "gdn-operator/version-not-in-catalogue" not in rules_of(evaluate(mk("0.33.0")))


def test_older_than_catalogue():
    ev = evaluate(mk("0.16.0", prefixCaching=False))
    assert "gdn-operator/version-older-than-catalogue" in rules_of(ev, "advisory")
    assert "vllm#36917" in rules_of(ev, "rejected")


def test_unknown_patch_id_is_reported():
    ev = evaluate(mk("0.33.0", prefixCaching=False, patches=["gdn-guard/vllm-4355"]))
    f = next(f for f in ev.findings if f.rule == "gdn-operator/unknown-patch-id")
    assert "gdn-guard/vllm-4355" in f.message and f.action == "warned"


def test_findings_order_is_deterministic_and_ranked():
    spec = mk("0.17.1", prefixCaching=True, tensorParallelSize=2)
    a = evaluate(spec).to_dict()
    b = evaluate(GDNModelServerSpec.model_validate(spec.model_dump(by_alias=True, exclude_unset=True)))
    assert json.dumps(a, sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    ranks = [({"rejected": 0, "mitigated": 1, "warned": 2, "advisory": 3}[f["action"]]) for f in a["findings"]]
    assert ranks == sorted(ranks)


def test_status_models_round_trip():
    ev = evaluate(_denied_spec())
    from gdn_operator.api.status import GDNModelServerStatus

    st = GDNModelServerStatus(findings=ev.findings, effective=ev.effective)
    again = GDNModelServerStatus.model_validate(st.model_dump(by_alias=True, mode="json"))
    assert [f.rule for f in again.findings] == [f.rule for f in ev.findings]
    assert again.effective.mamba_cache_mode == "align"


#: one engine over two 8-GPU nodes, TP=8 x PP=2 (the MTP + PP rules, issue 36)
PP2 = {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2, "resources": {"gpusPerNode": 8}}


def test_every_mitigation_converges_and_is_clean():
    """For each rule with a mitigation, at an affected version: the mitigate policy reaches a spec that a
    re-evaluation under reject admits (the mitigation itself does not trigger a reject-level rule)."""
    cat = load_rules()
    triggers = {
        "vllm#36917": ("0.17.1", {}),
        "vllm#45100": ("0.23.0", {"asyncScheduling": True}),
        "gdn-operator/mtp-full-decode-cudagraph": ("0.22.0", {"cudagraphMode": "FULL_AND_PIECEWISE", "model": TINY_MODEL}),
        "vllm#38041": ("0.24.0", {"modelRunner": "v2", "prefixCaching": True}),
        "vllm#37035": ("0.17.1", {"speculativeDecoding": {"numSpeculativeTokens": 8}, "attentionBackend": "FLASHINFER"}),
        "vllm#43559": ("0.28.0", {"prefixCaching": True}),
        "vllm#51571": ("0.33.0", {"prefixCaching": True, "modelRunner": "v1", "asyncScheduling": True}),
        "vllm#53962": ("0.26.0", {"asyncScheduling": True}),
        "vllm#51508": ("0.33.0", {"asyncScheduling": True}),
        "flashinfer#3329": ("0.25.0", {"gdnPrefillBackend": "flashinfer"}),
        "vllm-config/align-requires-chunked-prefill": ("0.28.0", {"prefixCaching": True, "chunkedPrefill": False}),
        "vllm-config/gdn-prefill-backend-unsupported": ("0.20.0", {"gdnPrefillBackend": "cutedsl"}),
        "vllm-config/shutdown-timeout-unsupported": ("0.17.1", {"shutdownTimeoutSeconds": 30}),
        "vllm#44697": ("0.33.0", {**PP2, "modelRunner": "v1"}),
        "vllm-config/v1-runner-removed": ("0.34.0", {"modelRunner": "v1"}),
        "vllm-config/cudagraph-implementation-unsupported": ("0.29.0", {"cudagraphImplementation": "breakable"}),
        "vllm#52069": ("0.29.0", PP2),
        "vllm#53051": ("0.26.0", {"cudagraphMode": "FULL_AND_PIECEWISE"}),
    }
    with_mitigation = {r.id for r in cat.rules if r.mitigation}
    assert with_mitigation == set(triggers)
    for rule_id, (version, fields) in triggers.items():
        spec = mk(version, **fields)
        assert rule_id in rules_of(evaluate(spec, default_policy="reject"))
        # apply the rule's own mitigation directly, then let the evaluator finish the job
        d = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
        for path, value in cat.rule(rule_id).mitigation.items():
            set_path(d, path, value)
        mitigated = GDNModelServerSpec.model_validate(d)
        assert rule_id not in rules_of(evaluate(mitigated), "rejected"), rule_id
        ev = evaluate(spec, default_policy="mitigate")
        if ev.allowed and ev.changed:
            final = evaluate(ev.mitigated_spec, default_policy="reject")
            assert final.allowed and not final.rejected, (rule_id, [f.message for f in final.rejected])
