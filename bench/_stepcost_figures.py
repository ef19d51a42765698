"""The arithmetic of bench/bench_gpu_stepcost.py (issue 50), stdlib only: what a step-cost capture's figures are
and how each is computed from its repetitions, so tests/rules/test_stepcost_capture.py recomputes them with the same
code the driver ran. The engines, the load and the deadline are the driver's; nothing here talks to an engine.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the speed-up math lives in the operator (rules/stepcost.py, the cost advisory's too); loaded by path: the GPU
# host's python imports no operator package here
_spec = importlib.util.spec_from_file_location("stepcost", REPO / "operator" / "gdn_operator" / "rules" / "stepcost.py")
assert _spec and _spec.loader
stepcost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stepcost)

GEOMETRY_DIR = REPO / "tests" / "fixtures" / "models-geometry"
ORACLE = REPO / "tests" / "fixtures" / "vllm-0.26.0-h200x2-release" / "release.json"
#: engine kind -> (speculative tokens, settings: SETTINGS key)
KINDS: dict[str, tuple[int, str]] = {
    "off": (0, "rendered"),
    "k2": (2, "rendered"),
    "k2v": (2, "vllm"),
    "k1": (1, "rendered"),
    "k3": (3, "rendered"),
    "k2b": (2, "rendered"),
    "k2a": (2, "async-default"),
    "offnpc": (0, "no-prefix-caching"),
    "k1v": (1, "vllm"),
    "k3v": (3, "vllm"),
}
RULE_FLAGS = ("--no-async-scheduling", "--async-scheduling", "--no-enable-prefix-caching", "--enable-prefix-caching")
#: settings -> (flags removed from the rendered line, flags added): "rendered" as gdnctl gave it; "vllm" the rules'
#: async-scheduling and prefix-caching flags removed (vLLM decides both); "async-default" only the async one removed;
#: "no-prefix-caching" prefix caching turned off by flag (MTP off's control for the prefill cost)
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rendered": ((), ()),
    "vllm": (RULE_FLAGS, ()),
    "async-default": (("--no-async-scheduling", "--async-scheduling"), ()),
    "no-prefix-caching": (("--enable-prefix-caching",), ("--no-enable-prefix-caching",)),
}
CELLS = ("c8", "c1", "c32", "c64", "prefix", "long")  # measured in this order: a deadline cut loses the last
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32, "c64": 64, "long": 8, "prefix": 8, "c8-again": 8}
#: the cells each kind measures (k1, k3 and the A/A twin: decode only, the rest is k2's question)
KIND_CELLS = {
    **{k: ("c1", "c8", "c32", "c64") for k in ("k1", "k3", "k2b", "k1v", "k3v")},
    "k2a": ("c1", "c8", "c32", "c64", "prefix"),  # async scheduling's share of k2v/k2
    "offnpc": ("c8", "prefix"),  # prefix caching's prefill cost without MTP (TTFT against off)
}
#: speed-up of (k, settings) over MTP off of the same geometry, per cell
PAIRS = (
    ("k2", "off"), ("k2v", "off"), ("k1", "off"), ("k3", "off"), ("k2b", "off"), ("k1v", "off"), ("k3v", "off"),
    ("k2a", "off"), ("k2v", "k2"), ("k2b", "k2"), ("k2a", "k2"), ("k2v", "k2a"), ("k1v", "k1"), ("k3v", "k3"),
    ("offnpc", "off"),
)  # fmt: skip
#: published acceptance of Qwen MTP heads: (label, k it was measured at, unconditional per-position rates, source)
PUBLISHED: tuple[dict, ...] = (
    {
        "label": "Rapid-MLX#3156: MTPLX, Qwen3.8-27B 4-bit, depth 3, greedy (per-depth 0.75 / 0.54 / 0.33)",
        "per_position": [0.75, 0.54, 0.33],
        "source": "https://github.com/raullenchai/Rapid-MLX/issues/3156 (2026-09-06; from #3140)",
        "caveat": "Qwen3.8-27B: the Qwen3.5-27B architecture (64 layers, 48 GDN + 16 attention, hidden 5120, one MTP "
        "layer); a 4-bit MLX checkpoint, one 2,726-token RAG prompt, 600-token answer; 2.62 tokens per verify",
    },
    {
        "label": "tenstorrent/vllm#442: Qwen3.8-27B bf16 MTP head, k=1, teacher-forced, pooled",
        "per_position": [0.647],
        "source": "https://github.com/tenstorrent/vllm/issues/442 (comment by L-Beale-NZ, 2026-08-25)",
        "caveat": "Qwen3.8-27B (the Qwen3.5-27B architecture), head assembled in HF transformers; by domain code 0.91, "
        "factual 0.61, prose 0.49, technical 0.48 (n=558)",
    },
)


def text_only_config(full: dict) -> dict:
    """The text-only checkpoint form of a Qwen3.5 config: ``text_config`` at the top, the matching *ForCausalLM
    architecture (what a text-only Qwen3.5 checkpoint carries); every geometry field unchanged."""
    arch = full["architectures"][0]
    causal = {
        "Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
    }
    if arch not in causal:
        raise ValueError(f"{arch}: not a Qwen3.5 multimodal architecture")
    out = dict(full["text_config"])
    out["architectures"] = [causal[arch]]
    out["tie_word_embeddings"] = bool(full.get("tie_word_embeddings", out.get("tie_word_embeddings", False)))
    return out


def text_params(cfg: dict) -> int:
    """Parameters of the text model (embeddings, decoder layers, final norm, LM head; the MTP layer not counted):
    what dummy weights occupy, so what a step reads."""
    h, n, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd, qh, kvh = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kd, vd, kh, vh = (
        cfg["linear_key_head_dim"],
        cfg["linear_value_head_dim"],
        cfg["linear_num_key_heads"],
        cfg["linear_num_value_heads"],
    )
    conv = cfg["linear_conv_kernel_dim"]
    full_attn = h * qh * hd * 2 + 2 * h * kvh * hd + qh * hd * h + 2 * hd  # q (+ output gate), k, v, o, q/k norms
    qkv = 2 * kh * kd + vh * vd
    gdn = (
        h * qkv + h * vh * vd + 2 * h * vh + qkv * conv + 2 * vh + vd + vh * vd * h
    )  # in_proj qkv, z, a/b, conv, A/dt, norm, out
    if "num_experts" in cfg:
        e, mi, si = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        mlp = e * 3 * h * mi + 3 * h * si + h * e + h  # experts, shared expert, router, shared gate
    else:
        mlp = 3 * h * cfg["intermediate_size"]
    kinds = cfg["layer_types"]
    layers = sum(full_attn if t == "full_attention" else gdn for t in kinds) + n * (mlp + 2 * h)
    emb = v * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return int(layers + emb + h)


def median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def spread(values: list[float], nd: int = 3) -> dict | None:
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    return {"median": round(median(xs) or 0.0, nd), "min": round(min(xs), nd), "max": round(max(xs), nd)}


SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def spec_counters(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except ValueError:
            continue
        if name in SPEC or (name.startswith("vllm:prefix_cache_") and name.endswith("_total")):  # not *_created
            out[name] = out.get(name, 0.0) + value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total" and 'position="' in line:
            pos = line.split('position="', 1)[1].split('"', 1)[0]
            out[f"pos{pos}"] = out.get(f"pos{pos}", 0.0) + value
    return out


def cell_acceptance(before: dict, after: dict, k: int) -> dict | None:
    d = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after}
    drafts = d.get(SPEC[0], 0.0)
    if not k or not drafts:
        return None
    acc = d.get(SPEC[2], 0.0)
    return {
        "drafts": drafts,
        "accepted": acc,
        "per_position": [round(d.get(f"pos{i}", 0.0) / drafts, 4) for i in range(k)],
        "tokens_per_step": round(1 + acc / drafts, 4),
    }


def finish_cell(cell: dict) -> None:
    """The cell's figures from its repetitions: step cost = ms per token x tokens per step (L)."""
    reps = cell["reps"]
    L = (cell.get("acceptance") or {}).get("tokens_per_step") or 1.0
    cell["tokens_per_step"] = L
    cell["step_ms"] = spread([r["ms_per_token"] * L for r in reps if r.get("ms_per_token")])
    cell["tokens_per_s"] = spread([r["tokens_per_s"] for r in reps if r.get("tokens_per_s")], 1)
    cell["ttft_ms"] = spread([r["ttft_ms"] for r in reps if r.get("ttft_ms")], 1)


