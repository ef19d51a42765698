#!/usr/bin/env python3
"""GPU host: does MTP under tensor parallelism crash (vllm#41190, B4) — and which one setting avoids it?

vllm#41190: Qwen3.6 hybrid GDN + `qwen3_next_mtp` at `--tensor-parallel-size 2` dies with
`CUDA error: an illegal memory access was encountered` at `num_accepted_tokens_event.synchronize()`.
The crash watch's remediation ladder under TP >= 2 (watch/data/signatures.yaml) tries, in order,
NCCL_P2P_DISABLE off, async scheduling off, and only then speculative decoding off. This benchmark
serves the trained tiny model (tests/models/tiny-qwen3-next-recall: 4 attention / 2 KV / 2+4 GDN heads
and 4 experts, so it splits over TP=2) with MTP k=2 at ``--tp`` GPUs in the configurations below, all
rendered by `gdnctl render` (tests/gpu/harness.py) and differing from ``base`` in one setting each, and
drives each with concurrent load for ``--duration`` seconds:

  requests of mixed kinds kept ``--concurrency`` in flight: held-out recall prompts (answers checked),
  long random prompts near max-model-len (2048) with max_tokens up to the context end, and short ones
  with 1..64 tokens, so requests finish at different times — the pattern of the reports.

Per configuration it records: crashed or not, seconds from first request to the crash, requests sent /
completed / failed, exact recall answers (a garbling check), generated tokens/s, the crash watch's
classification of the engine log (signature, upstream issue, remediation), and keeps the log of every
crashed engine (the crash watch's fixture when it reproduces). Engines run ``--parallel`` at a time (each
uses all ``--tp`` GPUs with a small fixed KV cache). Writes ``bench-gpu-tp.json`` (+ ``tp-<config>.log``
of crashed engines, at most 6) to ``--out``; stops starting work at ``--time-budget`` seconds.

Not varied, and why: ``--gdn-prefill-backend`` (the offline bundle carries the Triton kernels only, no
FlashInfer: hack/gpu/bundle.yaml), the FLASHINFER attention backend (same reason). ``--compiled`` adds
the CUDA-graph configuration (a cold torch.compile costs minutes of GPU time per engine).

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0:operator python3 bench/bench_gpu_tp.py --tp 2 --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import random
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import harness  # noqa: E402

MAX_MODEL_LEN = 2048
#: name -> (mtp, async scheduling, manifest overrides, extra env); each differs from `base` in one setting
CONFIGS: dict[str, tuple[bool, bool | None, dict, dict]] = {
    "base": (True, False, {}, {}),  # what the operator renders at 0.22.0 (async off: vllm#45100 mitigation)
    "async-on": (True, True, {}, {}),  # vLLM's default, the reported configuration
    "async-on-p2p-off": (True, True, {}, {"NCCL_P2P_DISABLE": "1"}),  # #41190's reporter ran with this
    "async-on-triton-attn": (True, True, {"attentionBackend": "TRITON_ATTN"}, {}),
    "nomtp-async-on": (False, True, {}, {}),  # the upstream workaround, as the control
}
COMPILED = {
    "async-on-cudagraph": (True, True, {"eager": False}, {}),
    "base-cudagraph": (True, False, {"eager": False}, {}),  # is it MTP + CUDA graphs, with async off too?
    "nomtp-cudagraph": (False, True, {"eager": False}, {}),  # control: CUDA graphs without MTP
    # which CUDA-graph mode keeps MTP correct (async off, as the operator renders at 0.22.0)?
    "base-cg-piecewise": (True, False, {"eager": False, "cudagraphMode": "PIECEWISE"}, {}),
    "base-cg-full-decode-only": (True, False, {"eager": False, "cudagraphMode": "FULL_DECODE_ONLY"}, {}),
    # vLLM 0.34.0 runs Qwen3.5 on breakable CUDA graphs by default on NVIDIA (config/vllm.py
    # default_breakable_cudagraph_architectures; the tiny model is Qwen3-Next, so it is forced on here): is G1 there
    # too, with vLLM's default mode and with the PIECEWISE the operator renders?
    "base-breakable": (True, False, {"eager": False}, {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}),
    "base-breakable-piecewise": (
        True,
        False,
        {"eager": False, "cudagraphMode": "PIECEWISE"},
        {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"},
    ),
}


def _without(argv: list[str], flag: str) -> list[str]:
    """argv with every `flag VALUE` pair removed."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        else:
            out.append(a)
    return out


