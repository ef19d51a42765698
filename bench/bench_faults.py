#!/usr/bin/env python3
"""Benchmark (issue 11's fault battery): the real operator SIGKILLed during creates and updates, the real
kube-apiserver frozen (SIGSTOP) and restarted (SIGKILL + start), then every object it owes checked.

    nice -n 10 .venv/bin/python bench/bench_faults.py                  # small: a few minutes on 2 shared cores
    nice -n 10 .venv/bin/python bench/bench_faults.py --kills 50 --creates 100 --updates 150 \\
        --write-seconds 300 --freeze 30 --down 30                       # the issue's sizes

Starts a core-tier control plane (tests/cluster: etcd + kube-apiserver) and the operator as a child process
(tests/integration/operator_harness.py), then three phases:

1. kills: one client writes `--creates` GDNModelServers and `--updates` spec patches (maxModelLen among a
   few values, so A → B → A sequences occur; replicas 1/2) spread over `--write-seconds`, while `--kills`
   SIGKILLs of the whole operator process group land at random times in the first 80 % of that window
   (each followed by a fresh start that waits for kopf's liveness). Then:
     observedGeneration lag   servers whose status.observedGeneration != metadata.generation 10 s after
                              the later of the last write and the last restart's liveness (must be 0)
     convergence time         from that moment until every server has its Deployment with the latest
                              spec's args and replicas, its Service, and status at its generation
     stale specs              servers whose Deployment args/replicas differ from what the operator's own
                              renderer makes of the latest spec, after convergence or its timeout (must be 0)
     missing objects          servers without Deployment or Service after convergence (must be 0)
     duplicates               a second Deployment/Service controlled by one server (must be 0)
     orphans                  managed Deployments/Services whose controller is not a live server (must be 0)
2. freeze: `--batch` servers patched, kube-apiserver SIGSTOPped at once for `--freeze` s (the operator's
   calls for those patches are in flight), SIGCONT; time until the batch converged; then a second batch
   written after recovery and its time (the operator's watches still deliver).
3. restart: the same with kube-apiserver SIGKILLed, kept down `--down` s and started again on the same
   port and etcd; times measured from its /readyz.
Throughout, a monitor counts operator exits the bench did not cause ("operator restarts", must be 0),
and the operator process that survives phases 2-3 (same pid) has its RSS / threads / open fds printed
before phase 2 and after phase 3. Prints one table; rows marked "must be 0" carry a ✓ or ✗.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests"))  # tests/waiting.py, which operator_harness uses

import urllib3  # noqa: E402
from controlplane import ControlPlane, ensure_built  # noqa: E402
from gdn_operator import GROUP, PLURAL, VERSION  # noqa: E402
from gdn_operator.api.load import parse_spec  # noqa: E402
from gdn_operator.labels import LABEL_MANAGED_BY, MANAGED_BY  # noqa: E402
from gdn_operator.render.objects import render_all  # noqa: E402
from gdn_operator.render.scaleout import engine_args, workload_of  # noqa: E402
from gdn_operator.rules import evaluate  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from operator_harness import Kube, OperatorProcess, gms, install_crd  # noqa: E402

NS = "faults"
MAX_MODEL_LEN = [4096, 8192, 16384]
SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def retrying(fn: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
    """Call the API server, riding out its own outage (refused / reset connections, 5xx) for `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (urllib3.exceptions.HTTPError, ConnectionError, ApiException) as e:
            if isinstance(e, ApiException) and e.status and e.status < 500:
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: API server unreachable for {timeout:.0f}s: {e}") from e
            time.sleep(0.5)


# ------------------------------------------------------------------------------------------------------
# what the operator owes each server, and what the cluster holds
# ------------------------------------------------------------------------------------------------------
def expected(server: dict[str, Any]) -> tuple[set[tuple[str, ...]], int]:
    """(engine argv set, replicas) the operator's renderer makes of the server's current spec."""
    meta = server["metadata"]
    spec = parse_spec(server["spec"])
    ev = evaluate(spec, default_policy="reject")
    run = ev.mitigated_spec or spec
    objs = render_all(meta["name"], meta["namespace"], run, meta["uid"], with_monitoring=False)
    return engine_args(objs), int(workload_of(objs)["spec"].get("replicas") or 1)


def snapshot(k: Kube) -> dict[str, Any]:
    """One consistent-enough look at the namespace: servers, managed Deployments and Services (3 LISTs)."""
    servers = retrying(lambda: k.co.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"], "list servers")
    deps = retrying(lambda: k.apps.list_namespaced_deployment(NS, label_selector=SELECTOR).items, "list deployments")
    svcs = retrying(lambda: k.core.list_namespaced_service(NS, label_selector=SELECTOR).items, "list services")
    return {"servers": servers, "Deployment": deps, "Service": svcs}


def controller_uid(obj: Any) -> str | None:
    for ref in obj.metadata.owner_references or []:
        if ref.controller and ref.kind == "GDNModelServer":
            return ref.uid
    return None


def judge(snap: dict[str, Any], want: dict[str, tuple[set[tuple[str, ...]], int]] | None = None) -> dict[str, list[str]]:
    """Names per defect class. `want` caches expected() per (name, generation) across polls."""
    want = {} if want is None else want
    live = {s["metadata"]["uid"]: s for s in snap["servers"]}
    out: dict[str, list[str]] = {"lag": [], "stale": [], "missing": [], "duplicates": [], "orphans": []}
    by_owner: dict[tuple[str, str], list[Any]] = {}
    for kind in ("Deployment", "Service"):
        for o in snap[kind]:
            uid = controller_uid(o)
            if uid not in live:
                out["orphans"].append(f"{kind}/{o.metadata.name}")
                continue
            by_owner.setdefault((kind, uid), []).append(o)
    for (kind, _uid), objs in by_owner.items():
        out["duplicates"] += [f"{kind}/{o.metadata.name}" for o in objs[1:]]  # more than one per server
    for uid, s in live.items():
        meta, name = s["metadata"], s["metadata"]["name"]
        if (s.get("status") or {}).get("observedGeneration") != meta.get("generation"):
            out["lag"].append(name)
        dep = next(iter(by_owner.get(("Deployment", uid), [])), None)
        if dep is None or ("Service", uid) not in by_owner:
            out["missing"].append(name)
            continue
        key = f"{name}@{meta.get('generation')}"
        if key not in want:
            want[key] = expected(s)
        args, replicas = want[key]
        have = {tuple(dep.spec.template.spec.containers[0].args or [])}
        if have != args or (dep.spec.replicas or 0) != replicas:
            out["stale"].append(name)
    return out


def converged(j: dict[str, list[str]], names: set[str] | None = None) -> bool:
    bad = set(j["lag"]) | set(j["stale"]) | set(j["missing"])
    return not (bad & names if names is not None else bad)


def wait_converged(k: Kube, timeout: float, names: set[str] | None = None) -> tuple[float | None, dict[str, list[str]]]:
    """Seconds until converged (None: not within timeout) and the last judgement."""
    t0, want = time.perf_counter(), {}
    while True:
        j = judge(snapshot(k), want)
        if converged(j, names):
            return time.perf_counter() - t0, j
        if time.perf_counter() - t0 > timeout:
            return None, j
        time.sleep(0.25)


def settle(k: Kube, t0: float, timeout: float, mark: float = 10.0) -> tuple[float | None, list[str], dict[str, list[str]]]:
    """Poll from t0: (seconds until everything converged or None, servers lagging at t0 + mark, last judgement).
    The lag snapshot is taken at t0 + mark whether or not convergence came earlier."""
    want: dict[str, Any] = {}
    conv: float | None = None
    lag: list[str] | None = None
    while True:
        now = time.perf_counter()
        j = judge(snapshot(k), want)
        if lag is None and now >= t0 + mark:
            lag = j["lag"]
        if conv is None and converged(j):
            conv = now - t0
        if (conv is not None and lag is not None) or now - t0 > max(timeout, mark):
            return conv, lag if lag is not None else j["lag"], j
        time.sleep(min(0.25, max(0.0, t0 + mark - now)) if lag is None else 0.25)


# ------------------------------------------------------------------------------------------------------
# the operator under a supervisor that knows which exits it caused
# ------------------------------------------------------------------------------------------------------
class Supervisor:
    def __init__(self, op: OperatorProcess):
        self.op = op
        self.lock = threading.Lock()
        self.killed: set[int] = set()
        self.unexpected: list[str] = []
        self.last_ready = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> Supervisor:
        self.op.start()
        self.last_ready = time.perf_counter()
        self.thread.start()
        return self

    @property
    def pid(self) -> int:
        assert self.op.proc is not None
        return self.op.proc.pid

    def kill_and_restart(self) -> None:
        with self.lock:
            self.killed.add(self.pid)
            self.op.kill()
            self.op.start()  # waits for kopf's liveness endpoint
            self.last_ready = time.perf_counter()

    def _watch(self) -> None:
        while not self.stop.wait(0.2):
            with self.lock:
                p = self.op.proc
                if p is not None and p.poll() is not None and p.pid not in self.killed:
                    self.unexpected.append(f"pid {p.pid} exited with {p.returncode}:\n{self.op.log_tail(30)}")
                    self.killed.add(p.pid)
                    self.op.start()
                    self.last_ready = time.perf_counter()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.op.stop()


def proc_stats(pid: int) -> dict[str, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


# ------------------------------------------------------------------------------------------------------
# kube-apiserver faults (the ControlPlane has no public restart; the bench owns this use of its records)
# ------------------------------------------------------------------------------------------------------
def apiserver_signal(cp: ControlPlane, sig: int) -> None:
    os.killpg(cp.pids["kube-apiserver"], sig)


def apiserver_restart(cp: ControlPlane, down: float) -> None:
    """SIGKILL kube-apiserver, wait `down` s, start it again with the same argv (same port, same etcd);
    returns once its /readyz answers."""
    old = cp._proc("kube-apiserver")
    argv = list(old.popen.args)
    os.killpg(old.popen.pid, signal.SIGKILL)
    old.popen.wait(10)
    cp._procs.remove(old)
    time.sleep(down)
    cp._spawn("kube-apiserver", argv)
    cp._wait("kube-apiserver", cp._apiserver_ready)


# ------------------------------------------------------------------------------------------------------
def plan_writes(rng: random.Random, creates: int, updates: int) -> list[tuple[str, str, dict[str, Any]]]:
    ops: list[tuple[str, str, dict[str, Any]]] = []
    made = 0
    for i in range(creates + updates):
        left_c, left = creates - made, creates + updates - i
        if made == 0 or (left_c and rng.random() < left_c / left):
            ops.append(("create", f"srv-{made:04d}", {}))
            made += 1
        else:
            target = f"srv-{rng.randrange(made):04d}"
            field = rng.choice(["maxModelLen", "maxModelLen", "replicas"])
            ops.append(("update", target, {field: rng.choice(MAX_MODEL_LEN) if field == "maxModelLen" else rng.choice([1, 2])}))
    return ops


def patch_batch(k: Kube, names: list[str], rng: random.Random) -> None:
    for n in names:
        cur = retrying(lambda n=n: k.get(NS, n), f"get {n}")["spec"].get("maxModelLen")
        new = rng.choice([v for v in MAX_MODEL_LEN if v != cur])
        retrying(lambda n=n, new=new: k.patch(NS, n, {"spec": {"maxModelLen": new}}), f"patch {n}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=5, help="operator SIGKILLs during the writes (issue: 50)")
    ap.add_argument("--creates", type=int, default=20, help="GDNModelServers created (issue: 100)")
    ap.add_argument("--updates", type=int, default=30, help="spec patches (issue: 150)")
    ap.add_argument("--write-seconds", type=float, default=40, help="the writes are spread over this window")
    ap.add_argument("--freeze", type=float, default=10, help="kube-apiserver SIGSTOP seconds (issue: 30)")
    ap.add_argument("--down", type=float, default=10, help="kube-apiserver down seconds in the restart phase")
    ap.add_argument("--batch", type=int, default=5, help="servers patched per fault-recovery measurement")
    ap.add_argument("--converge-timeout", type=float, default=180)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--log-level", default="INFO", help="the operator's GDN_LOG_LEVEL (its log stays in the work dir)")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    bins = ensure_built("core")
    work = Path(tempfile.mkdtemp(prefix="gdn-faults-"))
    rows: list[tuple[str, str, bool]] = []  # (label, value, must be 0)

    def row(label: str, value: Any, must_be_zero: bool = False) -> None:
        rows.append((label, str(value), must_be_zero))

    with ControlPlane(work / "cp", tier="core", binaries=bins) as cp:
        api = cp.api_client()
        install_crd(api)
        k = Kube(api)
        k.core.create_namespace({"metadata": {"name": NS}})
        op = OperatorProcess(cp, work / "op", env={"GDN_LOG_LEVEL": args.log_level, "GDN_STREAM_LOGS": "0"})
        sup = Supervisor(op).start()
        try:
            # ---- phase 1: kills during writes
            ops = plan_writes(rng, args.creates, args.updates)
            kill_at = sorted(rng.uniform(0, 0.8 * args.write_seconds) for _ in range(args.kills))
            t0 = time.perf_counter()
            kills_done = [0]

            def killer() -> None:
                for at in kill_at:
                    time.sleep(max(0.0, t0 + at - time.perf_counter()))
                    sup.kill_and_restart()
                    kills_done[0] += 1

            kt = threading.Thread(target=killer, daemon=True)
            kt.start()
            for i, (what, name, change) in enumerate(ops):
                time.sleep(max(0.0, t0 + i * args.write_seconds / len(ops) - time.perf_counter()))
                if what == "create":
                    retrying(lambda name=name: k.create(NS, gms(name)), f"create {name}")
                else:
                    retrying(lambda name=name, change=change: k.patch(NS, name, {"spec": change}), f"patch {name}")
            last_write = time.perf_counter()
            kt.join()
            settled = max(last_write, sup.last_ready)
            conv, lag10, j = settle(k, settled, args.converge_timeout)
            row("operator SIGKILLs during the writes (each restarted)", kills_done[0])
            row("writes: creates / updates", f"{args.creates} / {args.updates} in {last_write - t0:.1f} s")
            row("last restart live after the last write by", f"{max(0.0, sup.last_ready - last_write):.1f} s")
            row("observedGeneration lag 10 s after the last write", len(lag10), True)
            row("convergence time after the last write", "NOT CONVERGED" if conv is None else f"{conv:.1f} s")
            row("stale specs after convergence", len(j["stale"]), True)
            row("servers missing Deployment/Service", len(j["missing"]), True)
            row("duplicates", len(j["duplicates"]), True)
            row("orphans", len(j["orphans"]), True)
            for key in ("lag", "stale", "missing", "duplicates", "orphans"):
                if j[key]:
                    print(f"# {key}: {', '.join(sorted(j[key])[:20])}", file=sys.stderr)
            if lag10:
                print(f"# lag at +10 s: {', '.join(sorted(lag10)[:20])}", file=sys.stderr)

            # ---- phases 2 and 3: the same operator process through an API-server freeze and restart
            pid = sup.pid
            before = proc_stats(pid)
            names = sorted(s["metadata"]["name"] for s in snapshot(k)["servers"])

            def recovery(label: str, fault: Callable[[], None]) -> None:
                batch = min(args.batch, len(names))
                inflight, later = rng.sample(names, batch), rng.sample(names, batch)
                patch_batch(k, inflight, rng)
                fault()
                took, _ = wait_converged(k, args.converge_timeout, set(inflight))
                row(f"{label}: in-flight batch converged after recovery in", "NOT CONVERGED" if took is None else f"{took:.1f} s")
                patch_batch(k, later, rng)
                took, _ = wait_converged(k, args.converge_timeout, set(later))
                row(f"{label}: batch written after recovery converged in", "NOT CONVERGED" if took is None else f"{took:.1f} s")

            def freeze() -> None:
                apiserver_signal(cp, signal.SIGSTOP)
                time.sleep(args.freeze)
                apiserver_signal(cp, signal.SIGCONT)

            recovery(f"API-server freeze {args.freeze:g} s", freeze)
            recovery(f"API-server restart, down {args.down:g} s", lambda: apiserver_restart(cp, args.down))
            _, jend = wait_converged(k, args.converge_timeout)
            row(
                "after all phases: lag / stale / missing / duplicates / orphans",
                " / ".join(str(len(jend[x])) for x in ("lag", "stale", "missing", "duplicates", "orphans")),
            )
            row("operator restarts (exits the bench did not cause)", len(sup.unexpected), True)
            same = sup.pid == pid and sup.op.proc is not None and sup.op.proc.poll() is None
            row("operator process through phases 2-3", f"pid {pid} {'still running' if same else 'REPLACED'}")
            row("operator process replaced during phases 2-3", 0 if same else 1, True)
            if same:
                end = proc_stats(pid)
                row("operator RSS before → after phases 2-3", f"{before['rss_mib']:.1f} → {end['rss_mib']:.1f} MiB")
                row("operator threads before → after", f"{before['threads']:.0f} → {end['threads']:.0f}")
                row("operator open fds before → after", f"{before['fds']:.0f} → {end['fds']:.0f}")
            for u in sup.unexpected:
                print(f"# unexpected operator exit: {u}", file=sys.stderr)
        finally:
            sup.close()

    print(
        f"bench_faults: core tier, seed {args.seed}, operator log {work / 'op' / 'operator.log'}, load {os.getloadavg()[0]:.2f} (1 min) at the end"
    )
    width = max(len(r[0]) for r in rows)
    bad = 0
    for label, value, must in rows:
        mark = ""
        if must:
            ok = value == "0"
            bad += not ok
            mark = "must be 0 " + ("✓" if ok else "✗")
        print(f"{label:<{width}}  {value:>24}  {mark}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
