#!/usr/bin/env python3
"""Benchmark (GPU host, ONE GPU): MTP's step cost at real Qwen3.5 geometry, dummy weights (issue 50 items 2 and 3).

Real weights cannot reach the GPU hosts; real shapes can. Each geometry in tests/fixtures/models-geometry (config.json
assembled from the published model cards, sources in its README) is served by the bundle's vLLM with ``--load-format dummy`` and token-id
prompts (``--skip-tokenizer-init``: no tokenizer on the host). The engines run the text-only form of the
checkpoint (``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` built from ``text_config``, written by
``text_only_config`` beside the results: the multimodal processor needs a tokenizer); the vision tower (~0.9 GB
bf16) is the only thing left out.

Engines (argv from ``gdnctl render`` of the minimal manifest at ``--vllm-version`` via tests/gpu/harness.py, as
bench_gpu_release.py does), one at a time on the GPU, in the order of ``--plan`` (the most valuable first):

  GEOM:off    MTP off (the operator renders vLLM's defaults there: checked, else that engine is an error)
  GEOM:k2     MTP k=2 exactly as rendered (the rules' defaults: async scheduling off, prefix caching off)
  GEOM:k2v    MTP k=2 with vLLM's defaults (the two flags the rules added removed)
  GEOM:k1, GEOM:k3   as rendered with k=1 / k=3;  GEOM:k1v, GEOM:k3v  the same with vLLM's defaults (not in the
              default plan);  GEOM:k2b  k2 again: the A/A twin (noise floor)
  GEOM:k2a    k2 with only the async-scheduling flag removed (async's share of k2v/k2; the rest is prefix caching's)
  GEOM:offnpc MTP off with --no-enable-prefix-caching (prefix caching's prefill cost without MTP: prefix TTFT vs off)
  ex:FILE     an example manifest at real geometry: start, read capacity, stop (item 3; ``examples_plan``)

Bench adaptations after rendering, each recorded in the engine's notes: ``--load-format dummy`` and
``--skip-tokenizer-init``; nothing else. vLLM's own CUDA-graph capture sizes stay (``--capture-max`` exists but
is off by default: an explicit ``max_cudagraph_capture_size`` makes vLLM 0.34.0 fall back to the token-strided
legacy grid, whose sizes are not multiples of k+1, so MTP's uniform decode steps would lose their FULL graphs —
vllm/config/vllm.py, the ``legacy_sizes`` branch).

Cells (each ``--reps`` repetitions; a repetition is one wave of requests with fixed output length, EOS ignored):

  c1, c8, c32, c64   concurrency 1 / 8 / 32 / 64 (that many requests a repetition), 32-token random prompts,
                     ``--out-tokens`` out
  long               concurrency 8, 8 requests: every other one a 1,000-1,800-token prompt (the long-prompt mix)
  prefix             concurrency 8: 4 prefixes of 1,200 tokens (each sent alone first), then 16 requests = prefix + a
                     24-token tail, 32 tokens out. TTFT there is the prefill cost with prefix caching on or off

Step cost: with dummy weights acceptance is near 0, so a step emits ~1 token per request and the inter-token gap
IS the cost of one verify-(k+1) step. Per request: (last chunk - first chunk) / (tokens after the first chunk / L),
L the cell's mean tokens per step from /metrics (1 + accepted/drafts; 1 without MTP) — correct whatever the
acceptance and however the API server groups tokens into chunks. A repetition's figure is the median over its
requests; a cell's is the median (min-max) over repetitions. Every engine measures c8 again at the end of its
slot (``c8-again``: the within-engine A/A); ``k2b`` is the engine twin. The largest |ratio - 1| of those pairs at
a geometry is its noise floor: a step-cost ratio is ``claimed`` where the spreads do not overlap and
``beyond_noise`` where it is also farther from 1 than the floor (the release table's rule).

From the step costs, MTP's speed-up at acceptance: ``(1 + a1 + a1 a2 + ...) * t_off / t_k``
(gdn_operator/rules/stepcost.py), as curves over constant conditional acceptance, at the acceptance the oracle
model measured at 0.26.0 (tests/fixtures/vllm-0.26.0-h200x2-release) and at published Qwen MTP acceptance
(``PUBLISHED``). ``stepcost.json`` is rewritten after every repetition; the engines' kept log lines go to
``stepcost-engines.log``. ``--until`` (epoch seconds) bounds everything; an engine starts only with
``--engine-min`` seconds left; after an engine stops, its whole process group must be gone and the GPU's memory
back under 2 GiB before the next starts. An engine that exits before Ready keeps its log tail; a geometry whose
MTP-off engine did not start skips its MTP engines.

``--dry-run``: stand-in engines (tests/gpu/standin_engine.py), no GPU: proves arguments, deadline and files.
``--cost-entry CAPTURE_DIR GEOMETRY ACCEPTANCE``: print the rules.yaml ``cost`` entry (``basis: step-cost``) a
capture gives (bench/_stepcost_figures.py ``cost_entry``; ACCEPTANCE an oracle key such as "k2 c8" or a published
label), run nothing. ``--table CAPTURE_DIR``: the capture's tables for the closing note (markdown), run nothing.

    PYTHONPATH=$GDN_GPU_SITE:operator GDN_GPU_VLLM_VERSION=0.34.0 python3 bench/bench_gpu_stepcost.py --out .gpu-artifacts
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

import harness  # noqa: E402
from _stepcost_figures import (  # noqa: E402
    CELLS,
    CONCURRENCY,
    GEOMETRY_DIR,
    KIND_CELLS,
    KINDS,
    PUBLISHED,
    RULE_FLAGS,
    SETTINGS,
    cell_acceptance,
    cost_entry,
    curves,
    finish_cell,
    median,
    noise,
    oracle_acceptance,
    spec_counters,
    tables,
    text_only_config,
    text_params,
)
from bench_gpu_mtp_graphs import start_standin  # noqa: E402

TEARDOWN_S = 20.0
DEFAULT_PLAN = (
    "qwen3.5-27b:off,qwen3.5-27b:k2,qwen3.5-27b:k2v,qwen3.5-27b:k1,qwen3.5-27b:k3,qwen3.5-27b:k2b,"
    "qwen3.5-27b:k2a,qwen3.5-27b:offnpc,"
    "qwen3.5-9b:off,qwen3.5-9b:k2,qwen3.5-9b:k2v,qwen3.5-35b-a3b:off,qwen3.5-35b-a3b:k2"
)
_FACTS = re.compile(
    r"GPU KV cache size|Maximum concurrency|Available KV cache memory|Model loading took|[Gg]raph capturing finished|init engine|"
    r"max_num_seqs|cudagraph_mode|enable_prefix_caching|async_scheduling|mamba|block_size|Error|error:|V2 model|"
    r"Initializing a V1 LLM engine"
)
_KV = re.compile(r"KV cache size: ([\d,]+) tokens")  # "GPU KV cache size" (0.34.0: "GPU + host" with hisparse)
_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


# ------------------------------------------------------------------------------------------- the models


def prepare_models(work: Path, names: set[str]) -> dict[str, dict]:
    """Each geometry's text-only model directory under work/models (config.json + generation_config.json)."""
    out = {}
    for name in sorted(names):
        src = GEOMETRY_DIR / name / "config.json"
        raw = src.read_bytes()
        full = json.loads(raw)
        text = text_only_config(full)
        d = work / "models" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(text, indent=1) + "\n")
        gen = GEOMETRY_DIR / name / "generation_config.json"
        if gen.exists():
            (d / "generation_config.json").write_text(gen.read_text())
        out[name] = {
            "dir": str(d),
            "architecture": full["architectures"][0],
            "served_architecture": text["architectures"][0],
            "config_sha256": hashlib.sha256(raw).hexdigest(),
            "text_params": text_params(text),
        }
    return out


