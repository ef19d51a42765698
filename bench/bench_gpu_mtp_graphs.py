#!/usr/bin/env python3
"""Benchmark (GPU host, two GPUs): MTP's worth with CUDA graphs on the production-geometry model (issue 25 item 3).

Engines from the offline bundle, argv from `gdnctl render` (tests/gpu/harness.py, bench/bench_gpu_tp.py), one
GPU per engine (``CUDA_VISIBLE_DEVICES``), TP=1, compiled (torch.compile + CUDA graphs):

  (a) mtp       MTP k=2 as the operator renders it at 0.22.0 (cudagraph_mode PIECEWISE, async scheduling off)
                — GPU ``--gpus``[0]
  (b) nomtp     MTP off with vLLM's defaults (FULL_AND_PIECEWISE graphs, async scheduling on) — GPU [1]
  (c) mtp-full  MTP k=2 with vLLM's default FULL_AND_PIECEWISE graphs (G1's trigger), async off — GPU [1];
                started with (a) and (b) (``--c-start together``, as the tiny model's capture did), after (b)
                is measured (``after``) or not at all (``never``)

Phases, each capped by the deadline (``--until``, epoch seconds; every request's wait capped by ``--request-cap``
and the deadline; the engines are stopped ``TEARDOWN_S`` before it): Ready times; a warm-up batch; fixed-length
recall requests (``--length`` symbols, greedy) at each ``--concurrency`` on (a) then (b), generated tokens/s,
exact answers and (for MTP engines) acceptance from ``/metrics`` counter deltas; the held-out set at the highest
concurrency; then (c) the same if it is Ready in time. ``mtp-graphs.json`` is rewritten after every phase, so
what ran is kept whatever happens later. Ratios a/b and c/a per concurrency.

Model: ``--model`` (default $GDN_GPU_MODEL, else ~/.cache/gdn-operator/prod-model, written by
``hack/gpu/session.sh prodmodel-train``). ``--dry-run``: no GPU, no vLLM — the engines are replaced by
tests/gpu/standin_engine.py (answers the copy task, fake counters, a start-up delay) so the phases, deadlines
and files can be checked on any machine; its figures mean nothing.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0:operator python3 bench/bench_gpu_mtp_graphs.py --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import bench_gpu_mtp as mtpbench  # noqa: E402
import bench_gpu_tp as tp  # noqa: E402
import harness  # noqa: E402

TEARDOWN_S = 25.0
DEFAULT_MODEL = Path.home() / ".cache" / "gdn-operator" / "prod-model"
SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def counters(text: str) -> dict[str, float]:
    """Sum of each spec-decode counter over its label sets (plus accepted per position)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ")[0] else line.partition(" ")
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if name in SPEC:
            out[name] = out.get(name, 0.0) + value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
            pos = rest.split('position="', 1)[1].split('"', 1)[0] if 'position="' in rest else "?"
            out[f"accepted_pos{pos}"] = out.get(f"accepted_pos{pos}", 0.0) + value
    return out


def acceptance(before: dict, after: dict) -> dict | None:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    drafts, draft_toks = d.get(SPEC[0], 0.0), d.get(SPEC[1], 0.0)
    if not draft_toks:
        return None
    acc = d.get(SPEC[2], 0.0)
    return {
        "drafts": drafts,
        "draft_tokens": draft_toks,
        "accepted": acc,
        "rate": round(acc / draft_toks, 4),
        "per_position": [round(d.get(f"accepted_pos{i}", 0.0) / drafts, 4) for i in range(2)] if drafts else None,
        "mean_accepted_length": round(1 + acc / drafts, 3) if drafts else None,
    }


def _scrape(eng: harness.Engine) -> dict:
    try:
        return counters(harness.metrics(eng))
    except (OSError, RuntimeError):
        return {}


