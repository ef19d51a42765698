#!/usr/bin/env python3
"""Benchmark: the operator's memory at 1,000 servers, steady and in a full resync, and what the start-up heap
settling (handlers/core/heap.settle_heap: gc.freeze and GC_THRESHOLDS) costs in memory and buys in full collections,
against the interpreter's defaults and against another commit's tree, same run.

    .venv/bin/python bench/bench_heap.py [--count 1000] [--steady 30] [--rounds 2] [--variants shipped,freeze,none]
        [--compare-tree DIR]   # also another commit's operator (`git archive REV | tar -x -C DIR`), variant "base"
        [--resync]             # then a fresh operator over the same servers: the full resync (below)
        [--census OUT]         # what the steady heap holds (below); a diagnostic run, not a measurement

A real control plane (tests/cluster, core tier) and, per variant and round, a fresh operator process watching its own
namespace, into which `--count` GDNModelServers (the cluster tests' small server) are created; done when every one
has status at its generation, then `--steady` seconds of steady state. The variants differ only in settle_heap,
swapped in by a `sitecustomize` module on the operator's PYTHONPATH (bench only; the operator has no such knob):

  shipped  settle_heap as the operator runs it: gc.freeze after start-up, GC_THRESHOLDS;
  freeze   gc.freeze after start-up, the interpreter's thresholds (700, 10, 10);
  none     no settling at all (the operator before settle_heap existed);
  arenas2  shipped, with MALLOC_ARENA_MAX=2 (glibc's heaps for the 64 worker threads: 2 instead of up to 8 per core);
  trim     shipped, with glibc's malloc_trim(0) every 10 s (a thread of the sitecustomize);
  base     --compare-tree's operator as that tree ships it (its own CRD installed for its round).
(arenas2 and trim are the allocator settings tried against the resync's retained memory; neither is shipped: see
Figures.)

Every variant's process records each full (generation 2) collection and how long it held the GIL (gc.callbacks,
the same hook in all). Per variant: seconds and CPU seconds to done, CPU per minute steady, resident memory
at done and after the steady window (VmRSS) and its peak (VmHWM), full collections and their longest and total
pause. With --resync, that operator is stopped and a fresh one started over the same servers (kopf resumes every
one: the full resync an operator restart or a failover makes); the resync is done when the new process's CPU stays
under 5 % of a core for 4 s; printed: its seconds and CPU seconds from the start, its peak (VmHWM) and VmRSS after
another steady window. The rounds alternate the variants' order; the best round per variant (lowest RSS after steady)
and every round are printed.

--census OUT has each operator, at the end of its steady window (and the resync's), write OUT/<variant>-<round>.txt
(-resync.txt): its modules, threads, glibc's and pymalloc's heaps, gc-tracked objects by type (frozen ones included;
the census unfreezes them) and, with --trace (tracemalloc from the start: PYTHONTRACEMALLOC=1, which itself costs
memory and CPU), tracemalloc's top packages and lines.

Figures (issue 49 item 6; 1,000 servers, 2 shared cores, MiB of VmRSS; "old" is a190972, the tree issue 37's
"179 MiB steady, 235 MiB in a full resync" was written against, exported with `git archive a190972 | tar -x -C DIR`):

  --variants shipped --compare-tree DIR --resync --rounds 2     old a190972          today (24a9258)
    RSS steady after the creates                                204 / 217            223 / 236
    peak in the resync / RSS steady after it                    275, 269 / 270, 269  263, 266 / 263, 262
    resync seconds (load 2.5-6.5) / its CPU seconds             37.0, 24.9 / 15.3    22.6, 18.6 / 11.6
    full collections in the creates                             13 (max 1.2 s)       0
  --variants shipped,freeze --rounds 2 (load 1.9-2.8)           shipped 225 / 233, freeze 195 / 198

No tree lost 73 MiB: both hold 40-65 MiB more after a resync (a fresh operator over existing servers: a restart or
a failover) than after watching the servers be created, and the issue's today figures (252 / 259) are those of a
resync. --census shows what that is: after the resync the live Python data is smaller (75.5 MiB of pymalloc blocks
after a full collection, against 83.8 after the creates), the rest is free memory the allocators keep from the
resync's peak (pymalloc 42-70 MiB of free blocks, glibc 25 MiB, against 12-29 and 5). MALLOC_ARENA_MAX=2 and a
malloc_trim every 10 s did not move it beyond the noise of the load (the same tree: 214-236 MiB after the creates).
What the tree did add, in the creates' steady state: GC_THRESHOLDS, +30 MiB against the interpreter's thresholds at a
quiet load (the full collection they defer holds ~98,000 unreachable objects, 47.6 MiB of pymalloc blocks: kopf's
views of past events, a cycle each, with their bodies), for 0 full collections instead of 8 (346-390 ms, 1.3 s in
all, holding the GIL) and 0-3 fewer CPU seconds per 1,000 creates; the diff base out of the annotation gave back
16 MiB of glibc's heap (36.7 in use against 52.6).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
import waiting  # noqa: E402
from _stats import cpu_seconds, memory_mib  # noqa: E402  (bench/ is on sys.path when run as a script)
from bench_fuzz import tree_crd  # noqa: E402
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from operator_harness import OperatorProcess, gms, install_crd, wait_for  # noqa: E402


def _reinit(e: BaseException) -> bool:
    return isinstance(e, kubernetes.client.ApiException) and e.status in (404, 409, 429)


VARIANTS = ("shipped", "freeze", "none", "arenas2", "trim")

#: the operator's sitecustomize: the full-collection recorder (every variant), the census on SIGUSR1 (--census),
#: then the variant's settle_heap (a tree without one, like the base tree before it existed, is run as it is)
SITECUSTOMIZE = """
import gc, os, signal, sys, time

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