# ------------------------------------------------------------------------------------------- the engines


def _add_capture_cap(argv: list[str], notes: list[str], cap: int) -> None:
    if cap <= 0:
        return
    if "--compilation-config" in argv:
        i = argv.index("--compilation-config") + 1
        cfg = json.loads(argv[i])
        cfg.setdefault("max_cudagraph_capture_size", cap)
        argv[i] = json.dumps(cfg, separators=(",", ":"))
    else:
        argv += ["--compilation-config", json.dumps({"max_cudagraph_capture_size": cap}, separators=(",", ":"))]
    notes.append(f"# bench: max_cudagraph_capture_size {cap} (--capture-max; not vLLM's default capture sizes)")


def bench_adapt(r: harness.Rendered, model_dir: str, capture_max: int) -> harness.Rendered:
    """The rendered launch line with the bench's adaptations (each noted): the text-only model directory in place
    of the rendered model, dummy weights, no tokenizer, the graph-capture cap."""
    argv, notes = list(r.argv), list(r.notes)
    if argv[0] != model_dir:
        notes.append(f"# bench: model {argv[0]} -> {model_dir} (text-only form of the same geometry)")
        argv[0] = model_dir
    for flag, value in (("--load-format", "dummy"), ("--skip-tokenizer-init", None)):
        if flag not in argv:
            argv += [flag] if value is None else [flag, value]
            notes.append(f"# bench: added {flag}{' ' + value if value else ''}")
    _add_capture_cap(argv, notes, capture_max)
    return harness.Rendered(argv, dict(r.env), notes)


