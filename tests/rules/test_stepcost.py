"""MTP's speed-up from step costs (issue 50): gdn_operator/rules/stepcost.py, and the bench's model preparation
(bench/bench_gpu_stepcost.py text_only_config / text_params) on the committed geometry fixtures.

The arithmetic is checked against cases worked by hand; the geometry against the model cards' figures
(tests/fixtures/models-geometry/README.md names the sources).
"""

from __future__ import annotations

import json
import sys

import pytest
from paths import REPO

from gdn_operator.rules import stepcost

sys.path.insert(0, str(REPO / "bench"))
import bench_gpu_stepcost as bench  # noqa: E402

GEOM = REPO / "tests" / "fixtures" / "models-geometry"


def test_tokens_per_step_is_one_plus_the_unconditional_per_position_rates():
    assert stepcost.tokens_per_step([]) == 1.0
    assert stepcost.tokens_per_step([0.9934, 0.9513]) == pytest.approx(2.9447)
    with pytest.raises(ValueError, match="cannot grow"):
        stepcost.tokens_per_step([0.5, 0.6])  # position 2 accepted more often than position 1: not counters
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        stepcost.tokens_per_step([1.2])


def test_constant_acceptance_compounds_per_position():
    assert stepcost.constant(0.5, 3) == [0.5, 0.25, 0.125]
    assert stepcost.constant(1.0, 2) == [1.0, 1.0]
    with pytest.raises(ValueError):
        stepcost.constant(0.5, 0)


def test_speedup_worked_by_hand():
    # a verify-3 step costs 1.2x a plain step; at alpha 0.5 a step emits 1 + 0.5 + 0.25 = 1.75 tokens: 1.75 / 1.2
    assert stepcost.speedup(10.0, 12.0, stepcost.constant(0.5, 2)) == pytest.approx(1.4583333)
    # no acceptance: MTP costs exactly its step-cost ratio
    assert stepcost.speedup(10.0, 12.0, [0.0, 0.0]) == pytest.approx(10 / 12)
    with pytest.raises(ValueError):
        stepcost.speedup(0.0, 12.0, [0.5])


def test_break_even_solves_speedup_equals_one():
    a = stepcost.break_even(10.0, 12.0, 2)
    assert a is not None and 0 < a < 1
    # 1 + a + a^2 = 1.2 -> a = (-1 + sqrt(1.8)) / 2
    assert a == pytest.approx((-1 + 1.8**0.5) / 2, abs=1e-4)
    assert stepcost.speedup(10.0, 12.0, stepcost.constant(a, 2)) == pytest.approx(1.0, abs=1e-3)
    assert stepcost.break_even(10.0, 9.0, 2) == 0.0  # a cheaper step never loses
    assert stepcost.break_even(10.0, 40.0, 2) is None  # 3 tokens a step cannot pay for a 4x step


def test_curve_runs_over_the_grid_and_grows_with_acceptance():
    c = stepcost.curve(10.0, 12.0, 2)
    assert [a for a, _ in c] == list(stepcost.GRID) and c[0] == [0.0, 0.833] and c[-1] == [1.0, 2.5]
    assert all(x[1] <= y[1] for x, y in zip(c, c[1:], strict=False))


@pytest.mark.parametrize(
    "name, arch, layers, attn, hidden",
    [
        ("qwen3.5-27b", "Qwen3_5ForCausalLM", 64, 16, 5120),
        ("qwen3.5-9b", "Qwen3_5ForCausalLM", 32, 8, 4096),
        ("qwen3.5-35b-a3b", "Qwen3_5MoeForCausalLM", 40, 10, 2048),
    ],
)
def test_text_only_form_keeps_the_geometry(name, arch, layers, attn, hidden):
    full = json.loads((GEOM / name / "config.json").read_text())
    text = bench.text_only_config(full)
    assert text["architectures"] == [arch]
    assert {k: v for k, v in text.items() if k not in ("architectures",)} == full["text_config"]
    assert text["num_hidden_layers"] == len(text["layer_types"]) == layers and text["hidden_size"] == hidden
    assert text["layer_types"].count("full_attention") == attn
    assert text["layer_types"][3::4] == ["full_attention"] * attn  # every 4th layer (full_attention_interval 4)
    assert text["mtp_num_hidden_layers"] == 1 and text["vocab_size"] == 248320 and not text["tie_word_embeddings"]
    with pytest.raises(ValueError, match="not a Qwen3.5"):
        bench.text_only_config({"architectures": ["LlamaForCausalLM"], "text_config": {}})


