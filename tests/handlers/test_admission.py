"""The mutating webhook's merge patch (opt-in: GDN_MUTATE_SPEC) is the evaluator's mitigation of values the
user SET, recorded in an annotation; unset fields are not patched (they resolve to safe defaults at render)."""

import json

from gdn_operator.handlers.admission import mitigation_patch
from gdn_operator.handlers.admission import MITIGATIONS_ANNOTATION

SPEC = {
    "model": {"uri": "hf://Qwen/Qwen3.6-35B-A3B"},
    "image": {"tag": "v0.28.0", "vllmVersion": "0.28.0"},
    "speculativeDecoding": {"numSpeculativeTokens": 3},
}


def test_mitigate_policy_patches_spec_and_annotation():
    assert mitigation_patch({**SPEC, "admissionPolicy": "mitigate"}, "reject") is None  # unset: a safe default
    merge, mitigated = mitigation_patch({**SPEC, "prefixCaching": True, "admissionPolicy": "mitigate"}, "reject")
    assert merge["spec"]["prefixCaching"] is False
    note = json.loads(merge["metadata"]["annotations"][MITIGATIONS_ANNOTATION])
    assert "vllm#43559" in note
    assert {f.rule for f in mitigated} >= {"vllm#43559"}


def test_reject_policy_and_clean_specs_are_not_mutated():
    assert mitigation_patch({**SPEC, "prefixCaching": True, "admissionPolicy": "reject"}, "reject") is None
    assert mitigation_patch({**SPEC, "prefixCaching": False, "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}, "reject") is None
    assert mitigation_patch({"model": "not a mapping"}, "mitigate") is None  # validation explains; mutation stays out
