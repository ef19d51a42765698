"""The chart against the REAL API server (tests/cluster control plane).

1. Every value set's rendered manifests are accepted by `kubectl apply --dry-run=server` (minimal
   Prometheus-Operator and cert-manager CRDs are installed first, so their kinds are validated too).
2. `helm install` into the full cluster; then the operator runs locally AS the chart's ServiceAccount
   (TokenRequest token) with the chart's own command and environment, two replicas with kopf peering:
   it reconciles a GDNModelServer (Deployment + status), its webhook denies a known-bad config, exactly
   one replica is active, the standby takes over, and no API call is forbidden. `helm upgrade` keeps
   the CRD current.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from operator_harness import free_port, wait_for  # noqa: E402  (shared test helpers)
from builders import GMS  # noqa: E402

from _chart_helpers import CHART, GENERATED_CRD, ROOT, VALUE_SETS, docs, helm, render_text, value_args

# Minimal stand-ins for the CRDs of kinds the chart can create but this cluster does not ship.
FOREIGN_CRDS = [
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "PodMonitor", "podmonitors"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules"),
    ("cert-manager.io", "Certificate", "certificates"),
    ("cert-manager.io", "Issuer", "issuers"),
]


def _crd(group: str, kind: str, plural: str) -> dict:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": kind + "List"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


def kubectl(cp, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    from _chart_helpers import tools

    res = subprocess.run(
        [tools()["kubectl"], "--kubeconfig", str(cp.kubeconfig), *args], input=input, capture_output=True, text=True
    )
    if check and res.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{res.stdout}\n{res.stderr}")
    return res


def apply_crds(cp, objs: list[dict]) -> None:
    if not objs:
        return
    kubectl(
        cp,
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager",
        "chart-tests",
        "-f",
        "-",
        input=yaml.safe_dump_all(objs),
    )
    for o in objs:
        kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", f"crd/{o['metadata']['name']}")


@pytest.fixture(scope="module")
def foreign_crds(control_plane):
    apply_crds(control_plane, [_crd(*c) for c in FOREIGN_CRDS])
    for ns in ("gdn-system", "team-a", "team-b"):
        kubectl(control_plane, "create", "namespace", ns, check=False)
    return control_plane


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_rendered_manifests_pass_server_side_dry_run(chart_tools, foreign_crds, name):
    cp = foreign_crds
    objs = docs(render_text(VALUE_SETS[name], include_crds=True))
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"]
    # `helm test` hooks (templates/tests/) are not installed; their pod's ServiceAccount exists only while it runs
    rest = [
        o
        for o in objs
        if o["kind"] != "CustomResourceDefinition" and "helm.sh/hook" not in ((o.get("metadata") or {}).get("annotations") or {})
    ]
    # CRDs for real (their kinds must exist for the dry run of the objects using them) ...
    apply_crds(cp, crds)
    kubectl(cp, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(crds))
    # ... everything else as a server-side dry run: schema, defaulting, admission, RBAC escalation
    res = kubectl(cp, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(rest))
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == len(rest), res.stdout
    assert all("(server dry run)" in ln for ln in lines), res.stdout


def test_server_dry_run_rejects_a_broken_manifest(chart_tools, foreign_crds):
    """Guard: the dry run validates for real (a wrong type in the pod spec is refused)."""
    objs = docs(render_text())
    dep = next(o for o in objs if o["kind"] == "Deployment")
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] = "ALL"
    res = kubectl(foreign_crds, "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(dep), check=False)
    assert res.returncode != 0 and "drop" in res.stderr


# ---------------------------------------------------------------------------------------------------
# helm install + the operator as the chart's ServiceAccount
# ---------------------------------------------------------------------------------------------------


class LocalReplica:
    """One operator replica run locally with the chart's command + env, authenticated by the SA token."""

    def __init__(self, deployment: dict, namespace: str, pod_id: str, kubeconfig: Path, workdir: Path, webhook_port: int):
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        cmd = list(c["command"])
        assert cmd == ["gdn-operator"], cmd
        self.argv = [sys.executable, "-m", "gdn_operator"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBERNETES_", "GDN_"))}
        for e in c["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
        env.update(
            POD_NAMESPACE=namespace,
            POD_ID=pod_id,
            KUBECONFIG=str(kubeconfig),
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        self.liveness = free_port()
        # in-cluster the webhook is reached through the Service; here the API server calls us directly
        # on one port that all replicas bind (SO_REUSEPORT), like the Service in front of the pods
        env.update(
            GDN_WEBHOOK_MODE="local",
            GDN_WEBHOOK_ADDR="127.0.0.1",
            GDN_WEBHOOK_HOST="127.0.0.1",
            GDN_WEBHOOK_PORT=str(webhook_port),
            GDN_METRICS_PORT=str(free_port()),
            GDN_LIVENESS=f"http://127.0.0.1:{self.liveness}/healthz",
            GDN_LOG_LEVEL="DEBUG",
        )
        self.env, self.pod_id = env, pod_id
        self.log = workdir / f"{pod_id}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> LocalReplica:
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=str(ROOT)
            )
        wait_for(self.alive, 90, what=f"liveness of {self.pod_id} (log {self.log})")
        # ready as the chart's readinessProbe has it: its webhook port listens (the webhook front, after kopf started;
        # here the port is shared, so its log says so)
        wait_for(lambda: "webhook front (pid" in self.text(), 60, what=f"{self.pod_id}: its webhook front listening")
        return self

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.pod_id} exited {self.proc.returncode}:\n{self.text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _can(
    api: client.ApiClient,
    ns: str | None,
    verb: str,
    resource: str,
    group: str = "",
    name: str | None = None,
    sub: str | None = None,
) -> bool:
    r = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "namespace": ns,
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "name": name,
                    "subresource": sub,
                }
            }
        }
    )
    return r.status.allowed


