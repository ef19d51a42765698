#!/usr/bin/env python3
"""Probe (GPU host, one GPU): prompts and final prefill chunks of exactly 1 + k tokens under MTP (issue 47 item 3).

The seed hazard PR #32716 (Mamba2, then GDN in vllm#51562 / PR #51565): with MTP k, the attention metadata builder
treats every request with at most 1 + k new tokens as a decode (``decode_threshold`` = 1 + k). A new request whose
whole prompt, or whose final prefill chunk, is that short is then run down the speculative-decode path, and its
recurrent (GDN) state is never initialised from the prompt: silent wrong answers, no log line. This probe asks
whether a release shows it on the trained tiny recall model (tests/models/tiny-qwen3-next-recall), where every answer
token must be recalled from the prompt, so a state that was never written shows as wrong tokens.

Engines (every one rendered by ``gdnctl render`` at ``$GDN_GPU_VLLM_VERSION`` from the minimal manifest, the same
adaptation as the rest of the GPU tier: tests/gpu/harness.py; one GPU, a fixed KV pool each, eager, started at once):

  off      MTP off: the reference (same weights, no speculative path)
  k1 k2 k3 MTP with k = 1 / 2 / 3 as the operator renders it

Every engine runs with ``--max-num-batched-tokens CHUNK`` (default 64) and ``--max-num-seqs 16``, so a prompt of
CHUNK + L tokens sent alone is prefilled in two chunks, the last of L tokens.

Workloads (greedy, token-id prompts of random symbols + ``=``, the same list for every engine, seeded):

  short    whole prompts of L = 2..``--max-len`` tokens (1..L-1 symbols), ``--per-length`` prompts each, sent with
           ``--concurrency`` in flight, then the same again one at a time (a batch of one: no other request's decode
           rows beside it)
  chunk    prompts of CHUNK + L tokens, L = 1..``--max-len``, one at a time: the final chunk is L tokens

For each engine, workload and L: how many answers are exact (the task's answer, then EOS) and how many agree with the
``off`` engine's answer to the same prompt (the reference: a model that is wrong on two-symbol strings is wrong the
same way without MTP). The hazard predicts a drop at L = 1 + k for engine k and nowhere else; the other lengths and
engines are the controls. ``short-prompts.json`` is rewritten after every cell.

``--dry-run``: stand-in engines (tests/gpu/standin_engine.py), no GPU: proves the phases, deadline and files.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.34.0:operator GDN_GPU_VLLM_VERSION=0.34.0 \\
        python3 bench/probe_gpu_short_prompts.py --out .gpu-artifacts/short --until $(( $(date +%s) + 240 ))
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
ENGINES = {"off": 0, "k1": 1, "k2": 2, "k3": 3}  # name -> num_speculative_tokens (0: MTP off)


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


def render(k: int, chunk: int, kv_cache_memory: str) -> harness.Rendered:
    """gdnctl's argv for MTP k (0: off), with the chunk size and the probe's GPU share (extraArgs)."""
    m = harness.adapted_manifest(
        mtp=k > 0,
        gpu_memory_utilization=0.1,
        kv_cache_memory=kv_cache_memory,
    )
    m["spec"]["maxNumBatchedTokens"] = chunk
    m["spec"]["maxNumSeqs"] = 16
    if k > 0:
        m["spec"]["speculativeDecoding"]["numSpeculativeTokens"] = k
    m["spec"]["maxModelLen"] = 1024
    r = harness.render(m)
    if k > 0 and f'"num_speculative_tokens":{k}' not in "".join(r.argv).replace(" ", ""):
        raise RuntimeError(f"k{k}: the rendered argv does not carry num_speculative_tokens={k}: {r.argv}")
    return r


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
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--chunk", type=int, default=64, help="--max-num-batched-tokens of every engine")
    ap.add_argument("--max-len", type=int, default=10)
    ap.add_argument("--per-length", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kv-cache-memory", default="1G")
    ap.add_argument("--seed", type=int, default=32716)
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines, no GPU")
    a = ap.parse_args(argv)
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

    lengths = range(2, a.max_len + 1)
    work = {
        "short-c": (prompts(lengths, a.per_length, a.seed), a.concurrency),
        "short-1": (prompts(lengths, a.per_length // 2 or 1, a.seed + 1), 1),
        "chunk": (prompts(range(1, a.max_len + 1), 3, a.seed + 2, pad=a.chunk), 1),
    }
    engines: dict[str, harness.Engine] = {}
    try:
        for n in names:
            r = render(ENGINES[n], a.chunk, a.kv_cache_memory)
            result["engines"][n] = {"k": ENGINES[n], "argv": r.argv, "env": r.env, "notes": r.notes}
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
        for w, (items, conc) in work.items():
            for n in names:  # off first: the reference for the rest
                if "ready_s" not in result["engines"][n]:
                    continue
                if time.time() > a.until - 25:
                    result["skipped"].append(f"{n}/{w}")
                    continue
                cap = max(5.0, min(60.0, a.until - time.time() - 20))
                got, wall = harness.run_requests(engines[n], items, conc, keep_errors=True, timeout=cap)
                if n == "off":
                    ref[w] = got
                result["cells"].setdefault(w, {})[n] = {
                    "concurrency": conc,
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