def measure(eng: harness.Engine, items: list[dict], conc: int, deadline: float, cap: float) -> dict:
    """bench_gpu_mtp.measure's figures, every request's wait capped, plus acceptance from /metrics deltas."""
    timeout = max(1.0, min(cap, deadline - time.time()))
    before = _scrape(eng)
    got, wall = harness.run_requests(eng, items, conc, keep_errors=True, timeout=timeout)
    after = _scrape(eng)
    eos = harness.eos_ids()
    verdicts = [harness.judge(i, g, eos) for i, g in zip(items, got, strict=False)]
    toks = sum(g["completion_tokens"] or 0 for g in got)
    bad = [
        {
            "id": i["id"],
            "expected": i["expected"],
            "got": g["text"],
            "finish_reason": g["finish_reason"],
            "verdict": v,
            **({"error": g["error"][:200]} if "error" in g else {}),
        }
        for i, g, v in zip(items, got, verdicts, strict=False)
        if v != "exact"
    ]
    return {
        "concurrency": conc,
        "requests": len(items),
        "request_timeout_s": round(timeout, 1),
        "wall_s": round(wall, 3),
        "tokens": toks,
        "tokens_per_s": round(toks / wall, 1) if wall else None,
        "exact": verdicts.count("exact"),
        "short": verdicts.count("short"),
        "wrong": verdicts.count("wrong"),
        "errors": verdicts.count("error"),
        "exact_rate": round(verdicts.count("exact") / len(items), 4),
        "engine_alive": eng.proc.poll() is None,
        "acceptance": acceptance(before, after),
        "bad_sample": bad[:4],
    }


def start_standin(name: str, rendered: harness.Rendered, logdir: Path, gpu: str, ready_after: float) -> harness.Engine:
    """--dry-run: tests/gpu/standin_engine.py in place of `vllm serve` (same argv recorded in its log)."""
    port = harness.free_port()
    argv = harness.launch_argv(rendered.argv, port)
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"serve-{name}.log"
    mtp = "--speculative-config" in argv
    with open(log, "wb") as f:
        f.write(("# standin for: vllm serve " + " ".join(argv) + f"\n# CUDA_VISIBLE_DEVICES={gpu}\n").encode())
        f.flush()
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "gpu" / "standin_engine.py"),
                "--port",
                str(port),
                "--ready-after",
                str(ready_after),
                "--served-name",
                harness.SERVED_NAME,
                *(["--mtp"] if mtp else []),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return harness.Engine(name, argv, port, log, proc, time.monotonic())


