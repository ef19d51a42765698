"""Unset means safe (issue 23): an unset field resolves to the value the rules accept, MTP stays on, and each
value is traced to its rule; a value the user sets is judged by the policy exactly as before.

The rules behind the values: vllm#43559 (prefix caching + MTP, default on for hybrids from 0.28.0), vllm#45100 (<0.24.0
async + non-align V1), vllm#53962 (0.25-0.28 async padding), vllm#51508 (async stale rows),
flashinfer#3329 (FlashInfer GDN prefill hang), and G1 (tests/fixtures/vllm-0.22.0-h100-tp1-matrix).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rules_helpers import TINY_MODEL, UNKNOWN_LAYOUT_MODEL, mk, rules_of

from gdn_operator.api.load import load_file
from gdn_operator.render.engine import vllm_args
from gdn_operator.rules import evaluate, load_rules
from gdn_operator.rules.matching import keeps_spec_decoding

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
DENIED = "denied-qwen3.6-prefix-caching-mtp.yaml"


#: flag in the rendered argv for a defaulted field's value
def _flag(field: str, value) -> list[str]:
    return {
        ("prefixCaching", False): ["--no-enable-prefix-caching"],
        ("asyncScheduling", False): ["--no-async-scheduling"],
        ("gdnPrefillBackend", "triton"): ["--gdn-prefill-backend", "triton"],
        ("cudagraphMode", "PIECEWISE"): [
            "--compilation-config",
            json.dumps({"cudagraph_mode": "PIECEWISE"}, separators=(",", ":")),
        ],
        ("chunkedPrefill", True): ["--enable-chunked-prefill"],
    }[(field, value)]


def _contains(argv: list[str], seq: list[str]) -> bool:
    return any(argv[i : i + len(seq)] == seq for i in range(len(argv)))


def _traced(ev) -> dict[str, tuple]:
    return {d.field: (d.value, d.rule) for d in ev.defaults}


# what each catalogued release needs, from the rules (release -> field -> (value, rule))
MINIMAL = {
    # Qwen/Qwen3.5-27B forms one full-attention KV-cache group (data/checkpoints.yaml layers): G1 keeps FULL graphs
    # ... but up to 0.28.0 (V1 runner) a prompt of 1 + k tokens replays the FULL spec-decode graph (vllm#53051)
    "0.22.0": {
        "cudagraphMode": ("PIECEWISE", "vllm#53051"),
        "asyncScheduling": (False, "vllm#45100"),
        "gdnPrefillBackend": ("triton", "flashinfer#3329"),
    },
    "0.26.0": {  # prefix caching is opt-in for hybrids up to 0.27.1 (vLLM's own default is already off)
        "cudagraphMode": ("PIECEWISE", "vllm#53051"),
        "asyncScheduling": (False, "vllm#53962"),
        "gdnPrefillBackend": ("triton", "flashinfer#3329"),
    },
    "0.33.0": {
        "prefixCaching": (False, "vllm#43559"),
        "asyncScheduling": (False, "vllm#51508"),
        "gdnPrefillBackend": ("triton", "flashinfer#3329"),
    },
    "0.34.0": {  # issue 46: vllm#51508 ends with the V1 runner, async scheduling stays vLLM's (on)
        "prefixCaching": (False, "vllm#43559"),
        "gdnPrefillBackend": ("triton", "flashinfer#3329"),
    },
}


@pytest.mark.parametrize("version", sorted(MINIMAL))
def test_minimal_manifest_is_admitted_with_mtp_on_and_safe_flags_traced(version):
    spec = mk(version)  # model + image only
    ev = evaluate(spec)  # the operator's default policy: reject
    assert ev.allowed and not ev.changed and ev.exit_code == 0
    assert not ev.rejected and not ev.warnings, [f.message for f in ev.warnings]  # advisories only
    run = ev.run_spec
    assert run.speculative_decoding.enabled and ev.effective.spec_method == "mtp"
    assert _traced(ev) == MINIMAL[version]
    # status.effective carries the same records
    assert [(d.field, d.value, d.rule) for d in ev.effective.defaults] == [(d.field, d.value, d.rule) for d in ev.defaults]
    argv = vllm_args("m", run)
    for field, (value, _rule) in MINIMAL[version].items():
        assert _contains(argv, _flag(field, value)), (field, argv)
    assert '"method":"mtp"' in " ".join(argv)
    # the user's spec is untouched: defaults live in what runs, not in what was submitted
    assert spec.prefix_caching is None and spec.async_scheduling is None


G1 = "gdn-operator/mtp-full-decode-cudagraph"
U4 = "vllm#53051"


@pytest.mark.parametrize(
    "model,version,patches,piecewise",
    [
        # one attention group (data/checkpoints.yaml): G1 keeps FULL graphs, but the V1 runner's shape-only
        # dispatch (vllm#53051, issue 47) asks for PIECEWISE up to 0.28.0 all the same
        ("hf://Qwen/Qwen3.5-27B", "0.22.0", [], U4),
        (UNKNOWN_LAYOUT_MODEL, "0.22.0", [], G1),  # layout unknown: kept as measured at 0.22.0
        (UNKNOWN_LAYOUT_MODEL, "0.26.0", [], U4),
        (TINY_MODEL, "0.22.0", [], G1),  # config.json: two attention groups with the MTP layer
        (TINY_MODEL, "0.26.0", [], G1),  # ... at every release with the V1 runner
        (TINY_MODEL, "0.26.0", ["gdn-guard/fa3-group-metadata"], U4),  # the guard ends G1, not vllm#53051
        (TINY_MODEL, "0.29.0", [], None),  # V2 runner by default: metadata per group, dispatch by phase
        (TINY_MODEL, "0.34.0", [], None),  # V2 only (G1 ends with V1); the breakable path is the GPU run's
    ],
)
def test_g1_defaults_piecewise_only_where_the_trigger_is(model, version, patches, piecewise):
    ev = evaluate(mk(version, model=model, patches=patches))
    assert ev.allowed and not ev.rejected
    traced = _traced(ev)
    if piecewise:
        assert traced["cudagraphMode"] == ("PIECEWISE", piecewise)
        assert ev.run_spec.cudagraph_mode == "PIECEWISE"
    else:
        assert "cudagraphMode" not in traced and ev.run_spec.cudagraph_mode is None
    if piecewise is None:
        assert G1 not in rules_of(ev)
    elif piecewise == U4:
        # G1 itself does not fire; at 0.22.0 its measured PIECEWISE cost is reported (an advisory, no more)
        assert all(f.action == "advisory" and "slower" in f.title.lower() for f in ev.findings if f.rule == G1)


def test_the_defaulted_configuration_passes_admission_as_if_the_user_had_set_it():
    for version in MINIMAL:
        ev = evaluate(mk(version))
        explicit = ev.run_spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
        again = evaluate(type(ev.run_spec).model_validate(explicit))
        assert again.allowed and not again.defaults and not again.warnings, version


def test_a_value_the_user_sets_is_judged_by_the_policy():
    ev = evaluate(mk("0.33.0", prefixCaching=True))
    assert "vllm#43559" in rules_of(ev, "rejected") and ev.run_spec is None
    assert "prefixCaching" not in _traced(ev)
    ev = evaluate(mk("0.33.0", prefixCaching=True), default_policy="mitigate")
    assert "vllm#43559" in rules_of(ev, "mitigated") and ev.run_spec.prefix_caching is False
    # a warn rule on a value the user set is a warning naming the field and value (actionable)
    ev = evaluate(mk("0.33.0", asyncScheduling=True))
    f = next(f for f in ev.warnings if f.rule == "vllm#51508")
    assert "Set asyncScheduling: false." in f.message and ev.run_spec.async_scheduling is True


def test_vllm_own_default_is_kept_where_no_rule_objects():
    ev = evaluate(mk("0.27.1"))  # prefix caching opt-in for hybrids (<0.28.0): nothing to change
    assert "prefixCaching" not in _traced(ev) and ev.run_spec.prefix_caching is None
    argv = vllm_args("m", ev.run_spec)
    assert not any("prefix-caching" in a for a in argv)
    # without MTP nothing that only matters with MTP is defaulted
    ev = evaluate(mk("0.33.0", speculativeDecoding={"enabled": False}))
    assert "prefixCaching" not in _traced(ev) and "asyncScheduling" not in _traced(ev)


def test_defaults_never_turn_mtp_off():
    # vllm#36917 (<0.18.0) has only "MTP off" as its mitigation: the unset field stays on and the rule decides
    ev = evaluate(mk("0.17.1"))
    assert not any(d.field.startswith("speculativeDecoding") for d in ev.defaults)
    assert "vllm#36917" in rules_of(ev, "rejected")
    for r in load_rules().rules:
        if r.mitigation_patch and not keeps_spec_decoding(r.mitigation_patch):
            assert any(p.startswith("speculativeDecoding") for p in r.mitigation), r.id


def test_a_default_never_creates_a_rejection():
    # 0.17.1 with MTP off: flashinfer#3329 is not in range, and no default sets a backend 0.17 lacks
    ev = evaluate(mk("0.17.1", speculativeDecoding={"enabled": False}))
    assert ev.allowed and "gdnPrefillBackend" not in _traced(ev)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_admitted_without_an_actionable_warning(path):
    for gms in load_file(str(path)):
        ev = evaluate(gms.spec)
        if path.name == DENIED:
            assert not ev.allowed and rules_of(ev, "rejected") == {"vllm#43559"}  # it shows a denial
            continue
        assert ev.allowed and not ev.changed, [f.message for f in ev.rejected]
        assert not ev.warnings, [f.message for f in ev.warnings]
        run = ev.run_spec
        assert run.speculative_decoding.enabled
        argv = vllm_args(gms.metadata.name or "x", run)
        for d in ev.defaults:
            assert _contains(argv, _flag(d.field, d.value)), (d, argv)
        # what remains is advisories; a serious one is explained in a comment of the example
        text = path.read_text()
        for f in ev.advisories:
            if f.severity in ("critical", "high"):
                assert f.rule in text, f"{path.name}: say in a comment why advisory {f.rule} remains"
