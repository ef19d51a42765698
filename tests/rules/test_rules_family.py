"""The model family from every source a launch line has, in rules/family.py's documented order (issue 26).

Sources: --architecture, --hf-overrides / --additional-config, a readable local config.json (model path or
--hf-config-path), the published-checkpoint table (data/checkpoints.yaml, cited Hub pages), the model name,
--served-model-name. A contradiction is reported as a note; a name never outranks a config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gdn_operator.api.load import ManifestError
from gdn_operator.rules import family
from gdn_operator.rules.launchline import evaluate_launch, parse_launch_line

V = "0.32.0"


def _checkpoint(tmp_path: Path, name: str, cfg: dict) -> str:
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(d)


def test_every_published_checkpoint_names_a_gdn_class_and_cites_a_page() -> None:
    table = family.published_checkpoints()
    assert "qwen/qwen3-coder-next" in table
    for repo, (arch, source) in table.items():
        assert arch in family.GDN_CLASSES.values()
        assert "https://" in source, repo


def test_a_product_name_resolves_through_the_published_checkpoints() -> None:
    # Qwen3-Coder-Next is Qwen3NextForCausalLM (its Hub model card); the name has no "qwen3-next"
    line = parse_launch_line(["vllm", "serve", "Qwen/Qwen3-Coder-Next"], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3NextForCausalLM"
    line = parse_launch_line(["vllm", "serve", "ZirTech/OmniMath-2B"], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3_5ForCausalLM"
    assert line.overrides.architecture_source == "published checkpoint ZirTech/OmniMath-2B"


def test_a_local_config_json_decides_for_a_path_that_says_nothing(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "ckpt-7", {"architectures": ["Qwen3_5MoeForConditionalGeneration"]})
    line = parse_launch_line(["vllm", "serve", path], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert line.overrides.architecture_source == f"config.json at {path} architectures"


def test_hf_config_path_and_model_type(tmp_path: Path) -> None:
    cfg = _checkpoint(tmp_path, "cfg", {"model_type": "qwen3_next"})
    line = parse_launch_line(["vllm", "serve", "/weights/x", "--hf-config-path", cfg], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3NextForCausalLM"


def test_served_model_name_decides_when_nothing_else_does() -> None:
    line = parse_launch_line(["vllm", "serve", "/models/ft-01", "--served-model-name", "qwen3.6-27b"], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3_5ForConditionalGeneration"
    assert line.overrides.architecture_source == "--served-model-name 'qwen3.6-27b'"


def test_a_config_outranks_a_name_and_the_contradiction_is_reported(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path, "Qwen3.5-27B", {"architectures": ["Qwen3NextForCausalLM"]})
    line = parse_launch_line(["vllm", "serve", path, "--served-model-name", "qwen3.5"], vllm_version=V)
    assert line.spec.model.architecture == "Qwen3NextForCausalLM"
    conflicts = [n for n in line.notes if n.startswith("model family:")]
    assert len(conflicts) == 2 and all("config.json at" in n for n in conflicts), line.notes


def test_a_non_gdn_config_is_not_overruled_by_a_hybrid_name(tmp_path: Path) -> None:
    # a Qwen3.5-named directory holding a Llama checkpoint: the name never outranks the config
    path = _checkpoint(tmp_path, "Qwen3.5-9B-distill", {"architectures": ["LlamaForCausalLM"]})
    line, ev = evaluate_launch(["vllm", "serve", path], vllm_version=V)
    assert line.spec.model.architecture is None and line.overrides.not_gdn == "LlamaForCausalLM"
    assert ev.detail.values["gdn_hybrid"] is False
    assert any("says Qwen3_5" in n for n in line.notes)


def test_explicit_architecture_wins_over_hf_overrides_with_a_note() -> None:
    line = parse_launch_line(
        ["vllm", "serve", "x/y", "--hf-overrides", '{"architectures": ["Qwen3NextForCausalLM"]}'],
        vllm_version=V,
        architecture="Qwen3_5ForConditionalGeneration",
    )
    assert line.spec.model.architecture == "Qwen3_5ForConditionalGeneration"
    assert any("--hf-overrides architectures says Qwen3NextForCausalLM" in n for n in line.notes)


def test_additional_config_architectures() -> None:
    line = parse_launch_line(
        ["vllm", "serve", "x/y", "--additional-config", '{"architectures": ["Qwen3_5ForCausalLM"]}'], vllm_version=V
    )
    assert line.spec.model.architecture == "Qwen3_5ForCausalLM"


def test_dense_qwen3_and_unknown_names_stay_unknown() -> None:
    for name in ("Qwen/Qwen3-8B", "/models/ckpt", "meta-llama/Llama-3.1-8B"):
        assert parse_launch_line(["vllm", "serve", name], vllm_version=V).spec.model.architecture is None


def test_unreadable_config_is_no_evidence(tmp_path: Path) -> None:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "config.json").write_text("{not json", encoding="utf-8")
    assert family.read_local_config(str(d)) is None
    assert parse_launch_line(["vllm", "serve", str(d)], vllm_version=V).spec.model.architecture is None


def test_unknown_explicit_architecture_is_an_error() -> None:
    with pytest.raises(ManifestError, match="unknown architecture"):
        parse_launch_line(["vllm", "serve", "x/y"], vllm_version=V, architecture="Qwen3ForCausalLM")
