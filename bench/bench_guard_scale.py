#!/usr/bin/env python3
"""Benchmark (issue 35 item 8): one GDNGuard over N pods (default 1,000) against N GDNModelServers — the operator's
CPU and memory for each, measured in the same run on the same control plane, and their ratio.

    .venv/bin/python bench/bench_guard_scale.py [--count 1000] [--steady 60] [--workloads 10]

A real control plane (tests/cluster, core tier: etcd + kube-apiserver; no scheduler, so pods stay Pending and no
engine is scraped: the cost measured is the guard's own bookkeeping, the owner reads and the status writes) and
the operator as a separate process, one per phase, each watching only its phase's namespace:

  1. guard: `--workloads` ReplicaSets and N pods with a vLLM launch line owned by them (as a Deployment's
     ReplicaSets make them), then one GDNGuard selecting them all; done when the guard's status counts N pods;
  2. servers: N GDNModelServers (the cluster tests' small server); done when every one has status at its generation.

For each phase: seconds to done, operator CPU seconds to done, CPU seconds per minute over a steady window after
it (`--steady` seconds: the guard's rounds every GDN_GUARD_INTERVAL, the servers' acceptance rounds), and the
operator's resident memory (VmRSS, and VmHWM, its peak) at the end. Ratios guard / servers.
"""

from __future__ import annotations

import argparse
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
from _stats import cpu_seconds, memory_mib  # noqa: E402  (bench/ is on sys.path when run as a script)
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from guard_harness import GUARD, PLAIN, install_guard_crd  # noqa: E402
from operator_harness import OperatorProcess, gms, install_crd, wait_for  # noqa: E402

SAFE = ["vllm", "serve", "Qwen/Qwen3-Next-80B-A3B-Instruct", "--no-enable-prefix-caching",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']  # fmt: skip


def phase(
    cp: Any, work: Path, ns: str, env: dict[str, str], create: Any, done: Any, steady: float, timeout: float
) -> dict[str, Any]:
    op = OperatorProcess(cp, work, env={**env, "GDN_WATCH_NAMESPACES": ns}).start()
    try:
        pid = op.proc.pid
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        create()
        wait_for(done, timeout, interval=1.0, what=f"phase {ns} done")
        t_done, cpu_done = time.monotonic() - t0, cpu_seconds(pid) - cpu0
        mem_done = memory_mib(pid)
        c1 = cpu_seconds(pid)
        time.sleep(steady)
        per_min = (cpu_seconds(pid) - c1) * 60 / steady
        return {
            "t": t_done,
            "cpu": cpu_done,
            "cpu_per_min": per_min,
            "mem_done": mem_done,
            "mem": memory_mib(pid),
            "load": os.getloadavg()[0],
        }
    finally:
        op.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--workloads", type=int, default=10)
    ap.add_argument("--steady", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args()
    env = {"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0", "GDN_GUARD_INTERVAL": "15"}
    bins = ensure_built("core")
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-guard-"))
    with ControlPlane(work / "cp", tier="core", binaries=bins) as cp:
        api = cp.api_client()
        install_crd(api)
        install_guard_crd(api)
        core, apps, co = (
            kubernetes.client.CoreV1Api(api),
            kubernetes.client.AppsV1Api(api),
            kubernetes.client.CustomObjectsApi(api),
        )
        for ns in ("bench-guard", "bench-gms"):
            core.create_namespace({"metadata": {"name": ns}})
        labels = {"app": "bench-vllm"}
        container = PLAIN.tag("v0.33.0").argv(SAFE).container()

        def create_pods() -> None:
            owners = []
            for i in range(args.workloads):
                rs = apps.create_namespaced_replica_set("bench-guard", {
                    "metadata": {"name": f"vllm-{i}", "labels": labels},
                    "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                             "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}})  # fmt: skip
                owners.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs.metadata.name, "uid": rs.metadata.uid,
                               "controller": True})  # fmt: skip
            co.create_namespaced_custom_object(
                GROUP, VERSION, "bench-guard", "gdnguards", GUARD.name("bench").select(labels).obj()
            )
            for i in range(args.count):
                core.create_namespaced_pod("bench-guard", {
                    "metadata": {"name": f"vllm-{i % args.workloads}-{i}", "labels": labels,
                                 "ownerReferences": [owners[i % args.workloads]]},
                    "spec": {"containers": [container]}})  # fmt: skip

        def guard_done() -> bool:
            st = co.get_namespaced_custom_object(GROUP, VERSION, "bench-guard", "gdnguards", "bench").get("status") or {}
            return sum(w.get("pods", 0) for w in st.get("workloads") or []) == args.count

        def create_servers() -> None:
            for i in range(args.count):
                co.create_namespaced_custom_object(GROUP, VERSION, "bench-gms", PLURAL, gms(f"s{i}"))

        def servers_done() -> bool:
            items = co.list_namespaced_custom_object(GROUP, VERSION, "bench-gms", PLURAL)["items"]
            return len(items) == args.count and all(
                (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"] for o in items
            )

        g = phase(cp, work / "op-guard", "bench-guard", env, create_pods, guard_done, args.steady, args.timeout)
        s = phase(cp, work / "op-gms", "bench-gms", env, create_servers, servers_done, args.steady, args.timeout)

    print(f"control plane tier: core (pods Pending, no engines); N = {args.count}; guard over {args.workloads} ReplicaSets")
    print(f"{'':<28}{'done (s)':>10}{'CPU to done (s)':>17}{'CPU/min steady':>16}{'RSS (MiB)':>11}{'peak RSS':>10}{'load':>7}")
    for label, r in ((f"1 GDNGuard, {args.count} pods", g), (f"{args.count} GDNModelServers", s)):
        print(f"{label:<28}{r['t']:>10.1f}{r['cpu']:>17.1f}{r['cpu_per_min']:>16.2f}{r['mem']['VmRSS']:>11.0f}"
              f"{r['mem']['VmHWM']:>10.0f}{r['load']:>7.1f}")  # fmt: skip
    print(
        f"ratio guard / servers: CPU to done {g['cpu'] / s['cpu']:.2f}, steady CPU {g['cpu_per_min'] / max(s['cpu_per_min'], 1e-9):.2f}, "
        f"RSS {g['mem']['VmRSS'] / s['mem']['VmRSS']:.2f}, peak RSS {g['mem']['VmHWM'] / s['mem']['VmHWM']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
