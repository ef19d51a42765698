#!/usr/bin/env python3
"""Benchmark: what the operator's start-up heap settling (handlers/heap.settle_heap: gc.freeze and
GC_THRESHOLDS) costs in memory and buys in full collections, against the interpreter's defaults, same run.

    .venv/bin/python bench/bench_heap.py [--count 1000] [--steady 30] [--rounds 2] [--variants shipped,freeze,none]

A real control plane (tests/cluster, core tier) and, per variant and round, a fresh operator process watching its own
namespace, into which `--count` GDNModelServers (the cluster tests' small server) are created; done when every one
has status at its generation, then `--steady` seconds of steady state. The variants differ only in settle_heap,
swapped in by a `sitecustomize` module on the operator's PYTHONPATH (bench only; the operator has no such knob):

  shipped  settle_heap as the operator runs it: gc.freeze after start-up, GC_THRESHOLDS;
  freeze   gc.freeze after start-up, the interpreter's thresholds (700, 10, 10);
  none     no settling at all (the operator before settle_heap existed).

Every variant's process records each full (generation 2) collection and how long it held the GIL (gc.callbacks,
the same hook in all three). Per variant: seconds and CPU seconds to done, CPU per minute steady, resident memory
at done and after the steady window (VmRSS) and its peak (VmHWM), full collections and their longest and total
pause. The rounds alternate the variants' order; the best round per variant (lowest RSS after steady) and every
round are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # tests/waiting.py, which operator_harness uses

import kubernetes  # noqa: E402
from _stats import cpu_seconds  # noqa: E402  (bench/ is on sys.path when run as a script)
from bench_guard_scale import memory_mib  # noqa: E402
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from operator_harness import OperatorProcess, gms, install_crd, wait_for  # noqa: E402

VARIANTS = ("shipped", "freeze", "none")

#: the operator's sitecustomize: the full-collection recorder (every variant), then the variant's settle_heap
SITECUSTOMIZE = """
import gc, os, time
import gdn_operator.handlers.core.heap as _startup

_log = open(os.environ["GDN_BENCH_GC_LOG"], "a", buffering=1)
_t0 = [0.0]

def _hook(phase, info):
    if info.get("generation") != 2:
        return
    if phase == "start":
        _t0[0] = time.perf_counter()
    else:
        _log.write(f"{time.time():.3f} {time.perf_counter() - _t0[0]:.6f} {info.get('collected', 0)}\\n")

gc.callbacks.append(_hook)
VARIANT = os.environ["GDN_BENCH_HEAP_VARIANT"]
if VARIANT == "freeze":
    _startup.GC_THRESHOLDS = (700, 10, 10)
_settle = _startup.settle_heap

def _settled():
    n = _settle() if VARIANT != "none" else 0
    _log.write(f"settled {VARIANT} frozen={gc.get_freeze_count()} thresholds={gc.get_threshold()}\\n")
    return n

_startup.settle_heap = _settled  # __main__ imports the name after this module ran
"""


def variant_env(work: Path, variant: str) -> tuple[dict[str, str], Path]:
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = work / f"gc-{variant}.log"
    log.write_text("")
    paths = [str(site), str(ROOT / "operator")]
    return {"PYTHONPATH": os.pathsep.join(paths), "GDN_BENCH_GC_LOG": str(log), "GDN_BENCH_HEAP_VARIANT": variant}, log


def settled(log: Path) -> str:
    """What the variant's settle_heap did, as its process recorded it (the proof the variant ran)."""
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("settled ")]
    if len(lines) != 1:
        raise SystemExit(f"{log}: expected one 'settled' line from the operator's settle_heap, got {lines}")
    return lines[0].split(" ", 2)[2]


def gc_pauses(log: Path, since: float) -> list[float]:
    out = []
    for ln in log.read_text().splitlines():
        if ln.startswith("settled "):
            continue
        at, pause, _ = ln.split()
        if float(at) >= since:
            out.append(float(pause))
    return out