# ------------------------------------------------------------------------------------------- the figures


def oracle_acceptance(path: Path = ORACLE) -> dict[str, dict]:
    """What the trained production-geometry oracle accepted at 0.26.0 (per k and workload): unconditional
    per-position rates from its counters, so (1 + sum) is its mean tokens per step."""
    doc = json.loads(path.read_text())
    out: dict[str, dict] = {}
    for eng, k in (("k1", 1), ("a", 2), ("k3", 3)):
        for work, cell in doc["cells"].get(eng, {}).items():
            acc = cell.get("acceptance")
            if not acc:
                continue
            mal = acc["mean_accepted_length"]
            pp = list(acc["per_position"][:k])
            if len(pp) < k:  # the 0.26.0 driver kept two positions: the rest from the mean length
                pp.append(round(mal - 1 - sum(pp), 4))
            out[f"k{k} {work}"] = {"k": k, "per_position": pp, "tokens_per_step": mal, "engine": eng}
    return out


def noise_floor(result: dict, geom: str) -> float | None:
    """How far apart the same configuration came at this geometry (step cost): every engine's c8 against its own
    c8-again, and the twin k2b against k2 in every cell both measured. A step-cost ratio within it is not told
    apart from 1."""
    ratios = []
    for name, cells in result["cells"].items():
        if not name.startswith(f"{geom}:"):
            continue
        a, b = (cells.get("c8") or {}).get("step_ms"), (cells.get("c8-again") or {}).get("step_ms")
        if a and b:
            ratios.append(b["median"] / a["median"])
    twin, k2 = result["cells"].get(f"{geom}:k2b", {}), result["cells"].get(f"{geom}:k2", {})
    for work in CELLS:
        a, b = (k2.get(work) or {}).get("step_ms"), (twin.get(work) or {}).get("step_ms")
        if a and b:
            ratios.append(b["median"] / a["median"])
    return round(max(abs(r - 1) for r in ratios), 3) if ratios else None


