#!/usr/bin/env python3
"""Benchmark (GPU host, two GPUs): MTP's worth and what our safe defaults cost at one vLLM release (issues 32, 34).

Engines from the offline bundle, argv from `gdnctl render` of the minimal manifest (tests/gpu/harness.py) at
``--vllm-version``, TP=1, compiled (torch.compile + vLLM's CUDA graphs), the production-geometry model:

  a     MTP k=2 exactly as the operator renders it (the rules' defaults: prefix caching off, async scheduling off)
  b     MTP off, vLLM's defaults (prefix caching and async scheduling on)
  c     MTP k=2 with vLLM's defaults: (a) with the flags our defaults added removed
  e     MTP k=2, prefix caching on, async off: (a) with only the prefix-caching default removed (vllm#43559 alone)
  f     MTP off, prefix caching off: (b) with --no-enable-prefix-caching (prefix caching's cost without MTP)
  g     MTP k=2, prefix caching off, async on: (a) with only the async-scheduling default removed
  h     MTP k=2, prefix caching as rendered, async scheduling off by flag (from 0.34.0 the operator renders no async flag:
        h is (a) with async off, vllm#51508's old mitigation)
  p     MTP k=2, prefix caching on by flag (--enable-prefix-caching), async as rendered (vllm#43559 alone)
  q     MTP off, prefix caching on by flag (p's control)
  r     MTP k=2, prefix caching on by flag, async scheduling as vLLM decides (on): vLLM's defaults from 0.28.0 with the
        V1 runner (vllm#43559 with vllm#51571 / vllm#51508 reachable)
  p3    p with k=3
  a2    a again on the other GPU queue: the A/A pair whose ratio is the run's noise floor
  k1    (a) with k=1;  k3  (a) with k=3

Workloads, every one a cell of ``--reps`` repetitions; a repetition sends requests with the cell's concurrency in
flight until ``--min-seconds`` have passed or the cell's request count (``MIN_REQUESTS``: 200 at concurrency 1, more
where requests run many at a time) has been sent, whichever first, then it drains, so no phase is the 1-3 s kind that
misled before (issue 32's Method). Every request streams: TTFT and inter-chunk
gaps (ITL) are read at the client, completion tokens from the usage block, answers compared whole:

  c1, c8, c32  fixed-length recall (``--length`` symbols), answers checked against the task's
  long         c8: held-out recall prompts (checked) mixed 1:1 with random prompts of 1,000-1,800 tokens
               (64 tokens generated, EOS ignored): the long-prompt mix
  prefix       c8: vllm#43559's design — ``--prefixes`` random prefixes of ``--prefix-tokens`` tokens (longer than
               the block vLLM aligns hybrid prefix caching to) each followed by a fresh 24-symbol recall string; each
               prefix is sent alone first (the cache is filled), then the continuations. Answers are compared with the
               same request's answer on the reference engine without prefix caching (``REFERENCE``): the model's
               own answers with caching off, the same on every repetition (a repetition re-sends the same list, so
               an engine's agreement with itself is the noise floor). Hit rate from vLLM's prefix-cache counters.

Spec-decode acceptance and prefix-cache hits are counter deltas of each engine's /metrics over the cell. Engines
share GPUs (``--kv-cache-memory`` fixes each KV pool); each GPU measures one engine at a time (two queues, one per
GPU, in parallel), so a measured engine only shares its GPU with idle ones. Ratios a/b, c/a, e/a, b/f per cell are
medians with min-max; ``claimed`` only where the two spreads do not overlap, and ``beyond_noise`` where it is
also farther from 1 than the run's A/A pair (a2/a: a's twin on the other GPU) came. ``release.json`` is rewritten after
every repetition (what ran is kept whatever happens later); every request's wait is capped by ``--request-cap``
and the deadline (``--until``, epoch seconds); the engines are stopped ``TEARDOWN_S`` before it.

``--dry-run``: no GPU, no vLLM — stand-in engines (tests/gpu/standin_engine.py) prove the phases, deadlines and
files on any machine; its figures mean nothing.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.26.0:operator GDN_GPU_VLLM_VERSION=0.26.0 \\
        python3 bench/bench_gpu_release.py --model ~/.cache/gdn-operator/prod-model --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import re
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "operator"))

import bench_gpu_mtp as mtpbench  # noqa: E402
import harness  # noqa: E402
from _stats import pct  # noqa: E402
from bench_gpu_mtp_graphs import acceptance, counters, start_standin  # noqa: E402

TEARDOWN_S = 25.0
REFERENCE = {
    "a": "a", "a2": "a", "c": "a", "e": "a", "g": "a", "h": "a", "k1": "a", "k3": "a", "p": "a", "r": "a", "p3": "a",
    "b": "f", "f": "f", "q": "f",
}  # fmt: skip
#: name -> (speculative tokens or 0, prefix caching, async scheduling, GPU queue); a setting is "rendered" (as
#: `gdnctl render` gave it at the release), "default" (the operator's flag removed: vLLM decides), "on" or "off" (the
#: operator's flag replaced by vLLM's explicit one). Settings, not flag edits: what the operator renders differs by
#: release (0.26.0 renders no prefix-caching flag, 0.33.0 renders --no-enable-prefix-caching).
ENGINES: dict[str, tuple[int, str, str, int]] = {
    "a": (2, "rendered", "rendered", 0),
    "b": (0, "default", "default", 1),
    "c": (2, "default", "default", 0),
    "e": (2, "default", "rendered", 1),
    "f": (0, "off", "default", 1),
    "g": (2, "rendered", "default", 0),
    "h": (2, "rendered", "off", 1),
    "p": (2, "on", "rendered", 1),
    "q": (0, "on", "default", 1),
    "r": (2, "on", "default", 0),
    "p3": (3, "on", "rendered", 0),
    "a2": (2, "rendered", "rendered", 1),
    "k1": (1, "rendered", "rendered", 0),
    "k3": (3, "rendered", "rendered", 1),
}
_FLAGS = {
    "prefix": ("--enable-prefix-caching", "--no-enable-prefix-caching"),
    "async": ("--async-scheduling", "--no-async-scheduling"),
}
#: per GPU queue (engines spread over two GPUs, each KV pool fixed): (engine, workload) in order; a and b are measured
#: at the same time (one per GPU), then c beside e and f; the prefix-caching engines (p, q, r, p3) last
QUEUES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("a", "c1"), ("a", "c8"), ("a", "c32"), ("a", "long"), ("a", "prefix"), ("c", "c1"), ("c", "c8"), ("c", "c32"))
    + (("c", "long"), ("c", "prefix"), ("g", "c8"), ("g", "c32"), ("k1", "c8"), ("r", "prefix"), ("r", "c8"))
    + (("p3", "prefix"),),
    (("b", "c1"), ("b", "c8"), ("b", "c32"), ("b", "long"), ("b", "prefix"), ("e", "prefix"), ("e", "c8"))
    + (("f", "prefix"), ("f", "c8"), ("k3", "c8"), ("p", "prefix"), ("p", "c8"), ("q", "prefix"))
    + (("h", "c8"), ("a2", "c8"), ("a2", "prefix")),
)
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32, "long": 8, "prefix": 8}
#: requests after which a repetition stops sending even before --min-seconds (the lists hold this many)
MIN_REQUESTS = {"c1": 200, "c8": 400, "c32": 1200, "long": 200, "prefix": 400}
RATIOS = (
    ("a", "b"), ("c", "a"), ("e", "a"), ("g", "a"), ("p", "a"), ("r", "a"), ("p3", "a"), ("q", "f"), ("b", "f"),
    ("k1", "a"), ("k3", "a"), ("g", "e"), ("r", "p"), ("h", "a"),
)  # fmt: skip
_LOG_FACTS = re.compile(r"mamba_cache_mode|block_size|prefix caching|[Pp]refix[ _]cach|cudagraph_mode|async sched|V2 model")


def rendered_engines(version: str, kv_cache_memory: str, eager: bool = False) -> dict[str, harness.Rendered]:
    """Each engine's argv from `gdnctl render` of the minimal manifest (prefixCaching and asyncScheduling unset:
    the rules decide), then exactly the settings ENGINES names, each change noted."""
    out: dict[str, harness.Rendered] = {}
    for name, (k, prefix, asynch, _) in ENGINES.items():
        m = harness.adapted_manifest(mtp=k > 0, eager=eager, gpu_memory_utilization=0.1, kv_cache_memory=kv_cache_memory)
        s = m["spec"]
        s.pop("prefixCaching", None)  # the example sets it; the minimal manifest leaves it to the rules
        s["image"]["vllmVersion"] = version
        if k:
            s["speculativeDecoding"]["numSpeculativeTokens"] = k
        r = harness.render(m)
        argv, notes = list(r.argv), list(r.notes)
        for setting, want in (("prefix", prefix), ("async", asynch)):
            if want == "rendered":
                continue
            for flag in _FLAGS[setting]:
                if flag in argv:
                    argv.remove(flag)
                    notes.append(f"# removed {flag} after rendering")
            if want in ("on", "off"):
                flag = _FLAGS[setting][0 if want == "on" else 1]
                argv.append(flag)
                notes.append(f"# added {flag} after rendering")
        if name == "b" and any(f in argv for fs in _FLAGS.values() for f in fs):
            raise RuntimeError(f"b must run vLLM's defaults, the operator rendered {argv}")
        out[name] = harness.Rendered(argv, r.env, notes)
    return out


def recall_items(n: int, length: int, seed: int, prefix: str = "") -> list[dict]:
    return [dict(it, id=f"{prefix}{it['id']}") for it in mtpbench.fixed_requests(n, length, seed)]


def long_items(n: int, seed: int) -> list[dict]:
    held = harness.heldout()
    vocab = sorted({t for it in held for t in it["prompt_token_ids"]})
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(dict(rng.choice(held), id=f"long-recall-{i}"))
        else:
            toks = [rng.choice(vocab) for _ in range(rng.randint(1000, 1800))]
            out.append({"id": f"long-{i}", "prompt_token_ids": toks, "max_tokens": 64, "ignore_eos": True})
    return out


def prefix_items(n: int, prefixes: int, prefix_tokens: int, seed: int) -> list[dict]:
    """The same list on every engine and repetition: one request per prefix first (fills the cache), then
    continuations round-robin over the prefixes.  No task answer: compared with the reference engine."""
    held = harness.heldout()
    enc, sep = mtpbench.alphabet_codec(held)
    symbols = sorted(c for c, t in enc.items() if t != sep[0])
    rng = random.Random(seed)
    heads = [[enc[rng.choice(symbols)] for _ in range(prefix_tokens)] for _ in range(prefixes)]
    out = []
    for i in range(n):
        tail = [enc[rng.choice(symbols)] for _ in range(24)]
        out.append({"id": f"prefix-{i % prefixes}-{i}", "prompt_token_ids": heads[i % prefixes] + tail + sep, "max_tokens": 48})
    return out


def stream_one(port: int, item: dict, timeout: float) -> dict:
    """One streamed greedy completion: text, token ids (where the engine returns them), TTFT, chunk gaps."""
    body = {
        "model": harness.SERVED_NAME,
        "prompt": item["prompt_token_ids"],
        "max_tokens": item["max_tokens"],
        "temperature": 0.0,
        "ignore_eos": bool(item.get("ignore_eos")),
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    text, ids, reason, usage, times = [], [], None, None, []
    try:
        for chunk in harness.stream_chunks(port, body, timeout, t0):
            usage = chunk.get("usage") or usage
            for ch in chunk.get("choices") or []:
                if ch.get("text") or ch.get("token_ids"):
                    times.append(time.monotonic())
                text.append(ch.get("text") or "")
                ids.extend(ch.get("token_ids") or [])
                reason = ch.get("finish_reason") or reason
    except (OSError, ValueError) as e:  # socket errors, HTTP errors, caps, bad JSON
        return {"error": f"{type(e).__name__}: {e}", "text": "", "token_ids": None, "finish_reason": None, "completion_tokens": 0}
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return {
        "text": "".join(text),
        "token_ids": ids or None,
        "finish_reason": reason,
        "completion_tokens": (usage or {}).get("completion_tokens", len(ids)),
        "ttft": times[0] - t0 if times else None,
        "gaps": gaps,
    }


def prefix_counters(text: str) -> dict[str, float]:
    """vLLM's prefix-cache query/hit counters (token counts), summed over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:prefix_cache_"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
    return out


