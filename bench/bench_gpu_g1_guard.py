#!/usr/bin/env python3
"""GPU host: does the gdn-guard guard ``fa3-group-metadata`` make G1's trigger exact through a served engine (issue 33)?

G1 (docs/upstream-fa3-group-metadata.md): with FULL CUDA graphs, FlashAttention-3 and the V1 model runner, a model
whose full-attention layers (the MTP layer counts) split into two KV-cache groups of one spec gets the first
group's metadata handed to the second, whose FA3 ``scheduler_metadata`` buffer is never rewritten after capture.
The trained tiny model (tests/models/tiny-qwen3-next-recall: 2 GDN + 2 attention layers, + 1 MTP layer) splits.

Engines, all ``vllm serve`` from the offline bundle with the argv ``gdnctl render`` gives for the tiny model with
MTP k=2 and async scheduling off (tests/gpu/harness.py, bench/bench_gpu_tp.py ``base-cudagraph``), compiled, with
``--compilation-config`` set to the variant's CUDA-graph mode and ``VLLM_USE_V2_MODEL_RUNNER=0`` (hybrids default to
the V1 runner before 0.29.0 anyway: ``VllmConfig._is_default_v2_model_runner_model`` returns False for them), all
started at once on the same ``--gpus`` (``--tp`` of them each):

  base       FULL_AND_PIECEWISE, no plugin                      (G1's trigger)
  guard      FULL_AND_PIECEWISE, images/gdn-guard on PYTHONPATH  (the plugin's entry point in every process)
  piecewise  PIECEWISE, no plugin                               (today's mitigation; tokens/s reference)

Phases, each inside the deadline (``--until``, epoch seconds; every request's wait capped by ``--request-cap`` and the
deadline; engines stopped ``TEARDOWN_S`` before it): Ready times; one warm-up batch; then ``--repeats`` rounds of the
held-out recall set (greedy, answers checked token by token) at each ``--concurrency``, engines measured one at a
time in turn (so tokens/s are comparable). Per pass: exact / short / wrong / errors, tokens/s, requests that hit the
cap while ``/health`` stayed 200 (a stall). Per engine, from its log: the gdn-guard start-up lines (processes that
applied ``gdn-guard/fa3-group-metadata``), the guard's own decision lines, vLLM's "Add N padding layers" (the
attention layers split into groups), the CUDA-graph mode vLLM resolved. ``g1-guard.json`` in ``--out`` is rewritten
after every phase; engine logs go to ``--out``/logs.

``--dry-run``: no GPU, no vLLM -- stand-in engines (tests/gpu/standin_engine.py) check phases, deadlines and files;
their figures mean nothing.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.26.0:operator python3 bench/bench_gpu_g1_guard.py --out $OUT/g1
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _d in (REPO / "bench", REPO / "tests" / "gpu", REPO / "operator", REPO / "images" / "gdn-guard" / "src"):
    sys.path.insert(0, str(_d))

import bench_gpu_mtp_graphs as graphs  # noqa: E402
import bench_gpu_tp as tp  # noqa: E402
import harness  # noqa: E402
from gdn_guard import parse_log_line  # noqa: E402
from gdn_guard.guards import fa3_group_metadata  # noqa: E402

TEARDOWN_S = 20.0
#: name -> (cudagraph_mode, with the gdn-guard plugin)
VARIANTS: dict[str, tuple[str, bool]] = {
    "base": ("FULL_AND_PIECEWISE", False),
    "guard": ("FULL_AND_PIECEWISE", True),
    "piecewise": ("PIECEWISE", False),
}
PADDING_RE = re.compile(r"Add (\d+) padding layers")
MODE_RE = re.compile(r"cudagraph_mode['\"]?: *<?(?:CUDAGraphMode\.)?([A-Z_]+)")
VERSION_RE = re.compile(r"vLLM API server version (\S+)|Initializing a V1 LLM engine \(v(\S+?)\)")
GUARD_DECISION = f"gdn-guard {fa3_group_metadata.NAME} (G1)"


def argv_for(variant: str, tp_size: int, kv_cache_memory: str) -> tuple[harness.Rendered, dict]:
    """The rendered MTP k=2 launch line (async off, compiled) with the variant's CUDA-graph mode."""
    r, env = tp.render("base-cudagraph", tp_size, kv_cache_memory=kv_cache_memory)
    mode, _ = VARIANTS[variant]
    argv = tp._without(r.argv, "--compilation-config") + [
        "--compilation-config",
        json.dumps({"cudagraph_mode": mode}, separators=(",", ":")),
    ]
    if "--speculative-config" not in argv or "--no-async-scheduling" not in argv or "--enforce-eager" in argv:
        raise RuntimeError(f"{variant}: not MTP, async off, compiled: {argv}")
    return harness.Rendered(argv, r.env, r.notes + [f"# cudagraph_mode {mode} set for this benchmark"]), env