def curves(result: dict) -> dict:
    """Per geometry, pair and cell: the step-cost ratio, the speed-up curve over constant acceptance, the
    break-even acceptance, and the speed-up at the oracle's and the published acceptance (ranges from the
    step-cost spreads)."""
    oracle = result.get("oracle_acceptance") or {}
    out: dict[str, dict] = {}
    for geom in sorted({e["geometry"] for e in result["engines"].values() if e.get("geometry")}):
        floor = noise_floor(result, geom)
        for num, den in PAIRS:
            a, b = result["cells"].get(f"{geom}:{num}", {}), result["cells"].get(f"{geom}:{den}", {})
            k = KINDS[num][0]
            for work in CELLS:
                x, y = (a.get(work) or {}).get("step_ms"), (b.get(work) or {}).get("step_ms")
                if not x or not y:
                    continue
                key = f"{geom} {work} {num}/{den}"
                ratio = round(x["median"] / y["median"], 3)
                entry: dict = {
                    "t_num_ms": x,
                    "t_den_ms": y,
                    "step_ratio": ratio,
                    "claimed": x["min"] > y["max"] or x["max"] < y["min"],
                }
                if floor is not None:
                    entry["noise_floor"] = floor
                    entry["beyond_noise"] = entry["claimed"] and abs(ratio - 1) > floor
                if KINDS[den][0] == 0 and k:  # MTP against MTP off: the curve
                    t_off, t_k = y["median"], x["median"]
                    entry["curve"] = stepcost.curve(t_off, t_k, k)
                    entry["break_even_alpha"] = stepcost.break_even(t_off, t_k, k)
                    marks = {}
                    for label, o in oracle.items():
                        if o["k"] == k:
                            marks[f"oracle {label}"] = _mark(y, x, o["per_position"])
                    for p in result.get("published_acceptance", PUBLISHED):
                        pp = p["per_position"][:k]
                        if len(pp) == k:
                            marks[p["label"]] = _mark(y, x, pp)
                    entry["at"] = marks
                out[key] = entry
    return out


