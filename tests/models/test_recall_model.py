"""The committed recall model directory (issue 13): checkpoint names/shapes as vLLM's Qwen3-Next
loader expects them, held-out set consistent with the tokenizer, broken-MTP variant, size budget.

Stdlib only: the safetensors header is read directly (8-byte length + JSON), so this runs in the
project venv. The real loader is exercised by tests/integration/test_recall_engine.py (-m engine).
The expected names are written out here from vLLM 0.32.0's qwen3_next.py / qwen3_next_mtp.py
(HF checkpoint layout: per-expert MoE weights, in_proj_qkvz/in_proj_ba, mtp.* for the head)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_broken_mtp  # noqa: E402
import recall  # noqa: E402

MODEL = recall.MODEL_DIR
BROKEN = recall.BROKEN_MTP_DIR


def header(path: Path) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def expected_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kd, vd = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    conv = 2 * nk * kd + nv * vd

    def moe(p):
        out = {
            f"{p}.mlp.gate.weight": (E, H),
            f"{p}.mlp.shared_expert_gate.weight": (1, H),
            f"{p}.mlp.shared_expert.gate_proj.weight": (S, H),
            f"{p}.mlp.shared_expert.up_proj.weight": (S, H),
            f"{p}.mlp.shared_expert.down_proj.weight": (H, S),
            f"{p}.input_layernorm.weight": (H,),
            f"{p}.post_attention_layernorm.weight": (H,),
        }
        for e in range(E):
            out[f"{p}.mlp.experts.{e}.gate_proj.weight"] = (I, H)
            out[f"{p}.mlp.experts.{e}.up_proj.weight"] = (I, H)
            out[f"{p}.mlp.experts.{e}.down_proj.weight"] = (H, I)
        return out

    def attn(p):  # gated attention: q_proj carries the output gate too
        return {
            f"{p}.self_attn.q_proj.weight": (2 * nq * hd, H),
            f"{p}.self_attn.k_proj.weight": (nkv * hd, H),
            f"{p}.self_attn.v_proj.weight": (nkv * hd, H),
            f"{p}.self_attn.o_proj.weight": (H, nq * hd),
            f"{p}.self_attn.q_norm.weight": (hd,),
            f"{p}.self_attn.k_norm.weight": (hd,),
        }

    def gdn(p):
        return {
            f"{p}.linear_attn.in_proj_qkvz.weight": (2 * nk * kd + 2 * nv * vd, H),
            f"{p}.linear_attn.in_proj_ba.weight": (2 * nv, H),
            f"{p}.linear_attn.conv1d.weight": (conv, 1, cfg["linear_conv_kernel_dim"]),
            f"{p}.linear_attn.A_log": (nv,),
            f"{p}.linear_attn.dt_bias": (nv,),
            f"{p}.linear_attn.norm.weight": (vd,),
            f"{p}.linear_attn.out_proj.weight": (H, nv * vd),
        }

    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    n = cfg["num_hidden_layers"]
    for i in range(n):
        p = f"model.layers.{i}"
        full = (i + 1) % cfg["full_attention_interval"] == 0
        out |= moe(p) | (attn(p) if full else gdn(p))
    out |= {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
    }
    for j in range(cfg["num_nextn_predict_layers"]):
        out |= moe(f"mtp.layers.{j}") | attn(f"mtp.layers.{j}")
    return out


def test_checkpoint_names_and_shapes_are_what_vllm_loads():
    cfg = json.loads((MODEL / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3NextForCausalLM"] and cfg["model_type"] == "qwen3_next"
    assert cfg["num_nextn_predict_layers"] == 1
    assert cfg["linear_key_head_dim"] == cfg["linear_value_head_dim"] == 128  # CPU GDN kernel
    h = header(MODEL / "model.safetensors")
    got = {k: tuple(v["shape"]) for k, v in h.items()}
    want = expected_shapes(cfg)
    assert sorted(set(got) - set(want)) == [], "names vLLM would not know"
    assert sorted(set(want) - set(got)) == [], "names vLLM expects but the checkpoint lacks"
    assert got == want
    assert {v["dtype"] for v in h.values()} == {"BF16"}


def test_checkpoint_name_check_catches_a_renamed_tensor():
    """The check above is not vacuous: a renamed MTP tensor is reported on both sides."""
    cfg = json.loads((MODEL / "config.json").read_text())
    want = expected_shapes(cfg)
    got = dict(want)
    got["mtp.fc_renamed.weight"] = got.pop("mtp.fc.weight")
    assert set(got) - set(want) == {"mtp.fc_renamed.weight"}
    assert set(want) - set(got) == {"mtp.fc.weight"}


def test_heldout_matches_tokenizer_and_spans_lengths():
    items = recall.load_heldout()
    assert len(items) >= 200 and len({it["id"] for it in items}) == len(items)
    tok = json.loads((MODEL / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    eos = json.loads((MODEL / "config.json").read_text())["eos_token_id"]
    assert special["<|endoftext|>"] == eos == recall.EOS_TOKEN_ID
    assert json.loads((MODEL / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    for it in items:
        assert set(it) == {"id", "prompt", "prompt_token_ids", "expected", "expected_token_ids", "max_tokens"}
        assert [vocab[c] for c in it["prompt"]] == it["prompt_token_ids"]
        assert [vocab[c] for c in it["expected"]] == it["expected_token_ids"]
        assert it["prompt"] == it["expected"] + "="  # the copy task
        assert it["max_tokens"] == len(it["expected_token_ids"]) + 1  # room for EOS
    lengths = sorted(len(it["prompt_token_ids"]) for it in items)
    assert lengths[0] <= 10 and lengths[-1] >= 200


def test_broken_variant_scrambles_only_the_mtp_head(tmp_path):
    """The committed broken dir is what make_broken_mtp.py produces (deterministic), has the same
    names/shapes, identical main-model bytes and different bytes in every non-norm mtp.* tensor."""
    out = tmp_path / "broken"
    make_broken_mtp.main([str(MODEL), str(out)])
    assert (out / "model.safetensors").read_bytes() == (BROKEN / "model.safetensors").read_bytes()
    for name in ("config.json", "tokenizer.json", "heldout.jsonl"):
        assert (out / name).read_bytes() == (MODEL / name).read_bytes()
    a, b = header(MODEL / "model.safetensors"), header(BROKEN / "model.safetensors")
    assert {k: v["shape"] for k, v in a.items()} == {k: v["shape"] for k, v in b.items()}
    raw_a, raw_b = (MODEL / "model.safetensors").read_bytes(), (BROKEN / "model.safetensors").read_bytes()
    base_a, base_b = 8 + struct.unpack("<Q", raw_a[:8])[0], 8 + struct.unpack("<Q", raw_b[:8])[0]

    def data(raw, base, meta):
        s, e = meta["data_offsets"]
        return raw[base + s : base + e]

    changed = {k for k in a if data(raw_a, base_a, a[k]) != data(raw_b, base_b, b[k])}
    # a permutation of a constant tensor is the same tensor (the MTP layer's routed experts are all
    # zero in the committed weights: MODEL_CARD.md, "Known limitation")
    scrambled = {k for k in a if k.startswith("mtp.") and "norm" not in k}
    varied = {k for k in scrambled if len(set(memoryview(data(raw_a, base_a, a[k])).cast("H"))) > 1}
    assert changed == varied
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.shared_expert.up_proj.weight"} <= changed


def test_make_broken_refuses_a_dir_without_weights(tmp_path):
    with pytest.raises(SystemExit, match="model.safetensors"):
        make_broken_mtp.main([str(tmp_path), str(tmp_path / "out")])


def test_model_dirs_fit_the_size_budget():
    total = sum(f.stat().st_size for d in (MODEL, BROKEN) for f in d.iterdir())
    assert sum(f.stat().st_size for f in MODEL.iterdir()) <= 6 * 2**20
    assert total <= 16 * 2**20
    card = (MODEL / "MODEL_CARD.md").read_text()
    for needle in ("train_recall.py", "seed 13", "held-out", "acceptance"):
        assert needle in card