def engine_manifest(model_dir: str, architecture: str, version: str, k: int, gpu_util: float, max_model_len: int) -> dict:
    m = harness.adapted_manifest(mtp=k > 0, eager=False, gpu_memory_utilization=gpu_util, kv_cache_memory=None)
    s = m["spec"]
    s.pop("prefixCaching", None)  # the minimal manifest: the rules decide
    s["model"]["uri"] = f"file://{model_dir}"
    s["model"]["architecture"] = architecture
    s["image"]["vllmVersion"] = version
    s["image"]["tag"] = f"v{version}"
    s["maxModelLen"] = max_model_len
    if k:
        s["speculativeDecoding"]["numSpeculativeTokens"] = k
    return m


def render_engine(kind: str, model: dict, args: argparse.Namespace) -> harness.Rendered:
    """One engine's launch line: gdnctl render, then the settings KINDS names, then the bench's adaptations."""
    k, settings = KINDS[kind]
    r = harness.render(
        engine_manifest(model["dir"], model["architecture"], args.vllm_version, k, args.gpu_util, args.max_model_len)
    )
    argv, notes = list(r.argv), list(r.notes)
    if k == 0 and any(f in argv for f in RULE_FLAGS):
        raise RuntimeError(f"MTP off should render vLLM's defaults, the operator rendered {argv}")
    remove, add = SETTINGS[settings]
    for flag in remove:
        if flag in argv:
            argv.remove(flag)
            notes.append(f"# bench: removed {flag} after rendering (vLLM's default)")
    for flag in add:
        if flag not in argv:
            argv.append(flag)
            notes.append(f"# bench: added {flag} after rendering")
    return bench_adapt(harness.Rendered(argv, r.env, notes), model["dir"], args.capture_max)


def free_gpu(pgid: int, timeout: float, dry_run: bool) -> dict:
    """After an engine's stop: wait until its whole process group (the EngineCore too) is gone, killing what is
    left at the timeout, then until the GPU's used memory is back under 2 GiB (the next engine sizes its caches
    from the memory free at its start)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.25)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    used = None
    while not dry_run and time.monotonic() - t0 < timeout + 15:
        try:
            out = subprocess.run(
                [
                    "nvidia-smi",
                    "--query-gpu=memory.used",
                    "--format=csv,noheader,nounits",
                    "-i",
                    os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
                ],
                capture_output=True,
                text=True,
                timeout=10,
            )
            used = float(out.stdout.split()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            break
        if used < 2048:
            break
        time.sleep(0.5)
    return {"group_gone_s": round(time.monotonic() - t0, 1), "gpu_mib_used_after": used}


def capacity(log: str) -> dict:
    """vLLM's own capacity lines: KV cache tokens and the maximum concurrency at max-model-len."""
    kv = _KV.findall(log)
    conc = _CONC.findall(log)
    return {
        "kv_cache_tokens": int(kv[-1].replace(",", "")) if kv else None,
        "max_concurrency": float(conc[-1][1]) if conc else None,
        "at_tokens_per_request": int(conc[-1][0].replace(",", "")) if conc else None,
    }


