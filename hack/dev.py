#!/usr/bin/env python3
"""Dev mode: a real Kubernetes control plane with fake GPU nodes, the CRD, the operator, the examples.

    hack/dev.sh                        # build if needed, bring everything up, stay up until stopped
    hack/dev.sh --exit-after 60        # same, but tear down 60 s after it is up (smoke test / CI)
    hack/dev.sh --no-operator          # cluster + CRD + examples only (run kopf yourself)
    hack/dev.sh --real-engine [NAME]   # + the real vLLM CPU engine with the trained recall model (MTP k=2)
                                       #   behind an engine pod of NAME (default: the flagship sample,
                                       #   examples/qwen3.5-27b-mtp.yaml): real acceptance in `kubectl get gms`
    hack/dev.sh --real-engine-broken-mtp [NAME]  # the same with the broken MTP head: the acceptance alarm

Steps: tests/cluster/build.sh full + lws (cached) -> ControlPlane(tier="full") with 4 fake 8-GPU nodes
(kwok) -> the real LeaderWorkerSet controller and the Gateway API Inference Extension CRDs
(tests/cluster/addons.py) -> CRD from `gdnctl crd` -> `kopf run -m gdn_operator.handlers` -> apply
examples/*.yaml -> wait until each one is Ready or refused -> print kubeconfig, a kubectl hint and
each resource's status.

Stopping: Ctrl-C in the terminal, or SIGTERM (`kill <pid>`); both tear every process down. Started in
the background (`hack/dev.sh &`, nohup, a CI step), Ctrl-C does not reach it (the shell makes
background jobs ignore SIGINT): stop it with `kill -TERM <pid>` (hack/dev.sh execs this script, so
`$!` is the pid), or pass --exit-after.

Size (~560 lines): one command's whole flow (build, start, install add-ons, apply, wait, report, tear down) in
the order it runs; the parts that stand alone live in tests/cluster/ and hack/dev_engine.py.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "operator"))

from addons import GIE_CRDS, LWSController, find_addons  # noqa: E402
from addons import install_crds as install_addon_crds  # noqa: E402
from controlplane import (  # noqa: E402
    ControlPlane,
    ControlPlaneError,
    _child_setup,
    _tail,
    ensure_built,
    free_port,
)
from gdn_operator import GROUP, GUARD_PLURAL, KIND, PLURAL, VERSION  # noqa: E402

CACHE = Path(os.environ.get("GDN_CACHE_DIR", Path.home() / ".cache" / "gdn-operator"))
OPERATOR_MODULE = "gdn_operator.handlers"
# The README's flagship sample: --real-engine attaches to it unless told otherwise.
FLAGSHIP = ROOT / "examples" / "qwen3.5-27b-mtp.yaml"
# Each fake node is sized like an 8 x H100 server (DGX H100: 2 x 56 cores / 224 threads, 2 TiB), so
# the 2-node example's pods (64 CPUs, 1 TiB each) fit next to the operator's other samples.
NODE_CPU, NODE_MEMORY = "224", "2Ti"
# kwok gives pods loopback IPs from this range; the real engine listens on its pod's IP (port 8000).
DEV_POD_CIDR = "127.43.0.0/16"


def say(msg: str) -> None:
    print(f"[dev] {msg}", flush=True)


def crd_documents() -> list[dict]:
    """The CRD exactly as `gdnctl crd` prints it."""
    import yaml

    gdnctl = shutil.which("gdnctl", path=str(Path(sys.executable).parent)) or shutil.which("gdnctl")
    cmd = [gdnctl, "crd"] if gdnctl else [sys.executable, "-m", "gdn_operator.cli", "crd"]
    out = []
    for extra in ([], ["--kind", "GDNGuard"]):  # GDNModelServer, and GDNGuard (examples/guard/)
        res = subprocess.run(cmd + extra, capture_output=True, text=True, cwd=ROOT)
        if res.returncode != 0:
            raise SystemExit(f"dev.py: `{' '.join(cmd + extra)}` failed: {res.stderr.strip()}")
        out += [d for d in yaml.safe_load_all(res.stdout) if d]
    return out


def install_crds(cp: ControlPlane, docs: list[dict], timeout: float = 30) -> list[str]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    names = []
    with cp.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        for d in docs:
            name = d["metadata"]["name"]
            try:
                ext.create_custom_resource_definition(d)
            except ApiException as e:
                if e.status != 409:
                    raise SystemExit(f"dev.py: CRD {name} rejected by the apiserver: {e.body}") from e
            names.append(name)
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                crd = ext.read_custom_resource_definition(name)
                conds = {c.type: c.status for c in (crd.status.conditions or [])}
                if conds.get("Established") == "True":
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"dev.py: CRD {name} not Established: {conds}")
                time.sleep(0.2)
    return names


def operator_available() -> tuple[bool, str]:
    spec = importlib.util.find_spec(OPERATOR_MODULE)
    if spec is None:
        return False, f"module {OPERATOR_MODULE} not found"
    return True, spec.origin or OPERATOR_MODULE


def start_operator(cp: ControlPlane, log: Path, webhook: bool = True) -> subprocess.Popen:
    kopf = shutil.which("kopf", path=str(Path(sys.executable).parent)) or shutil.which("kopf")
    argv = ([kopf] if kopf else [sys.executable, "-m", "kopf"]) + [
        "run",
        "--standalone",
        "--all-namespaces",
        "-m",
        OPERATOR_MODULE,
    ]
    env = cp.env()
    # The operator's own settings (gdn_operator/settings.py): validating/mutating webhook
    # served by this process on 127.0.0.1 (the apiserver calls it by URL), metrics on a free port.
    env.setdefault("GDN_WEBHOOK_MODE", "local" if webhook else "")
    env.setdefault("GDN_WEBHOOK_ADDR", "127.0.0.1")
    env.setdefault("GDN_WEBHOOK_HOST", "127.0.0.1")
    env.setdefault("GDN_WEBHOOK_PORT", str(free_port()))
    env.setdefault("GDN_METRICS_PORT", str(free_port()))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "operator"), env.get("PYTHONPATH")]))
    f = open(log, "ab")  # noqa: SIM115 - the child process writes to it for its whole life
    f.write(("$ " + " ".join(argv) + "\n").encode())
    f.flush()
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT, preexec_fn=_child_setup
    )


def wait_webhook(cp: ControlPlane, operator: subprocess.Popen, timeout: float) -> bool:
    """Wait until the operator registered its admission webhook (kopf writes the configuration once its
    server listens), so that no example is created unchecked. False on timeout or if the operator exited."""
    from kubernetes import client

    name = os.environ.get("GDN_WEBHOOK_CONFIG_NAME", "gdn-operator.serving.gdn-operator.io")
    deadline = time.monotonic() + timeout
    with cp.api_client() as api:
        adm = client.AdmissionregistrationV1Api(api)
        while time.monotonic() < deadline and operator.poll() is None:
            items = adm.list_validating_webhook_configuration(field_selector=f"metadata.name={name}").items
            if items and any(w.client_config.url for w in items[0].webhooks or []):
                return True
            time.sleep(0.5)
    return False


def stop_process(p: subprocess.Popen, grace: float = 10) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGINT)  # kopf shuts down gracefully on SIGINT
            p.wait(grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()


@dataclass
class Applied:
    """One example document: created (``plural`` set for custom objects) or refused (``refused``)."""

    path: Path
    kind: str
    namespace: str
    name: str
    api_version: str = ""
    plural: str = ""
    refused: str = ""


def _api_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    try:
        return json.loads(body).get("message", str(e)) if body else str(e)
    except ValueError:
        return str(e)


#: What stands in for a storage provisioner in dev mode: volumes the examples' cache claims bind to (no class,
#: ReadWriteMany, hostPath: kwok's pods never write to them). The control plane has no provisioner, and a pod
#: whose claim stays unbound is never scheduled.
DEV_VOLUMES = [("dev-model-cache-0", "2Ti"), ("dev-model-cache-1", "2Ti")]


def create_dev_volumes(cp: ControlPlane) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with cp.api_client() as api:
        core = client.CoreV1Api(api)
        for name, size in DEV_VOLUMES:
            pv = {
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    # kwok nodes never mount it; the path only has to be a valid absolute one on this machine
                    "hostPath": {"path": str(Path(tempfile.gettempdir()) / "gdn-dev" / name)},
                },
            }
            try:
                core.create_persistent_volume(pv)
            except ApiException as e:
                if e.status != 409:
                    raise


def default_examples() -> list[Path]:
    """examples/*.yaml, then examples/guard/ (the guard before the plain Deployment it guards)."""
    guard = sorted((ROOT / "examples" / "guard").glob("*.yaml"), key=lambda p: (not p.name.startswith("my-vllm."), p.name))
    return sorted((ROOT / "examples").glob("*.yaml")) + guard


def apply_examples(cp: ControlPlane, paths: list[Path]) -> list[Applied]:
    """Create each document; one Applied per document, refused ones with the API server's message."""
    import yaml
    from kubernetes import client, utils
    from kubernetes.client.rest import ApiException

    out = []
    with cp.api_client() as api:
        ext = client.ApiextensionsV1Api(api)
        plurals = {}
        for crd in ext.list_custom_resource_definition().items:
            for v in crd.spec.versions:
                plurals[(f"{crd.spec.group}/{v.name}", crd.spec.names.kind)] = crd.spec.names.plural
        co = client.CustomObjectsApi(api)
        for path in paths:
            for doc in yaml.safe_load_all(path.read_text()):
                if not doc:
                    continue
                key = (doc.get("apiVersion"), doc.get("kind"))
                a = Applied(
                    path,
                    doc.get("kind", "?"),
                    doc.get("metadata", {}).get("namespace", "default"),
                    doc.get("metadata", {}).get("name", "?"),
                    api_version=key[0] or "",
                )
                try:
                    if key in plurals:
                        group, version = a.api_version.split("/", 1)
                        co.create_namespaced_custom_object(group, version, a.namespace, plurals[key], doc)
                        a.plural = plurals[key]
                    else:
                        utils.create_from_dict(api, doc, namespace=a.namespace)
                    say(f"applied {path.name}: {a.kind} {a.namespace}/{a.name}")
                except ApiException as e:
                    a.refused = _api_message(e)
                    say(f"REFUSED {path.name}: {a.kind} {a.namespace}/{a.name}: {a.refused}")
                except utils.FailToCreateError as e:
                    a.refused = "; ".join(_api_message(x) for x in e.api_exceptions)
                    say(f"REFUSED {path.name}: {a.kind} {a.namespace}/{a.name}: {a.refused}")
                out.append(a)
    return out


def _cond(status: dict, ctype: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == ctype), {})


def settled(status: dict) -> bool:
    """Nothing more to wait for: refused by the operator (Validated False) or Ready."""
    return _cond(status, "Validated").get("status") == "False" or _cond(status, "Ready").get("status") == "True"


def print_status(cp: ControlPlane, applied: list[Applied], wait: float) -> None:
    """Wait (up to ``wait`` s) until every created server is Ready or refused, then print one line each."""
    from kubernetes import client

    servers = [a for a in applied if a.plural == PLURAL]
    guards = [a for a in applied if a.plural == GUARD_PLURAL and not a.refused]
    deadline = time.monotonic() + wait
    with cp.api_client() as api:
        co = client.CustomObjectsApi(api)
        while True:
            rows = []
            for a in servers:
                group, version = a.api_version.split("/", 1)
                o = co.get_namespaced_custom_object(group, version, a.namespace, a.plural, a.name)
                rows.append((a, o.get("status") or {}))
            guard_rows = [
                (a, co.get_namespaced_custom_object(*a.api_version.split("/", 1), a.namespace, a.plural, a.name)) for a in guards
            ]
            # a guard is settled once it reports its workloads' findings (the example Deployment's KnownCrash)
            guards_done = all(w.get("findings") for _, g in guard_rows for w in (g.get("status") or {}).get("workloads") or [{}])
            if (all(settled(st) for _, st in rows) and guards_done) or time.monotonic() > deadline:
                break
            time.sleep(1)
        pods = client.CoreV1Api(api).list_pod_for_all_namespaces().items
    say("examples:")
    for a in applied:
        if a.refused:
            say(
                f"  {a.path.name}: {a.kind} {a.namespace}/{a.name} refused at admission"
                + (" (on purpose)" if a.path.name.startswith("denied-") else "")
            )
    for a, st in rows:
        v, r = _cond(st, "Validated"), _cond(st, "Ready")
        say(
            f"  {a.path.name}: {a.namespace}/{a.name} phase={st.get('phase', '(no status yet)')} "
            f"Validated={v.get('status', '-')}({v.get('reason', '-')}) Ready={r.get('status', '-')} "
            f"ready={st.get('ready', '-')}"
            + ("" if settled(st) else f"  (not settled after {wait:.0f}s: {r.get('message', '')})")
        )
    for a, g in guard_rows:
        gst = g.get("status") or {}
        for w in gst.get("workloads") or []:
            found = ", ".join(f"{f['type']} {f.get('rule') or ''}".strip() for f in w.get("findings") or []) or "no findings"
            say(f"  {a.path.name}: GDNGuard {a.namespace}/{a.name} guards {w['kind']} {w['name']}: {found}")
        if not gst.get("workloads"):
            say(f"  {a.path.name}: GDNGuard {a.namespace}/{a.name}: no guarded workload yet")
    for p in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        say(f"  pod {p.metadata.namespace}/{p.metadata.name}: {p.status.phase} node={p.spec.node_name} ip={p.status.pod_ip}")


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kubectl_line(kubectl: str | None, kubeconfig: Path) -> str:
    """The kubectl line the banner prints: runnable as printed on a fresh machine (hack/dev.sh installs kubectl
    with hack/tools.sh and passes its path; a kubectl on the PATH otherwise)."""
    return f"{shlex.quote(kubectl or 'kubectl')} --kubeconfig {shlex.quote(str(kubeconfig))} get gdnmodelservers -A"


def example_name(path: Path) -> str:
    import yaml

    return next(d for d in yaml.safe_load_all(path.read_text()) if d)["metadata"]["name"]


def attach_real_engine(
    cp: ControlPlane, applied: list[Applied], wanted: str | None, broken: bool, workdir: Path, pod_wait: float
):
    """Start the real engine behind the chosen server's API-serving pod; None (after saying which servers
    were considered and why each was skipped) if no server qualifies."""
    from dev_engine import Candidate, RealEngine, choose_target, observe, order_candidates

    flag = "--real-engine-broken-mtp" if broken else "--real-engine"
    cands = [Candidate(a.namespace, a.name, a.path.name, refused=a.refused) for a in applied if a.kind == KIND]
    ordered = order_candidates(cands, wanted, example_name(FLAGSHIP))
    if isinstance(ordered, str):
        say(f"{flag}: {ordered}")
        return None
    with cp.api_client() as api:
        target, skipped = choose_target(ordered, pod_wait, observe=lambda c: observe(api, c, GROUP, VERSION, PLURAL, pod_wait))
    for line in skipped:
        say(f"{flag}: skipped {line}")
    if target is None:
        say(f"{flag}: no server qualifies (admitted, with an engine pod); considered: {', '.join(c.ref for c in ordered)}")
        return None
    say(f"{flag}: attaching to {target.ref} ({target.source}), pod {target.pod}")
    return RealEngine(workdir / "real-engine", target.pod, target.ip, broken_mtp=broken, say=say)


class _Stop(Exception):
    """SIGTERM: unwind to the teardown from wherever start-up is."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="hack/dev.sh",
        description=__doc__.split("\n")[0],
        epilog="Stopping:" + __doc__.split("Stopping:", 1)[1].rstrip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--workdir", type=Path, default=None, help="where PKI, kubeconfig and logs go (default: a new temp dir)")
    ap.add_argument(
        "--gpu-nodes", type=int, default=4, help="fake 8-GPU nodes (default 4: the 2-node example takes two whole nodes)"
    )
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--kubectl", default=None, help="kubectl the banner names (hack/dev.sh passes hack/tools.sh's)")
    ap.add_argument(
        "--pod-cidr",
        default=DEV_POD_CIDR,
        help=f"kwok's pod IPs (default {DEV_POD_CIDR}; the test clusters use another range, so a "
        "test session and dev mode on one machine never give two engines the same address)",
    )
    ap.add_argument("--examples", type=Path, nargs="*", default=None, help="manifests to apply (default: examples/*.yaml)")
    ap.add_argument("--no-operator", action="store_true", help="do not start kopf")
    ap.add_argument(
        "--no-webhook", action="store_true", help="run the operator without its admission webhook (GDN_WEBHOOK_MODE='')"
    )
    ap.add_argument(
        "--no-addons",
        action="store_true",
        help="no LeaderWorkerSet controller, no Inference Extension CRDs (the scale-out examples "
        "then stay Validated=False, naming what to install)",
    )
    ap.add_argument(
        "--exit-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="tear down this many seconds after everything is up, instead of running until Ctrl-C / SIGTERM",
    )
    ap.add_argument(
        "--status-wait",
        type=float,
        default=120,
        help="seconds to wait for every example to be Ready or refused before printing status",
    )
    engine = ap.add_mutually_exclusive_group()
    engine.add_argument(
        "--real-engine",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        help="serve the trained recall model with the real vLLM CPU engine (MTP k=2) behind "
        "an engine pod of GDNModelServer NAME (name or namespace/name; default: the "
        f"flagship sample, {FLAGSHIP.relative_to(ROOT)}, else the first admitted "
        "server with a pod), with traffic (hack/dev_engine.py); exits non-zero, naming "
        "each server considered and why it was skipped, if none qualifies",
    )
    engine.add_argument(
        "--real-engine-broken-mtp",
        nargs="?",
        const="",
        default=None,
        metavar="NAME",
        help="like --real-engine, with the broken-MTP-head variant (acceptance collapses; "
        "the operator sets AcceptanceHealthy=False, SpecAcceptanceNearZero)",
    )
    args = ap.parse_args(argv)
    broken = args.real_engine_broken_mtp is not None
    wanted = args.real_engine_broken_mtp if broken else args.real_engine
    use_engine = wanted is not None

    t0 = time.monotonic()
    try:
        bins = ensure_built("full")
        addon_paths = None if args.no_addons else find_addons(build=True)
    except ControlPlaneError as e:
        print(f"dev.py: build failed: {e}", file=sys.stderr)
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gdn-dev-"))
    cp = ControlPlane(
        workdir,
        tier="full",
        gpu_nodes=args.gpu_nodes,
        gpus_per_node=args.gpus_per_node,
        binaries=bins,
        node_cpu=NODE_CPU,
        node_memory=NODE_MEMORY,
        pod_cidr=args.pod_cidr,
    )
    operator = None
    lws = None
    real_engine = None
    stopping = False

    def on_signal(signum, frame):
        if not stopping:
            raise _Stop()

    signal.signal(signal.SIGTERM, on_signal)
    rc = 0
    try:
        say(
            f"starting control plane (Kubernetes {bins.k8s_version}, etcd {bins.etcd_version}, "
            f"kwok {bins.kwok_version}) in {workdir}"
        )
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"dev.py: control plane failed to start: {e}", file=sys.stderr)
            return 1
        say(
            f"cluster ready in {cp.timings['total']:.1f}s: {cp.server}, nodes {', '.join(cp.node_names)} "
            f"({args.gpus_per_node} GPUs, {NODE_CPU} CPUs, {NODE_MEMORY} each)"
        )

        names = install_crds(cp, crd_documents())
        say(f"CRD installed: {', '.join(names)}")

        if addon_paths is not None:
            try:
                lws = LWSController(cp, addon_paths, workdir / "logs").start()
                with cp.api_client() as api:
                    gie = install_addon_crds(api, addon_paths.gie_src, GIE_CRDS)
            except ControlPlaneError as e:
                print(f"dev.py: add-ons failed to start: {e}", file=sys.stderr)
                return 1
            v = addon_paths.versions
            say(
                f"LeaderWorkerSet controller {v['LWS_VERSION']} running (log {lws.log}); "
                f"Inference Extension {v['GIE_VERSION']} CRDs: {', '.join(gie)}"
            )

        if args.no_operator:
            say("operator NOT started (--no-operator)")
        else:
            ok, where = operator_available()
            if not ok:
                # INTEGRATION POINT: the operator's kopf handlers live in gdn_operator.handlers.
                say(f"operator NOT started: {where}")
            else:
                log = workdir / "logs" / "operator.log"
                operator = start_operator(cp, log, webhook=not args.no_webhook)
                if args.no_webhook:
                    time.sleep(5)
                elif not wait_webhook(cp, operator, timeout=90) and operator.poll() is None:
                    say(f"operator's webhook not registered after 90s; last lines of {log}:")
                    print(_tail(log), flush=True)
                if operator.poll() is not None:
                    say(f"operator exited with code {operator.returncode}; last lines of {log}:")
                    print(_tail(log), flush=True)
                    operator = None
                else:
                    say(f"operator running: kopf run -m {OPERATOR_MODULE} (pid {operator.pid}, log {log})")

        paths = args.examples if args.examples is not None else default_examples()
        create_dev_volumes(cp)
        applied = apply_examples(cp, paths)
        print_status(cp, applied, wait=args.status_wait if operator else 0)

        if use_engine:
            try:
                real_engine = attach_real_engine(cp, applied, wanted or None, broken, workdir, pod_wait=60)
            except RuntimeError as e:  # the engine did not start: its log tail is in the message
                say(f"real engine failed to start: {e}")
                return 1
            if real_engine is None:
                return 1

        say("")
        say(f"export KUBECONFIG={cp.kubeconfig}")
        say(kubectl_line(args.kubectl, cp.kubeconfig))
        say(f"logs: {workdir / 'logs'}/")
        say(
            f"up in {time.monotonic() - t0:.1f}s; "
            + (
                f"tearing down in {args.exit_after:.0f}s"
                if args.exit_after is not None
                else f"Ctrl-C (or SIGTERM to pid {os.getpid()}) stops everything"
            )
        )

        deadline = None if args.exit_after is None else time.monotonic() + args.exit_after
        while deadline is None or time.monotonic() < deadline:
            if operator is not None and operator.poll() is not None:
                say(f"operator exited with code {operator.returncode}; last lines:")
                print(_tail(workdir / "logs" / "operator.log"), flush=True)
                operator = None
            if real_engine is not None and not real_engine.alive():
                say(f"real engine exited; last lines:\n{real_engine.engine.log_tail()}")
                real_engine = None
            if lws is not None and lws.proc is not None and lws.proc.poll() is not None:
                say(f"LeaderWorkerSet controller exited with code {lws.proc.returncode}; last lines:")
                print(lws.log_tail(), flush=True)
                lws = None
            dead = [n for n, alive in cp.alive().items() if not alive]
            if dead:
                say(f"component(s) died: {dead}; last lines of {dead[0]}:")
                print(cp.log_tail(dead[0]), flush=True)
                rc = 1
                break
            time.sleep(0.5)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        stopping = True
        say("stopping")
        if real_engine is not None:
            say(real_engine.describe())
            real_engine.stop()
        pids = dict(cp.pids)
        if operator is not None:
            pids["operator"] = operator.pid
            stop_process(operator)
        if lws is not None and lws.proc is not None:
            pids["lws-controller"] = lws.proc.pid
            lws.stop()
        cp.stop()
        left = [f"{n}({p})" for n, p in pids.items() if _pid_alive(p)]
        if left:
            say(f"WARNING: still running: {', '.join(left)}")
            rc = 1
        else:
            say(f"stopped {len(pids)} processes; none left behind")
    return rc


if __name__ == "__main__":
    sys.exit(main())
