#!/usr/bin/env python3
"""Benchmark: time from creating a GDNModelServer to everything the operator owes it (Deployment, Service,
status at the object's generation), for N objects (default 500),
against the raw API write latency measured in the same run on the same control plane.

    .venv/bin/python bench/bench_reconcile.py [--count 500] [--tier core|full] [--operator-env K=V ...]
        [--py-spy OUT.txt]   # sample the operator process (py-spy, collapsed stacks; bench/pyspy_top.py reads them)

Starts a real control plane (tests/cluster, built by tests/cluster/build.sh), installs the CRD, runs the
operator as a separate process, then:
  1. baseline: creates N ConfigMaps of similar size and records each create call's latency;
  2. creates N GDNModelServers as fast as one client can, and watches Deployments, Services and the
     servers' status; for each object and kind, latency = time the watch event arrived - time the create
     call returned; "ALL objects" is the latest of the three (every object counted, not only Deployments).
Prints p50/p90/p99/max of both, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

import kubernetes  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from controlplane import ControlPlane, ensure_built  # noqa: E402
from operator_harness import Kube, OperatorProcess, gms, install_crd  # noqa: E402
from _stats import pct  # noqa: E402  (bench/ is on sys.path when run as a script)


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
    ap.add_argument("--operator-env", action="append", default=[], metavar="K=V",
                    help="extra environment for the operator process (e.g. GDN_MAX_WORKERS=32)")
    ap.add_argument("--py-spy", metavar="OUT", help="record the operator with py-spy (raw collapsed stacks, --idle)")
    args = ap.parse_args()
    op_env = {"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0"}
    for kv in args.operator_env:
        key, sep, val = kv.partition("=")
        if not sep or not key:
            ap.error(f"--operator-env {kv!r}: expected KEY=VALUE")
        op_env[key] = val

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

        op = OperatorProcess(cp, work / "op", env=op_env).start()
        spy = None
        if args.py_spy:
            assert op.proc is not None
            spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(op.proc.pid),
                                    "--format", "raw", "--idle", "--threads", "--nonblocking", "--rate", "50",
                                    "-o", args.py_spy], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attaches
        try:
            created_at: dict[str, float] = {}
            # every object the operator owes each server: Deployment, Service, and a status that
            # records this generation (observedGeneration); a server is done when all three are there
            seen: dict[str, dict[str, float]] = {"Deployment": {}, "Service": {}, "status": {}}
            threads = []
            apps = kubernetes.client.AppsV1Api(cp.api_client())
            core2 = kubernetes.client.CoreV1Api(cp.api_client())
            co = kubernetes.client.CustomObjectsApi(cp.api_client())

            def watch(kind: str, list_fn, *fn_args, ready=lambda o: True) -> None:
                w = kubernetes.watch.Watch()
                for ev in w.stream(list_fn, *fn_args, timeout_seconds=int(args.timeout)):
                    obj = ev["object"]
                    name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                    if ev["type"] in ("ADDED", "MODIFIED") and ready(obj):
                        seen[kind].setdefault(name, time.perf_counter())
                        if len(seen[kind]) >= args.count:
                            w.stop()
                            break

            for kind, fn, fargs, ready in (
                ("Deployment", apps.list_namespaced_deployment, ("bench-gms",), lambda o: True),
                ("Service", core2.list_namespaced_service, ("bench-gms",), lambda o: True),
                ("status", co.list_namespaced_custom_object, (GROUP, VERSION, "bench-gms", PLURAL),
                 lambda o: (o.get("status") or {}).get("observedGeneration") == o["metadata"].get("generation")),
            ):
                th = threading.Thread(target=watch, args=(kind, fn, *fargs), kwargs={"ready": ready}, daemon=True)
                th.start()
                threads.append(th)
            time.sleep(1.0)  # let the watches establish
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
            deadline = time.perf_counter() + args.timeout
            for th in threads:
                th.join(max(0.0, deadline - time.perf_counter()))
            t_total = time.perf_counter() - t_all
            lat = {kind: [seen[kind][n] - created_at[n] for n in created_at if n in seen[kind]] for kind in seen}
            complete = [max(seen[kd][n] for kd in seen) - created_at[n] for n in created_at if all(n in seen[kd] for kd in seen)]
            missing = {kind: len(created_at) - len(v) for kind, v in lat.items()}
        finally:
            op.stop()
            if spy is not None:
                spy.wait(60)  # py-spy writes its file when the operator exits

    pace = f"{args.rate:g}/s" if args.rate > 0 else "burst"
    print(f"control plane tier: {args.tier}; objects: {args.count} created {pace}; operator: 1 process (kopf), SSA; "
          f"operator env {' '.join(args.operator_env) or '(defaults)'}; load {os.getloadavg()[0]:.2f} (1 min)")
    print(line("raw write: ConfigMap create", raw))
    print(line("raw write: GDNModelServer create", crd_create))
    print(line("apply → Deployment created", lat["Deployment"]))
    print(line("apply → Service created", lat["Service"]))
    print(line("apply → status at generation", lat["status"]))
    print(line("apply → ALL objects (Dep+Svc+status)", complete))
    print(f"all {args.count} servers within {t_total:.1f} s of the first create; missing: "
          + ", ".join(f"{kd} {m}" for kd, m in missing.items()))
    print(f"ratio p50 (apply→all objects / raw ConfigMap write): {pct(complete, 50) / pct(raw, 50):.1f}x; "
          f"p99: {pct(complete, 99) / pct(raw, 99):.1f}x")
    return 0 if not any(missing.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
