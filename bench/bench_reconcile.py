#!/usr/bin/env python3
"""Benchmark: time from creating a GDNModelServer to its Deployment existing, for N objects (default 500),
against the raw API write latency measured in the same run on the same control plane.

    .venv/bin/python bench/bench_reconcile.py [--count 500] [--tier core|full]

Starts a real control plane (tests/cluster, built by tests/cluster/build.sh), installs the CRD, runs the
operator as a separate process, then:
  1. baseline: creates N ConfigMaps of similar size and records each create call's latency;
  2. creates N GDNModelServers as fast as one client can, and watches Deployments; for each object,
     latency = time the Deployment ADDED event arrived - time the create call returned.
Prints p50/p90/p99/max of both, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import kubernetes  # noqa: E402
from controlplane import ControlPlane, ensure_built  # noqa: E402
from operator_harness import Kube, OperatorProcess, gms, install_crd  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[i]


def line(label: str, xs: list[float]) -> str:
    ms = [x * 1000 for x in xs]
    return (
        f"{label:<34} n={len(ms):4d}  p50={pct(ms, 50):8.1f} ms  p90={pct(ms, 90):8.1f} ms  "
        f"p99={pct(ms, 99):8.1f} ms  max={max(ms):8.1f} ms  mean={statistics.mean(ms):8.1f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument("--tier", choices=["core", "full"], default="core",
                    help="core: no pods are created (measures the reconciler alone); full: kwok pods too")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--rate", type=float, default=0.0,
                    help="objects created per second (0: as fast as one client can, a burst)")
    args = ap.parse_args()

    bins = ensure_built(args.tier)
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-"))
    with ControlPlane(work / "cp", tier=args.tier, binaries=bins) as cp:
        api = cp.api_client()
        install_crd(api)
        k = Kube(api)
        core = kubernetes.client.CoreV1Api(api)
        for ns in ("bench-raw", "bench-gms"):
            core.create_namespace({"metadata": {"name": ns}})
        if args.tier == "full":
            for ns in ("bench-raw", "bench-gms"):
                k.create_namespace(ns)

        # 1. baseline: raw API writes of a similar-sized object
        payload = json.dumps(gms("x")["spec"])
        raw = []
        for i in range(args.count):
            t = time.perf_counter()
            core.create_namespaced_config_map("bench-raw", {"metadata": {"name": f"cm-{i}"}, "data": {"spec": payload}})
            raw.append(time.perf_counter() - t)

        op = OperatorProcess(cp, work / "op", env={"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0"}).start()
        try:
            created_at: dict[str, float] = {}
            seen_at: dict[str, float] = {}
            done = threading.Event()
            apps = kubernetes.client.AppsV1Api(cp.api_client())

            def watch() -> None:
                w = kubernetes.watch.Watch()
                for ev in w.stream(apps.list_namespaced_deployment, "bench-gms", timeout_seconds=int(args.timeout)):
                    if ev["type"] == "ADDED":
                        seen_at.setdefault(ev["object"].metadata.name, time.perf_counter())
                        if len(seen_at) >= args.count:
                            w.stop()
                            break
                done.set()

            th = threading.Thread(target=watch, daemon=True)
            th.start()
            time.sleep(1.0)  # let the watch establish
            crd_create = []
            t_all = time.perf_counter()
            for i in range(args.count):
                name = f"gms-{i:04d}"
                if args.rate > 0:
                    time.sleep(max(0.0, t_all + i / args.rate - time.perf_counter()))
                t = time.perf_counter()
                k.create("bench-gms", gms(name))
                now = time.perf_counter()
                crd_create.append(now - t)
                created_at[name] = now
            done.wait(args.timeout)
            t_total = time.perf_counter() - t_all
            lat = [seen_at[n] - created_at[n] for n in created_at if n in seen_at]
            missing = len(created_at) - len(lat)
        finally:
            op.stop()

    pace = f"{args.rate:g}/s" if args.rate > 0 else "burst"
    print(f"control plane tier: {args.tier}; objects: {args.count} created {pace}; operator: 1 process (kopf), SSA")
    print(line("raw write: ConfigMap create", raw))
    print(line("raw write: GDNModelServer create", crd_create))
    print(line("apply → Deployment created", lat))
    print(f"all {args.count} Deployments within {t_total:.1f} s of the first create; missing: {missing}")
    print(f"ratio p50 (apply→Deployment / raw ConfigMap write): {pct(lat, 50) / pct(raw, 50):.1f}x; "
          f"p99: {pct(lat, 99) / pct(raw, 99):.1f}x")
    return 0 if missing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
