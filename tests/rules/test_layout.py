"""rules/layout.py: the full-attention KV-cache groups vLLM forms for a GDN hybrid (G1's trigger, issue 33).

The grouping is vLLM's `_get_kv_cache_groups_uniform_page_size` (kv_cache_utils.py): group size = the smallest layer
count of any spec, or from 0.18.0 the largest when it is below 1.5x the smallest; the MTP layer counts with the
attention layers. The probe (tests/fixtures/vllm-0.22.0-h100-g1-probe) saw the tiny model's split; the production
geometry (one attention group) served exact answers under FULL graphs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rules_helpers import TINY_MODEL, mk

from gdn_operator.rules import family
from gdn_operator.rules.effective import effective_config
from gdn_operator.rules.layout import LayerLayout, attention_groups, layout_from_config, model_layout
from gdn_operator.versions import require_version

REPO = Path(__file__).resolve().parents[2]
V17, V22 = require_version("0.17.0"), require_version("0.22.0")


def _lay(full: int, linear: int, mtp: int = 1) -> LayerLayout:
    return LayerLayout(full, linear, mtp, "test")


@pytest.mark.parametrize(
    "full, linear, mtp, on, groups",
    [
        (2, 2, 1, True, 2),  # the tiny model + MTP: 3 vs 2 -> size 2 -> two attention groups (the probe)
        (2, 2, 1, False, 1),  # the tiny model without MTP (3400/3400 exact under FULL graphs)
        (1, 3, 1, True, 1),  # production geometry + MTP: 2 vs 3 -> size 2 -> one attention group
        (12, 36, 1, True, 1),  # Qwen3-Next-80B + MTP: 13 vs 36
        (16, 48, 1, True, 1),  # Qwen3.5-27B + MTP: 17 vs 48
        (6, 2, 0, False, 3),  # attention-heavy, no MTP: split without any drafter
        (4, 3, 0, False, 1),  # 4 < 1.5 x 3: padded up to one group of 4 (0.18.0+)
        (3, 0, 1, True, 1),  # no GDN layer: one spec, one group
    ],
)
def test_attention_groups(full, linear, mtp, on, groups):
    assert attention_groups(_lay(full, linear, mtp), mtp=on, version=V22) == groups


def test_0_17_has_no_pad_up_and_an_unknown_version_takes_the_larger_answer():
    lay = _lay(4, 3, 0)
    assert attention_groups(lay, mtp=False, version=V17) == 2  # 0.17.0: always the smallest count (3)
    assert attention_groups(lay, mtp=False, version=None) == 2


def test_layout_from_config_forms():
    tiny = json.loads((REPO / "tests" / "models" / "tiny-qwen3-next-recall" / "config.json").read_text())
    assert layout_from_config(tiny, "c") == LayerLayout(2, 2, 1, "c layer_types")
    nested = {"text_config": {"num_hidden_layers": 64, "full_attention_interval": 4, "mtp_num_hidden_layers": 1}}
    assert layout_from_config(nested, "c") == LayerLayout(16, 48, 1, "c num_hidden_layers / full_attention_interval")
    assert layout_from_config({"layer_types": ["full_attention", "sliding_attention"]}, "c") is None  # no guess
    assert layout_from_config({"num_hidden_layers": 8}, "c") is None


def test_model_layout_sources(tmp_path):
    assert model_layout(TINY_MODEL).source.startswith("config.json at ")
    hub = model_layout("hf://Qwen/Qwen3.5-27B")
    assert hub == LayerLayout(16, 48, 1, "published checkpoint Qwen/Qwen3.5-27B (rules/data/checkpoints.yaml)")
    assert model_layout("hf://Qwen/Qwen3.5-9B") is None
    assert model_layout("pvc://claim/models/Qwen/Qwen3-Coder-Next").full_attention == 12  # a copy named ORG/NAME
    cfg = {"layer_types": ["full_attention"] * 6 + ["linear_attention"] * 2}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert model_layout(f"file://{tmp_path}") == LayerLayout(6, 2, 0, f"config.json at {tmp_path} layer_types")


def test_effective_value_and_its_source(tmp_path):
    eff = effective_config(mk("0.22.0", model=TINY_MODEL))
    assert eff.attention_kv_groups == 2 and "2 full-attention + 1 MTP vs 2 GDN layers" in eff.sources["attention_kv_groups"]
    assert effective_config(mk("0.22.0", model=TINY_MODEL, speculativeDecoding={"enabled": False})).attention_kv_groups == 1
    assert effective_config(mk("0.22.0")).attention_kv_groups == 1  # Qwen/Qwen3.5-27B
    unknown = effective_config(mk("0.22.0", model="hf://Qwen/Qwen3.5-9B"))
    assert unknown.attention_kv_groups is None and unknown.sources["attention_kv_groups"].startswith("unknown:")


def test_every_checkpoint_layout_is_well_formed():
    entries = family._checkpoint_entries()
    laid = {k: e["layers"] for k, e in entries.items() if "layers" in e}
    assert "qwen/qwen3.5-27b" in laid and "qwen/qwen3-next-80b-a3b-instruct" in laid
    for k, layers in laid.items():
        assert set(layers) == {"full_attention", "linear_attention", "mtp"}, k
        assert "http" in entries[k]["source"], k
