"""Every rule of data/rules.yaml: fires on its trigger at an affected version, not at the fixed version,
not when the image carries its patch id; known-good configurations are clean of reject-level findings.

The table judges configurations as vLLM runs them (`defaults=False`: unset fields keep vLLM's own
defaults, as for a raw launch line); tests/rules/test_defaults.py checks what the operator's safe
defaults make of the same rows. Expected actions: rejected / warned (actionable: the rule names a value
that avoids it with MTP on) / advisory (no spec value avoids it yet).

Test ids name the upstream issue (catalogue ../shared/docs/vllm-known-issues.md, B1-B14).
"""

from __future__ import annotations

import pytest
from rules_helpers import TINY_MODEL, UNKNOWN_LAYOUT_MODEL, mk, rules_of

from gdn_operator.rules import evaluate, load_rules
from gdn_operator.rules.effective import LaunchOverrides

# (rule id, trigger spec fields, affected version, expected action under policy reject,
#  fixed version (or None: open bug), patch id (or None), launch overrides)
TABLE = [
    ("vllm#36917", {}, "0.17.1", "rejected", "0.18.0", "gdn-guard/vllm-36917", None),
    ("vllm#36917", {"speculativeDecoding": {"numSpeculativeTokens": 1}}, "0.17.0", "rejected", "0.18.0", None, None),
    ("vllm#45100", {}, "0.23.0", "rejected", "0.24.0", "gdn-guard/vllm-45100", None),
    ("vllm#45100", {"prefixCaching": False}, "0.17.0", "rejected", "0.24.0", None, None),
    ("vllm#38041", {"modelRunner": "v2", "prefixCaching": False}, "0.19.1", "rejected", "0.25.0", None, None),
    ("vllm#38041", {"modelRunner": "v2", "prefixCaching": True}, "0.24.0", "rejected", "0.25.0", None, None),
    ("vllm#41190", {"tensorParallelSize": 2}, "0.19.2rc1.dev226+g53b9640fb", "advisory", None, None, None),
    # G1 where the layout is unknown: as measured (0.22.0, MTP); auto = FULL_AND_PIECEWISE
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": UNKNOWN_LAYOUT_MODEL}, "0.22.0", "rejected", None, None, None),
    (
        "gdn-operator/mtp-full-decode-cudagraph",
        {"model": UNKNOWN_LAYOUT_MODEL, "cudagraphMode": "FULL_DECODE_ONLY", "asyncScheduling": False},
        "0.22.0",
        "rejected",
        None,
        "gdn-guard/fa3-group-metadata",
        None,
    ),
    # G1 at its trigger (tests/fixtures/vllm-0.22.0-h100-g1-probe): two attention KV-cache groups, any V1 release
    (
        "gdn-operator/mtp-full-decode-cudagraph",
        {"model": TINY_MODEL},
        "0.26.0",
        "rejected",
        None,
        "gdn-guard/fa3-group-metadata",
        None,
    ),
    (  # ends with the V1 runner: silent at 0.34.0 (ends_in), where vllm-config/v1-runner-removed refuses v1
        "gdn-operator/mtp-full-decode-cudagraph",
        {"model": TINY_MODEL, "modelRunner": "v1"},
        "0.33.0",
        "rejected",
        "0.34.0",
        None,
        None,
    ),
    (
        "vllm#41190",
        {"tensorParallelSize": 2, "env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}]},
        "0.20.0",
        "rejected",
        None,
        None,
        None,
    ),
    ("vllm#51562", {}, "0.30.0", "advisory", "0.31.0", "gdn-guard/vllm-51562", None),
    ("vllm#51562", {"speculativeDecoding": {"enabled": False}}, "0.24.0", "advisory", "0.31.0", None, None),
    (
        "vllm#37035",
        {"speculativeDecoding": {"numSpeculativeTokens": 5}, "attentionBackend": "FLASHINFER"},
        "0.17.1",
        "rejected",
        None,
        "gdn-guard/vllm-37035",
        None,
    ),
    ("vllm#37035", {"speculativeDecoding": {"numSpeculativeTokens": 6}}, "0.33.0", "warned", None, None, None),
    ("vllm#43559", {"prefixCaching": True}, "0.23.0", "rejected", None, "gdn-guard/vllm-43559", None),
    ("vllm#43559", {}, "0.28.0", "rejected", None, None, None),  # default-on prefix caching for hybrids from 0.28.0
    ("vllm#43559", {}, "0.33.0", "rejected", None, None, None),  # open @0.33.0
    ("vllm#51571", {"prefixCaching": True, "modelRunner": "v1"}, "0.33.0", "rejected", "0.34.0", "gdn-guard/vllm-51571", None),
    ("vllm#51571", {"prefixCaching": True}, "0.24.0", "rejected", None, None, None),
    ("vllm#53962", {}, "0.25.0", "warned", "0.29.0", "gdn-guard/vllm-53962", None),
    ("vllm#40756", {}, "0.19.1", "advisory", None, None, None),
    # ends at 0.33.x: the V2 runner, the only one from 0.34.0, never stores a zero accepted count (issue 46)
    ("vllm#51508", {}, "0.33.0", "warned", "0.34.0", "gdn-guard/vllm-51508", None),
    ("flashinfer#3329", {}, "0.18.0", "warned", None, None, None),
    ("flashinfer#3329", {"gdnPrefillBackend": "flashinfer"}, "0.33.0", "warned", None, None, None),
    ("vllm#50708", {}, "0.26.0", "rejected", None, None, LaunchOverrides(spec_method="dflash", num_speculative_tokens=16)),
    (
        "vllm-config/align-requires-chunked-prefill",
        {"prefixCaching": True, "chunkedPrefill": False},
        "0.33.0",
        "rejected",
        None,
        None,
        None,
    ),
    ("vllm-config/gdn-prefill-backend-unsupported", {"gdnPrefillBackend": "triton"}, "0.17.1", "rejected", "0.18.0", None, None),
    ("vllm-config/gdn-prefill-backend-unsupported", {"gdnPrefillBackend": "cutedsl"}, "0.21.0", "rejected", "0.22.0", None, None),
    ("vllm-config/gdn-prefill-backend-unsupported", {"gdnPrefillBackend": "sycl"}, "0.32.0", "rejected", "0.33.0", None, None),
    (
        "vllm-config/v2-runner-env-not-integer",
        {},
        "0.22.0",
        "rejected",
        None,
        None,
        LaunchOverrides(env={"VLLM_USE_V2_MODEL_RUNNER": "true"}),
    ),
    # multi-node engines need the MP launcher (vllm PR #23691); the floor is named in the rule data
    ("vllm-config/multi-node-launcher", {"tensorParallelSize": 8, "nodes": 2}, "0.16.0", "rejected", "0.17.0", None, None),
    ("vllm-config/shutdown-timeout-unsupported", {"shutdownTimeoutSeconds": 30}, "0.17.1", "rejected", "0.18.0", None, None),
    # vllm#41190 (TP>=2 spec decode) holds per multi-node group: TP is the group's TP world
    ("vllm#41190", {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2}, "0.33.0", "advisory", None, None, None),
    # issue 36 sweep: MTP under pipeline parallelism, KV connectors on hybrids (tests/rules/test_rules_pp_mtp.py)
    (
        "vllm#44697",
        {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2, "modelRunner": "v1"},
        "0.33.0",
        "rejected",
        "0.34.0",
        None,
        None,
    ),
    ("vllm#52069", {"tensorParallelSize": 8, "pipelineParallelSize": 2, "nodes": 2}, "0.29.0", "rejected", None, None, None),
    ("vllm#41830", {"extraArgs": ["--kv-offloading-size", "64"]}, "0.21.0", "rejected", "0.22.0", None, None),
    # issue 46: vLLM 0.34.0 read in its wheel
    ("vllm-config/v1-runner-removed", {"modelRunner": "v1"}, "0.34.0", "rejected", None, None, None),
    # platforms/interface.py compares the string with "1": "01" (True to int()) is refused as well
    (
        "vllm-config/v1-runner-removed",
        {},
        "0.34.0",
        "rejected",
        None,
        None,
        LaunchOverrides(env={"VLLM_USE_V2_MODEL_RUNNER": "01"}),
    ),
    (
        "vllm-config/cudagraph-implementation-unsupported",
        {"cudagraphImplementation": "breakable"},
        "0.29.0",
        "rejected",
        "0.30.0",
        None,
        None,
    ),
    (
        "vllm-config/cudagraph-implementation-unsupported",
        {"cudagraphImplementation": "compiled"},
        "0.26.0",
        "rejected",
        "0.30.0",
        None,
        None,
    ),
    # U4 (issue 47): 1 + k prompt on the FULL spec-decode graph; V1 default up to 0.28.0, V2 shape dispatch < 0.28.0
    ("vllm#53051", {}, "0.26.0", "rejected", None, None, None),
    ("vllm#53051", {"modelRunner": "v1"}, "0.33.0", "rejected", None, None, None),
    ("vllm#53051", {"modelRunner": "v2", "cudagraphMode": "FULL_DECODE_ONLY"}, "0.27.1", "rejected", None, None, None),
]


def _id(row):
    rule, fields, version, *_ = row
    extra = ",".join(f"{k}" for k in fields) or "defaults"
    return f"{rule}@{version}[{extra}]"


@pytest.mark.parametrize("row", TABLE, ids=[_id(r) for r in TABLE])
def test_rule_fires_on_trigger(row):
    rule, fields, version, action, _fixed, _patch, ov = row
    ev = evaluate(mk(version, **fields), overrides=ov, policy="reject", defaults=False)
    got = {f.rule: f.action for f in ev.findings}
    assert rule in got, f"{rule} did not fire; findings: {got}"
    assert got[rule] == action
    f = next(f for f in ev.findings if f.rule == rule)
    assert rule in f.message and f.fields and all(p.startswith("spec.") for p in f.fields)
    assert f.workaround


@pytest.mark.parametrize("row", [r for r in TABLE if r[4]], ids=[_id(r) for r in TABLE if r[4]])
def test_rule_silent_at_fixed_version(row):
    rule, fields, _version, _action, fixed, _patch, ov = row
    ev = evaluate(mk(fixed, **fields), overrides=ov, policy="reject", defaults=False)
    assert rule not in rules_of(ev)


@pytest.mark.parametrize("row", [r for r in TABLE if r[5]], ids=[_id(r) for r in TABLE if r[5]])
def test_rule_neutralised_by_patch(row):
    rule, fields, version, _action, _fixed, patch, ov = row
    cat = load_rules()
    assert patch in cat.patch_ids or patch in cat.planned_patch_ids
    ev = evaluate(mk(version, patches=[patch], **fields), overrides=ov, policy="reject", defaults=False)
    if patch in cat.planned_patch_ids:
        # a planned (not shipped) patch is documented but never relied on
        assert rule in rules_of(ev)
        assert "gdn-operator/unknown-patch-id" in rules_of(ev) or any("not shipped" in f.message for f in ev.findings)
        return
    assert rule not in rules_of(ev)
    # a patch for another defect does not neutralise this one
    other = next(p for p in [*cat.patch_ids, *cat.planned_patch_ids] if p != patch)
    ev2 = evaluate(mk(version, patches=[other], **fields), overrides=ov, policy="reject", defaults=False)
    assert rule in rules_of(ev2)


def test_every_rule_has_a_table_row():
    covered = {row[0] for row in TABLE}
    assert {r.id for r in load_rules().rules} == covered


def test_every_patch_id_is_used_and_tested():
    cat = load_rules()
    used = {p for r in cat.rules for p in r.patches}
    assert used == set(cat.patch_ids) | set(cat.planned_patch_ids)
    assert set(cat.patch_ids) == {"gdn-guard/vllm-36917", "gdn-guard/fa3-group-metadata"}  # what gdn-guard 0.1.0 ships
    tested = {row[5] for row in TABLE if row[5]}
    assert tested == used


# ---- triggers that must NOT fire (boundaries from the catalogue) ----------------------------------

NEGATIVE = [
    ("vllm#36917", {"speculativeDecoding": {"enabled": False}}, "0.17.1"),  # B1 needs MTP
    ("vllm#45100", {"asyncScheduling": False}, "0.23.0"),  # the documented workaround
    ("vllm#45100", {"prefixCaching": True}, "0.23.0"),  # align mode takes the synchronized path
    ("vllm#45100", {"modelRunner": "v2", "prefixCaching": False}, "0.23.0"),  # V1-only code path
    ("vllm#38041", {"modelRunner": "v2", "prefixCaching": False}, "0.23.0"),  # 0.23-0.24: only with align
    ("vllm#38041", {}, "0.24.0"),  # auto = V1 before 0.29.0
    ("vllm#41190", {"tensorParallelSize": 1}, "0.20.0"),
    # G1 (tests/fixtures/vllm-0.22.0-h100-tp1-matrix): exact answers with PIECEWISE, eager, or MTP off
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": UNKNOWN_LAYOUT_MODEL, "cudagraphMode": "PIECEWISE"}, "0.22.0"),
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": UNKNOWN_LAYOUT_MODEL, "enforceEager": True}, "0.22.0"),
    (
        "gdn-operator/mtp-full-decode-cudagraph",
        {"model": UNKNOWN_LAYOUT_MODEL, "speculativeDecoding": {"enabled": False}},
        "0.22.0",
    ),
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": UNKNOWN_LAYOUT_MODEL}, "0.22.1"),  # unknown layout: only 0.22.0 was run
    # G1 at its trigger: a checkpoint with one attention group (3 GDN : 1 attention + 1 MTP) keeps FULL graphs
    ("gdn-operator/mtp-full-decode-cudagraph", {}, "0.22.0"),  # Qwen/Qwen3.5-27B: data/checkpoints.yaml layers
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": TINY_MODEL, "speculativeDecoding": {"enabled": False}}, "0.22.0"),
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": TINY_MODEL}, "0.29.0"),  # V2 runner: metadata per group
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": TINY_MODEL, "cudagraphMode": "PIECEWISE"}, "0.26.0"),
    ("gdn-operator/mtp-full-decode-cudagraph", {"model": TINY_MODEL, "attentionBackend": "TRITON_ATTN"}, "0.26.0"),
    ("vllm#37035", {"speculativeDecoding": {"numSpeculativeTokens": 4}, "attentionBackend": "FLASHINFER"}, "0.17.1"),
    ("vllm#43559", {}, "0.25.1"),  # prefix caching default off for hybrids up to 0.27.1
    ("vllm#43559", {}, "0.27.1"),  # (opt-in: vllm/engine/arg_utils.py; the 0.26.0 GPU engines resolved it off)
    ("vllm#43559", {"prefixCaching": False}, "0.33.0"),
    ("vllm#43559", {"prefixCaching": True, "speculativeDecoding": {"enabled": False}}, "0.33.0"),
    ("vllm#51571", {"prefixCaching": True}, "0.29.0"),  # V2 runner is the default from 0.29.0
    ("vllm#51571", {"prefixCaching": True, "asyncScheduling": False, "modelRunner": "v1"}, "0.28.0"),
    ("vllm#51571", {"prefixCaching": True, "modelRunner": "v1"}, "0.23.0"),  # align CPU path from 0.24.0
    ("vllm#53962", {"asyncScheduling": False}, "0.26.0"),
    ("vllm#40756", {}, "0.19.0"),
    ("vllm#51508", {"asyncScheduling": False}, "0.33.0"),
    ("flashinfer#3329", {"gdnPrefillBackend": "triton"}, "0.33.0"),
    ("flashinfer#3329", {}, "0.17.1"),
    ("vllm#50708", {"speculativeDecoding": {"numSpeculativeTokens": 16}}, "0.26.0"),  # serial MTP: 0 slots
    ("vllm-config/align-requires-chunked-prefill", {"prefixCaching": False, "chunkedPrefill": False}, "0.33.0"),
    ("vllm-config/gdn-prefill-backend-unsupported", {"gdnPrefillBackend": "aiter_flydsl"}, "0.32.0"),
    ("vllm-config/v1-runner-removed", {"modelRunner": "v2"}, "0.34.0"),  # =1: redundant, vLLM only warns
    ("vllm-config/v1-runner-removed", {}, "0.34.0"),
    ("vllm-config/v1-runner-removed", {"modelRunner": "v1"}, "0.33.0"),
    ("vllm-config/cudagraph-implementation-unsupported", {}, "0.29.0"),  # unset: vLLM's own choice
    ("vllm-config/cudagraph-implementation-unsupported", {"cudagraphImplementation": "breakable"}, "0.34.0"),
    # from 0.34.0 no rule needs the V1 runner: a default server gets no asyncScheduling default (issue 46)
    ("vllm#51508", {}, "0.34.0"),
    ("vllm#51571", {"prefixCaching": True, "modelRunner": "v1"}, "0.34.0"),
    # vllm#53051: PIECEWISE / eager never replay a FULL graph; V2 dispatches by phase from 0.28.0 (the default
    # runner from 0.29.0); MTP off has no spec-decode graph
    ("vllm#53051", {"cudagraphMode": "PIECEWISE"}, "0.26.0"),
    ("vllm#53051", {"enforceEager": True}, "0.26.0"),
    ("vllm#53051", {"modelRunner": "v2"}, "0.28.0"),
    ("vllm#53051", {}, "0.29.0"),
    ("vllm#53051", {}, "0.33.0"),
    ("vllm#53051", {"speculativeDecoding": {"enabled": False}}, "0.26.0"),
    ("vllm-config/v1-runner-removed", {"modelRunner": "v2"}, "0.34.0"),
]


@pytest.mark.parametrize("rule, fields, version", NEGATIVE, ids=[_id((r, f, v)) for r, f, v in NEGATIVE])
def test_rule_does_not_fire(rule, fields, version):
    ev = evaluate(mk(version, **fields), policy="reject", defaults=False)
    assert rule not in rules_of(ev)


def test_vllm_50708_budget_precomputation():
    # #50708: v0.26.0, DFlash k=16, default batching -> 2048 - 15 x 256 = -1792
    ov = LaunchOverrides(spec_method="dflash", num_speculative_tokens=16)
    ev = evaluate(mk("0.26.0", prefixCaching=False), overrides=ov, defaults=False)
    assert ev.detail.scheduled_token_budget == -1792
    assert "vllm#50708" in rules_of(ev, "rejected")
    # raising maxNumBatchedTokens above slots x seqs admits it (4096 - 3840 = 256)
    ev = evaluate(mk("0.26.0", prefixCaching=False, maxNumBatchedTokens=4096), overrides=ov, defaults=False)
    assert ev.detail.scheduled_token_budget == 256 and "vllm#50708" not in rules_of(ev)
    # and lowering maxNumSeqs does too (2048 - 15 x 128 = 128)
    ev = evaluate(mk("0.26.0", prefixCaching=False, maxNumSeqs=128), overrides=ov, defaults=False)
    assert "vllm#50708" not in rules_of(ev)


# ---- known-good configurations ------------------------------------------------------------------

GOOD = [
    ("0.33.0", {"speculativeDecoding": {"numSpeculativeTokens": 1}, "tensorParallelSize": 1, "prefixCaching": False}),
    ("0.33.0", {"speculativeDecoding": {"numSpeculativeTokens": 2}, "prefixCaching": False, "gdnPrefillBackend": "triton"}),
    ("0.31.0", {"speculativeDecoding": {"numSpeculativeTokens": 3}, "prefixCaching": False}),
    ("0.24.0", {"prefixCaching": False}),  # B2 fixed, B7 avoided, V1 + non-align is the fixed path
    ("0.23.0", {"prefixCaching": False, "asyncScheduling": False}),  # B2 workaround
    ("0.33.0", {"speculativeDecoding": {"enabled": False}}),  # no MTP: prefix caching on is fine
]


@pytest.mark.parametrize("version, fields", GOOD, ids=[f"good@{v}-{i}" for i, (v, _f) in enumerate(GOOD)])
def test_known_good_configs_have_no_reject_level_findings(version, fields):
    for policy in ("reject", "mitigate", "warn"):
        ev = evaluate(mk(version, **fields), policy=policy)
        assert ev.allowed and not ev.changed, [f.message for f in ev.findings]
        assert not ev.rejected and not ev.mitigated
        assert ev.exit_code == 0
