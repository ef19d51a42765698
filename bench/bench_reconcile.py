#!/usr/bin/env python3
"""Benchmark: time from creating a GDNModelServer to everything the operator owes it (Deployment, Service,
status at the object's generation), for N objects (default 500),
against the raw API write latency measured in the same run on the same control plane.

    .venv/bin/python bench/bench_reconcile.py [--count 500] [--tier core|full] [--operator-env K=V ...]
        [--compare-env K=V ...]   # a second burst in the same run with the operator's env changed (ratio)
        [--rounds N]              # the bursts and the floor N times, the order alternating: the median ratio
        [--timers OUT.txt]        # the CPU time of the operator's own steps (bench/optimers/sitecustomize.py)
        [--py-spy OUT.txt [--py-spy-idle]]  # sample the operator (py-spy, collapsed stacks; bench/pyspy_top.py reads them;
                                            # py-spy is not a project dependency: .venv/bin/pip install py-spy)

Starts a real control plane (tests/cluster, built by tests/cluster/build.sh), installs the CRD, runs the
operator as a separate process, then:
  1. baseline: creates N ConfigMaps of similar size and records each create call's latency;
  2. creates N GDNModelServers as fast as one client can, and watches Deployments, Services and the
     servers' status; for each object and kind, latency = time the watch event arrived - time the create
     call returned; "ALL objects" is the latest of the three (every object counted, not only Deployments).
  3. floor: the same objects written directly by a plain client, in a fresh namespace: one thread creates
     the N servers as in step 2 and, as each create returns, a pool of as many workers as the operator has
     (GDN_MAX_WORKERS, default 64) server-side-applies the objects the operator renders for it
     (render_all: Deployment, Service, PodDisruptionBudget, ...) and patches its status at the generation,
     while the same three watches as in step 2 run (both steps pay for the bench's instruments alike);
     "burst / floor" is the ratio of the two completion times (first create -> last object the watches saw),
     issue 29 part 9; the floor's own client-side time (its last write returned) is printed beside it;
  4. with --compare-env, step 2 again in a fresh namespace with a fresh operator whose environment also
     has the given values (each burst's operator watches only its own namespace, so the second one does
     not resume the first one's servers).
  5. with --rounds N, steps 2-4 N-1 more times in fresh namespaces, the floor first in even rounds: the machine's
     speed drifts within a run, so one burst against one floor is a noisy ratio; prints each round's and the median.
Prints p50/p90/p99/max of both, the ratio, and the CPU seconds the operator, kube-apiserver, etcd and the bench
itself used during each burst and during the floor, their sum against the machine's cores and per server (where
the time goes: a burst that keeps every core busy lasts as long as that sum), with the load average (the machine
may be shared).
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # tests/waiting.py, which operator_harness uses

import kubernetes  # noqa: E402
from _stats import cpu_seconds, pct  # noqa: E402  (bench/ is on sys.path when run as a script)
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from operator_harness import Kube, OperatorProcess, apiserver_requests, gms, install_crd  # noqa: E402

KINDS = ("Deployment", "Service", "status")


def line(label: str, xs: list[float]) -> str:
    if not xs:
        return f"{label:<34} n=   0"
    ms = [x * 1000 for x in xs]
    return (
        f"{label:<34} n={len(ms):4d}  p50={pct(ms, 50):8.1f} ms  p90={pct(ms, 90):8.1f} ms  "
        f"p99={pct(ms, 99):8.1f} ms  max={max(ms):8.1f} ms  mean={statistics.mean(ms):8.1f} ms"
    )


def parse_env(ap: argparse.ArgumentParser, flag: str, items: list[str]) -> dict[str, str]:
    out = {}
    for kv in items:
        key, sep, val = kv.partition("=")
        if not sep or not key:
            ap.error(f"{flag} {kv!r}: expected KEY=VALUE")
        out[key] = val
    return out


class Watches:
    """The bench's instruments: three watches in one namespace (Deployments, Services, and servers whose status
    records their generation), each noting when it first saw each object. The burst and the floor both run
    them, so both pay for them alike (the API server encodes every event for each watch)."""

    def __init__(self, cp: ControlPlane, ns: str, count: int, timeout: float) -> None:
        self.cp, self.ns, self.count = cp, ns, count
        self.deadline = time.perf_counter() + timeout
        # every object the operator owes each server: Deployment, Service, and a status that
        # records this generation (observedGeneration); a server is done when all three are there
        self.seen: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
        self.restarts = {kind: 0 for kind in KINDS}
        self.threads: list[threading.Thread] = []

    def _watch(self, kind: str, list_fn: Any, *fn_args: Any, ready: Any) -> None:
        # a watch that ends or fails early is opened again (its synthetic ADDED events re-list every
        # object; setdefault keeps the first time seen, so a re-list can only make a figure later)
        seen = self.seen[kind]
        while len(seen) < self.count and time.perf_counter() < self.deadline:
            w = kubernetes.watch.Watch()
            try:
                for ev in w.stream(list_fn, *fn_args, timeout_seconds=max(1, int(self.deadline - time.perf_counter()))):
                    obj = ev["object"]
                    if ev["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    name = obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name
                    if ready(obj):
                        seen.setdefault(name, time.perf_counter())
                        if len(seen) >= self.count:
                            w.stop()
                            return
            except Exception as e:  # noqa: BLE001 - counted and printed; the watch is opened again
                print(f"# {self.ns} {kind} watch failed: {e!r}", file=sys.stderr)
            self.restarts[kind] += 1

    def start(self) -> Watches:
        apps = kubernetes.client.AppsV1Api(self.cp.api_client())
        core = kubernetes.client.CoreV1Api(self.cp.api_client())
        co = kubernetes.client.CustomObjectsApi(self.cp.api_client())
        for kind, fn, fargs, ready in (
            ("Deployment", apps.list_namespaced_deployment, (self.ns,), lambda o: True),
            ("Service", core.list_namespaced_service, (self.ns,), lambda o: True),
            (
                "status",
                co.list_namespaced_custom_object,
                (GROUP, VERSION, self.ns, PLURAL),
                lambda o: (o.get("status") or {}).get("observedGeneration") == o["metadata"].get("generation"),
            ),
        ):
            th = threading.Thread(target=self._watch, args=(kind, fn, *fargs), kwargs={"ready": ready}, daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def join(self) -> None:
        for th in self.threads:
            th.join(max(0.0, self.deadline - time.perf_counter()))

    def last(self) -> float | None:
        """When the last object was first seen (None: some were not seen)."""
        if any(len(v) < self.count for v in self.seen.values()):
            return None
        return max(max(v.values()) for v in self.seen.values())


def burst(
    cp: ControlPlane, k: Kube, ns: str, env: dict[str, str], args: argparse.Namespace, workdir: Path, py_spy: str | None
) -> dict[str, Any]:  # noqa: C901 - one measured sequence, kept in one place
    """Create args.count servers in `ns` with a fresh operator (env) and time every object it owes."""
    op = OperatorProcess(cp, workdir, env={**env, "GDN_WATCH_NAMESPACES": ns}).start()
    spy = None
    if py_spy:
        assert op.proc is not None
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(op.proc.pid),
                "--format",
                "raw",
                "--threads",
                "--rate",
                str(args.py_spy_rate),
                "-o",
                py_spy,
            ]
            + (["--idle"] if args.py_spy_idle else []),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
    try:
        created_at: dict[str, float] = {}
        watches = Watches(cp, ns, args.count, args.timeout).start()
        seen, restarts = watches.seen, watches.restarts
        time.sleep(1.0)  # let the watches establish
        pids = {
            "operator": op.proc.pid if op.proc else 0,
            "kube-apiserver": cp.pids["kube-apiserver"],
            "etcd": cp.pids["etcd"],
            "bench": os.getpid(),  # its creates and its three watches
        }
        cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
        req0 = apiserver_requests(cp)
        crd_create = []
        t_all = time.perf_counter()
        for i in range(args.count):
            name = f"gms-{i:04d}"
            if args.rate > 0:
                time.sleep(max(0.0, t_all + i / args.rate - time.perf_counter()))
            t = time.perf_counter()
            k.create(ns, gms(name))
            now = time.perf_counter()
            crd_create.append(now - t)
            created_at[name] = now
        watches.join()
        t_total = time.perf_counter() - t_all
        cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
        req1 = apiserver_requests(cp)
        # every request the API server served during the burst (the bench's own: its creates and 3 watches)
        requests = {key: n - req0.get(key, 0.0) for key, n in req1.items() if n - req0.get(key, 0.0) > 0}
        load = os.getloadavg()[0]
    finally:
        op.stop()
        if spy is not None:
            spy.wait(60)  # py-spy writes its file when the operator exits
    lat = {kind: [seen[kind][n] - created_at[n] for n in created_at if n in seen[kind]] for kind in seen}
    complete = [max(seen[kd][n] for kd in seen) - created_at[n] for n in created_at if all(n in seen[kd] for kd in seen)]
    return {
        "env": env,
        "crd_create": crd_create,
        "lat": lat,
        "complete": complete,
        "t_total": t_total,
        "cpu": cpu,
        "load": load,
        "requests": requests,
        "missing": {kind: len(created_at) - len(v) for kind, v in lat.items()},
        "restarts": restarts,
    }


def floor(cp: ControlPlane, k: Kube, ns: str, count: int, workers: int, timeout: float) -> dict[str, Any]:
    """Step 3: the objects the operator owes N servers, written by a plain client at the operator's concurrency,
    observed by the same watches as the burst (its completion: the last object they saw, as the burst's)."""
    from concurrent.futures import ThreadPoolExecutor

    from gdn_operator.api.load import parse_spec
    from gdn_operator.render.objects import render_all

    api = cp.api_client()
    apply_kw = dict(field_manager="bench-floor", force=True, _content_type="application/apply-patch+yaml")
    apps, core, policy = kubernetes.client.AppsV1Api(api), kubernetes.client.CoreV1Api(api), kubernetes.client.PolicyV1Api(api)
    co = kubernetes.client.CustomObjectsApi(api)
    appliers = {
        "Deployment": apps.patch_namespaced_deployment,
        "Service": core.patch_namespaced_service,
        "PodDisruptionBudget": policy.patch_namespaced_pod_disruption_budget,
        "PersistentVolumeClaim": core.patch_namespaced_persistent_volume_claim,
    }
    kinds: dict[str, int] = {}

    def owe(created: dict[str, Any]) -> float:
        meta = created["metadata"]
        for obj in render_all(meta["name"], ns, parse_spec(created["spec"]), meta["uid"], with_monitoring=False):
            kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
            appliers[obj["kind"]](
                meta["name"] if obj["kind"] != "PersistentVolumeClaim" else obj["metadata"]["name"], ns, obj, **apply_kw
            )
        co.patch_namespaced_custom_object_status(
            GROUP, VERSION, ns, PLURAL, meta["name"], {"status": {"observedGeneration": meta["generation"]}}
        )
        return time.perf_counter()

    watches = Watches(cp, ns, count, timeout).start()
    time.sleep(1.0)  # let the watches establish, as the burst does
    pids = {"kube-apiserver": cp.pids["kube-apiserver"], "etcd": cp.pids["etcd"], "bench": os.getpid()}  # bench: the client
    req0 = apiserver_requests(cp)
    cpu0 = {n: cpu_seconds(p) for n, p in pids.items()}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(owe, k.create(ns, gms(f"gms-{i:04d}"))) for i in range(count)]
        done = [f.result() for f in futures]
    watches.join()
    cpu = {n: cpu_seconds(p) - cpu0[n] for n, p in pids.items()}
    req1 = apiserver_requests(cp)
    requests = {key: n - req0.get(key, 0.0) for key, n in req1.items() if n - req0.get(key, 0.0) > 0}
    seen = watches.last()
    if seen is None:
        raise SystemExit(f"floor: the watches did not see every object in {timeout:g} s")
    return {"t_total": seen - t0, "t_client": max(done) - t0, "kinds": kinds, "requests": requests, "cpu": cpu}