def test_helm_install_and_operator_runs_as_chart_service_account(chart_tools, full_cluster, tmp_path):
    cp = full_cluster
    kc = str(cp.kubeconfig)
    suffix = uuid.uuid4().hex[:5]
    rel, rel_ns, watched = f"gdnc{suffix}", f"gdn-chart-{suffix}", f"chart-ml-{suffix}"
    cfg_name = f"gdn-chart-{suffix}.serving.gdn-operator.io"
    admin = cp.api_client()
    core, apps, co = client.CoreV1Api(admin), client.AppsV1Api(admin), client.CustomObjectsApi(admin)
    core.create_namespace({"metadata": {"name": watched}})
    sets = {"operator.watchNamespaces": [watched], "webhook.configName": cfg_name}

    # An "old" chart whose CRD differs (stands in for the previous release), to prove upgrades apply it.
    old_chart = tmp_path / "old-chart"
    shutil.copytree(CHART, old_chart)
    old_crd = yaml.safe_load(GENERATED_CRD.read_text())
    old_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "OLD CRD from the previous chart"
    (old_chart / "files" / "crds" / GENERATED_CRD.name).write_text(yaml.safe_dump(old_crd))

    replicas: list[LocalReplica] = []
    try:
        helm(
            "install",
            rel,
            str(old_chart),
            "-n",
            rel_ns,
            "--create-namespace",
            "--take-ownership",
            "--force-conflicts",
            *value_args(sets=sets),
            kubeconfig=kc,
        )
        ext = client.ApiextensionsV1Api(admin)
        crd_name = old_crd["metadata"]["name"]

        def crd_description():
            c = admin.sanitize_for_serialization(ext.read_custom_resource_definition(crd_name))
            return c["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("description")

        assert crd_description() == "OLD CRD from the previous chart"
        helm("upgrade", rel, str(CHART), "-n", rel_ns, "--force-conflicts", *value_args(sets=sets), kubeconfig=kc)
        want = yaml.safe_load(GENERATED_CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"].get("description")
        assert crd_description() == want, "helm upgrade did not apply the current CRD"
        live = admin.sanitize_for_serialization(ext.read_custom_resource_definition(crd_name))
        assert live["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

        manifest = docs(helm("get", "manifest", rel, "-n", rel_ns, kubeconfig=kc).stdout)
        dep = next(o for o in manifest if o["kind"] == "Deployment")
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]

        # -- the SA's token, and what it may (not) do -----------------------------------------------
        token = cp.create_token(rel_ns, sa)
        sa_kc = cp.write_token_kubeconfig(token, tmp_path / "sa.kubeconfig")
        sa_api = cp.api_client(token=token)
        secret = next(
            e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "GDN_WEBHOOK_SECRET"
        )
        wait_for(lambda: _can(sa_api, watched, "create", "deployments", "apps"), 20, what="RBAC for the SA")
        assert _can(sa_api, watched, "get", "pods", sub="log")
        assert _can(sa_api, watched, "delete", "pods")  # the stall detector's restart (handlers/engines/stall.py)
        assert _can(sa_api, rel_ns, "update", "secrets", name=secret)
        for ns, verb, res, grp, name in [
            (watched, "delete", "deployments", "apps", None),
            (watched, "create", "pods", "", None),
            (watched, "get", "secrets", "", None),
            (rel_ns, "get", "secrets", "", "someone-elses"),
            ("default", "create", "deployments", "apps", None),  # not a watched namespace
            (None, "patch", "validatingwebhookconfigurations", "admissionregistration.k8s.io", "other-webhooks"),
            (watched, "update", "gdnmodelservers", "serving.gdn-operator.io", None),
        ]:
            assert not _can(sa_api, ns, verb, res, grp, name), f"SA may {verb} {res} {name or ''} in {ns}"

        # -- the self-signed webhook Secret path (handlers/webhook/certs.py) as the SA -------------------------
        prog = (
            "import sys; from gdn_operator.handlers.webhook import certs; "
            "b = certs.ensure_secret_bundle(sys.argv[1], sys.argv[2], sys.argv[3:]); print(b.ca_pem.decode().splitlines()[1])"
        )
        env = {**os.environ, "KUBECONFIG": str(sa_kc), "NO_PROXY": "127.0.0.1"}
        sans = [f"x.{rel_ns}.svc"]
        runs = [
            subprocess.run(
                [sys.executable, "-c", prog, rel_ns, secret, *s], capture_output=True, text=True, env=env, cwd=str(ROOT)
            )
            for s in (sans, sans, sans + [f"y.{rel_ns}.svc"])
        ]  # create, read, renew (update)
        for r in runs:
            assert r.returncode == 0, r.stderr[-3000:]
        assert runs[0].stdout == runs[1].stdout == runs[2].stdout, "CA must survive reads and renewals"

        # -- two replicas, kopf peering ---------------------------------------------------------------
        webhook_port = free_port()
        for i in range(2):
            replicas.append(LocalReplica(dep, rel_ns, f"{rel}-replica-{i}", sa_kc, tmp_path, webhook_port).start())
        peering_name = next(
            e["value"] for e in dep["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "GDN_PEERING"
        )

        def peers():
            obj = co.get_namespaced_custom_object("kopf.dev", "v1", watched, "kopfpeerings", peering_name)
            st = obj.get("status") or {}
            return st if {r.pod_id for r in replicas} <= set(st) else None

        status = wait_for(peers, 60, what="both replicas in the KopfPeering")
        prios = {pid: status[pid]["priority"] for pid in (r.pod_id for r in replicas)}
        assert len(set(prios.values())) == 2, f"replicas must draw distinct priorities: {prios}"
        active = max(replicas, key=lambda r: prios[r.pod_id])
        standby = next(r for r in replicas if r is not active)
        # kopf starts every replica paused; the first one alone resumes, and pauses again "in favour of"
        # a later one with a higher priority: in the end only the highest priority is active.
        resumed, paused = "Resuming operations after the pause", "Pausing operations in favour of"

        def is_active(r: LocalReplica) -> bool:
            t = r.text()
            return t.rfind(resumed) > t.rfind(paused)

        wait_for(lambda: is_active(active) and not is_active(standby), 60, what="exactly one active replica")

        # -- reconcile: GDNModelServer -> Deployment + status -----------------------------------------
        co.create_namespaced_custom_object(
            "serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", GMS("qwen-a", namespace=None).small().obj()
        )
        wait_for(lambda: apps.read_namespaced_deployment("qwen-a", watched), 60, what="engine Deployment")

        def validated(name):
            st = (
                co.get_namespaced_custom_object("serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", name).get(
                    "status"
                )
                or {}
            )
            return next((c for c in st.get("conditions", []) if c["type"] == "Validated" and c["status"] == "True"), None)

        wait_for(lambda: validated("qwen-a"), 60, what="Validated=True")
        wait_for(
            lambda: (
                co.get_namespaced_custom_object("serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", "qwen-a")
                .get("status", {})
                .get("readyReplicas")
                == 1
            ),
            90,
            what="readyReplicas=1 (kwok engine pod)",
        )
        if any(c.metadata.name == "podmonitors.monitoring.coreos.com" for c in ext.list_custom_resource_definition().items):
            wait_for(
                lambda: co.get_namespaced_custom_object("monitoring.coreos.com", "v1", watched, "podmonitors", "qwen-a"),
                30,
                what="per-server PodMonitor",
            )

        # Positive evidence that the standby cannot see qwen-a (instead of a fixed sleep): its own log says
        # its watch-stream of GDNModelServers is paused (kopf logs it at DEBUG when the peering pauses it,
        # and "Resuming the watch-stream" if it ever watches again); only then assert that it did nothing.
        watch = "the watch-stream for gdnmodelservers."

        def watch_paused(r: LocalReplica) -> bool:
            t = r.text()
            return t.rfind(f"Pausing {watch}") > t.rfind(f"Resuming {watch}")

        wait_for(lambda: watch_paused(standby), 60, what=f"{standby.pod_id}: 'Pausing {watch}' in its log")
        assert not watch_paused(active), "the active replica must be watching GDNModelServers"
        assert is_active(active) and not is_active(standby), "the lower-priority replica must stay paused"
        since_pause = standby.text()
        since_pause = since_pause[since_pause.rfind(paused) :] if paused in since_pause else since_pause
        assert "reconciled: applied" in active.text(), "the active replica reconciles"
        assert "reconciled" not in since_pause, "the paused replica must not reconcile"

        # -- admission through the chart's webhook configurations (pointed at the replicas) -----------
        # the chart ships them complete; the operator (GDN_WEBHOOK_CONFIGS=shipped from the chart's env)
        # patches only clientConfig: here the local replicas' URL and CA instead of the Service
        adm = client.AdmissionregistrationV1Api(admin)
        # (the chart ships the MutatingWebhookConfiguration only with operator.mutateSpec, off here)
        read = adm.read_validating_webhook_configuration
        wait_for(
            lambda: all(h.client_config.url and h.client_config.ca_bundle for h in read(cfg_name).webhooks),
            60,
            what="webhooks pointed at the replicas",
        )
        bad = (
            GMS("qwen-bad", namespace=None)
            .small()
            .update(
                image={"repository": "vllm/vllm-openai", "tag": "v0.28.0", "vllmVersion": "0.28.0"},
                prefixCaching=True,
                admissionPolicy="reject",
            )
            .obj()
        )
        with pytest.raises(ApiException) as e:
            co.create_namespaced_custom_object("serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", bad)
        assert e.value.status in (403, 422) and "43559" in e.value.body, e.value.body

        # -- failover: the active replica stops, the standby takes over --------------------------------
        active.stop()
        wait_for(lambda: is_active(standby), 90, what="the standby to resume")
        co.create_namespaced_custom_object(
            "serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", GMS("qwen-b", namespace=None).small().obj()
        )
        wait_for(lambda: apps.read_namespaced_deployment("qwen-b", watched), 60, what="Deployment from the former standby")
        wait_for(lambda: validated("qwen-b"), 60, what="Validated=True from the former standby")

        # -- no API call was forbidden ------------------------------------------------------------------
        for r in replicas:
            t = r.text()
            for needle in ("Forbidden", "Not enough permissions", "(403)", " 403 "):
                assert needle not in t, (
                    f"{r.pod_id}: {needle!r} in the operator log:\n"
                    + "\n".join(ln for ln in t.splitlines() if needle in ln)[:4000]
                )

        # clean up the servers while an operator still runs (it owns their finalizers)
        for n in ("qwen-a", "qwen-b"):
            co.delete_namespaced_custom_object("serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", n)
        for n in ("qwen-a", "qwen-b"):
            wait_for(
                lambda n=n: (
                    not co.list_namespaced_custom_object(
                        "serving.gdn-operator.io", "v1alpha1", watched, "gdnmodelservers", field_selector=f"metadata.name={n}"
                    )["items"]
                ),
                60,
                what=f"{n} deleted",
            )
    finally:
        for r in replicas:
            r.stop()
        helm("uninstall", rel, "-n", rel_ns, kubeconfig=kc, check=False)
        for ns in (watched, rel_ns):
            try:
                core.delete_namespace(ns)
            except ApiException:
                pass
        admin.close()
    # uninstall removed the webhook configurations the chart owns, and kept the CRD
    adm = client.AdmissionregistrationV1Api(cp.api_client())
    with pytest.raises(ApiException) as e:
        adm.read_validating_webhook_configuration(cfg_name)
    assert e.value.status == 404
    client.ApiextensionsV1Api(cp.api_client()).read_custom_resource_definition(crd_name)
