#!/usr/bin/env python3
"""Benchmark: crash detection latency, from an engine container's termination to the diagnosis in the
GDNModelServer's status (goal < 2 s), on the real control plane with kwok-simulated restarts.

    .venv/bin/python bench/bench_crash_detect.py [--servers 10] [--crashes 5]

For each crash: the test annotates the engine pod; kwok (playing the kubelet) writes the terminated
state with a real vLLM crash tail as termination message and restarts the container. Two watches record
(a) when the pod's restartCount changed (= the termination became visible in the API: the baseline, what
any watcher could know at the earliest) and (b) when status.lastCrash of the server named that restart.
Detection latency = (b) - (a). Prints p50/p90/max of both the baseline (trigger → termination visible)
and the detection latency.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # tests/waiting.py, which operator_harness uses

import kubernetes  # noqa: E402
from _stats import pct  # noqa: E402  (bench/ is on sys.path when run as a script)
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from operator_harness import Kube, OperatorProcess, gms, install_crd, wait_for  # noqa: E402

MESSAGE = (
    (ROOT / "tests" / "fixtures" / "logs" / "b1-gdn-assert-tp2-interleaved.tail.log")
    .read_bytes()[-2048:]
    .decode("utf-8", "replace")
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--servers", type=int, default=10)
    ap.add_argument("--crashes", type=int, default=5, help="crashes per server")
    args = ap.parse_args()

    bins = ensure_built("full")
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-crash-"))
    with ControlPlane(work / "cp", tier="full", binaries=bins, gpu_nodes=2, gpus_per_node=max(8, args.servers)) as cp:
        api = cp.api_client()
        install_crd(api)
        k = Kube(api)
        ns = k.create_namespace("bench-crash")
        op = OperatorProcess(cp, work / "op", env={"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0"}).start()
        try:
            names = [f"s{i:03d}" for i in range(args.servers)]
            for n in names:
                k.create(ns, gms(n, remediation={"mode": "none"}))
            pods = {}
            for n in names:
                pods[n] = wait_for(
                    lambda n=n: next((p.metadata.name for p in k.engine_pods(ns, n) if p.status.phase == "Running"), None),
                    120,
                    what=f"pod of {n}",
                )
            visible: dict[tuple[str, int], float] = {}
            detected: dict[tuple[str, int], float] = {}
            stop = threading.Event()

            def watch_pods() -> None:
                core = kubernetes.client.CoreV1Api(cp.api_client())
                w = kubernetes.watch.Watch()
                for ev in w.stream(core.list_namespaced_pod, ns, timeout_seconds=600):
                    p = ev["object"]
                    server = (p.metadata.labels or {}).get("serving.gdn-operator.io/server")
                    for cs in p.status.container_statuses or []:
                        if cs.restart_count:
                            visible.setdefault((server, cs.restart_count), time.perf_counter())
                    if stop.is_set():
                        w.stop()

            def watch_status() -> None:
                co = kubernetes.client.CustomObjectsApi(cp.api_client())
                w = kubernetes.watch.Watch()
                for ev in w.stream(co.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, timeout_seconds=600):
                    o = ev["object"]
                    lc = (o.get("status") or {}).get("lastCrash")
                    if lc and lc.get("restartCount"):
                        detected.setdefault((o["metadata"]["name"], int(lc["restartCount"])), time.perf_counter())
                    if stop.is_set():
                        w.stop()

            def quiet(fn):
                def run() -> None:
                    with contextlib.suppress(Exception):  # the watch ends when the cluster stops
                        fn()

                return run

            for fn in (watch_pods, watch_status):
                threading.Thread(target=quiet(fn), daemon=True).start()
            time.sleep(1.0)
            triggered: dict[tuple[str, int], float] = {}
            for c in range(1, args.crashes + 1):
                for n in names:
                    triggered[(n, c)] = time.perf_counter()
                    k.core.patch_namespaced_pod(
                        pods[n], ns, {"metadata": {"annotations": {"gdn-operator.io/test-crash-message": MESSAGE}}}
                    )
                wait_for(lambda c=c: all((n, c) in detected for n in names), 60, what=f"round {c} detected")
            stop.set()
        finally:
            op.stop()

    keys = sorted(triggered)
    base = [visible[key] - triggered[key] for key in keys if key in visible]
    lat = [detected[key] - visible[key] for key in keys if key in visible and key in detected]
    print(f"servers: {args.servers}, crashes each: {args.crashes}, total: {len(keys)}")
    print(
        f"baseline  trigger → termination visible in the API (kwok as kubelet): p50 {pct(base, 50) * 1000:7.1f} ms  "
        f"p90 {pct(base, 90) * 1000:7.1f} ms  max {max(base) * 1000:7.1f} ms"
    )
    print(
        f"detection termination visible → status.lastCrash:                p50 {pct(lat, 50) * 1000:7.1f} ms  "
        f"p90 {pct(lat, 90) * 1000:7.1f} ms  max {max(lat) * 1000:7.1f} ms  mean {statistics.mean(lat) * 1000:7.1f} ms"
    )
    print(f"goal < 2 s: {'PASS' if max(lat) < 2.0 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