def _census(signum, frame):
    out = open(os.environ["GDN_BENCH_CENSUS"] + ".part", "w")
    try:
        _write_census(out)
    except Exception:
        import traceback
        traceback.print_exc(file=out)
    out.close()
    os.rename(os.environ["GDN_BENCH_CENSUS"] + ".part", os.environ["GDN_BENCH_CENSUS"])

def _mallocstats():
    # pymalloc's own arenas, as lines: sys._debugmallocstats writes them to fd 2
    import tempfile
    with tempfile.TemporaryFile() as tf:
        saved = os.dup(2)
        os.dup2(tf.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tf.seek(0)
        return tf.read().decode(errors="replace").splitlines()

def _write_census(out):
    import collections, threading, tracemalloc
    out.write(open("/proc/self/status").read().split("VmRSS:")[1].split("\\n")[0].strip() + " VmRSS\\n")
    out.write(f"gc count {gc.get_count()} threshold {gc.get_threshold()} frozen {gc.get_freeze_count()}\\n")
    try:  # glibc's heaps: what malloc holds (arena), of it in use (uordblks) and free but kept (fordblks), mmapped
        import ctypes

        class _MI(ctypes.Structure):
            _fields_ = [(f, ctypes.c_size_t) for f in
                        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MI
        mi = libc.mallinfo2()
        out.write("malloc " + " ".join(f"{f} {getattr(mi, f) / 2**20:.1f}" for f in
                                       ("arena", "uordblks", "fordblks", "hblkhd", "keepcost")) + " MiB\\n")
    except (OSError, AttributeError) as e:
        out.write(f"malloc: {e}\\n")
    for ln in _mallocstats():
        if "arenas" in ln or ln.startswith("Total") or "bytes in" in ln:
            out.write("pymalloc " + " ".join(ln.split()) + "\\n")
    mods = collections.Counter(m.split(".")[0] for m in list(sys.modules))
    out.write(f"modules {len(sys.modules)}: " + ", ".join(f"{k} {v}" for k, v in mods.most_common(40)) + "\\n")
    names = collections.Counter(t.name.rstrip("0123456789_-").split(" ")[0] for t in threading.enumerate())
    out.write(f"threads {threading.active_count()}: " + ", ".join(f"{k} {v}" for k, v in names.most_common()) + "\\n")
    def _pymalloc_used():
        for ln in _mallocstats():
            if "bytes in allocated blocks" in ln:
                return int(ln.split("=")[1].replace(",", "")) / 2**20
        return -1.0

    used0 = _pymalloc_used()
    n = gc.collect()  # what the next full collection frees (the frozen start-up heap stays out of it)
    out.write(f"a full collection now: {n} objects unreachable, pymalloc blocks in use {used0:.1f} -> {_pymalloc_used():.1f} MiB\\n")
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # frozen objects are not listed by gc.get_objects (this run is a diagnostic from here on)
    by_type = collections.Counter()
    size = collections.Counter()
    for o in gc.get_objects():
        t = type(o)
        k = f"{t.__module__}.{t.__qualname__}"
        by_type[k] += 1
        size[k] += sys.getsizeof(o)
    objs = gc.get_objects()
    bodies = [o for o in objs if type(o) is dict and "kind" in o and "metadata" in o and "apiVersion" in o]
    bodies = [o for o in bodies if type(o["kind"]) is str and type(o["metadata"]) is dict]
    kinds = collections.Counter((o["kind"], "managedFields" in o["metadata"]) for o in bodies)
    out.write("API objects held (kind, with managedFields): " + ", ".join(f"{k} {v}" for k, v in kinds.most_common(12)) + "\\n")
    out.flush()
    universe = {id(x) for x in objs if type(x).__name__ != "frame"}
    universe -= {id(objs), id(bodies)}
    deadline = time.monotonic() + 30

    def _holders(o, depth):
        refs = [r for r in gc.get_referrers(o) if id(r) in universe][:3]
        if depth == 0 or time.monotonic() > deadline:
            return [type(r).__qualname__ for r in refs]
        return [(type(r).__qualname__, _holders(r, depth - 1)) for r in refs]

    seen = set()
    for o in bodies:
        key = (o["kind"], "managedFields" in o["metadata"])
        if key not in seen:
            seen.add(key)
            out.write(f"  held by ({key}): {_holders(o, 3)}\\n")
            out.flush()
    del objs, bodies
    out.write(f"gc-tracked objects {sum(by_type.values())} (frozen before the census {frozen}); top by shallow size:\\n")
    for k, v in size.most_common(40):
        out.write(f"  {v / 2**20:8.2f} MiB {by_type[k]:>9} {k}\\n")
    if tracemalloc.is_tracing():
        snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        stats = snap.statistics("filename")
        out.write(f"tracemalloc traced {sum(s.size for s in stats) / 2**20:.1f} MiB; by package:\\n")
        pkg = collections.Counter()
        for s in stats:
            f = s.traceback[0].filename
            key = f.split("site-packages/")[-1] if "site-packages/" in f else f
            parts = key.split("/")
            if "gdn_operator" in parts:
                key = "/".join(parts[parts.index("gdn_operator"):])
            elif "site-packages/" in f:
                key = parts[0]
            else:
                key = "python:" + (parts[-1] if "lib/python" in f else key)
            pkg[key] += s.size
        for k, v in pkg.most_common(40):
            out.write(f"  {v / 2**20:8.2f} MiB {k}\\n")
        out.write("top lines:\\n")
        for s in snap.statistics("lineno")[:40]:
            fr = s.traceback[0]
            out.write(f"  {s.size / 2**20:8.2f} MiB {s.count:>8} {fr.filename.split('site-packages/')[-1]}:{fr.lineno}\\n")

if os.environ.get("GDN_BENCH_CENSUS"):
    signal.signal(signal.SIGUSR1, _census)

VARIANT = os.environ["GDN_BENCH_HEAP_VARIANT"]
_startup = None
for _name in ("gdn_operator.handlers.core.heap", "gdn_operator.handlers.heap"):
    try:
        _startup = __import__(_name, fromlist=["settle_heap"])
        break
    except ModuleNotFoundError:
        pass
if VARIANT == "trim":  # exploratory: glibc's free memory handed back every 10 s
    import ctypes, threading

    def _trim():
        libc = ctypes.CDLL("libc.so.6")
        while True:
            time.sleep(10)
            libc.malloc_trim(0)

    threading.Thread(target=_trim, daemon=True, name="bench-trim").start()
if _startup is None:
    _log.write(f"settled {VARIANT} as its tree ships it (no settle_heap) thresholds={gc.get_threshold()}\\n")
else:
    if VARIANT == "freeze":
        _startup.GC_THRESHOLDS = (700, 10, 10)
    _settle = _startup.settle_heap

    def _settled():
        n = _settle() if VARIANT != "none" else 0
        _log.write(f"settled {VARIANT} frozen={gc.get_freeze_count()} thresholds={gc.get_threshold()}\\n")
        return n

    _startup.settle_heap = _settled  # __main__ imports the name after this module ran
"""


def variant_env(work: Path, variant: str, operator_dir: Path, tag: str = "") -> tuple[dict[str, str], Path]:
    site = work / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = work / f"gc-{variant}{tag}.log"
    log.write_text("")
    paths = [str(site), str(operator_dir)]
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


def until_quiet(pid: int, timeout: float, window: float = 4.0, share: float = 0.05, busy: float = 0.2) -> float:
    """Seconds from now until the process's CPU stayed under `share` of a core for `window` seconds (the start
    of that quiet window), once it has used `busy` CPU seconds from now (the work has begun)."""
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    samples: list[tuple[float, float]] = []
    while time.monotonic() - t0 < timeout:
        now = time.monotonic()
        samples.append((now, cpu_seconds(pid)))
        old = [s for s in samples if now - s[0] >= window]
        if old and old[-1][1] - c0 >= busy and (samples[-1][1] - old[-1][1]) < share * (now - old[-1][0]):
            return old[-1][0] - t0
        time.sleep(0.5)
    raise SystemExit(f"operator {pid}: not quiet within {timeout:.0f} s")


def census(pid: int, path: Path) -> None:
    os.kill(pid, signal.SIGUSR1)
    wait_for(path.exists, 300, interval=1.0, what=f"census {path}")
    print(path.read_text(), flush=True)


def run_variant(cp: Any, co: Any, work: Path, ns: str, variant: str, operator_dir: Path, args: Any, tag: str) -> dict:
    env, log = variant_env(work, variant, operator_dir)
    env.update({"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0", "GDN_WATCH_NAMESPACES": ns})
    if variant == "arenas2":
        env["MALLOC_ARENA_MAX"] = "2"
    if args.census:
        env["GDN_BENCH_CENSUS"] = str(Path(args.census) / f"{tag}.txt")
        if args.trace:
            env["PYTHONTRACEMALLOC"] = "1"
    op = OperatorProcess(cp, work, env=env).start()
    try:
        pid = op.proc.pid
        cpu0, t0, wall0 = cpu_seconds(pid), time.monotonic(), time.time()
        for i in range(args.count):
            co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, gms(f"s{i}"))

        def done() -> bool:
            items = co.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
            return len(items) == args.count and all(
                (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"] for o in items
            )

        wait_for(done, args.timeout, interval=1.0, what=f"{variant}: every server reconciled")
        t_done, cpu_done, mem_done = time.monotonic() - t0, cpu_seconds(pid) - cpu0, memory_mib(pid)
        c1 = cpu_seconds(pid)
        time.sleep(args.steady)  # the steady window is the measurement itself, not a wait before an assertion
        per_min = (cpu_seconds(pid) - c1) * 60 / args.steady
        pauses = gc_pauses(log, wall0)
        print(f"    {variant}: {settled(log)}", flush=True)
        res = {
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
        if args.census:
            census(pid, Path(env["GDN_BENCH_CENSUS"]))
    finally:
        op.stop()
    if args.resync:
        env2, log2 = variant_env(work, variant, operator_dir, "-resync")
        env["GDN_BENCH_GC_LOG"] = env2["GDN_BENCH_GC_LOG"]
        if args.census:
            env["GDN_BENCH_CENSUS"] = str(Path(args.census) / f"{tag}-resync.txt")
        t0 = time.monotonic()
        op = OperatorProcess(cp, work / "resync", env=env).start()
        try:
            pid = op.proc.pid
            res["resync_s"] = time.monotonic() - t0 + until_quiet(pid, args.timeout)
            res["resync_cpu"] = cpu_seconds(pid)
            res["resync_hwm"] = memory_mib(pid)["VmHWM"]
            time.sleep(args.steady)  # as above: a steady window after the resync
            res["resync_rss"] = memory_mib(pid)["VmRSS"]
            if args.census:
                census(pid, Path(env["GDN_BENCH_CENSUS"]))
            settled(log2)
        finally:
            op.stop()
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--steady", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="shipped,freeze,none", help=f"a subset of {','.join(VARIANTS)}")
    ap.add_argument("--compare-tree", metavar="DIR", help="also run another commit's operator (an exported tree)")
    ap.add_argument("--resync", action="store_true", help="then a fresh operator over the same servers")
    ap.add_argument("--census", metavar="OUT", help="each operator's steady heap described into OUT (diagnostic)")
    ap.add_argument("--trace", action="store_true", help="with --census: tracemalloc in each operator (costs memory)")
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants: a comma-separated subset of {', '.join(VARIANTS)}")
    trees = {v: ROOT / "operator" for v in variants}
    if args.compare_tree:
        other = Path(args.compare_tree).resolve() / "operator"
        if not (other / "gdn_operator").is_dir():
            raise SystemExit(f"--compare-tree {other.parent}: no operator/gdn_operator there")
        trees["base"] = other
    if not trees:
        raise SystemExit("nothing to run: --variants is empty and no --compare-tree")
    if args.census:
        Path(args.census).mkdir(parents=True, exist_ok=True)
    crds = {v: tree_crd(str(d)) for v, d in trees.items()}  # its own schema: the API server's defaults match its model
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-heap-"))
    results: dict[str, list[dict]] = {v: [] for v in trees}
    with ControlPlane(work / "cp", tier="core", binaries=ensure_built("core")) as cp:
        api = cp.api_client()
        core, co = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
        for r in range(args.rounds):
            for v in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                ns = f"heap-{v}-{r}"
                core.create_namespace({"metadata": {"name": ns}})
                # another tree's schema makes the API server re-initialise the kind's storage (429s meanwhile)
                waiting.wait_for(lambda v=v: install_crd(api, crds[v]) is None, 120, 2.0, "CRD installed", retry=_reinit)
                time.sleep(3)  # the new schema reaches the API server's handlers before the creates
                res = run_variant(cp, co, work / f"{v}-{r}", ns, v, trees[v], args, f"{v}-{r}")
                results[v].append(res)
                print(f"  round {r + 1} {v}: {json.dumps({k: round(x, 3) for k, x in res.items()})}", flush=True)
    print(f"control plane tier: core; {args.count} GDNModelServers per variant and round; steady window {args.steady:.0f} s")
    resync = (
        f"{'resync (s)':>11}{'CPU (s)':>9}{'peak':>7}{'RSS':>7}" if args.resync else ""
    )  # fmt: skip
    print(
        f"{'variant':<9}{'done (s)':>9}{'CPU (s)':>9}{'CPU/min':>9}{'RSS done':>10}{'RSS':>7}{'peak':>7}"
        f"{'full GCs':>10}{'max pause':>11}{'sum pause':>11}{'load':>6}{resync}   (best round: lowest RSS after steady)"
    )
    best = {v: min(rs, key=lambda x: x["rss"]) for v, rs in results.items()}
    for v, b in best.items():
        tail = (
            f"{b['resync_s']:>11.1f}{b['resync_cpu']:>9.1f}{b['resync_hwm']:>7.0f}{b['resync_rss']:>7.0f}" if args.resync else ""
        )
        print(
            f"{v:<9}{b['t']:>9.1f}{b['cpu']:>9.1f}{b['cpu_per_min']:>9.2f}{b['rss_done']:>10.0f}{b['rss']:>7.0f}{b['hwm']:>7.0f}"
            f"{b['full']:>10d}{b['pause_max'] * 1000:>9.0f}ms{b['pause_sum'] * 1000:>9.0f}ms{b['load']:>6.1f}{tail}"
        )
    first = variants[0] if variants else None
    for v in best:
        if first and v != first:
            s, o = best[first], best[v]
            print(
                f"{first} / {v}: RSS {s['rss'] / o['rss']:.2f}x ({s['rss'] - o['rss']:+.0f} MiB), peak {s['hwm'] / o['hwm']:.2f}x, "
                f"CPU to done {s['cpu'] / o['cpu']:.2f}x, full collections {s['full']} vs {o['full']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