def log_facts(log: str, limit: int = 40) -> list[str]:
    return [ln.strip()[:400] for ln in log.splitlines() if _FACTS.search(ln) and '"POST /' not in ln and "ulimit" not in ln][
        :limit
    ]


# ------------------------------------------------------------------------------------------- the load


def stream_timed(port: int, prompt: list[int], max_tokens: int, timeout: float) -> dict:
    """One streamed completion of a token-id prompt, EOS ignored: chunk arrival times and token counts."""
    body = {
        "model": harness.SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.monotonic()
    times: list[float] = []
    counts: list[int] = []
    usage = None
    try:
        for chunk in harness.stream_chunks(port, body, timeout, t0):
            usage = chunk.get("usage") or usage
            n = sum(len(ch.get("token_ids") or []) for ch in chunk.get("choices") or [])
            if n:
                times.append(time.monotonic())
                counts.append(n)
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}", "tokens": 0}
    tokens = (usage or {}).get("completion_tokens", sum(counts))
    return {
        "tokens": tokens,
        "ttft": times[0] - t0 if times else None,
        "span": times[-1] - times[0] if len(times) > 1 else None,
        "after_first": sum(counts[1:]),
        "chunks": len(counts),
    }


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 200_000) for _ in range(n)]  # ordinary ids: far from the special tokens (>= 248044)


def workload(name: str, seed: int, out_tokens: int) -> tuple[list[tuple[list[int], int]], list[tuple[list[int], int]]]:
    """(warm-up requests sent alone first, the measured requests) as (prompt ids, output tokens)."""
    rng = random.Random(f"{seed}-{name}")
    conc = CONCURRENCY[name]
    if name == "long":
        return [], [(_prompt(rng, rng.randint(1000, 1800) if i % 2 else 32), out_tokens) for i in range(8)]
    if name == "prefix":
        heads = [_prompt(rng, 1200) for _ in range(4)]
        return [(h, 1) for h in heads], [(heads[i % 4] + _prompt(rng, 24), 32) for i in range(16)]
    return [], [(_prompt(rng, 32), out_tokens) for _ in range(conc)]


def rep(port: int, items: list[tuple[list[int], int]], conc: int, cap: float) -> dict:
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        res = list(ex.map(lambda it: stream_timed(port, it[0], it[1], cap), items))
    wall = round(time.monotonic() - t0, 4)  # the figure kept: tokens/s is recomputed from it
    ok = [r for r in res if "error" not in r]
    per_token = [r["span"] / r["after_first"] * 1e3 for r in ok if r.get("span") and r.get("after_first")]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "requests": len(items),
        "errors": len(res) - len(ok),
        "error_sample": next((r["error"][:200] for r in res if "error" in r), None),
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1) if wall else None,
        "ms_per_token": round(median(per_token), 3) if per_token else None,  # x tokens per step = step cost
        "ttft_ms": round(median([r["ttft"] * 1e3 for r in ok if r.get("ttft") is not None]) or 0.0, 1) if ok else None,
        "tokens_per_chunk": round(sum(r["after_first"] for r in ok) / max(1, sum(r["chunks"] - 1 for r in ok)), 3),
    }


def scrape(eng: harness.Engine) -> dict[str, float]:
    try:
        return spec_counters(harness.metrics(eng))
    except (OSError, RuntimeError):
        return {}


# ------------------------------------------------------------------------------------------- examples (item 3)

#: examples naming a model of the family -> (geometry it runs at on one GPU, how it was scaled)
EXAMPLE_GEOMETRY = {
    "Qwen/Qwen3.5-27B": ("qwen3.5-27b", "same geometry"),
    "Qwen/Qwen3.5-397B-A17B": ("qwen3.5-35b-a3b", "397B-A17B does not fit one GPU: the 35B-A3B geometry of the same MoE family"),
    "Qwen/Qwen3.6-35B-A3B": ("qwen3.5-35b-a3b", "Qwen3.6-35B-A3B shares the Qwen3.5-35B-A3B architecture and shapes"),
}