def scrape(eng: harness.Engine) -> tuple[dict, dict]:
    try:
        text = harness.metrics(eng)
    except (OSError, RuntimeError):
        return {}, {}
    return counters(text), prefix_counters(text)


def rep(
    eng: harness.Engine,
    items: list[dict],
    conc: int,
    args: argparse.Namespace,
    stop_at: float,
    keep_outputs: bool = False,
    min_requests: int | None = None,
) -> dict:
    """One repetition: `conc` in flight until min-seconds passed or min-requests sent (or the list ends), then
    drain.  keep_outputs: every answer's text by request id (the prefix workload's comparison)."""
    lock = threading.Lock()
    sent = [0]
    most = min_requests or len(items)
    results: dict[str, dict] = {}
    t0 = time.monotonic()

    def worker() -> None:
        while True:
            with lock:
                if sent[0] >= min(len(items), most) or time.monotonic() - t0 >= args.min_seconds:
                    return
                it = items[sent[0]]
                sent[0] += 1
            cap = max(1.0, min(args.request_cap, stop_at - time.time()))
            results[it["id"]] = stream_one(eng.port, it, cap)

    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        for f in [ex.submit(worker) for _ in range(conc)]:
            f.result()
    wall = time.monotonic() - t0
    done = [i for i in items if i["id"] in results]
    eos = harness.eos_ids()
    verdicts = {i["id"]: harness.judge(i, results[i["id"]], eos) for i in done if "expected" in i}
    toks = sum(results[i["id"]]["completion_tokens"] or 0 for i in done)
    ttft = [r["ttft"] for r in results.values() if r.get("ttft") is not None]
    gaps = [g for r in results.values() for g in r.get("gaps", [])]
    v = list(verdicts.values())
    return {
        "requests": len(done),
        "wall_s": round(wall, 3),
        "tokens": toks,
        "tokens_per_s": round(toks / wall, 1) if wall else None,
        "checked": len(v),
        "exact": v.count("exact"),
        "short": v.count("short"),
        "wrong": v.count("wrong"),
        "errors": sum(1 for r in results.values() if "error" in r),
        "ttft_ms": {"p50": round(pct(ttft, 50) * 1e3, 1), "p99": round(pct(ttft, 99) * 1e3, 1)} if ttft else None,
        "itl_ms": {"p50": round(pct(gaps, 50) * 1e3, 2), "p99": round(pct(gaps, 99) * 1e3, 2)} if gaps else None,
        "bad_sample": [
            {"id": k, "verdict": x, "got": results[k]["text"][:80], "error": results[k].get("error", "")[:160]}
            for k, x in verdicts.items()
            if x != "exact"
        ][:3],
        "outputs": {i["id"]: results[i["id"]]["text"] for i in done} if keep_outputs else None,
    }