def timer_env(out: str | None) -> dict[str, str]:
    """The operator's environment for bench/optimers (its steps' CPU time written to `out`); nothing without `out`."""
    if not out:
        return {}
    path = os.pathsep.join([str(ROOT / "bench" / "optimers"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path.rstrip(os.pathsep), "GDN_OPTIMERS": str(Path(out).resolve())}


def timer_lines(label: str, out: str, count: int) -> list[str]:
    """bench/optimers' figures for one burst: CPU-s and ms per server of each step (a step includes those it calls)."""
    rows = []
    for text in Path(out).read_text().splitlines():
        head, _, calls = text.rpartition(" ")
        name, _, cpu = head.rpartition(" ")
        if not name:  # "process <cpu>" and "main_thread <cpu>": no call count
            name, cpu, calls = head, calls, ""
        per = float(cpu) / count * 1000
        rows.append(f"    {name:<34} {float(cpu):6.2f} CPU-s {per:6.2f} ms per server" + (f"  ({calls} calls)" if calls else ""))
    return [f"  {label}: the operator's steps (bench/optimers, thread CPU time from its first reconcile on):", *rows]


def cpu_line(label: str, cpu: dict[str, float], wall: float, count: int) -> str:
    """CPU seconds per process, their sum against what the machine's cores could give in `wall`, per server."""
    total = sum(cpu.values())
    cores = os.cpu_count() or 1
    return (
        f"  {label:<10} {total:5.1f} CPU-s in {wall:.1f} s ({total / (wall * cores) * 100:3.0f} % of {cores} cores), "
        f"{total / count * 1000:.1f} ms per server: " + ", ".join(f"{n} {s:.1f}" for n, s in cpu.items())
    )


def report(label: str, r: dict[str, Any], raw: list[float], count: int) -> None:
    print(f"--- {label}: operator env {' '.join(f'{k}={v}' for k, v in r['env'].items())}; load {r['load']:.2f} (1 min)")
    print(line("raw write: GDNModelServer create", r["crd_create"]))
    print(line("apply → Deployment created", r["lat"]["Deployment"]))
    print(line("apply → Service created", r["lat"]["Service"]))
    print(line("apply → status at generation", r["lat"]["status"]))
    print(line("apply → ALL objects (Dep+Svc+status)", r["complete"]))
    print(
        f"all {count} servers within {r['t_total']:.1f} s of the first create; missing: "
        + ", ".join(f"{kd} {m}" for kd, m in r["missing"].items())
        + "; watches re-opened: "
        + ", ".join(f"{kd} {m}" for kd, m in r["restarts"].items())
    )
    print(
        "CPU seconds during the burst: "
        + ", ".join(f"{n} {s:.1f}" for n, s in r["cpu"].items())
        + f" (wall {r['t_total']:.1f} s)"
    )
    reqs = sorted(r["requests"].items(), key=lambda kv: -kv[1])
    print(
        f"API requests during the burst, per server ({sum(r['requests'].values()) / count:.1f} in all, incl. the "
        "bench's create): " + ", ".join(f"{key} {n / count:.2f}" for key, n in reqs if n / count >= 0.05)
    )
    if r["complete"]:
        print(
            f"ratio p50 (apply→all objects / raw ConfigMap write): {pct(r['complete'], 50) / pct(raw, 50):.1f}x; "
            f"p99: {pct(r['complete'], 99) / pct(raw, 99):.1f}x"
        )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=500)
    ap.add_argument(
        "--tier",
        choices=["core", "full"],
        default="core",
        help="core: no pods are created (measures the reconciler alone); full: kwok pods too",
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the bursts and the floor this many times (fresh namespaces, the order alternating) and print each "
        "round's burst / floor and their median",
    )
    ap.add_argument("--rate", type=float, default=0.0, help="objects created per second (0: as fast as one client can, a burst)")
    ap.add_argument(
        "--operator-env",
        action="append",
        default=[],
        metavar="K=V",
        help="extra environment for the operator process (e.g. GDN_MAX_WORKERS=32)",
    )
    ap.add_argument(
        "--compare-env",
        action="append",
        default=[],
        metavar="K=V",
        help="run a second burst with these values added to the operator's environment",
    )
    ap.add_argument(
        "--py-spy",
        metavar="OUT",
        help="record the operator with py-spy (raw collapsed stacks: CPU samples); "
        "with --compare-env the second burst goes to OUT.compare",
    )
    ap.add_argument(
        "--timers",
        metavar="OUT",
        help="the CPU time of the operator's own steps (bench/optimers: reconcile, applies, status writes, Events, plans, "
        "the event loop's thread), written to OUT and printed; with --compare-env the second burst's to OUT.compare",
    )
    ap.add_argument("--py-spy-rate", type=int, default=50, help="with --py-spy: samples per second (more samples, more overhead)")
    ap.add_argument(
        "--py-spy-idle", action="store_true", help="with --py-spy: sample waiting threads too (wall time: where the workers wait)"
    )
    args = ap.parse_args()
    op_env = {"GDN_LOG_LEVEL": "WARNING", "GDN_STREAM_LOGS": "0", **parse_env(ap, "--operator-env", args.operator_env)}
    compare = parse_env(ap, "--compare-env", args.compare_env)

    bins = ensure_built(args.tier)
    work = Path(tempfile.mkdtemp(prefix="gdn-bench-"))
    timers = {"baseline": args.timers, "compare": args.timers and args.timers + ".compare"}
    runs = [("baseline", "bench-gms", {**op_env, **timer_env(timers["baseline"])}, args.py_spy)]
    if compare:
        compare_env = {**op_env, **compare, **timer_env(timers["compare"])}
        runs.append(("compare", "bench-gms2", compare_env, args.py_spy and args.py_spy + ".compare"))
    with ControlPlane(work / "cp", tier=args.tier, binaries=bins) as cp:
        api = cp.api_client()
        install_crd(api)
        k = Kube(api)
        core = kubernetes.client.CoreV1Api(api)
        for ns in ["bench-raw"] + [r[1] for r in runs]:
            create_namespace(core, k, ns, args.tier)

        # 1. baseline: raw API writes of a similar-sized object
        payload = json.dumps(gms("x")["spec"])
        raw = []
        for i in range(args.count):
            t = time.perf_counter()
            core.create_namespaced_config_map("bench-raw", {"metadata": {"name": f"cm-{i}"}, "data": {"spec": payload}})
            raw.append(time.perf_counter() - t)

        results = [(label, burst(cp, k, ns, env, args, work / f"op-{label}", spy)) for label, ns, env, spy in runs]
        create_namespace(core, k, "bench-floor", args.tier)
        workers = int(op_env.get("GDN_MAX_WORKERS", "64"))  # the (baseline) operator's concurrency
        fl = floor(cp, k, "bench-floor", args.count, workers, args.timeout)

        # 5. --rounds: the bursts and the floor again, in fresh namespaces, the floor first in even rounds (the
        # machine's speed drifts within a run: one burst against one floor is a noisy ratio)
        later: list[dict[str, dict[str, Any]]] = []
        for rnd in range(2, args.rounds + 1):
            got: dict[str, dict[str, Any]] = {}
            for step in ("floor", "bursts") if rnd % 2 == 0 else ("bursts", "floor"):
                if step == "floor":
                    ns = f"bench-floor-{rnd}"
                    create_namespace(core, k, ns, args.tier)
                    got["floor"] = floor(cp, k, ns, args.count, workers, args.timeout)
                    continue
                for label, ns0, env, _spy in runs:
                    create_namespace(core, k, f"{ns0}-{rnd}", args.tier)
                    env = {key: v for key, v in env.items() if key != "GDN_OPTIMERS"}  # --timers: the first round's
                    got[label] = burst(cp, k, f"{ns0}-{rnd}", env, args, work / f"op-{label}-{rnd}", None)
            later.append(got)

    pace = f"{args.rate:g}/s" if args.rate > 0 else "burst"
    print(
        f"control plane tier: {args.tier}; objects: {args.count} created {pace}; operator: 1 process (kopf), SSA, "
        "watching its burst's namespace"
    )
    print(line("raw write: ConfigMap create", raw))
    for label, r in results:
        report(label, r, raw, args.count)
    kinds = ", ".join(f"{kd} {n // args.count}" for kd, n in sorted(fl["kinds"].items()))
    print(
        f"floor (plain client, {workers} workers, same objects: {kinds} + status patch per server): all {args.count} "
        f"servers within {fl['t_total']:.1f} s as the watches saw them ({fl['t_client']:.1f} s as the client's "
        f"last write returned); API requests per server {sum(fl['requests'].values()) / args.count:.1f}"
    )
    for label, r in results:
        print(
            f"burst / floor ({label}): completion {r['t_total']:.1f} s / {fl['t_total']:.1f} s = "
            f"{r['t_total'] / fl['t_total']:.2f}x (target <= 1.3)"
        )
        if later:
            ratios = [r["t_total"] / fl["t_total"]] + [g[label]["t_total"] / g["floor"]["t_total"] for g in later]
            print(
                f"burst / floor ({label}) in each of {len(ratios)} rounds (the floor first in even rounds): "
                + ", ".join(f"{x:.2f}x" for x in ratios)
                + f"; median {statistics.median(ratios):.2f}x (target <= 1.3)"
            )
    print("where the time goes: the CPU each process used (a burst that keeps the cores busy is bound by the sum):")
    for label, r in results:
        print(cpu_line(label, r["cpu"], r["t_total"], args.count))
    print(cpu_line("floor", fl["cpu"], fl["t_total"], args.count))
    for label, _r in results:
        if timers[label]:
            print("\n".join(timer_lines(label, timers[label], args.count)))
    if len(results) == 2 and results[0][1]["complete"] and results[1][1]["complete"]:
        a, b = results[0][1]["complete"], results[1][1]["complete"]
        print(f"compare / baseline (apply→all objects): p50 {pct(b, 50) / pct(a, 50):.2f}x, p99 {pct(b, 99) / pct(a, 99):.2f}x")
    bursts = [r for _, r in results] + [g[label] for g in later for label, *_ in runs]
    return 0 if not any(any(r["missing"].values()) for r in bursts) else 1


def create_namespace(core: Any, k: Kube, ns: str, tier: str) -> None:
    """A fresh namespace; on the full tier also its default ServiceAccount, which kube-controller-manager makes
    (Kube.create_namespace waits for it; the core tier has no controller-manager)."""
    if tier == "full":
        k.create_namespace(ns)
    else:
        core.create_namespace({"metadata": {"name": ns}})


if __name__ == "__main__":
    sys.exit(main())
