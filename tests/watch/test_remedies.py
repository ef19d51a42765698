"""Remediation actions are spec changes in data/signatures.yaml (`actions:`), read by watch/remedies.py."""

from __future__ import annotations

import re

import pytest

from gdn_operator.api.load import parse_spec
from gdn_operator.api.specpatch import merge
from gdn_operator.watch.signatures import ACTIONS, CatalogueError, default_catalogue, parse_catalogue

from builders import GMS
from test_signatures import _minimal

BASE = GMS().spec()
P2P = {"env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}, {"name": "OTHER", "value": "x"}]}


def _doc(actions=None, action="investigate"):
    doc = _minimal(remediation={"action": action, "hint": "h"})  # the one minimal catalogue of the signature tests
    if actions is not None:
        doc["actions"] = actions
    return doc


def test_every_action_id_is_defined_once_in_the_data():
    cat = default_catalogue()
    assert tuple(cat.actions) == ACTIONS
    used = {s.remediation.action for s in cat.signatures} | {st.action for s in cat.signatures for st in s.remediation.ladder}
    assert used <= set(ACTIONS)
    assert {a for a, d in cat.actions.items() if d.manual} == {
        "patched-image",
        "raise-max-num-batched-tokens",
        "reduce-memory",
        "investigate",
        "kv-connector-with-hma",  # issue 36: vllm#41830
    }


@pytest.mark.parametrize(
    "action, spec, described",
    [
        # the texts status.remediations[].action recorded before the actions became data (ladder "tried" checks read them)
        ("disable-spec-decode", {}, "speculativeDecoding.enabled=false"),
        ("disable-async-scheduling", {}, "asyncScheduling=false"),
        (
            "lower-num-speculative-tokens",
            {"speculativeDecoding": {"numSpeculativeTokens": 6}},
            "speculativeDecoding.numSpeculativeTokens=4",
        ),
        (
            "lower-num-speculative-tokens",
            {"speculativeDecoding": {"numSpeculativeTokens": 3}},
            "speculativeDecoding.numSpeculativeTokens=2",
        ),
        ("lower-num-speculative-tokens", {"speculativeDecoding": {"numSpeculativeTokens": 3, "enabled": False}}, None),
        ("gdn-prefill-backend-triton", {"gdnPrefillBackend": "flashinfer"}, "gdnPrefillBackend=triton"),
        ("disable-v2-model-runner", {"modelRunner": "v2"}, "modelRunner=v1"),
        ("disable-v2-model-runner", {"modelRunner": "v1"}, None),
        # issue 46: vLLM 0.34.0 has no V1 runner (VLLM_USE_V2_MODEL_RUNNER=0 stops it at start-up): not offered
        ("disable-v2-model-runner", {"modelRunner": "v2", "image": {"tag": "v0.34.0", "vllmVersion": "0.34.0"}}, None),
        ("disable-v2-model-runner", {"modelRunner": "v2", "image": {"tag": "v0.35.0", "vllmVersion": "0.35.0"}}, None),
        (
            "disable-v2-model-runner",
            {"modelRunner": "v2", "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}},
            "modelRunner=v1",
        ),
        # ... and its way back: signature v1-runner-removed (VLLM_USE_V2_MODEL_RUNNER=0 refused at start-up)
        (
            "disable-v1-model-runner",
            {"modelRunner": "v1", "image": {"tag": "v0.34.0", "vllmVersion": "0.34.0"}},
            "modelRunner=auto",
        ),
        ("disable-v1-model-runner", {"modelRunner": "v1", "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}, None),
        ("disable-v1-model-runner", {"image": {"tag": "v0.34.0", "vllmVersion": "0.34.0"}}, None),  # in effect
        ("enable-chunked-prefill", {"chunkedPrefill": False}, "chunkedPrefill=true"),
        ("disable-prefix-caching", {"prefixCaching": True}, "prefixCaching=false"),
        ("drop-nccl-p2p-disable", P2P, "env NCCL_P2P_DISABLE removed"),
        ("drop-nccl-p2p-disable", {"env": [{"name": "NCCL_P2P_DISABLE", "value": "0"}]}, None),  # not disabled
        ("reduce-memory", {}, None),
    ],
)
def test_action_changes(action, spec, described):
    p = default_catalogue().remedy_patch(action, parse_spec({**BASE, **spec}))
    assert (p.describe() if p else None) == described


@pytest.mark.parametrize("extra", [{}, P2P, {"speculativeDecoding": {"numSpeculativeTokens": 7}, "modelRunner": "v2"}])
def test_an_applied_action_is_valid_and_never_applies_twice(extra):
    cat = default_catalogue()
    for action in ACTIONS:
        spec = {**BASE, **extra}
        p = cat.remedy_patch(action, parse_spec(spec))
        if p is None:
            continue
        after = parse_spec(merge(spec, p.merge_patch()))  # what the API server stores after the crash watch's patch
        again = cat.remedy_patch(action, after)
        if action == "lower-num-speculative-tokens":  # steps down one token per generation, to the floor
            assert (
                again is None
                or again.as_dict()["speculativeDecoding.numSpeculativeTokens"] < after.speculative_decoding.num_speculative_tokens
            )
        else:
            assert again is None, action


@pytest.mark.parametrize(
    "actions, needle",
    [
        (
            {"investigate": {"set": {"speculativeDecoding.numSpecTokens": 1}}},
            "actions.investigate.set: unknown spec field 'numSpecTokens'",
        ),
        ({"investigate": {"manual": "why", "set": {"prefixCaching": False}}}, "'manual' is a non-empty reason and stands alone"),
        ({"investigate": {"only_if": {"prefixCaching": True}}}, "needs a spec change"),
        ({"investigate": {"lower": {"maxNumSeqs": {"by": 1}}}}, "needs exactly by, at_most and at_least"),
        ({"investigate": {"unset": ["prefixCaching"]}}, "unknown field(s) unset"),
        ({"investigate": None}, "needs one of set, lower, drop_env"),
        ({"investigate": {"set": {"modelRunner": "v1"}, "versions": "<=banana"}}, "actions.investigate.versions: bad version"),
        ({"investigate": {"set": {"modelRunner": "v1"}, "versions": 34}}, "expected a version range such as '<0.34.0'"),
        (
            {"other": {"manual": "m"}},
            "field 'remediation' needs 'action' (one of other)",
        ),  # its own table replaces the packaged one
    ],
)
def test_action_table_validation(actions, needle):
    with pytest.raises(CatalogueError, match=re.escape(needle)):
        parse_catalogue(_doc(actions), "t.yaml")


def test_a_catalogue_without_actions_uses_the_packaged_ones():
    cat = parse_catalogue(_doc(action="disable-async-scheduling"), "t.yaml")
    assert cat.actions == default_catalogue().actions
    own = parse_catalogue(_doc({"prefix-off": {"set": {"prefixCaching": False}}}, action="prefix-off"), "t.yaml")
    assert own.remedy_patch("prefix-off", parse_spec(BASE)).merge_patch() == {"prefixCaching": False}
    assert own.remedy_patch("disable-async-scheduling", parse_spec(BASE)) is None  # not in its table