def render(
    name: str, tp: int, *, gpu_memory_utilization: float = 0.12, kv_cache_memory: str = "2G"
) -> tuple[harness.Rendered, dict]:
    """`gdnctl render` of the configuration (policy mitigate). `base` is what the operator renders; every other
    configuration exists to reproduce a bug the rules refuse (vllm#45100, G1), so after rendering the refused
    setting is put back the way tests/gpu/harness.flip does it (the operator never renders them at 0.22.0),
    each change noted in the result, and the argv is checked to carry exactly what was asked."""
    mtp, async_on, over, env = {**CONFIGS, **COMPILED}[name]
    eager = over.get("eager", True)
    m = harness.adapted_manifest(
        mtp=mtp,
        async_scheduling=async_on,
        tensor_parallel_size=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_memory=kv_cache_memory,
        eager=eager,
    )
    if "attentionBackend" in over:
        m["spec"]["attentionBackend"] = over["attentionBackend"]
    r = harness.render(m)
    if async_on and "--no-async-scheduling" in r.argv:  # refused by vllm#45100 at 0.22.0
        r = harness.flip(r, "--no-async-scheduling", "--async-scheduling")
    argv, notes = list(r.argv), list(r.notes)
    if not eager and "--compilation-config" in argv and "cudagraphMode" not in over:
        argv = _without(argv, "--compilation-config")
        notes.append("# removed the rendered --compilation-config: vLLM's default CUDA-graph mode (refused by G1)")
    if "cudagraphMode" in over:
        argv = _without(argv, "--compilation-config") + [
            "--compilation-config",
            json.dumps({"cudagraph_mode": over["cudagraphMode"]}, separators=(",", ":")),
        ]
    want = ["--async-scheduling" if async_on else "--no-async-scheduling"] + (["--enforce-eager"] if eager else [])
    want += [over["attentionBackend"]] if "attentionBackend" in over else []
    missing = [w for w in want if w not in argv]
    if missing or (eager and "--compilation-config" in argv):
        raise RuntimeError(f"{name}: the argv does not carry what was asked ({missing}): {argv}")
    return harness.Rendered(argv, r.env, notes), env


def requests(seed: int):
    """An endless mix: recall prompts (checked), long random prompts near the context end, short ones."""
    held = harness.heldout()
    vocab = sorted({t for it in held for t in it["prompt_token_ids"]})
    rng = random.Random(seed)
    i = 0
    while True:
        i += 1
        kind = rng.random()
        if kind < 0.5:
            it = dict(rng.choice(held), id=f"recall-{i}")
            yield it
        elif kind < 0.8:
            n = rng.randint(1000, MAX_MODEL_LEN - 200)
            yield {
                "id": f"long-{i}",
                "prompt_token_ids": [rng.choice(vocab) for _ in range(n)],
                "max_tokens": rng.randint(16, MAX_MODEL_LEN - n - 1),
                "ignore_eos": True,
            }
        else:
            yield {
                "id": f"short-{i}",
                "prompt_token_ids": [rng.choice(vocab) for _ in range(rng.randint(4, 64))],
                "max_tokens": rng.randint(1, 64),
                "ignore_eos": True,
            }


def drive(eng: harness.Engine, duration: float, concurrency: int, seed: int) -> dict:
    """Keep `concurrency` requests in flight for `duration` s or until the engine dies."""
    eos = harness.eos_ids()
    gen = requests(seed)
    lock = threading.Lock()
    stats = {
        "sent": 0,
        "completed": 0,
        "failed": 0,
        "tokens": 0,
        "recall": 0,
        "recall_exact": 0,
        "failures": [],
        "bad_recall_sample": [],
    }
    t0 = time.monotonic()
    crash_at: list[float] = []

    def alive() -> bool:
        if eng.proc.poll() is not None:
            if not crash_at:
                crash_at.append(time.monotonic() - t0)
            return False
        return True

    def worker() -> None:
        while time.monotonic() - t0 < duration and alive():
            with lock:
                it = next(gen)
                stats["sent"] += 1
            try:
                got = harness.complete(
                    eng, it["prompt_token_ids"], it["max_tokens"], ignore_eos=it.get("ignore_eos", False), timeout=300
                )
            except (OSError, ValueError, KeyError) as e:
                with lock:
                    stats["failed"] += 1
                    if len(stats["failures"]) < 5:
                        stats["failures"].append(f"{it['id']}: {type(e).__name__}: {str(e)[:200]}")
                alive()
                continue
            with lock:
                stats["completed"] += 1
                stats["tokens"] += got.get("completion_tokens") or 0
                if it["id"].startswith("recall"):
                    stats["recall"] += 1
                    verdict = harness.judge(it, got, eos)
                    stats["recall_exact"] += verdict == "exact"
                    if verdict != "exact" and len(stats["bad_recall_sample"]) < 4:
                        stats["bad_recall_sample"].append(
                            {"verdict": verdict, "expected": it["expected"], "got": got["text"], "finish": got["finish_reason"]}
                        )

    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.monotonic() - t0
    alive()
    stats.update(
        wall_s=round(wall, 1),
        tokens_per_s=round(stats["tokens"] / wall, 1),
        crashed=bool(crash_at),
        seconds_to_crash=round(crash_at[0], 1) if crash_at else None,
        exact_recall_rate=round(stats["recall_exact"] / stats["recall"], 4) if stats["recall"] else None,
    )
    return stats


