"""Effective configuration: vLLM's version-dependent defaults (catalogue §2) and the model family."""

from __future__ import annotations

import pytest
from rules_helpers import mk

from gdn_operator.api.status import EffectiveConfig
from gdn_operator.rules import effective_config, evaluate, infer_architecture
from gdn_operator.rules.effective import LaunchOverrides

# catalogue §2 "Consequence for the operator": plain MTP config, nothing else set
# version -> (async, prefix caching, mamba cache mode, runner)
DEFAULTS = [
    ("0.17.0", True, False, "none", "v1"),
    ("0.17.1", True, False, "none", "v1"),
    ("0.21.0", True, False, "none", "v1"),
    ("0.22.0", True, False, "none", "v1"),
    ("0.25.1", True, False, "none", "v1"),
    # prefix caching stays opt-in for hybrids up to 0.27.1 (the wheels' arg_utils.py; the 0.26.0 GPU engines of
    # tests/fixtures/vllm-0.26.0-h200x2-release resolved enable_prefix_caching=False), on from 0.28.0
    ("0.26.0", True, False, "none", "v1"),
    ("0.27.1", True, False, "none", "v1"),
    ("0.28.0", True, True, "align", "v1"),
    ("0.29.0", True, True, "align", "v2"),  # V2 default runner from 0.29.0
    ("0.33.0", True, True, "align", "v2"),
    ("0.19.2rc1.dev226+g53b9640fb", True, False, "none", "v1"),
]


