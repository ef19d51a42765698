#!/usr/bin/env python3
"""Benchmark (GPU host): what MTP is worth on vLLM 0.22.0, and what the operator's mitigation costs.

Trained tiny model (tests/models/tiny-qwen3-next-recall: copy task, MTP head trained), one GPU, engines
from the offline bundle (hack/gpu/README.md), argv from `gdnctl render` (tests/gpu/harness.py), eager.
Three configurations, identical flags except the one varied:

  (i)   mtp-async   MTP k=2, async scheduling on — vLLM's default; the operator enforces vllm#45100 at
                    0.22.0 and never renders it, so this is (ii)'s rendered line with that one flag flipped
  (ii)  mitigated   MTP k=2 with the operator's mitigations for 0.22.0's live rules, computed by the
                    rules evaluator (policy mitigate) — at 0.22.0 that is asyncScheduling false (PR #45100)
  (iii) nomtp       speculative decoding off (the upstream workaround), async scheduling vLLM's default

Modes (``--mode``; ``all`` runs both on one set of engines, the engines start together once):
  throughput  the same fixed-length requests (``--length`` symbols, greedy) at concurrency 1/8/32:
              generated tokens/s and exact-answer rate per configuration; ratios (ii)/(iii) (throughput
              the operator keeps instead of turning MTP off) and (ii)/(i) (the mitigation's cost).
              Then the start-up time to Ready of (ii) alone, eager, and with ``--compiled`` also in
              torch.compile + CUDA-graph mode (a cold compiled start costs ~5 min of GPU time).
  startup     only the start-up times below (e.g. ``--mode startup --compiled`` in its own command).
  b2          PR #45100 / B2 reproduction: (i) vs (ii), rounds of many concurrent requests of mixed
              lengths (4..250 symbols, so they finish at different times); counts exact / short (early
              EOS: a strict prefix) / wrong answers and keeps a sample of the bad ones.

Stops cleanly at ``--time-budget`` seconds (default 540: one 10-minute device command with margin);
whatever did not run is listed under "skipped".  Writes ``bench-gpu-mtp.json`` to ``--out``.
Note: with dummy weights MTP has 0 acceptance and runs ~2.5x slower than no MTP (147.6 vs 371.8 tok/s,
../shared/docs/vllm-gpu-engine.md): such a figure measures a broken head, not MTP — hence the trained model.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0:operator python3 bench/bench_gpu_mtp.py --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import harness  # noqa: E402

CONFIGS = {
    "mtp-async": dict(mtp=True, async_scheduling=True),
    "mitigated": dict(mtp=True, async_scheduling=None),
    "nomtp": dict(mtp=False, async_scheduling=None),
}


def alphabet_codec(items: list[dict]) -> tuple[dict[str, int], list[int]]:
    """char → token id, read off the held-out set itself (prompt = string + separator)."""
    enc: dict[str, int] = {}
    for it in items:
        for ch, tid in zip(it["prompt"], it["prompt_token_ids"], strict=False):
            enc.setdefault(ch, tid)
    sep = items[0]["prompt_token_ids"][-1]
    return enc, [sep]


def fixed_requests(n: int, length: int, seed: int) -> list[dict]:
    held = harness.heldout()
    enc, sep = alphabet_codec(held)
    symbols = sorted(c for c, t in enc.items() if t != sep[0])
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = "".join(rng.choice(symbols) for _ in range(length))
        out.append(
            {
                "id": f"fixed-{i}",
                "prompt_token_ids": [enc[c] for c in s] + sep,
                "expected": s,
                "expected_token_ids": [enc[c] for c in s],
                "max_tokens": length + 1,
            }
        )
    return out


def mixed_requests(n: int, seed: int) -> list[dict]:
    held = harness.heldout()
    rng = random.Random(seed)
    return [rng.choice(held) for _ in range(n)]


def measure(eng: harness.Engine, items: list[dict], conc: int) -> dict:
    got, wall = harness.run_requests(eng, items, concurrency=conc, keep_errors=True)
    eos = harness.eos_ids()
    verdicts = [harness.judge(i, g, eos) for i, g in zip(items, got, strict=True)]
    toks = sum(g["completion_tokens"] for g in got)
    bad = [
        {
            "id": i["id"],
            "expected": i["expected"],
            "got": g["text"],
            "got_token_ids": g["token_ids"],
            "finish_reason": g["finish_reason"],
            "verdict": v,
            **({"error": g["error"]} if "error" in g else {}),
        }
        for i, g, v in zip(items, got, verdicts, strict=True)
        if v != "exact"
    ]
    return {
        "concurrency": conc,
        "requests": len(items),
        "wall_s": round(wall, 3),
        "tokens": toks,
        "tokens_per_s": round(toks / wall, 1),
        "exact": verdicts.count("exact"),
        "short": verdicts.count("short"),
        "wrong": verdicts.count("wrong"),
        "errors": verdicts.count("error"),
        "engine_alive": eng.proc.poll() is None,
        "exact_rate": round(verdicts.count("exact") / len(items), 4),
        "bad_sample": bad[:5],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(".gpu-artifacts"), help="directory for bench-gpu-mtp.json")
    ap.add_argument(
        "--mode",
        choices=["all", "throughput", "b2", "startup"],
        default="all",
        help="startup: only the start-up times of (ii) alone (eager, and compiled with --compiled)",
    )
    ap.add_argument("--time-budget", type=float, default=540.0, help="seconds; stop cleanly before this")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", default="8,32,64", help="requests per concurrency level (same order)")
    ap.add_argument("--length", type=int, default=64, help="symbols per fixed-length request")
    ap.add_argument("--b2-requests", type=int, default=256, help="requests per B2 round")
    ap.add_argument("--b2-concurrency", type=int, default=64)
    ap.add_argument("--b2-rounds", type=int, default=3)
    ap.add_argument("--compiled", action="store_true", help="also time a compiled + CUDA-graph start of (ii)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=45100)
    args = ap.parse_args(argv)
    t_start = time.monotonic()

    def left() -> float:
        return args.time_budget - (time.monotonic() - t_start)

    site = os.environ.get("GDN_GPU_SITE") or next(
        (p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p, "vllm").is_dir()), None
    )
    if not site:
        ap.error("put the installed bundle on PYTHONPATH (or set GDN_GPU_SITE)")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-gpu-"))
    result: dict = {
        "vllm_version": harness.VLLM_VERSION,
        "model": str(harness.model_dir().name),
        "mode": args.mode,
        "configs": {},
        "throughput": {},
        "b2": {},
        "startup": {},
        "skipped": [],
        "note": "eager mode; a dummy-weight MTP figure measures a broken head, not MTP",
    }
    levels = list(zip((int(c) for c in args.concurrency.split(",")), (int(n) for n in args.requests.split(",")), strict=False))
    engines: dict[str, harness.Engine] = {}

    def save() -> None:
        (args.out / "bench-gpu-mtp.json").write_text(json.dumps(result, indent=1) + "\n")

    try:
        for name, kw in CONFIGS.items() if args.mode != "startup" else ():
            r = harness.config_rendered(gpu_memory_utilization=args.gpu_memory_utilization, **kw)
            result["configs"][name] = {"argv": r.argv, "operator_findings": [n for n in r.notes if n.startswith("#")]}
            engines[name] = harness.start(name, r, work, site_path=site)
        for name, eng in engines.items():
            harness.wait_ready(eng, timeout=max(30.0, left() - 30))
            result["startup"][f"{name} (3 engines starting together)"] = round(eng.ready_s, 1)
            print(f"ready: {name} in {eng.ready_s:.1f}s", flush=True)
        if args.mode in ("all", "throughput"):
            for conc, n in levels:
                items = fixed_requests(n, args.length, args.seed + conc)
                for name, eng in engines.items():
                    if left() < 60:
                        result["skipped"].append(f"throughput {name} c={conc}: time budget")
                        continue
                    m = measure(eng, items, conc)
                    result["throughput"].setdefault(name, {})[str(conc)] = m
                    print(
                        f"throughput {name:10s} c={conc:<3d} {m['tokens_per_s']:8.1f} tok/s  exact {m['exact']}/{m['requests']}",
                        flush=True,
                    )
                tp = {k: v.get(str(conc), {}).get("tokens_per_s") for k, v in result["throughput"].items()}
                if tp.get("mitigated") and tp.get("nomtp"):
                    result["throughput"].setdefault("ratios", {})[f"c={conc} (ii)/(iii) mitigated/nomtp"] = round(
                        tp["mitigated"] / tp["nomtp"], 3
                    )
                if tp.get("mitigated") and tp.get("mtp-async"):
                    result["throughput"].setdefault("ratios", {})[f"c={conc} (ii)/(i) mitigated/mtp-async"] = round(
                        tp["mitigated"] / tp["mtp-async"], 3
                    )
                save()
        if args.mode in ("all", "b2"):
            for rnd in range(args.b2_rounds):
                items = mixed_requests(args.b2_requests, args.seed * 100 + rnd)
                for name in ("mtp-async", "mitigated"):
                    if left() < 75:
                        result["skipped"].append(f"b2 round {rnd} {name}: time budget")
                        continue
                    m = measure(engines[name], items, args.b2_concurrency)
                    agg = result["b2"].setdefault(
                        name,
                        {
                            "rounds": 0,
                            "requests": 0,
                            "exact": 0,
                            "short": 0,
                            "wrong": 0,
                            "errors": 0,
                            "concurrency": args.b2_concurrency,
                            "bad_sample": [],
                        },
                    )
                    for k in ("requests", "exact", "short", "wrong", "errors"):
                        agg[k] += m[k]
                    agg["rounds"] += 1
                    agg["bad_sample"] = (agg["bad_sample"] + m["bad_sample"])[:8]
                    print(
                        f"b2 round {rnd} {name:10s} exact {m['exact']}/{m['requests']} short {m['short']} "
                        f"wrong {m['wrong']} errors {m['errors']}",
                        flush=True,
                    )
                save()
        for eng in engines.values():
            harness.stop(eng)
        # Start-up to Ready of (ii) alone: eager (caches warm now), then optionally compiled + graphs.
        variants = [("eager", True)] + ([("compiled+cudagraphs", False)] if args.compiled else [])
        for label, eager in variants:
            need = 150 if eager else 420
            if left() < need:
                result["skipped"].append(f"startup {label}: needs ~{need}s, {left():.0f}s left")
                continue
            r = harness.config_rendered(eager=eager, gpu_memory_utilization=args.gpu_memory_utilization, **CONFIGS["mitigated"])
            eng = harness.start(f"startup-{label}", r, work, site_path=site)
            try:
                harness.wait_ready(eng, timeout=max(30.0, left() - 20))
                result["startup"][f"mitigated alone, {label}"] = round(eng.ready_s, 1)
                print(f"startup mitigated {label}: {eng.ready_s:.1f}s", flush=True)
            except RuntimeError as e:
                result["skipped"].append(f"startup {label}: {str(e)[:300]}")
            finally:
                harness.stop(eng)
            save()
    finally:
        for eng in engines.values():
            harness.stop(eng)
        result["elapsed_s"] = round(time.monotonic() - t_start, 1)
        save()
        # The async + MTP engine's log (B2 evidence), and the log of any engine that died.
        for eng in engines.values():
            died = eng.proc.returncode not in (None, 0, -15)
            if eng.log.exists() and (eng.name == "mtp-async" or died):
                (args.out / f"bench-serve-{eng.name}.log").write_bytes(eng.log.read_bytes())
    print(json.dumps({k: result[k] for k in ("startup", "skipped")}, indent=1))
    ratios = result["throughput"].get("ratios", {})
    for k, v in ratios.items():
        print(f"ratio {k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