def classify(log_text: str) -> dict:
    from gdn_operator.watch.signatures import classify_text  # needs PyYAML (the host has it)

    r = classify_text(log_text)
    return {
        "crashed": r.crashed,
        "signature": r.signature,
        "upstream": r.upstream,
        "root_cause": r.root_cause,
        "remediation": getattr(r.remediation, "action", None) if r.remediation else None,
    }


def run_one(name: str, args: argparse.Namespace, logdir: Path, seed: int) -> dict:
    rendered, env = render(name, args.tp)
    eng = harness.start(name, rendered, logdir, extra_env=env)
    out: dict = {
        "config": name,
        "argv": eng.argv,
        "env": {**rendered.env, **env},
        "changed_after_render": [n for n in rendered.notes if n.startswith(("# flipped", "# removed"))],
    }
    try:
        try:
            out["ready_s"] = round(harness.wait_ready(eng), 1)
        except RuntimeError as e:
            out.update(started=False, error=str(e)[-2000:], classification=classify(eng.log_text()))
            return out
        out["started"] = True
        out["load"] = drive(eng, args.duration, args.concurrency, seed)
        text = eng.log_text()
        if out["load"]["crashed"] or "illegal memory access" in text:
            out["classification"] = classify(text)
            out["log_tail"] = text.splitlines()[-60:]
        return out
    finally:
        harness.stop(eng)
        out["log"] = str(eng.log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join({**CONFIGS, **COMPILED})}")
    ap.add_argument("--compiled", action="store_true", help="add the CUDA-graph configuration")
    ap.add_argument("--duration", type=float, default=150.0, help="seconds of load per engine")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--parallel", type=int, default=3, help="engines at once")
    ap.add_argument("--time-budget", type=float, default=540.0)
    ap.add_argument(
        "--start-allowance", type=float, default=240.0, help="seconds an engine start may take (a config starts only if it fits)"
    )
    ap.add_argument("--out", default=".gpu-artifacts")
    args = ap.parse_args(argv)
    names = [n for n in args.configs.split(",") if n] + (list(COMPILED) if args.compiled else [])
    unknown = [n for n in names if n not in {**CONFIGS, **COMPILED}]
    if unknown:
        ap.error(f"--configs: unknown {unknown}; choose from {', '.join({**CONFIGS, **COMPILED})}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logdir = out_dir / "tp-logs"
    t0 = time.monotonic()
    results: list[dict] = []
    skipped: list[str] = []
    pending = list(names)
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as ex:
        running: dict = {}
        while pending or running:
            while pending and len(running) < args.parallel:
                # an engine start (<= ~4 min cold) + the load must fit in what is left
                if time.monotonic() - t0 + args.duration + args.start_allowance > args.time_budget:
                    skipped += pending
                    pending = []
                    break
                name = pending.pop(0)
                running[ex.submit(run_one, name, args, logdir, len(results) + len(running) + 1)] = name
            if not running:
                break
            done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
            for f in done:
                name = running.pop(f)
                try:
                    results.append(f.result())
                except Exception as e:  # noqa: BLE001 - one configuration's harness failure is a result too
                    results.append({"config": name, "started": False, "error": f"{type(e).__name__}: {e}"})
    import subprocess

    gpus = (
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()
    )
    summary = {
        "tp": args.tp,
        "vllm_version": harness.VLLM_VERSION,
        "gpus": gpus,
        "duration_s": args.duration,
        "concurrency": args.concurrency,
        "results": sorted(results, key=lambda r: r["config"]),
        "skipped": skipped,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    (out_dir / "bench-gpu-tp.json").write_text(json.dumps(summary, indent=1))
    kept = 0
    for r in results:
        crashed = r.get("load", {}).get("crashed") or not r.get("started", True)
        if crashed and kept < 6 and r.get("log") and Path(r["log"]).exists():
            (out_dir / f"tp-{r['config']}.log").write_text(Path(r["log"]).read_text(errors="replace"))
            kept += 1
    print(
        f"{'config':24} {'ready s':>8} {'crashed':>8} {'t_crash s':>9} {'sent':>6} {'done':>6} {'fail':>5} "
        f"{'tok/s':>8} {'recall':>7}  classification"
    )
    for r in summary["results"]:
        ld = r.get("load", {})
        cls = r.get("classification") or {}
        print(
            f"{r['config']:24} {r.get('ready_s', '-')!s:>8} {('START' if not r.get('started') else ld.get('crashed'))!s:>8} "
            f"{ld.get('seconds_to_crash') or '-'!s:>9} {ld.get('sent', '-')!s:>6} {ld.get('completed', '-')!s:>6} "
            f"{ld.get('failed', '-')!s:>5} {ld.get('tokens_per_s', '-')!s:>8} {ld.get('exact_recall_rate', '-')!s:>7}  "
            f"{cls.get('signature') or ''} {cls.get('upstream') or ''}"
        )
    if skipped:
        print(f"skipped (time budget): {', '.join(skipped)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
