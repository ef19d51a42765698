"""Operator-owned overrides (issue 23): applied at render, never written to the spec, and when each ends."""

from __future__ import annotations

import copy

from gdn_operator.api.overrides import (
    CLEAR_ANNOTATION,
    CLEARED_KEY,
    add_override,
    apply_overrides,
    live_overrides,
    revision,
)
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch

from builders import GMS

SPEC = GMS().update(tensorParallelSize=2, asyncScheduling=True).spec()


def _status_with(patch: SpecPatch, spec=SPEC, reason="cuda-illegal-address-accepted-sync", gen=1):
    status: dict = {}
    add_override(status, patch, reason=reason, generation=gen, since="2026-11-22T10:00:00Z", spec=spec)
    return status


def test_apply_overrides_is_pure_and_sets_the_value():
    spec = GDNModelServerSpec.model_validate(SPEC)
    status = _status_with(SpecPatch.of({"asyncScheduling": False, "speculativeDecoding.numSpeculativeTokens": 1}))
    run = apply_overrides(spec, status["overrides"])
    assert run.async_scheduling is False and run.speculative_decoding.num_speculative_tokens == 1
    assert spec.async_scheduling is True  # the input is untouched
    assert apply_overrides(spec, []) is spec


def test_entry_records_path_value_reason_generation_since_and_the_users_value():
    status = _status_with(SpecPatch.of({"asyncScheduling": False, "gdnPrefillBackend": "triton"}))
    a, g = status["overrides"]
    assert a == {
        "path": "asyncScheduling",
        "value": False,
        "reason": "cuda-illegal-address-accepted-sync",
        "source": "remediation",
        "generation": 1,
        "since": "2026-11-22T10:00:00Z",
        "userValue": True,
        "vllmVersion": "0.33.0",
    }
    assert g["userValue"] == {"unset": True}  # the user left it unset
    # a later override of the same path replaces the earlier one
    add_override(status, SpecPatch.of({"asyncScheduling": None}), reason="x", generation=2, since="t", spec=SPEC)
    assert [o["path"] for o in status["overrides"]] == ["gdnPrefillBackend", "asyncScheduling"]


def test_an_override_lasts_across_unrelated_edits():
    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    edited = {**SPEC, "replicas": 3, "image": {"tag": "v0.33.0-b", "vllmVersion": "0.33.0"}}
    kept, ended, clear = live_overrides(status, edited, {})
    assert [o["path"] for o in kept] == ["asyncScheduling"] and not ended and clear is None


def test_an_override_ends_when_the_user_changes_that_field():
    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    for spec in (
        {**SPEC, "asyncScheduling": False},  # the user adopted the value: redundant
        {k: v for k, v in SPEC.items() if k != "asyncScheduling"},
    ):  # the user unset it
        kept, ended, _ = live_overrides(status, spec, {})
        assert not kept and ended[0][1] == "the spec changed asyncScheduling"


def test_an_override_ends_with_a_new_vllm_version():
    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    kept, ended, _ = live_overrides(status, {**SPEC, "image": {"tag": "v0.34.0", "vllmVersion": "0.34.0"}}, {})
    assert not kept and "vllmVersion is now 0.34.0" in ended[0][1]


def test_the_clear_annotation_ends_every_remediation_override_once():
    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    status["overrides"].append({"path": "prefixCaching", "value": False, "reason": "vllm#43559", "source": "mitigation"})
    kept, ended, token = live_overrides(status, SPEC, {CLEAR_ANNOTATION: "1"})
    assert not kept and token == "1" and [o["path"] for o, _ in ended] == ["asyncScheduling"]
    assert CLEAR_ANNOTATION in ended[0][1]
    # once acted on (status.overridesCleared), the same token clears nothing made later
    status[CLEARED_KEY] = "1"
    kept, ended, token = live_overrides(status, SPEC, {CLEAR_ANNOTATION: "1"})
    assert [o["path"] for o in kept] == ["asyncScheduling"] and token is None


def test_revision_moves_with_the_remediation_overrides_only():
    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    assert revision(4, []) == "4"
    r1 = revision(4, status["overrides"])
    assert r1.startswith("4+") and r1 != revision(4, [])
    assert revision(4, [{"path": "p", "value": 1, "source": "mitigation"}]) == "4"
    add_override(status, SpecPatch.of({"speculativeDecoding.enabled": False}), reason="s", generation=4, since="t", spec=SPEC)
    assert revision(4, status["overrides"]) not in (r1, "4")


def test_status_model_accepts_overrides():
    from gdn_operator.api.status import GDNModelServerStatus

    status = _status_with(SpecPatch.of({"asyncScheduling": False}))
    st = GDNModelServerStatus.model_validate(copy.deepcopy(status))
    assert st.overrides[0].path == "asyncScheduling" and st.overrides[0].user_value is True