def log_facts(text: str) -> dict:
    """What an engine log says about the guard, the KV-cache groups and the CUDA-graph mode."""
    startup = [p for p in (parse_log_line(line) for line in text.splitlines() if "gdn-guard" in line) if p]
    mode = MODE_RE.search(text)
    ver = VERSION_RE.search(text)
    return {
        "vllm_version": next((g for g in ver.groups() if g), None) if ver else None,
        "guard_startup_lines": len(startup),
        "processes_with_guard": sum(fa3_group_metadata.PATCH_ID in p["patch_ids"] for p in startup),
        "guard_decision_lines": text.count(GUARD_DECISION),
        "padding_layers": [int(n) for n in PADDING_RE.findall(text)],
        "cudagraph_mode": mode.group(1) if mode else None,
        "v2_runner_mentioned": "V2 model runner" in text or "Model Runner V2" in text,
        "tracebacks": text.count("Traceback (most recent call last)"),
    }


def health(eng: harness.Engine) -> int:
    return harness._get(eng.url + "/health", timeout=5.0)[0]


def measure(eng: harness.Engine, items: list[dict], conc: int, until: float, cap: float, eos: set[int]) -> dict:
    """One pass: ``items`` with ``conc`` in flight; each request waits at most ``cap`` s and none is sent after
    ``until`` (a stalled engine cannot hold the pass past the deadline). Greedy answers judged token by token."""

    def one(it: dict) -> dict:
        wait = min(cap, until - time.time())
        if wait < 1.0:
            return {"error": "not sent: deadline", "unsent": True, "completion_tokens": 0}
        try:
            return harness.complete(eng, it["prompt_token_ids"], it["max_tokens"], timeout=wait)
        except (OSError, ValueError, KeyError) as e:  # URLError/HTTPError/ConnectionError/timeouts are OSErrors
            return {"error": f"{type(e).__name__}: {e}"[:200], "completion_tokens": 0}

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        got = list(ex.map(one, items))
    wall = time.monotonic() - t0
    sent = [(i, g) for i, g in zip(items, got, strict=True) if not g.get("unsent")]
    verdicts = [harness.judge(i, g, eos) for i, g in sent]
    toks = sum(g["completion_tokens"] or 0 for _, g in sent)
    return {
        "concurrency": conc,
        "requests": len(sent),
        "unsent": len(items) - len(sent),
        "wall_s": round(wall, 3),
        "tokens": toks,
        "tokens_per_s": round(toks / wall, 1) if wall and not any(v == "error" for v in verdicts) else None,
        "exact": verdicts.count("exact"),
        "short": verdicts.count("short"),
        "wrong": verdicts.count("wrong"),
        "errors": verdicts.count("error"),
        "engine_alive": eng.proc.poll() is None,
        "bad_sample": [
            {"id": i["id"], "verdict": v, "got_token_ids": (g.get("token_ids") or [])[:80], "error": g.get("error")}
            for (i, g), v in zip(sent, verdicts, strict=True)
            if v != "exact"
        ][:4],
    }


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear driver of deadline-bound phases
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default: now + 230)")
    ap.add_argument("--variants", default="base,guard", help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument(
        "--gpus", default=None, help="CUDA_VISIBLE_DEVICES of every engine (default: this process's own, else 0..tp-1)"
    )
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--repeats", type=int, default=2, help="rounds of the held-out set per concurrency")
    ap.add_argument("--request-cap", type=float, default=30.0, help="longest wait for one request (s)")
    ap.add_argument("--phase-min", type=float, default=8.0, help="a pass starts only with this many s left")
    ap.add_argument("--kv-cache-memory", default="2G")
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines instead of vLLM (no GPU)")
    ap.add_argument("--standin-ready", type=float, default=2.0)
    args = ap.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        ap.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    until = args.until or time.time() + 230.0
    stop_at = until - TEARDOWN_S
    # default: the GPUs this process was given (a lease step on GPU 1 runs with CUDA_VISIBLE_DEVICES=1), else 0..tp-1
    given = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    gpus = args.gpus or ",".join(given[: args.tp] if len(given) >= args.tp else [str(i) for i in range(args.tp)])
    levels = [int(c) for c in args.concurrency.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    logdir = args.out / "logs"
    work = Path(tempfile.mkdtemp(prefix="g1-guard-"))  # plugin dir and compile caches: not results
    guard_dir = harness.install_guard_layout(work / "gdn-guard")
    held = harness.heldout()
    eos = harness.eos_ids()
    t0 = time.monotonic()
    result: dict = {
        "dry_run": args.dry_run,
        "tp": args.tp,
        "gpus": gpus,
        "variants": names,
        "heldout_requests": len(held),
        "concurrency": levels,
        "repeats": args.repeats,
        "request_cap_s": args.request_cap,
        "kv_cache_memory": args.kv_cache_memory,
        "engines": {},
        "passes": [],
        "skipped": [],
        "errors": [],
    }

    def save() -> None:
        result["elapsed_s"] = round(time.monotonic() - t0, 1)
        (args.out / "g1-guard.json").write_text(json.dumps(result, indent=1) + "\n")

    def left() -> float:
        return stop_at - time.time()

    engines: dict[str, harness.Engine] = {}
    try:
        for name in names:
            rendered, env = argv_for(name, args.tp, args.kv_cache_memory)
            mode, guarded = VARIANTS[name]
            extra_env = {
                **env,
                "CUDA_VISIBLE_DEVICES": gpus,
                "VLLM_USE_V2_MODEL_RUNNER": "0",
                "VLLM_CACHE_ROOT": str(work / f"cache-{name}"),
            }
            if args.dry_run:
                engines[name] = graphs.start_standin(name, rendered, logdir, gpus, args.standin_ready)
            else:
                engines[name] = harness.start(
                    name, rendered, logdir, extra_pythonpath=[str(guard_dir)] if guarded else [], extra_env=extra_env
                )
            result["engines"][name] = {
                "argv": engines[name].argv,
                "env": {**rendered.env, **extra_env, "VLLM_CACHE_ROOT": "<tmp>"},
                "cudagraph_mode_asked": mode,
                "gdn_guard_on_pythonpath": guarded,
            }
        save()
        for name, eng in engines.items():
            try:
                harness.wait_ready(eng, timeout=max(1.0, time.monotonic() - eng.started + left() - args.phase_min))
                result["engines"][name]["ready_s"] = round(eng.ready_s or 0.0, 1)
                print(f"ready: {name} in {eng.ready_s:.1f} s", flush=True)
            except RuntimeError as e:
                result["engines"][name]["ready_s"] = None
                result["errors"].append(f"{name}: {str(e)[-1500:]}")
                print(f"not ready: {name}: {str(e)[:300]}", flush=True)
            result["engines"][name]["log"] = log_facts(eng.log_text())
            save()
        live = [n for n in names if result["engines"][n].get("ready_s") is not None]
        for name in live:  # warm-up: first requests pay lazy initialisation, not measured
            if left() > args.phase_min:
                w = measure(engines[name], held[:8], 8, stop_at, args.request_cap, eos)
                result["engines"][name]["warmup"] = {k: w[k] for k in ("wall_s", "exact", "requests", "errors")}
        save()
        for rep in range(args.repeats):
            for conc in levels:
                for name in live:
                    eng = engines[name]
                    if left() < args.phase_min or eng.proc.poll() is not None:
                        result["skipped"].append(
                            f"{name} c={conc} round {rep}: {left():.0f} s left, engine alive {eng.proc.poll() is None}"
                        )
                        continue
                    m = measure(eng, held, conc, stop_at, args.request_cap, eos)
                    m.update(variant=name, round=rep, health_after=health(eng))
                    m["stalled"] = m["errors"] > 0 and m["engine_alive"] and m["health_after"] == 200
                    result["passes"].append(m)
                    print(
                        f"{name:9s} c={conc:<3d} round {rep}: exact {m['exact']}/{m['requests']} "
                        f"{m['tokens_per_s']} tok/s errors {m['errors']}",
                        flush=True,
                    )
                    save()
    except Exception as e:  # keep what was measured; the error goes into the result
        result["errors"].append(f"driver: {type(e).__name__}: {e}")
        raise
    finally:
        for name, eng in engines.items():
            result["engines"][name]["exit_code_before_stop"] = eng.proc.poll()
        for eng in engines.values():
            harness.stop(eng, grace=8.0)
        for name, eng in engines.items():
            result["engines"][name]["log"] = log_facts(eng.log_text())
        result["summary"] = summary(result)
        save()
    print(json.dumps(result["summary"], indent=1), flush=True)
    return 0


def summary(result: dict) -> dict:
    """Exact fraction and mean tokens/s per variant and concurrency (over the rounds)."""
    out: dict = {}
    for p in result["passes"]:
        s = out.setdefault(p["variant"], {}).setdefault(
            f"c={p['concurrency']}", {"exact": 0, "requests": 0, "errors": 0, "unsent": 0, "tokens_per_s": []}
        )
        s["exact"] += p["exact"]
        s["requests"] += p["requests"]
        s["errors"] += p["errors"]
        s["unsent"] += p["unsent"]
        if p["tokens_per_s"] is not None:
            s["tokens_per_s"].append(p["tokens_per_s"])
    for per in out.values():
        for s in per.values():
            s["exact_rate"] = round(s["exact"] / s["requests"], 4) if s["requests"] else None
    return out


if __name__ == "__main__":
    sys.exit(main())