def example_manifest(path: Path, model: dict, version: str | None) -> tuple[dict, list[str]]:
    """An example adapted to one GPU of the host, each change said: TP/PP/nodes 1, the local model of its geometry,
    the harness's bundle adaptations (Triton GDN prefill: no FlashInfer in the bundle), the harness's served name."""
    import yaml

    m = yaml.safe_load(path.read_text())
    s = m["spec"]
    how = []
    for f in ("tensorParallelSize", "pipelineParallelSize", "nodes"):
        if s.get(f, 1) != 1:
            how.append(f"{f} {s[f]} -> 1")
            s[f] = 1
    res = s.get("resources") or {}
    if res.get("gpusPerNode", 1) != 1:
        how.append(f"resources.gpusPerNode {res['gpusPerNode']} -> 1")
        res["gpusPerNode"] = 1
    uri = s["model"]["uri"]
    s["model"] = {"uri": f"file://{model['dir']}", "servedName": harness.SERVED_NAME, "architecture": model["architecture"]}
    how.append(f"model {uri} -> the {Path(model['dir']).name} geometry, dummy weights")
    if version:
        s["image"]["vllmVersion"] = version
        s["image"]["tag"] = f"v{version}"
    s.setdefault("env", []).append({"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"})
    if s.get("gdnPrefillBackend") not in (None, "triton"):
        how.append(f"gdnPrefillBackend {s['gdnPrefillBackend']} -> triton (no FlashInfer in the bundle)")
        s["gdnPrefillBackend"] = "triton"
    return m, how


#: flags that change nothing of an engine's start or memory (how long a shutdown drains)
_NOT_STARTUP = ("--shutdown-timeout",)