def run_variant(cp: Any, co: Any, work: Path, ns: str, variant: str, count: int, steady: float, timeout: float) -> dict:
    env, log = variant_env(work, variant)
    env.update({"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0", "GDN_WATCH_NAMESPACES": ns})
    op = OperatorProcess(cp, work, env=env).start()
    try:
        pid = op.proc.pid
        cpu0, t0, wall0 = cpu_seconds(pid), time.monotonic(), time.time()
        for i in range(count):
            co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, gms(f"s{i}"))

        def done() -> bool:
            items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            return len(items) == count and all(
                (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"] for o in items
            )

        wait_for(done, timeout, interval=1.0, what=f"{variant}: every server reconciled")
        t_done, cpu_done, mem_done = time.monotonic() - t0, cpu_seconds(pid) - cpu0, memory_mib(pid)
        c1 = cpu_seconds(pid)
        time.sleep(steady)  # the steady window is the measurement itself, not a wait before an assertion
        per_min = (cpu_seconds(pid) - c1) * 60 / steady
        pauses = gc_pauses(log, wall0)
        print(f"    {variant}: {settled(log)}", flush=True)
        return {
            "t": t_done,
            "cpu": cpu_done,
            "cpu_per_min": per_min,
            "rss_done": mem_done["VmRSS"],
            "rss": memory_mib(pid)["VmRSS"],
            "hwm": memory_mib(pid)["VmHWM"],
            "full": len(pauses),
            "pause_max": max(pauses, default=0.0),
            "pause_sum": sum(pauses),
            "load": os.getloadavg()[0],
        }
    finally:
        op.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--steady", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants: a comma-separated subset of {', '.join(VARIANTS)}")
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-heap-"))
    results: dict[str, list[dict]] = {v: [] for v in variants}
    with ControlPlane(work / "cp", tier="core", binaries=ensure_built("core")) as cp:
        api = cp.api_client()
        install_crd(api)
        core, co = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
        for r in range(args.rounds):
            for v in variants if r % 2 == 0 else variants[::-1]:
                ns = f"heap-{v}-{r}"
                core.create_namespace({"metadata": {"name": ns}})
                res = run_variant(cp, co, work / f"{v}-{r}", ns, v, args.count, args.steady, args.timeout)
                results[v].append(res)
                print(f"  round {r + 1} {v}: {json.dumps({k: round(x, 3) for k, x in res.items()})}", flush=True)
    print(f"control plane tier: core; {args.count} GDNModelServers per variant and round; steady window {args.steady:.0f} s")
    print(
        f"{'variant':<9}{'done (s)':>9}{'CPU (s)':>9}{'CPU/min':>9}{'RSS done':>10}{'RSS':>7}{'peak':>7}"
        f"{'full GCs':>10}{'max pause':>11}{'sum pause':>11}{'load':>6}   (best round: lowest RSS after steady)"
    )
    best = {v: min(rs, key=lambda x: x["rss"]) for v, rs in results.items()}
    for v, b in best.items():
        print(
            f"{v:<9}{b['t']:>9.1f}{b['cpu']:>9.1f}{b['cpu_per_min']:>9.2f}{b['rss_done']:>10.0f}{b['rss']:>7.0f}{b['hwm']:>7.0f}"
            f"{b['full']:>10d}{b['pause_max'] * 1000:>9.0f}ms{b['pause_sum'] * 1000:>9.0f}ms{b['load']:>6.1f}"
        )
    if "shipped" in best:
        for v in variants:
            if v != "shipped":
                s, o = best["shipped"], best[v]
                print(
                    f"shipped / {v}: RSS {s['rss'] / o['rss']:.2f}x ({s['rss'] - o['rss']:+.0f} MiB), peak {s['hwm'] / o['hwm']:.2f}x, "
                    f"CPU to done {s['cpu'] / o['cpu']:.2f}x, full collections {s['full']} vs {o['full']}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