@pytest.mark.parametrize("version, async_, prefix, mamba, runner", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_version_defaults(version, async_, prefix, mamba, runner):
    eff = effective_config(mk(version))
    assert (eff.async_scheduling, eff.prefix_caching, eff.mamba_cache_mode, eff.model_runner) == (async_, prefix, mamba, runner)
    assert eff.chunked_prefill is True
    assert eff.spec_method == "mtp" and eff.mtp
    status = eff.to_status()
    assert isinstance(status, EffectiveConfig)
    assert status.model_dump()["prefix_caching"] == prefix and status.model_runner == runner


def test_explicit_fields_win_over_defaults():
    eff = effective_config(mk("0.33.0", asyncScheduling=False, prefixCaching=False, modelRunner="v1", chunkedPrefill=False))
    assert (eff.async_scheduling, eff.prefix_caching, eff.mamba_cache_mode, eff.model_runner, eff.chunked_prefill) == (
        False,
        False,
        "none",
        "v1",
        False,
    )
    assert eff.sources["model_runner"].startswith("spec.modelRunner: v1")


def test_async_default_only_with_mtp():
    eff = effective_config(mk("0.33.0", speculativeDecoding={"enabled": False}))
    assert eff.async_scheduling is None  # not catalogued without EAGLE/MTP
    assert not eff.mtp and eff.num_speculative_tokens == 0 and eff.spec_method is None


def test_vllm_version_argument_overrides_the_spec():
    spec = mk("0.25.1")
    assert effective_config(spec).prefix_caching is False
    assert effective_config(spec, "0.28.0").prefix_caching is True


@pytest.mark.parametrize("alias", ["qwen3_next_mtp", "qwen3_5_mtp"])
def test_deprecated_method_aliases_become_mtp(alias):
    eff = effective_config(mk("0.33.0", speculativeDecoding={"method": alias, "numSpeculativeTokens": 3}))
    assert eff.spec_method == "mtp" and eff.spec_method_requested == alias and eff.mtp
    assert any("deprecated alias" in n for n in eff.notes)


@pytest.mark.parametrize(
    "value, version, runner, valid",
    [
        ("1", "0.19.1", "v2", True),
        ("0", "0.33.0", "v1", True),  # =0 forces V1 even where V2 is the default
        (" 1 ", "0.22.0", "v2", True),
        ("true", "0.21.0", None, False),  # bool(int('true')) raises in vLLM
        ("", "0.25.0", None, False),
    ],
)
def test_v2_runner_env_parsing(value, version, runner, valid):
    eff = effective_config(mk(version), overrides=LaunchOverrides(env={"VLLM_USE_V2_MODEL_RUNNER": value}))
    assert eff.model_runner == runner
    assert eff.v2_runner_env_valid is valid


def test_mamba_cache_mode_flag_until_0_32_and_noop_in_0_33():
    ov = LaunchOverrides(mamba_cache_mode="align")
    assert effective_config(mk("0.27.1", prefixCaching=True), overrides=ov).mamba_cache_mode == "align"
    e = effective_config(mk("0.27.1", prefixCaching=False), overrides=ov)
    assert e.mamba_cache_mode == "align"  # explicit flag honoured (#53912 comment used it on 0.27.1)
    e = effective_config(mk("0.33.0", prefixCaching=False), overrides=ov)
    assert e.mamba_cache_mode == "none" and any("no-op" in n for n in e.notes)


def test_unparseable_version_leaves_version_dependent_defaults_unknown():
    eff = effective_config(mk("latest"))
    assert eff.version is None
    assert eff.prefix_caching is None and eff.model_runner is None and eff.mamba_cache_mode is None
    assert eff.async_scheduling is True  # version-independent


@pytest.mark.parametrize(
    "name, arch",
    [
        ("Qwen/Qwen3.5-27B", "Qwen3_5ForConditionalGeneration"),
        ("Qwen/Qwen3.5-9B", "Qwen3_5ForConditionalGeneration"),
        ("Qwen/Qwen3.5-35B-A3B", "Qwen3_5MoeForConditionalGeneration"),
        ("Qwen/Qwen3.5-397B-A17B-FP8", "Qwen3_5MoeForConditionalGeneration"),
        ("QuantTrio/Qwen3.6-35B-A3B-AWQ", "Qwen3_5MoeForConditionalGeneration"),  # vllm#41190
        ("Qwen/Qwen3.6-27B-FP8", "Qwen3_5ForConditionalGeneration"),  # vllm#40756
        ("cyankiwi/Qwen3.5-27B-AWQ-BF16-INT4", "Qwen3_5ForConditionalGeneration"),  # vllm#37035
        ("Qwen/Qwen3.8-27B", "Qwen3_5ForConditionalGeneration"),  # PR #50021 comments
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen3NextForCausalLM"),
        ("models/qwen3_5-27b", "Qwen3_5ForConditionalGeneration"),
        ("Qwen/Qwen3-8B", None),  # dense Qwen3, not a GDN hybrid
        ("Qwen/Qwen3-30B-A3B", None),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("acme/finetune-v3", None),
    ],
)
def test_architecture_inference(name, arch):
    assert infer_architecture(name) == arch


def test_unrecognised_model_is_a_finding_not_a_guess():
    ev = evaluate(mk("0.17.1", model="hf://acme/my-finetune"), policy="reject")
    f = next(f for f in ev.findings if f.rule == "gdn-operator/unrecognised-model-family")
    assert f.action == "rejected"
    assert "unrecognised model family; set spec.model.architecture" in f.message
    assert f.fields == ["spec.model.architecture"]
    assert ev.effective.architecture is None
    # GDN rules are not guessed for it
    assert "vllm#36917" not in {x.rule for x in ev.findings}
    # with the architecture set, the real rules apply
    from gdn_operator.api.spec import GDNModelServerSpec
    from rules_helpers import spec_dict

    d = spec_dict("0.17.1", "hf://acme/my-finetune")
    d["model"]["architecture"] = "Qwen3NextForCausalLM"
    ev = evaluate(GDNModelServerSpec.model_validate(d), policy="reject")
    assert "vllm#36917" in {x.rule for x in ev.findings}
    assert "gdn-operator/unrecognised-model-family" not in {x.rule for x in ev.findings}
    assert ev.detail.sources["architecture"] == "spec.model.architecture"