def start_key(argv: list[str]) -> list[str]:
    """The launch line without the flags in _NOT_STARTUP (and their values): two examples with equal keys start the
    same engine, so the second is not started again."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in _NOT_STARTUP:
            skip = True
        else:
            out.append(x)
    return out


def examples_plan() -> list[str]:
    import yaml

    out = []
    for p in sorted((REPO / "examples").glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        uri = ((doc or {}).get("spec") or {}).get("model", {}).get("uri", "")
        if any(uri.endswith(m) for m in EXAMPLE_GEOMETRY):
            out.append(f"ex:{p.name}")
    return out


# ------------------------------------------------------------------------------------------- the driver


def parse_plan(plan: str) -> list[str]:
    items = [x for x in plan.split(",") if x]
    for it in items:
        if it.startswith("ex:"):
            if not (REPO / "examples" / it[3:]).is_file():
                raise SystemExit(f"--plan: {it}: no such example")
            continue
        geom, _, kind = it.partition(":")
        if kind not in KINDS or not (GEOMETRY_DIR / geom / "config.json").is_file():
            raise SystemExit(f"--plan: {it}: want GEOMETRY:KIND (kinds {sorted(KINDS)}) or ex:FILE")
    return items


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one linear, deadline-bound driver
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds (default now + 420)")
    ap.add_argument("--out", type=Path, default=Path(".gpu-artifacts/stepcost"))
    ap.add_argument("--vllm-version", default=os.environ.get("GDN_GPU_VLLM_VERSION", harness.VLLM_VERSION))
    ap.add_argument("--plan", default=DEFAULT_PLAN + ",examples", help="GEOMETRY:KIND,... ; 'examples' = every example")
    ap.add_argument("--cells", default=",".join(CELLS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--gpu-util", type=float, default=0.9)
    ap.add_argument("--capture-max", type=int, default=0, help="max_cudagraph_capture_size (0: vLLM's default sizes)")
    ap.add_argument("--engine-min", type=float, default=75.0, help="an engine starts only with this many s left")
    ap.add_argument("--cell-min", type=float, default=8.0, help="a repetition starts only with this many s left")
    ap.add_argument("--request-cap", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=50)
    ap.add_argument("--dry-run", action="store_true", help="stand-in engines (no GPU)")
    ap.add_argument("--standin-ready", type=float, default=1.5)
    ap.add_argument(
        "--cost-entry",
        nargs=3,
        metavar=("CAPTURE_DIR", "GEOMETRY", "ACCEPTANCE"),
        help="print the rules.yaml `cost` entry (JSON, which YAML reads) a capture gives, and run nothing",
    )
    ap.add_argument("--table", type=Path, metavar="CAPTURE_DIR", help="print a capture's tables (markdown), run nothing")
    args = ap.parse_args(argv)
    if args.table:
        print(tables(json.loads((args.table / "stepcost.json").read_text())), end="")
        return 0
    if args.cost_entry:
        capture, geom, name = args.cost_entry
        path = Path(capture) / "stepcost.json"
        fixture = path.resolve().relative_to(REPO).as_posix() if path.resolve().is_relative_to(REPO) else str(path)
        print(json.dumps(cost_entry(json.loads(path.read_text()), fixture, geom, name), indent=1))
        return 0
    stop_at = (args.until or time.time() + 420.0) - TEARDOWN_S
    plan = parse_plan(args.plan.replace("examples", ",".join(examples_plan())))
    cells = [c for c in args.cells.split(",") if c]
    if set(cells) - set(CELLS):
        ap.error(f"--cells: unknown {sorted(set(cells) - set(CELLS))}")
    harness.VLLM_VERSION = args.vllm_version
    args.out.mkdir(parents=True, exist_ok=True)
    logdir = args.out / "logs"
    geoms = {it.split(":")[0] for it in plan if not it.startswith("ex:")} | {EXAMPLE_GEOMETRY[m][0] for m in EXAMPLE_GEOMETRY}
    t0 = time.monotonic()
    result: dict = {
        "vllm_version": args.vllm_version,
        "dry_run": args.dry_run,
        "gpu": os.environ.get("GDN_GPU_NAME", ""),
        "method": {
            **{k: getattr(args, k) for k in ("reps", "out_tokens", "max_model_len", "gpu_util", "capture_max", "seed")},
            "cells": cells,
            "concurrency": {c: CONCURRENCY[c] for c in cells},
        },
        "plan": plan,
        "models": prepare_models(args.out, geoms),
        "oracle_acceptance": oracle_acceptance(),
        "published_acceptance": list(PUBLISHED),
        "engines": {},
        "cells": {},
        "examples": {},
        "stops": [],
        "skipped": [],
        "errors": [],
    }
    lock = threading.Lock()

    def save() -> None:
        with lock:
            result["elapsed_s"] = round(time.monotonic() - t0, 1)
            result["curves"] = curves(result)
            result["noise"] = noise(result)
            (args.out / "stepcost.json").write_text(json.dumps(result, indent=1) + "\n")

    def left() -> float:
        return stop_at - time.time()

    def start(name: str, r: harness.Rendered) -> harness.Engine:
        if args.dry_run:
            return start_standin(name, r, logdir, "0", args.standin_ready)
        return harness.start(name, r, logdir, extra_env={"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")})

    def stop(eng: harness.Engine) -> None:
        t = time.monotonic()
        harness.stop(eng, grace=8.0)
        rec = {"stopped_s": round(time.monotonic() - t, 1), **free_gpu(eng.proc.pid, 30.0, args.dry_run)}
        result["stops"].append({"engine": eng.name, **rec})

    def wait(eng: harness.Engine, rec: dict) -> bool:
        try:
            harness.wait_ready(eng, timeout=max(1.0, time.monotonic() - eng.started + left() - args.cell_min))
            rec["ready_s"] = round(eng.ready_s or 0.0, 1)
            return True
        except RuntimeError as e:
            rec["start_error"] = str(e)[-2500:]
            rec["cut_by_deadline"] = eng.proc.poll() is None  # still starting: the bench's clock, not the engine
            return False
        finally:
            log = eng.log_text()
            rec["capacity"] = capacity(log)
            rec["log_facts"] = log_facts(log)

    def counted(cell: dict, before: dict, after: dict, k: int) -> None:
        """The cell's counters so far (acceptance, prefix-cache hits) and its figures: after every repetition, so a
        cell the deadline cuts is as consistent as a finished one."""
        cell["acceptance"] = cell_acceptance(before, after, k)
        pc = {key: after.get(key, 0.0) - before.get(key, 0.0) for key in after if key.startswith("vllm:prefix_cache_")}
        q = next((v for key, v in pc.items() if "quer" in key), 0.0)
        h = next((v for key, v in pc.items() if "hit" in key), 0.0)
        cell["prefix_cache"] = {"queries": q, "hits": h, "hit_rate": round(h / q, 4) if q else None}
        finish_cell(cell)

    def measure(eng: harness.Engine, name: str, kind: str) -> None:
        k = KINDS[kind][0]
        rec = result["cells"].setdefault(name, {})
        mine = [c for c in cells if c in KIND_CELLS.get(kind, CELLS)]
        for work in [*mine, "c8-again"] if "c8" in mine else mine:
            conc = CONCURRENCY[work]
            warm, items = workload(work.replace("-again", ""), args.seed, args.out_tokens)
            if left() < args.cell_min:
                result["skipped"].append(f"{name} {work}: {left():.0f} s left")
                continue
            for prompt, n in warm:  # prefix: each prefix alone first (fills the cache where it is on)
                stream_timed(eng.port, prompt, n, max(1.0, min(args.request_cap, left())))
            cell = rec.setdefault(work, {"concurrency": conc, "reps": []})
            before = scrape(eng)
            for _ in range(args.reps):
                if left() < args.cell_min:
                    result["skipped"].append(f"{name} {work}: repetition {len(cell['reps']) + 1}, {left():.0f} s left")
                    break
                r = rep(eng.port, items, conc, max(1.0, min(args.request_cap, left())))
                cell["reps"].append(r)
                counted(cell, before, scrape(eng), k)
                print(
                    f"{name} {work} rep {len(cell['reps'])}: {r['ms_per_token']} ms/token, {r['tokens_per_s']} tok/s, "
                    f"ttft {r['ttft_ms']} ms, errors {r['errors']}",
                    flush=True,
                )
                save()

    def run_engine(item: str) -> None:
        geom, _, kind = item.partition(":")
        model = result["models"][geom]
        try:
            r = render_engine(kind, model, args)
        except (RuntimeError, ValueError) as e:
            result["errors"].append(f"{item}: render: {e}")
            return
        rec = result["engines"].setdefault(
            item, {"geometry": geom, "kind": kind, "k": KINDS[kind][0], "argv": r.argv, "env": r.env, "notes": r.notes}
        )
        eng = start(item.replace(":", "-"), r)
        try:
            if wait(eng, rec):
                print(f"ready: {item} in {rec['ready_s']} s; capacity {rec['capacity']}", flush=True)
                save()
                warm, items = workload("c8", args.seed - 1, 8)
                rep(eng.port, items, 8, max(1.0, min(args.request_cap, left())))  # graphs and allocator warm
                measure(eng, item, kind)
            else:
                print(f"not ready: {item}: {rec.get('start_error', '')[-300:]}", flush=True)
        finally:
            rec["exit_code_before_stop"] = eng.proc.poll()
            stop(eng)
            save()

    def run_example(item: str) -> None:
        fname = item[3:]
        import yaml

        doc = yaml.safe_load((REPO / "examples" / fname).read_text())
        uri = doc["spec"]["model"]["uri"]
        geom, scaled = next(v for m, v in EXAMPLE_GEOMETRY.items() if uri.endswith(m))
        pinned = (doc["spec"].get("image") or {}).get("vllmVersion")
        rec: dict = {"model": uri, "geometry": geom, "scaled": scaled, "pinned_release": pinned}
        result["examples"][fname] = rec
        model = result["models"][geom]
        lines = {}
        for ver in dict.fromkeys([pinned or args.vllm_version, args.vllm_version]):
            m, how = example_manifest(REPO / "examples" / fname, model, ver)
            rec["how"] = how
            try:
                lines[ver] = harness.render(m)
            except (RuntimeError, StopIteration) as e:
                rec.setdefault("render_refused", {})[ver] = str(e)[-1500:]
        if args.vllm_version not in lines:
            rec["starts"] = None
            rec["reason"] = f"not rendered at {args.vllm_version}: refused by the operator (render_refused)"
            save()
            return
        run = lines[args.vllm_version]
        if pinned and pinned in lines and pinned != args.vllm_version:
            a, b = lines[pinned].argv, run.argv
            rec["pinned_argv"] = a
            rec["argv_diff_vs_pinned"] = {
                "only_pinned": [x for x in a if x not in b],
                "only_started": [x for x in b if x not in a],
            }
        r = bench_adapt(run, model["dir"], 0)  # vLLM's own capture sizes: the example's real start
        rec.update(argv=r.argv, env=r.env, notes=r.notes, started_release=args.vllm_version)
        mns = r.argv[r.argv.index("--max-num-seqs") + 1] if "--max-num-seqs" in r.argv else None
        rec["configured_max_num_seqs"] = int(mns) if mns else "vLLM default (see log_facts)"
        twin = next(
            (
                n
                for n, e in result["examples"].items()
                if n != fname and e.get("starts") is not None and start_key(e.get("argv") or []) == start_key(r.argv)
            ),
            None,
        )
        if twin:  # the same server as far as its start goes (the autoscaled example's is the plain one's): started once
            t = result["examples"][twin]
            rec.update(starts=t["starts"], capacity=t.get("capacity"), reason=f"the launch line of {twin}: {t['reason']}")
            save()
            return
        if left() < args.engine_min:
            result["skipped"].append(f"{item}: {left():.0f} s left")
            rec["starts"] = None
            rec["reason"] = "not started: out of time"
            save()
            return
        eng = start("ex-" + Path(fname).stem, r)
        try:
            ok = wait(eng, rec)
            err = [ln for ln in rec.get("start_error", "").splitlines() if "Error" in ln or "error" in ln]
            if ok:
                rec["starts"], rec["reason"] = True, "Ready"
            elif rec["cut_by_deadline"]:
                rec["starts"], rec["reason"] = None, f"still starting when the bench's deadline came ({left():.0f} s left)"
            else:
                rec["starts"] = False
                rec["reason"] = err[-1][:400] if err else f"exited {eng.proc.returncode} before Ready"
            print(f"example {fname}: starts={ok} capacity={rec['capacity']}", flush=True)
        finally:
            rec["exit_code_before_stop"] = eng.proc.poll()
            stop(eng)
            save()

    failed: list[str] = []  # engines that exited (or failed to render) before Ready
    save()
    try:
        for item in plan:
            geom = item.partition(":")[0]
            if item.startswith("ex:"):  # rendered whatever the time (an example the operator refuses needs no GPU)
                run_example(item)
            elif left() < args.engine_min:
                result["skipped"].append(f"{item}: not started, {left():.0f} s left")
            elif f"{geom}:off" in failed:  # no baseline at this geometry: its MTP engines would measure nothing usable
                result["skipped"].append(f"{item}: not started, {geom}:off did not start")
            elif len(failed) >= 3 and not any(n in result["cells"] for n in plan):
                result["skipped"].append(f"{item}: not started, the first three engines exited before Ready")
            else:
                run_engine(item)
                e = result["engines"].get(item, {})
                if "ready_s" not in e and not e.get("cut_by_deadline"):
                    failed.append(item)
    except Exception as e:  # keep what was measured
        result["errors"].append(f"driver: {type(e).__name__}: {e}")
        raise
    finally:
        save()
        with open(args.out / "stepcost-engines.log", "w") as f:
            for p in sorted(logdir.glob("serve-*.log")) if logdir.exists() else []:
                lines = p.read_text(errors="replace").splitlines()
                keep = [ln for ln in lines if ln.strip() and '"POST /' not in ln and '"GET /' not in ln]
                f.write(f"===== {p.name} ({len(lines)} lines; access lines dropped)\n")
                f.write("\n".join(keep[:60] + ["# [...]"] + keep[-60:] if len(keep) > 120 else keep) + "\n")
    print(
        json.dumps(
            {"curves": {k: {x: v[x] for x in ("step_ratio", "break_even_alpha") if x in v} for k, v in result["curves"].items()}},
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
