#!/usr/bin/env python3
"""Probe (GPU host, one GPU): prompts and final prefill chunks of exactly 1 + k tokens under MTP (issue 47 item 3).

The seed hazard PR #32716 (short prompts taken for decodes under MTP) has a 2026 descendant (vllm#53051, vllm#49918;
fix PRs #47123 / #53059 open for the V1 runner; the V2 runner's phase-aware dispatch from 0.28.0, vllm#51865): a step
is dispatched to the FULL speculative-decode CUDA graph by its shape alone, so a request whose prompt, or whose final
prefill chunk, is exactly 1 + k tokens (alone, or beside decode rows of 1 + k tokens each) replays the spec-decode
graph on stale state indices, and its GDN state is never written: deterministic wrong answers, no log line. It needs
FULL graphs (vLLM's default FULL_AND_PIECEWISE); PIECEWISE and eager cannot reach it. This probe asks whether a
release shows it on the trained tiny recall model (tests/models/tiny-qwen3-next-recall), where every answer token
must be recalled from the prompt, and whether what the operator renders avoids it.

Engines (argv from ``gdnctl render`` at ``$GDN_GPU_VLLM_VERSION`` of the minimal manifest, the GPU tier's adaptation:
tests/gpu/harness.py; one GPU, a fixed KV pool each, started at once):

  off   MTP off, eager: the reference (same weights, no speculative path)
  k2    MTP k = 2 with vLLM's default CUDA graphs (the rendered --compilation-config removed): the hazard's setting
  k3    the same with k = 3: the fatal length moves with k
  k1    the same with k = 1
  k2r   MTP k = 2 exactly as the operator renders it (the tiny model's two attention KV groups make the G1 rule
        render PIECEWISE; so does vllm#53051's rule where it applies): the mitigation

Every engine runs with ``maxNumBatchedTokens`` CHUNK (default 64) and ``maxNumSeqs`` 16, so a prompt of CHUNK + L
tokens sent alone is prefilled in two chunks, the last of L tokens.

Workloads (greedy, token-id prompts of random symbols + ``=``, the same list for every engine, seeded; one request at
a time, so G1 — which garbles rows after the first of a FULL-graph batch on this model — cannot confound them):

  short    whole prompts of L = 1..``--max-len`` tokens (L - 1 symbols, then `=`), ``--per-length`` each (L = 1:
           vllm#51562's one-token first chunk, MTP or not)
  chunk    prompts of CHUNK + L tokens, L = 1..``--max-len``: the final chunk is L tokens

For each engine, workload and L: how many answers are exact (the task's answer, then EOS) and how many agree with the
``off`` engine's answer to the same prompt. The hazard predicts wrong answers at L = 1 + k for engine kN and nowhere
else; the other lengths and engines are the controls. ``short-prompts.json`` is rewritten after every cell.

``--dry-run``: stand-in engines (tests/gpu/standin_engine.py), no GPU: proves the phases, deadline and files.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.34.0:operator GDN_GPU_VLLM_VERSION=0.34.0 \\
        python3 bench/probe_gpu_short_prompts.py --out .gpu-artifacts/short --until $(( $(date +%s) + 240 ))
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "tests" / "models"))
sys.path.insert(0, str(REPO / "operator"))

import harness  # noqa: E402
from bench_gpu_mtp_graphs import start_standin  # noqa: E402
from recall import EOS_TOKEN_ID, FIRST_SYMBOL_ID  # noqa: E402

SYMBOLS = 62
EQUALS = 3
#: name -> (num_speculative_tokens (0: MTP off), CUDA graphs: "eager", "default" (vLLM's) or "rendered" (ours))
ENGINES = {"off": (0, "eager"), "k2": (2, "default"), "k3": (3, "default"), "k1": (1, "default"), "k2r": (2, "rendered")}


def prompts(lengths: range, per_length: int, seed: int, pad: int = 0) -> list[dict]:
    """Recall prompts whose token count is pad + L for each L: pad + L - 1 random symbols, then `=`."""
    rng = random.Random(seed)
    out = []
    for n_tokens in lengths:
        total = pad + n_tokens
        for j in range(per_length):
            syms = [FIRST_SYMBOL_ID + rng.randrange(SYMBOLS) for _ in range(total - 1)]
            out.append(
                {
                    "id": f"L{n_tokens}-{j}",
                    "length": n_tokens,
                    "prompt_token_ids": [*syms, EQUALS],
                    "expected_token_ids": syms,
                    "max_tokens": len(syms) + 1,
                }
            )
    return out


def render(k: int, graphs: str, chunk: int, kv_cache_memory: str) -> harness.Rendered:
    """gdnctl's argv for MTP k (0: off) with the probe's chunk size and GPU share; graphs "default" removes the rendered
    --compilation-config (vLLM's own mode), "eager" renders enforceEager."""
    m = harness.adapted_manifest(mtp=k > 0, eager=graphs == "eager", gpu_memory_utilization=0.1, kv_cache_memory=kv_cache_memory)
    m["spec"]["maxNumBatchedTokens"] = chunk
    m["spec"]["maxNumSeqs"] = 16
    m["spec"]["maxModelLen"] = 1024
    if k > 0:
        m["spec"]["speculativeDecoding"]["numSpeculativeTokens"] = k
    r = harness.render(m)
    argv, notes = list(r.argv), list(r.notes)
    if graphs == "default" and "--compilation-config" in argv:
        i = argv.index("--compilation-config")
        notes.append(f"# removed the rendered --compilation-config {argv[i + 1]}: vLLM's default CUDA-graph mode")
        del argv[i : i + 2]
    if k > 0 and f'"num_speculative_tokens":{k}' not in "".join(argv).replace(" ", ""):
        raise RuntimeError(f"k{k}: the rendered argv does not carry num_speculative_tokens={k}: {argv}")
    return harness.Rendered(argv, r.env, notes)


def tally(items: list[dict], got: list[dict], ref: list[dict] | None) -> dict[str, dict]:
    """Per prompt length: sent, exact answers, agreement with the reference engine's answer, errors."""
    rows: dict[str, dict] = {}
    for i, (it, g) in enumerate(zip(items, got, strict=True)):
        r = rows.setdefault(str(it["length"]), {"sent": 0, "exact": 0, "agree": 0, "errors": 0})
        r["sent"] += 1
        if "error" in g:
            r["errors"] += 1
            continue
        out = list(g.get("token_ids") or [])
        if out and out[-1] == EOS_TOKEN_ID:
            out = out[:-1]
        r["exact"] += int(out == it["expected_token_ids"] and g.get("finish_reason") == "stop")
        if ref is not None and "error" not in ref[i]:
            r["agree"] += int(g.get("token_ids") == ref[i].get("token_ids"))
    return rows


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear driver of deadline-bound phases
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--until", type=float, default=time.time() + 300, help="deadline, epoch seconds")
    ap.add_argument("--engines", default="off,k2,k3,k2r")
    ap.add_argument("--chunk", type=int, default=64, help="--max-num-batched-tokens of every engine")
    ap.add_argument("--max-len", type=int, default=8)
    ap.add_argument("--per-length", type=int, default=12)
    ap.add_argument("--kv-cache-memory", default="1G")
    ap.add_argument("--seed", type=int, default=32716)
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines, no GPU")
    a = ap.parse_args(argv)
    # SIGTERM (the lease stops this step when a later release has arrived): unwind, so `finally` stops the engines
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    names = [n for n in a.engines.split(",") if n]
    if "off" not in names or any(n not in ENGINES for n in names):
        ap.error(f"--engines: a comma list of {', '.join(ENGINES)} that includes off (the reference)")
    a.out.mkdir(parents=True, exist_ok=True)
    logdir = a.out / "logs"
    result: dict = {
        "vllm_version": harness.VLLM_VERSION,
        "gpu": os.environ.get("GDN_GPU_NAME", ""),
        "model": str(harness.model_dir().name),
        "chunk": a.chunk,
        "seed": a.seed,
        "dry_run": a.dry_run,
        "engines": {},
        "cells": {},
        "skipped": [],
    }
    path = a.out / "short-prompts.json"

    def save() -> None:
        path.write_text(json.dumps(result, indent=1) + "\n")

    work = {
        "short": prompts(range(1, a.max_len + 1), a.per_length, a.seed),
        "chunk": prompts(range(1, a.max_len + 1), max(1, a.per_length // 3), a.seed + 1, pad=a.chunk),
    }
    engines: dict[str, harness.Engine] = {}
    try:
        for n in names:
            k, graphs = ENGINES[n]
            r = render(k, graphs, a.chunk, a.kv_cache_memory)
            result["engines"][n] = {"k": k, "graphs": graphs, "argv": r.argv, "env": r.env, "notes": r.notes}
            engines[n] = start_standin(n, r, logdir, "0", 2.0) if a.dry_run else harness.start(n, r, logdir)
        save()
        for n in names:
            left = a.until - time.time() - 20
            try:
                result["engines"][n]["ready_s"] = round(harness.wait_ready(engines[n], timeout=max(5.0, left)), 1)
            except RuntimeError as e:
                result["engines"][n]["failed"] = str(e)[-4000:]
        save()
        ref: dict[str, list[dict]] = {}
        for w, items in work.items():
            for n in names:  # off first: the reference for the rest
                if "ready_s" not in result["engines"][n]:
                    continue
                if time.time() > a.until - 25:
                    result["skipped"].append(f"{n}/{w}")
                    continue
                cap = max(5.0, min(60.0, a.until - time.time() - 20))
                got, wall = harness.run_requests(engines[n], items, 1, keep_errors=True, timeout=cap)
                if n == "off":
                    ref[w] = got
                result["cells"].setdefault(w, {})[n] = {
                    "wall_s": round(wall, 2),
                    "by_length": tally(items, got, ref.get(w)),
                }
                save()
    finally:
        for eng in engines.values():
            harness.stop(eng)
        save()
    print(json.dumps({w: {n: c["by_length"] for n, c in cells.items()} for w, cells in result["cells"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