def renders(kv_cache_memory: str) -> dict[str, harness.Rendered]:
    """(a) as rendered (checked: PIECEWISE, async off), (b) and (c) via bench_gpu_tp.render (checked there).

    The KV pool is fixed (``--kv-cache-memory-bytes``) and large: on a hybrid model every running request holds a
    Mamba-style state block (here 32 value heads x 128 x 128 per GDN layer), and vLLM refuses to start when
    max_num_seqs (1024 by default on an 80 GB card) exceeds the blocks the pool holds (vllm#49064) — 2G, enough
    for the tiny model, is not for these shapes."""
    a = harness.config_rendered(
        mtp=True, async_scheduling=None, eager=False, gpu_memory_utilization=0.12, kv_cache_memory=kv_cache_memory
    )
    cc = a.argv[a.argv.index("--compilation-config") + 1] if "--compilation-config" in a.argv else ""
    if '"PIECEWISE"' not in cc or "--no-async-scheduling" not in a.argv or "--enforce-eager" in a.argv:
        raise RuntimeError(f"(a) is not what the operator renders at 0.22.0 (PIECEWISE, async off, compiled): {a.argv}")
    b, _ = tp.render("nomtp-cudagraph", 1, kv_cache_memory=kv_cache_memory)
    c, _ = tp.render("base-cudagraph", 1, kv_cache_memory=kv_cache_memory)
    return {"mtp": a, "nomtp": b, "mtp-full": c}


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear driver of deadline-bound phases
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default: now + 390)")
    ap.add_argument("--out", type=Path, default=Path(".gpu-artifacts"))
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--gpus", default="0,1", help="GPU for (a), GPU for (b) and (c)")
    ap.add_argument("--c-start", choices=["together", "after", "never"], default="together")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", default="8,32,64", help="requests per concurrency level (same order)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--request-cap", type=float, default=60.0, help="longest wait for one request (s)")
    ap.add_argument("--phase-min", type=float, default=12.0, help="a phase starts only with this many s left")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--kv-cache-memory", default="24G", help="--kv-cache-memory-bytes of every engine (see renders())")
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines instead of vLLM (no GPU)")
    ap.add_argument("--standin-ready", type=float, default=3.0, help="--dry-run: stand-in start-up seconds")
    args = ap.parse_args(argv)
    until = args.until or time.time() + 390.0
    stop_at = until - TEARDOWN_S
    model = args.model or Path(os.environ.get("GDN_GPU_MODEL") or DEFAULT_MODEL)
    if not (model / "config.json").exists() or not (model / "heldout.jsonl").exists():
        ap.error(f"--model {model}: no config.json/heldout.jsonl (run hack/gpu/session.sh prodmodel-train first)")
    os.environ["GDN_GPU_MODEL"] = str(model)
    gpus = args.gpus.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    logdir = args.out / "logs"
    t0 = time.monotonic()
    cfg = json.loads((model / "config.json").read_text())
    train = json.loads((model / "training.json").read_text()) if (model / "training.json").exists() else None
    result: dict = {
        "vllm_version": harness.VLLM_VERSION,
        "dry_run": args.dry_run,
        "c_start": args.c_start,
        "model": {
            "dir_name": model.name,
            "training": train,
            "geometry": {
                k: cfg.get(k)
                for k in (
                    "hidden_size",
                    "vocab_size",
                    "num_experts",
                    "num_experts_per_tok",
                    "linear_num_key_heads",
                    "linear_num_value_heads",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "layer_types",
                )
            },
        },
        "length": args.length,
        "kv_cache_memory": args.kv_cache_memory,
        "request_cap_s": args.request_cap,
        "engines": {},
        "throughput": {},
        "heldout": {},
        "ratios": {},
        "skipped": [],
        "errors": [],
    }

    def save() -> None:
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        (args.out / "mtp-graphs.json").write_text(json.dumps(result, indent=1) + "\n")

    def left() -> float:
        return stop_at - time.time()

    rendered = renders(args.kv_cache_memory)
    gpu_of = {"mtp": gpus[0], "nomtp": gpus[-1], "mtp-full": gpus[-1]}
    engines: dict[str, harness.Engine] = {}

    def launch(name: str, together: bool) -> None:
        r = rendered[name]
        env = {"CUDA_VISIBLE_DEVICES": gpu_of[name]}
        if args.dry_run:
            engines[name] = start_standin(name, r, logdir, gpu_of[name], args.standin_ready)
        else:
            engines[name] = harness.start(name, r, logdir, extra_env=env)
        result["engines"][name] = {
            "argv": engines[name].argv,
            "env": {**r.env, **env},
            "gpu": gpu_of[name],
            "started_with_others": together,
            "started_at_s": round(time.monotonic() - t0, 1),
            "changed_after_render": [x for x in r.notes if x.startswith(("# flipped", "# removed"))],
            "operator_findings": [x for x in r.notes if x.startswith("# ") and "advisory" not in x],
        }

    def wait(name: str) -> bool:
        eng = engines[name]
        try:
            # wait_ready's timeout counts from the engine's start
            harness.wait_ready(eng, timeout=max(1.0, time.monotonic() - eng.started + left() - args.phase_min))
        except RuntimeError as e:
            result["engines"][name]["ready_s"] = None
            result["errors"].append(f"{name}: {str(e)[-1500:]}")
            print(f"not ready: {name}: {str(e)[:300]}", flush=True)
            save()
            return False
        result["engines"][name]["ready_s"] = round(eng.ready_s, 1)
        print(f"ready: {name} in {eng.ready_s:.1f} s", flush=True)
        save()
        return True

    levels = list(zip((int(c) for c in args.concurrency.split(",")), (int(n) for n in args.requests.split(",")), strict=False))
    held = harness.heldout()

    def phase(name: str, what: str) -> bool:
        eng = engines[name]
        if left() < args.phase_min or eng.proc.poll() is not None:
            result["skipped"].append(f"{name} {what}: {left():.0f} s left, engine alive {eng.proc.poll() is None}")
            save()
            return False
        return True

    def warmup(name: str) -> None:
        if phase(name, "warm-up"):
            w = measure(engines[name], mtpbench.fixed_requests(8, args.length, args.seed - 1), 8, stop_at, args.request_cap)
            result["engines"][name]["warmup"] = {k: w[k] for k in ("wall_s", "exact", "requests", "errors")}

    def level(name: str, conc: int, n: int) -> None:
        if phase(name, f"c={conc}"):
            m = measure(engines[name], mtpbench.fixed_requests(n, args.length, args.seed + conc), conc, stop_at, args.request_cap)
            result["throughput"].setdefault(name, {})[str(conc)] = m
            acc = m["acceptance"]["rate"] if m["acceptance"] else None
            print(
                f"{name:9s} c={conc:<3d} {m['tokens_per_s']} tok/s exact {m['exact']}/{m['requests']} acceptance {acc}",
                flush=True,
            )
            ratios()
            save()

    def heldout_pass(name: str) -> None:
        if phase(name, "held-out"):
            m = measure(engines[name], held, max(c for c, _ in levels), stop_at, args.request_cap)
            result["heldout"][name] = m
            print(
                f"{name:9s} held-out {m['exact']}/{m['requests']} exact, acceptance "
                f"{m['acceptance']['rate'] if m['acceptance'] else None}",
                flush=True,
            )
            save()

    def ratios() -> None:
        th = result["throughput"]
        for conc, _ in levels:
            g = {n: th.get(n, {}).get(str(conc), {}).get("tokens_per_s") for n in ("mtp", "nomtp", "mtp-full")}
            if g["mtp"] and g["nomtp"]:
                result["ratios"][f"c={conc} a/b mtp/nomtp"] = round(g["mtp"] / g["nomtp"], 3)
            if g["mtp-full"] and g["mtp"]:
                result["ratios"][f"c={conc} c/a mtp-full/mtp"] = round(g["mtp-full"] / g["mtp"], 3)

    try:
        launch("mtp", True)
        launch("nomtp", True)
        if args.c_start == "together":
            launch("mtp-full", True)
        save()
        ok: dict[str, bool] = {}
        bg = concurrent.futures.ThreadPoolExecutor(1)  # (c)'s readiness, timed while (a) and (b) are measured
        c_wait = bg.submit(wait, "mtp-full") if "mtp-full" in engines else None
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            ok.update(zip(("mtp", "nomtp"), ex.map(wait, ("mtp", "nomtp")), strict=False))
        # (a) and (b) one at a time, interleaved per phase (the ratios first, the held-out set after)
        ab = [n for n in ("mtp", "nomtp") if ok[n]]
        for n in ab:
            if n == "nomtp":  # (c) shares (b)'s GPU: was it still compiling / capturing graphs while (b) was measured?
                result["engines"]["nomtp"]["mtp_full_ready_before_measured"] = (
                    None if c_wait is None else bool(c_wait.done() and c_wait.result())
                )
            warmup(n)
        for conc, k in levels:
            for n in ab:
                level(n, conc, k)
        for n in ab:
            heldout_pass(n)
        if c_wait is not None:
            ok["mtp-full"] = c_wait.result()
        bg.shutdown()
        if args.c_start == "after":
            if "nomtp" in engines:
                harness.stop(engines["nomtp"], grace=10.0)
            if left() > 2 * args.phase_min:
                launch("mtp-full", False)
                ok["mtp-full"] = wait("mtp-full")
            else:
                result["skipped"].append(f"mtp-full: not started ({left():.0f} s left)")
        if ok.get("mtp-full"):
            warmup("mtp-full")
            for conc, k in levels:
                level("mtp-full", conc, k)
            heldout_pass("mtp-full")
        elif args.c_start == "never":
            result["skipped"].append("mtp-full: --c-start never")
    except Exception as e:  # keep what was measured; the error goes into the result
        result["errors"].append(f"driver: {type(e).__name__}: {e}")
        raise
    finally:
        for eng in engines.values():
            result["engines"][eng.name]["exit_code_before_stop"] = eng.proc.poll()
        with concurrent.futures.ThreadPoolExecutor(3) as ex:
            list(ex.map(lambda e: harness.stop(e, grace=8.0), engines.values()))
        save()
    print(
        json.dumps(
            {
                "ready_s": {n: e.get("ready_s") for n, e in result["engines"].items()},
                "ratios": result["ratios"],
                "skipped": result["skipped"],
            },
            indent=1,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