def spread(reps: list[dict], key: str = "tokens_per_s") -> dict | None:
    xs = sorted(r[key] for r in reps if r.get(key) is not None)
    if not xs:
        return None
    return {
        "median": xs[len(xs) // 2] if len(xs) % 2 else round((xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2, 1),
        "min": xs[0],
        "max": xs[-1],
    }


def noise_floor(cells: dict) -> dict[str, float]:
    """Per workload, how far apart the A/A pair (a and its twin a2, the same configuration on the other GPU) came:
    |ratio of medians - 1|. A ratio within it is not told apart from 1 whatever its spreads."""
    out: dict[str, float] = {}
    for w in CONCURRENCY:
        x, y = cells.get("a2", {}).get(w, {}).get("tokens_per_s"), cells.get("a", {}).get(w, {}).get("tokens_per_s")
        if x and y:
            out[w] = round(abs(x["median"] / y["median"] - 1.0), 3)
    return out


def ratios(cells: dict) -> dict:
    """num/den per workload both measured: ratio of medians, its range, claimed where the spreads do not overlap;
    where the run has its A/A pair (a2/a) for that workload, `beyond_noise` says whether the ratio also lies
    farther from 1 than the pair did (the claim a table may make)."""
    floor = noise_floor(cells)
    out: dict[str, dict] = {}
    for num, den in RATIOS:
        for w in CONCURRENCY:
            x, y = cells.get(num, {}).get(w, {}).get("tokens_per_s"), cells.get(den, {}).get(w, {}).get("tokens_per_s")
            if not x or not y:
                continue
            ratio = x["median"] / y["median"]
            entry = {
                "ratio": round(ratio, 3),
                "range": [round(x["min"] / y["max"], 3), round(x["max"] / y["min"], 3)],
                "claimed": x["min"] > y["max"] or x["max"] < y["min"],
            }
            if w in floor:
                entry["noise_floor"] = floor[w]
                entry["beyond_noise"] = entry["claimed"] and abs(ratio - 1.0) > floor[w]
            out[f"{w} {num}/{den}"] = entry
    return out


def agreement(cells: dict) -> dict:
    """Prefix workload: each engine's answers against its reference engine's (same request ids), and its own
    repetitions against each other (the noise floor)."""
    out: dict[str, dict] = {}
    for name, ref in REFERENCE.items():
        mine = [r["outputs"] for r in cells.get(name, {}).get("prefix", {}).get("reps", []) if r.get("outputs")]
        base = [r["outputs"] for r in cells.get(ref, {}).get("prefix", {}).get("reps", []) if r.get("outputs")]
        if not mine or not base:
            continue
        first = base[0]
        same = [k for o in mine for k in o if k in first]
        agree = sum(1 for o in mine for k in o if k in first and o[k] == first[k])
        own = [k for o in mine[1:] for k in o if k in mine[0]]
        own_agree = sum(1 for o in mine[1:] for k in o if k in mine[0] and o[k] == mine[0][k])
        out[name] = {
            "reference": ref,
            "compared": len(same),
            "agree": agree,
            "agree_rate": round(agree / len(same), 4) if same else None,
            "self_compared": len(own),
            "self_agree_rate": round(own_agree / len(own), 4) if own else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear driver of deadline-bound phases
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default: now + 560)")
    ap.add_argument("--out", type=Path, default=Path(".gpu-artifacts"))
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--vllm-version", default=harness.VLLM_VERSION)
    ap.add_argument("--gpus", default="0,1", help="the GPU of each queue")
    ap.add_argument("--engines", default=",".join(ENGINES), help="subset of engines to start")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=20.0)
    ap.add_argument("--request-scale", type=float, default=1.0, help="MIN_REQUESTS times this (dry runs: less)")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--prefixes", type=int, default=4)
    ap.add_argument("--prefix-tokens", type=int, default=1200)
    ap.add_argument("--request-cap", type=float, default=60.0, help="longest wait for one request (s)")
    ap.add_argument("--phase-min", type=float, default=15.0, help="a cell starts only with this many s left")
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--kv-cache-memory", default="24G")
    ap.add_argument("--eager", action="store_true", help="--enforce-eager engines (a quick check; not the compiled table)")
    ap.add_argument("--workloads", default=",".join(CONCURRENCY), help="subset of workloads to run")
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines instead of vLLM (no GPU)")
    ap.add_argument("--standin-ready", type=float, default=2.0)
    args = ap.parse_args(argv)
    stop_at = (args.until or time.time() + 560.0) - TEARDOWN_S
    model = args.model or harness.model_dir()
    if not (model / "config.json").exists() or not (model / "heldout.jsonl").exists():
        ap.error(f"--model {model}: no config.json/heldout.jsonl (hack/gpu/session.sh prodmodel-train writes it)")
    os.environ["GDN_GPU_MODEL"] = str(model)
    gpus = args.gpus.split(",")
    wanted = [n for n in args.engines.split(",") if n]
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown:
        ap.error(f"--engines: unknown {unknown}; known: {sorted(ENGINES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    logdir = args.out / "logs"
    t0 = time.monotonic()
    train = model / "training.json"
    result: dict = {
        "vllm_version": args.vllm_version,
        "dry_run": args.dry_run,
        "gpu": os.environ.get("GDN_GPU_NAME", ""),
        "model": {"dir_name": model.name, "training": json.loads(train.read_text()) if train.exists() else None},
        "method": {
            **{k: getattr(args, k) for k in ("reps", "min_seconds", "length", "prefixes", "prefix_tokens", "eager")},
            "min_requests": {w: int(n * args.request_scale) for w, n in MIN_REQUESTS.items()},
        },
        "kv_cache_memory": args.kv_cache_memory,
        "request_cap_s": args.request_cap,
        "engines": {},
        "cells": {},
        "skipped": [],
        "errors": [],
    }
    lock = threading.Lock()

    def save() -> None:
        with lock:
            result["elapsed_s"] = round(time.monotonic() - t0, 1)
            result["ratios"] = ratios(result["cells"])
            result["prefix_agreement"] = agreement(result["cells"])
            (args.out / "release.json").write_text(json.dumps(result, indent=1) + "\n")

    def left() -> float:
        return stop_at - time.time()

    harness.VLLM_VERSION = args.vllm_version
    rendered = {n: r for n, r in rendered_engines(args.vllm_version, args.kv_cache_memory, args.eager).items() if n in wanted}
    works = set(args.workloads.split(","))
    queues = [tuple(x for x in q if x[0] in rendered and x[1] in works) for q in QUEUES]
    if len(gpus) == 1:  # one GPU: one queue, in the same order
        queues = [tuple(x for q in queues for x in q)]
    engines: dict[str, harness.Engine] = {}
    most = {w: max(1, int(n * args.request_scale)) for w, n in MIN_REQUESTS.items()}
    workloads = {
        "c1": recall_items(most["c1"], args.length, args.seed + 1, "c1-"),
        "c8": recall_items(most["c8"], args.length, args.seed + 8, "c8-"),
        "c32": recall_items(most["c32"], args.length, args.seed + 32, "c32-"),
        "long": long_items(most["long"], args.seed + 2),
        "prefix": prefix_items(most["prefix"], args.prefixes, args.prefix_tokens, args.seed + 3),
    }
    try:
        for name, r in rendered.items():
            gpu = gpus[min(ENGINES[name][3], len(gpus) - 1)]  # one GPU: every engine on it
            env = {"CUDA_VISIBLE_DEVICES": gpu}
            eng = (
                start_standin(name, r, logdir, gpu, args.standin_ready)
                if args.dry_run
                else harness.start(name, r, logdir, extra_env=env)
            )
            engines[name] = eng
            result["engines"][name] = {
                "argv": eng.argv,
                "env": {**r.env, **env},
                "operator_notes": r.notes,
            }
        save()

        def ready(name: str) -> bool:
            eng = engines[name]
            try:
                harness.wait_ready(eng, timeout=max(1.0, time.monotonic() - eng.started + left() - args.phase_min))
            except RuntimeError as e:
                result["errors"].append(f"{name}: {str(e)[-1500:]}")
                print(f"not ready: {name}: {str(e)[-300:]}", flush=True)
                return False
            facts = [ln.strip()[:300] for ln in eng.log_text().splitlines() if _LOG_FACTS.search(ln)]
            result["engines"][name].update(ready_s=round(eng.ready_s or 0.0, 1), log_facts=facts[:25])
            print(f"ready: {name} in {eng.ready_s:.1f} s", flush=True)
            return True

        with concurrent.futures.ThreadPoolExecutor(len(engines) or 1) as ex:
            ok = dict(zip(engines, ex.map(ready, engines), strict=True))
        save()

        def run_queue(queue: tuple[tuple[str, str], ...]) -> None:
            warmed: set[str] = set()
            for name, work in queue:
                eng = engines.get(name)
                if eng is None or not ok.get(name):
                    continue
                if left() < args.phase_min or eng.proc.poll() is not None:
                    result["skipped"].append(f"{name} {work}: {left():.0f} s left, alive {eng.proc.poll() is None}")
                    continue
                if name not in warmed:
                    w = rep(eng, recall_items(16, args.length, args.seed - 1, "warm-"), 8, args, stop_at)
                    result["engines"][name]["warmup"] = {k: w[k] for k in ("requests", "exact", "errors", "wall_s")}
                    warmed.add(name)
                conc = CONCURRENCY[work]
                items = workloads[work]
                if work == "prefix":  # each prefix alone first (the list starts with one request per prefix)
                    rep(eng, items[: args.prefixes], 1, args, stop_at)
                cell = result["cells"].setdefault(name, {}).setdefault(work, {"concurrency": conc, "reps": []})
                spec0, pc0 = scrape(eng)
                for _ in range(args.reps):
                    if left() < args.phase_min:
                        result["skipped"].append(f"{name} {work}: repetition {len(cell['reps']) + 1}, {left():.0f} s left")
                        break
                    r = rep(eng, items, conc, args, stop_at, keep_outputs=work == "prefix")
                    cell["reps"].append(r)
                    cell["tokens_per_s"] = spread(cell["reps"])
                    print(
                        f"{name:3s} {work:6s} rep {len(cell['reps'])}: {r['tokens_per_s']} tok/s, {r['requests']} req in "
                        f"{r['wall_s']} s, exact {r['exact']}/{r['checked']}, errors {r['errors']}, ttft {r['ttft_ms']}",
                        flush=True,
                    )
                    save()
                spec1, pc1 = scrape(eng)
                cell["acceptance"] = acceptance(spec0, spec1)
                d = {k: pc1.get(k, 0.0) - pc0.get(k, 0.0) for k in pc1}
                q = next((v for k, v in d.items() if "quer" in k), 0.0)
                h = next((v for k, v in d.items() if "hit" in k), 0.0)
                cell["prefix_cache"] = {"queries": q, "hits": h, "hit_rate": round(h / q, 4) if q else None}
                cell["exact"] = [sum(r["exact"] for r in cell["reps"]), sum(r["checked"] for r in cell["reps"])]
                save()

        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            for f in [ex.submit(run_queue, q) for q in queues]:
                f.result()
    except Exception as e:  # keep what was measured; the error goes into the result
        result["errors"].append(f"driver: {type(e).__name__}: {e}")
        raise
    finally:
        for eng in engines.values():
            result["engines"][eng.name]["exit_code_before_stop"] = eng.proc.poll()
        with concurrent.futures.ThreadPoolExecutor(max(1, len(engines))) as ex:
            list(ex.map(lambda e: harness.stop(e, grace=8.0), engines.values()))
        save()
    print(json.dumps({"ratios": result["ratios"], "prefix_agreement": result["prefix_agreement"]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