def test_parameter_counts_match_the_model_names():
    """27B / 9B dense, 35B-A3B MoE: the text model of each file has the size its name says (the vision tower,
    ~0.46 B, and the MTP layer are not counted)."""
    names = ("qwen3.5-27b", "qwen3.5-9b", "qwen3.5-35b-a3b")
    n = {g: bench.text_params(bench.text_only_config(json.loads((GEOM / g / "config.json").read_text()))) for g in names}
    assert 26.5e9 < n["qwen3.5-27b"] < 27.5e9
    assert 8.5e9 < n["qwen3.5-9b"] < 9.5e9
    assert 34e9 < n["qwen3.5-35b-a3b"] < 35.5e9


def test_oracle_acceptance_is_read_from_the_0_26_0_capture():
    o = bench.oracle_acceptance()
    assert o["k2 c8"]["per_position"] == [0.9934, 0.9513] and o["k2 c8"]["tokens_per_step"] == 2.945
    assert o["k1 c8"]["per_position"] == [0.9935]
    # the 0.26.0 driver kept two positions: the third from the mean accepted length 3.883
    assert o["k3 c8"]["per_position"] == [0.994, 0.9633, pytest.approx(0.9257, abs=1e-4)]
    assert stepcost.tokens_per_step(o["k3 c8"]["per_position"]) == pytest.approx(3.883, abs=1e-3)
    assert {v["k"] for v in o.values()} == {1, 2, 3}


#: the geometry table of tests/fixtures/models-geometry/README.md (each figure with its source there)
TABLE = {
    # name: (layers, GDN, attention, hidden, Q heads, KV heads, head dim, GDN V heads, GDN QK heads, GDN head dim, MLP)
    "qwen3.5-27b": (64, 48, 16, 5120, 24, 4, 256, 48, 16, 128, "dense 17408"),
    "qwen3.5-9b": (32, 24, 8, 4096, 16, 4, 256, 32, 16, 128, "dense 12288"),
    "qwen3.5-35b-a3b": (40, 30, 10, 2048, 16, 2, 256, 32, 16, 128, "256 experts top-8 x 512 + shared 512"),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_geometry_files_hold_the_readme_table(name: str):
    t = json.loads((GEOM / name / "config.json").read_text())["text_config"]
    kinds = t["layer_types"]
    if "num_experts" in t:
        mlp = f"{t['num_experts']} experts top-{t['num_experts_per_tok']} x {t['moe_intermediate_size']} + shared {t['shared_expert_intermediate_size']}"
    else:
        mlp = f"dense {t['intermediate_size']}"
    got = (
        t["num_hidden_layers"], kinds.count("linear_attention"), kinds.count("full_attention"), t["hidden_size"],
        t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"], t["linear_num_value_heads"],
        t["linear_num_key_heads"], t["linear_key_head_dim"], mlp,
    )  # fmt: skip
    assert got == TABLE[name]
    assert t["linear_value_head_dim"] == t["linear_key_head_dim"] == 128 and t["vocab_size"] == 248320
    assert t["partial_rotary_factor"] * t["head_dim"] == 64  # RoPE dimension 64 (the model cards)
    assert t["mamba_ssm_dtype"] == "float32" and t["mtp_num_hidden_layers"] == 1
    readme = (GEOM / "README.md").read_text()
    row = f"| `{name}` |"
    assert row in readme and f"| {TABLE[name][3]} |" in readme.split(row, 1)[1].split("\n", 1)[0]
