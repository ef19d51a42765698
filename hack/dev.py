#!/usr/bin/env python3
"""Dev mode: a real Kubernetes control plane with fake GPU nodes, the CRD, the operator, the examples.

    python hack/dev.py                 # build if needed, bring everything up, stay up until Ctrl-C
    python hack/dev.py --exit-after 60 # same, but tear down after 60 s (smoke test / CI)
    python hack/dev.py --no-operator   # cluster + CRD + examples only (run kopf yourself)
    python hack/dev.py --real-engine   # + the real vLLM CPU engine with the trained recall model (MTP k=2)
                                       #   behind the first example's engine pod: real acceptance in status

Steps: tests/cluster/build.sh full (cached) -> ControlPlane(tier="full") with 2 fake 8-GPU nodes
(kwok) -> CRD from `gdnctl crd` -> `kopf run -m gdn_operator.handlers` -> apply examples/*.yaml ->
print kubeconfig, a kubectl hint and each resource's status.  Ctrl-C stops every process.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))
sys.path.insert(0, str(ROOT / "operator"))

from controlplane import (  # noqa: E402
    ControlPlane,
    ControlPlaneError,
    _child_setup,
    _tail,
    ensure_built,
    free_port,
)

CACHE = Path(os.environ.get("GDN_CACHE_DIR", Path.home() / ".cache" / "gdn-operator"))
OPERATOR_MODULE = "gdn_operator.handlers"


def say(msg: str) -> None:
    print(f"[dev] {msg}", flush=True)


def crd_documents() -> list[dict]:
    """The CRD exactly as `gdnctl crd` prints it."""
    import yaml

    gdnctl = shutil.which("gdnctl", path=str(Path(sys.executable).parent)) or shutil.which("gdnctl")
    cmd = [gdnctl, "crd"] if gdnctl else [sys.executable, "-m", "gdn_operator.cli", "crd"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"dev.py: `{' '.join(cmd)}` failed: {res.stderr.strip()}")
    return [d for d in yaml.safe_load_all(res.stdout) if d]


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
                    raise SystemExit(f"dev.py: CRD {name} rejected by the apiserver: {e.body}")
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
        "run", "--standalone", "--all-namespaces", "-m", OPERATOR_MODULE,
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
    f = open(log, "ab")
    f.write(("$ " + " ".join(argv) + "\n").encode())
    f.flush()
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT, preexec_fn=_child_setup)


def stop_process(p: subprocess.Popen, grace: float = 10) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGINT)  # kopf shuts down gracefully on SIGINT
            p.wait(grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def apply_examples(cp: ControlPlane, paths: list[Path]) -> list[tuple[str, str, str, str]]:
    """Create each document; returns (apiVersion, namespace, plural, name) for custom objects."""
    import yaml
    from kubernetes import client, utils
    from kubernetes.client.rest import ApiException

    created = []
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
                name = doc.get("metadata", {}).get("name", "?")
                ns = doc.get("metadata", {}).get("namespace", "default")
                try:
                    if key in plurals:
                        group, version = key[0].split("/", 1)
                        co.create_namespaced_custom_object(group, version, ns, plurals[key], doc)
                        created.append((key[0], ns, plurals[key], name))
                    else:
                        utils.create_from_dict(api, doc, namespace=ns)
                    say(f"applied {path.name}: {doc['kind']} {ns}/{name}")
                except ApiException as e:
                    reason = e.reason
                    try:
                        import json

                        reason = json.loads(e.body).get("message", reason)
                    except Exception:
                        pass
                    say(f"REJECTED {path.name}: {doc['kind']} {ns}/{name}: {reason}")
                except utils.FailToCreateError as e:
                    say(f"REJECTED {path.name}: {doc['kind']} {ns}/{name}: {e}")
    return created


def print_status(cp: ControlPlane, objs, wait: float) -> None:
    from kubernetes import client

    deadline = time.monotonic() + wait
    with cp.api_client() as api:
        co = client.CustomObjectsApi(api)
        while True:
            rows = []
            for api_version, ns, plural, name in objs:
                group, version = api_version.split("/", 1)
                o = co.get_namespaced_custom_object(group, version, ns, plural, name)
                rows.append((f"{ns}/{name}", o.get("status") or {}))
            if all(s.get("phase") for _, s in rows) or time.monotonic() > deadline:
                break
            time.sleep(1)
        pods = client.CoreV1Api(api).list_pod_for_all_namespaces().items
    for name, st in rows:
        conds = ", ".join(f"{c.get('type')}={c.get('status')}" for c in st.get("conditions") or [])
        say(f"  {name}: phase={st.get('phase', '(no status yet)')} ready={st.get('ready', '-')}"
            + (f" [{conds}]" if conds else ""))
    for p in pods:
        say(f"  pod {p.metadata.namespace}/{p.metadata.name}: {p.status.phase} "
            f"node={p.spec.node_name} ip={p.status.pod_ip}")


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kubectl_path() -> str:
    for cand in (CACHE / "bin" / "kubectl-layer-v35-2.2.2" / "kubectl",):
        if cand.is_file():
            return str(cand)
    return "kubectl  # (hack/tools.sh installs kubectl v1.35.2)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where PKI, kubeconfig and logs go (default: a new temp dir)")
    ap.add_argument("--gpu-nodes", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--examples", type=Path, nargs="*", default=None,
                    help="manifests to apply (default: examples/*.yaml)")
    ap.add_argument("--no-operator", action="store_true", help="do not start kopf")
    ap.add_argument("--no-webhook", action="store_true",
                    help="run the operator without its admission webhook (GDN_WEBHOOK_MODE='')")
    ap.add_argument("--exit-after", type=float, default=None, metavar="SECONDS",
                    help="tear down after this many seconds instead of waiting for Ctrl-C")
    ap.add_argument("--status-wait", type=float, default=20,
                    help="seconds to wait for the examples to get a status.phase")
    ap.add_argument("--real-engine", action="store_true",
                    help="serve the trained recall model with the real vLLM CPU engine (MTP k=2) behind "
                         "the first example's first engine pod, with traffic (hack/dev_engine.py)")
    ap.add_argument("--real-engine-broken-mtp", action="store_true",
                    help="like --real-engine, with the broken-MTP-head variant (acceptance collapses)")
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    try:
        bins = ensure_built("full")
    except ControlPlaneError as e:
        print(f"dev.py: build failed: {e}", file=sys.stderr)
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gdn-dev-"))
    cp = ControlPlane(workdir, tier="full", gpu_nodes=args.gpu_nodes,
                      gpus_per_node=args.gpus_per_node, binaries=bins)
    operator = None
    real_engine = None
    stop_requested = False

    def on_signal(signum, frame):
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, on_signal)
    try:
        say(f"starting control plane (Kubernetes {bins.k8s_version}, etcd {bins.etcd_version}, "
            f"kwok {bins.kwok_version}) in {workdir}")
        try:
            cp.start()
        except ControlPlaneError as e:
            print(f"dev.py: control plane failed to start: {e}", file=sys.stderr)
            return 1
        say(f"cluster ready in {cp.timings['total']:.1f}s: {cp.server}, nodes {', '.join(cp.node_names)}")

        names = install_crds(cp, crd_documents())
        say(f"CRD installed: {', '.join(names)}")

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
                time.sleep(5)
                if operator.poll() is not None:
                    say(f"operator exited with code {operator.returncode}; last lines of {log}:")
                    print(_tail(log), flush=True)
                    operator = None
                else:
                    say(f"operator running: kopf run -m {OPERATOR_MODULE} (pid {operator.pid}, log {log})")

        paths = args.examples if args.examples is not None else sorted((ROOT / "examples").glob("*.yaml"))
        objs = apply_examples(cp, paths)
        print_status(cp, objs, wait=args.status_wait if operator else 0)

        if args.real_engine or args.real_engine_broken_mtp:
            from dev_engine import RealEngine, engine_pod_ip

            served = [o for o in objs if o[2] == "gdnmodelservers"]
            if not served:
                say("--real-engine: no GDNModelServer was created; no engine started")
            else:
                _, ns, _, name = served[0]
                with cp.api_client() as api:
                    pod, ip = engine_pod_ip(api, ns, name)
                real_engine = RealEngine(workdir / "real-engine", pod, ip,
                                         broken_mtp=args.real_engine_broken_mtp, say=say)

        say("")
        say(f"export KUBECONFIG={cp.kubeconfig}")
        say(f"{kubectl_path()} get gdnmodelservers -A")
        say(f"logs: {workdir / 'logs'}/")
        say(f"up in {time.monotonic() - t0:.1f}s; "
            + (f"tearing down in {args.exit_after:.0f}s" if args.exit_after is not None
               else "press Ctrl-C to stop"))

        deadline = None if args.exit_after is None else time.monotonic() + args.exit_after
        while not stop_requested and (deadline is None or time.monotonic() < deadline):
            if operator is not None and operator.poll() is not None:
                say(f"operator exited with code {operator.returncode}; last lines:")
                print(_tail(workdir / "logs" / "operator.log"), flush=True)
                operator = None
            if real_engine is not None and not real_engine.alive():
                say(f"real engine exited; last lines:\n{real_engine.engine.log_tail()}")
                real_engine = None
            dead = [n for n, alive in cp.alive().items() if not alive]
            if dead:
                say(f"component(s) died: {dead}; last lines of {dead[0]}:")
                print(cp.log_tail(dead[0]), flush=True)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        say("stopping")
        if real_engine is not None:
            say(real_engine.describe())
            real_engine.stop()
        pids = dict(cp.pids)
        if operator is not None:
            pids["operator"] = operator.pid
            stop_process(operator)
        cp.stop()
        left = [f"{n}({p})" for n, p in pids.items() if _pid_alive(p)]
        if left:
            say(f"WARNING: still running: {', '.join(left)}")
            return 1
        say(f"stopped {len(pids)} processes; none left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