def _mark(off: dict, mtp: dict, pp: list[float]) -> dict:
    return {
        "per_position": pp,
        "speedup": round(stepcost.speedup(off["median"], mtp["median"], pp), 3),
        "range": [
            round(stepcost.speedup(off["min"], mtp["max"], pp), 3),
            round(stepcost.speedup(off["max"], mtp["min"], pp), 3),
        ],
    }


def noise(result: dict) -> dict:
    """The A/A figures: per engine c8 at the start and the end of its slot; k2b against k2 per cell."""
    out: dict[str, dict] = {}
    for name, cells in result["cells"].items():
        a, b = (cells.get("c8") or {}).get("step_ms"), (cells.get("c8-again") or {}).get("step_ms")
        if a and b:
            out[f"{name} c8-again/c8"] = {"ratio": round(b["median"] / a["median"], 3)}
    for key, e in result.get("curves", {}).items():
        if key.endswith("k2b/k2"):
            out[key] = {"ratio": e["step_ratio"]}
    return out


# ------------------------------------------------------------------------------------------- into the rules (item 4)


def acceptance_named(doc: dict, name: str, k: int) -> tuple[list[float], str]:
    """Per-position acceptance for k drafted tokens by name: an oracle key of the capture ("k2 c8": the trained
    production-geometry model at 0.26.0) or a published label; with its source."""
    oracle = doc.get("oracle_acceptance") or {}
    if name in oracle:
        o = oracle[name]
        if o["k"] != k:
            raise ValueError(f"{name}: measured at k={o['k']}, not k={k}")
        return list(o["per_position"]), f"the oracle model's {name} at vLLM 0.26.0, {ORACLE.parent.name}"
    for p in doc.get("published_acceptance", PUBLISHED):
        if p["label"] == name:
            if len(p["per_position"]) < k:
                raise ValueError(f"{name}: {len(p['per_position'])} positions published, k={k} needs {k}")
            return list(p["per_position"][:k]), f"{p['label']}, {p['source']}"
    raise ValueError(f"{name}: not an oracle key ({sorted(oracle)}) nor a published label")


def cost_entry(doc: dict, fixture: str, geom: str, acceptance: str) -> dict:
    """A rules.yaml `cost` entry (basis step-cost) from a capture: MTP k=2 as the operator rendered it (GEOM:k2)
    against MTP off (GEOM:off), at every decode concurrency both measured, projected at the named acceptance.
    No vs_unmitigated: vLLM's-defaults engine (k2v) differs by two rules' flags, not one rule's mitigation; its
    step-cost ratio goes into the note. `fixture` is the capture's stepcost.json as a checkout path."""
    mit, off = f"{geom}:k2", f"{geom}:off"
    argv = doc["engines"][mit]["argv"]
    k = doc["engines"][mit]["k"]
    if not {"--no-async-scheduling", "--no-enable-prefix-caching"} <= set(argv) or "--compilation-config" in argv:
        raise ValueError(f"{mit} did not run the rendered defaults this entry describes: {argv}")
    pp, source = acceptance_named(doc, acceptance, k)
    points = []
    for c in (1, 8, 32, 64):
        x = (doc["cells"].get(mit, {}).get(f"c{c}") or {}).get("step_ms")
        y = (doc["cells"].get(off, {}).get(f"c{c}") or {}).get("step_ms")
        if x and y:
            points.append({"concurrency": c, "vs_off": round(stepcost.speedup(y["median"], x["median"], pp), 3)})
    if not points:
        raise ValueError(f"{mit} and {off} share no measured decode cell")
    v = {c: (doc["cells"].get(f"{geom}:k2v", {}).get(f"c{c}") or {}).get("step_ms") for c in (1, 8, 32, 64)}
    k2 = {c: (doc["cells"].get(mit, {}).get(f"c{c}") or {}).get("step_ms") for c in (1, 8, 32, 64)}
    vs = [f"{v[c]['median'] / k2[c]['median']:.3f} at {c}" for c in (1, 8, 32, 64) if v[c] and k2[c]]
    return {
        "vllm": doc["vllm_version"],
        "hardware": f"1x {doc['gpu']}",
        "model": f"{geom} geometry ({doc['models'][geom]['text_params'] / 1e9:.1f} B text parameters, dummy weights)",
        "model_path": f"tests/fixtures/models-geometry/{geom}",
        "representative": True,
        "basis": "step-cost",
        "acceptance": {"per_position": pp, "source": source},
        "fixture": fixture,
        "engines": {"mitigated": mit, "mtp_off": off},
        "config": {
            "mtp": True,
            "num_speculative_tokens": k,
            "async_scheduling": False,
            "prefix_caching": False,
            "cudagraph_mode": "auto",
            "tensor_parallel_size": 1,
        },
        "baseline": "MTP off with vLLM's defaults (async scheduling and prefix caching as vLLM decides at the release)",
        "points": points,
        "note": (
            f"Step cost (median of {doc['method']['reps']} repetitions, {doc['method']['out_tokens']} tokens out, EOS "
            f"ignored) of the verify-{k + 1} step against MTP off's step, times the tokens per step the acceptance gives "
            f"({stepcost.tokens_per_step(pp):.3f}). MTP k=2 with vLLM's defaults (async scheduling and prefix caching "
            f"on) stepped " + (", ".join(vs) if vs else "(not measured)") + " x the rendered k=2 step (concurrency)."
        ),
    }


