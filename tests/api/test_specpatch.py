"""One spec change, three forms (api/specpatch.py): applied to a dict, as a merge patch (webhook, crash
watch) and as JSON-patch ops (gdnctl validate), which must all give the same spec."""

from __future__ import annotations

import copy

import pytest

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch, check_path, get_path, merge, set_path
from gdn_operator.rules import evaluate

from builders import GMS

BASE = GMS().spec()


def apply_ops(doc, ops):
    """RFC 6902 add / replace / remove on objects (enough for the evaluator's ops)."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = op["path"].lstrip("/").split("/")
        node = out
        for p in parents:
            node = node[p]
        if op["op"] == "remove":
            del node[last]
        else:
            node[last] = copy.deepcopy(op["value"])
    return out


def test_set_and_get_path_create_parents_and_unset():
    d: dict = {}
    set_path(d, "speculativeDecoding.numSpeculativeTokens", 4)
    assert d == {"speculativeDecoding": {"numSpeculativeTokens": 4}}
    assert get_path(d, "speculativeDecoding.numSpeculativeTokens") == (True, 4)
    assert get_path(d, "speculativeDecoding.enabled") == (False, None)
    set_path(d, "speculativeDecoding.numSpeculativeTokens", None)
    assert d == {"speculativeDecoding": {}}
    set_path(d, "resources.cpu", None)  # unsetting below a missing parent creates nothing
    assert d == {"speculativeDecoding": {}}


def test_merge_is_rfc7386():
    spec = {
        "speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 5},
        "prefixCaching": True,
        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
    }
    out = merge(
        spec,
        {
            "speculativeDecoding": {"numSpeculativeTokens": 4},
            "prefixCaching": None,
            "env": [{"name": "B", "value": "2"}],
            "resources": {"cpu": "4"},
        },
    )
    assert out == {
        "speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": 4},
        "env": [{"name": "B", "value": "2"}],
        "resources": {"cpu": "4"},
    }
    assert spec["prefixCaching"] is True and len(spec["env"]) == 2  # the input is not changed


def test_pending_leaves_out_what_is_in_effect():
    p = SpecPatch.of({"asyncScheduling": False, "speculativeDecoding.enabled": False, "gdnPrefillBackend": None})
    assert p.pending({"asyncScheduling": False}).as_dict() == {"speculativeDecoding.enabled": False}
    assert not p.pending({"asyncScheduling": False, "speculativeDecoding": {"enabled": False}})
    assert p.pending({"gdnPrefillBackend": "cutedsl"}).as_dict()["gdnPrefillBackend"] is None


def test_describe_summary_and_merge_patch():
    p = SpecPatch.of({"speculativeDecoding.enabled": False, "gdnPrefillBackend": "triton", "shutdownTimeoutSeconds": None})
    assert p.describe() == "speculativeDecoding.enabled=false, gdnPrefillBackend=triton, shutdownTimeoutSeconds=unset"
    assert p.summary() == "speculativeDecoding.enabled: false, gdnPrefillBackend: triton, shutdownTimeoutSeconds: unset"
    assert p.merge_patch() == {
        "speculativeDecoding": {"enabled": False},
        "gdnPrefillBackend": "triton",
        "shutdownTimeoutSeconds": None,
    }
    assert SpecPatch.of([("env", [])], label="env X removed").describe() == "env X removed"


def test_check_path_names_the_bad_part():
    assert check_path("speculativeDecoding.numSpeculativeTokens") is None
    assert "unknown spec field 'numSpecTokens'" in check_path("speculativeDecoding.numSpecTokens")
    assert "has no sub-fields" in check_path("prefixCaching.enabled")


@pytest.mark.parametrize(
    "changes",
    [
        [("speculativeDecoding.numSpeculativeTokens", 4), ("prefixCaching", False)],
        [("prefixCaching", False), ("prefixCaching", None), ("asyncScheduling", False)],
        [("gdnPrefillBackend", None), ("resources.cpu", "4")],
    ],
)
def test_the_three_forms_agree(changes):
    original = {**BASE, "gdnPrefillBackend": "cutedsl", "prefixCaching": True}
    p = SpecPatch.of(changes)
    applied = p.apply(original)
    assert merge(original, p.merge_patch()) == applied
    assert apply_ops({"spec": original}, p.json_patch(original))["spec"] == applied


@pytest.mark.parametrize(
    "version, fields",
    [
        ("0.20.0", {"prefixCaching": True, "asyncScheduling": True}),  # two mitigations chained (vllm#43559, vllm#45100)
        ("0.17.1", {"gdnPrefillBackend": "triton", "speculativeDecoding": {"enabled": False}}),  # an unset
        ("0.20.0", {"prefixCaching": True, "speculativeDecoding": {"numSpeculativeTokens": 6}, "attentionBackend": "FLASHINFER"}),
    ],
)
def test_webhook_merge_patch_gives_the_mitigated_spec(version, fields):
    submitted = {**BASE, "image": {"tag": f"v{version}", "vllmVersion": version}, **fields}
    ev = evaluate(GDNModelServerSpec.model_validate(submitted), default_policy="mitigate")
    assert ev.allowed and ev.changed
    # the patched object resolves (safe defaults included) to exactly the spec the evaluator mitigated to
    again = evaluate(GDNModelServerSpec.model_validate(merge(submitted, ev.merge_patch())), default_policy="mitigate")
    assert not again.changed and again.run_spec.model_dump(mode="json") == ev.mitigated_spec.model_dump(mode="json")
    assert apply_ops({"spec": submitted}, ev.patch)["spec"] == merge(submitted, ev.merge_patch())


def test_no_merge_patch_without_a_mitigation():
    ev = evaluate(GDNModelServerSpec.model_validate({**BASE, "prefixCaching": False}), default_policy="mitigate")
    assert not ev.changed and ev.merge_patch() == {} and not ev.change