# ------------------------------------------------------------------------------------------- the closing note's tables


def _r(s: dict | None, nd: int = 2) -> str:
    return f"{s['median']:.{nd}f} ({s['min']:.{nd}f}-{s['max']:.{nd}f})" if s else "-"


def tables(doc: dict) -> str:
    """Markdown tables of a capture, every figure read from it: step cost per engine and cell, MTP's speed-up at the
    marked acceptance with break-even acceptance and the noise judgement, the A/A pairs, and the examples."""
    out = [
        f"vLLM {doc['vllm_version']}, {doc['gpu'] or 'GPU not named'}{' (DRY RUN: figures meaningless)' if doc['dry_run'] else ''}; "
        f"{doc['method']['reps']} repetitions a cell, {doc['method']['out_tokens']} tokens out, EOS ignored.",
        "",
        "| engine | ready s | KV tokens / max concurrency | cell | step ms | tokens/step | tokens/s | TTFT ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, cells in doc["cells"].items():
        e = doc["engines"][name]
        cap = e.get("capacity") or {}
        for i, (work, c) in enumerate(cells.items()):
            head = (
                f"| {name} | {e.get('ready_s', '-')} | {cap.get('kv_cache_tokens') or '-'} / {cap.get('max_concurrency') or '-'} "
                if i == 0
                else "| | | "
            )
            out.append(
                head + f"| {work} | {_r(c.get('step_ms'))} | {c.get('tokens_per_step', '-')} | {_r(c.get('tokens_per_s'), 0)} "
                f"| {_r(c.get('ttft_ms'), 0)} |"
            )
    out += [
        "",
        "| pair | cell | step-cost ratio | claimed / beyond noise (floor) | break-even alpha | speed-up at the marks |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, c in doc["curves"].items():
        geom, work, pair = key.split(" ")
        marks = "; ".join(
            f"{label}: {m['speedup']:.2f}x ({m['range'][0]:.2f}-{m['range'][1]:.2f})" for label, m in c.get("at", {}).items()
        )
        judged = f"{c['claimed']} / {c.get('beyond_noise', '-')} ({c.get('noise_floor', '-')})"
        out.append(
            f"| {geom} {pair} | {work} | {c['step_ratio']:.3f} | {judged} | {c.get('break_even_alpha', '-')} | {marks or '-'} |"
        )
    out += ["", "| A/A | ratio |", "| --- | --- |"] + [f"| {k} | {v['ratio']} |" for k, v in doc["noise"].items()]
    out += ["", "| example | geometry (how scaled) | starts | reason | KV tokens / max concurrency | configured max_num_seqs |"]
    out += ["| --- | --- | --- | --- | --- | --- |"]
    for name, e in doc["examples"].items():
        cap = e.get("capacity") or {}
        out.append(
            f"| {name} | {e['geometry']} ({'; '.join(e.get('how') or [e['scaled']])}) | {e.get('starts')} | {e.get('reason', '')[:160]} "
            f"| {cap.get('kv_cache_tokens') or '-'} / {cap.get('max_concurrency') or '-'} | {e.get('configured_max_num_seqs', '-')} |"
        )
    if doc["skipped"]:
        out += ["", "Not measured (the deadline): " + "; ".join(doc["skipped"])]
    return "\n".join(out) + "\n"
