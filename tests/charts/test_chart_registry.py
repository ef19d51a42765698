"""The install path from a registry (issue 39), on the real control plane and a real OCI registry
(`crane registry serve`, built from the Go module proxy by tests/cluster/build.sh release).

1. README's first install command (`helm install ... oci://ghcr.io/gdn-operator/charts/gdn-operator --version X`),
   read from README.md, with only the registry host pointed at the local registry (and --plain-http: it serves
   HTTP), after hack/release/chart.sh pushed this checkout's chart there: the release is deployed, the CRD and
   the webhook configurations exist.
2. The upgrade path: the previous release's chart (hack/release/previous.yaml: its version and commit; the chart
   taken from git history) is pushed too and installed from the registry; the operator runs as the chart's
   ServiceAccount with the chart's command and environment (test_chart_cluster.LocalReplica); once its webhook
   answers, an example from examples/ is applied and becomes Ready. `helm upgrade --version <this checkout>`
   from the registry then keeps the server (same uid, generation, spec) and its status, applies this checkout's
   CRD, and the operator of the upgraded chart keeps serving it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from readme_commands import readme_commands
from test_chart_cluster import LocalReplica, free_port, wait_for

from _chart_helpers import CHART, GENERATED_CRD, ROOT, docs, helm, value_args
from controlplane import ControlPlane, ControlPlaneError, ensure_built

GROUP, VERSION, PLURAL = "serving.gdn-operator.io", "v1alpha1", "gdnmodelservers"
PREVIOUS = yaml.safe_load((ROOT / "hack" / "release" / "previous.yaml").read_text())
EXAMPLE = ROOT / "examples" / "qwen3.5-27b-mtp.yaml"
OCI = re.compile(r"oci://ghcr\.io/gdn-operator/charts/gdn-operator")

pytestmark = [pytest.mark.tools]


def chart_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])


def push(chart: Path, registry: str, helm_bin: str, out: Path) -> str:
    env = {"HELM": helm_bin, "CHART_DIR": str(chart), "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        ["bash", str(ROOT / "hack" / "release" / "chart.sh"), "push", str(out), registry, "--plain-http"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def previous_chart(dest: Path) -> Path:
    """The previous release's chart, from git history (hack/release/previous.yaml)."""
    archive = dest / "previous.tar"
    res = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), PREVIOUS["commit"], "charts/gdn-operator"],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, f"the previous release's commit {PREVIOUS['commit']} is not in git history: {res.stderr}"
    with tarfile.open(archive) as t:
        t.extractall(dest, filter="data")
    chart = dest / "charts" / "gdn-operator"
    assert chart_version(chart) == str(PREVIOUS["version"])
    return chart


def readme_install_line() -> str:
    lines = [raw for raw in readme_commands().values() if OCI.search(raw) and raw.startswith("helm install")]
    assert lines, "README.md has no `helm install ... oci://ghcr.io/gdn-operator/charts/gdn-operator` command"
    return lines[0]


def test_readme_first_install_command_is_the_registry_one():
    text = (ROOT / "README.md").read_text()
    first = next(m for m in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M))
    assert first.group(1).strip() == readme_install_line(), "README's first command must be the registry install"
    assert text.index("## Install") < text.index("## Set-up on a fresh machine")
    words = shlex.split(readme_install_line())
    assert words[words.index("--version") + 1] == chart_version(CHART), "README pins another version than Chart.yaml"


@pytest.mark.cluster  # a control plane of its own (not through the session fixtures, which mark by themselves)
@pytest.mark.timeout(420)
@pytest.mark.readme(
    "helm install gdn-operator oci://ghcr.io/gdn-operator/charts/gdn-operator --version 0.2.0 -n gdn-system --create-namespace"
)
def test_readme_registry_install_on_the_real_control_plane(chart_tools, oci_registry, tmp_path):
    # A control plane of its own (as tests/charts/test_chart_readme.py): the session's clusters hold the CRD
    # already (applied by other tests, without helm's ownership labels), which a user's clean cluster never does.
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1: real control-plane tests disabled")
    ref = push(CHART, oci_registry.host, chart_tools["helm"], tmp_path / "dist")
    assert ref.startswith(f"{oci_registry.host}/charts/gdn-operator:{chart_version(CHART)}@sha256:")
    line = readme_install_line()
    argv = [w.replace("oci://ghcr.io/gdn-operator", f"oci://{oci_registry.host}") for w in shlex.split(line)]
    assert argv[:3] == ["helm", "install", "gdn-operator"]
    rel_ns = argv[argv.index("-n") + 1]
    try:
        cp = ControlPlane(tmp_path / "cp", tier="core", binaries=ensure_built("core")).start()
    except ControlPlaneError as e:
        pytest.fail(f"starting the core control plane failed: {e}", pytrace=False)
    try:
        res = subprocess.run(
            [chart_tools["helm"], *argv[1:], "--plain-http", "--kubeconfig", str(cp.kubeconfig)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        assert "STATUS: deployed" in res.stdout and f"gdn-operator {chart_version(CHART)} is installed" in res.stdout
        # NOTES send the newcomer to this release's examples (stock images), not to a clone
        assert f"gdn-operator/v{chart_version(CHART)}/examples/qwen3.5-27b-mtp.yaml" in res.stdout, res.stdout
        with cp.api_client() as api:
            dep = client.AppsV1Api(api).read_namespaced_deployment("gdn-operator", rel_ns)
            (c,) = dep.spec.template.spec.containers
            assert c.image == f"ghcr.io/gdn-operator/gdn-operator:{chart_version(CHART)}", c.image
            client.ApiextensionsV1Api(api).read_custom_resource_definition(f"{PLURAL}.{GROUP}")
            names = [
                w.metadata.name for w in client.AdmissionregistrationV1Api(api).list_validating_webhook_configuration().items
            ]
            assert any("gdn-operator" in n for n in names), names
    finally:
        cp.stop()


@pytest.mark.timeout(600)
@pytest.mark.readme("helm upgrade gdn-operator oci://ghcr.io/gdn-operator/charts/gdn-operator --version X.Y.Z -n gdn-system")
def test_helm_upgrade_from_the_previous_release_in_the_registry_keeps_every_server(
    chart_tools, full_cluster, oci_registry, tmp_path
):
    cp = full_cluster
    kc = str(cp.kubeconfig)
    old = previous_chart(tmp_path)
    old_v, new_v = chart_version(old), chart_version(CHART)
    assert old_v != new_v, "the previous release must have another version than this checkout"
    push(old, oci_registry.host, chart_tools["helm"], tmp_path / "dist-old")
    push(CHART, oci_registry.host, chart_tools["helm"], tmp_path / "dist-new")
    res = subprocess.run(
        [oci_registry.crane, "ls", "--insecure", f"{oci_registry.host}/charts/gdn-operator"], capture_output=True, text=True
    )
    assert sorted(res.stdout.split()) == sorted([old_v, new_v]), res.stdout + res.stderr

    suffix = uuid.uuid4().hex[:5]
    rel, rel_ns, watched = f"gdnr{suffix}", f"gdn-reg-{suffix}", f"reg-ml-{suffix}"
    cfg_name = f"gdn-reg-{suffix}.{GROUP}"
    admin = cp.api_client()
    core, co = client.CoreV1Api(admin), client.CustomObjectsApi(admin)
    adm, ext = client.AdmissionregistrationV1Api(admin), client.ApiextensionsV1Api(admin)
    core.create_namespace({"metadata": {"name": watched}})
    sets = value_args(sets={"operator.watchNamespaces": [watched], "webhook.configName": cfg_name})
    oci = f"oci://{oci_registry.host}/charts/gdn-operator"
    webhook_port = free_port()
    replica: LocalReplica | None = None

    def manifest_deployment() -> dict:
        return next(
            o for o in docs(helm("get", "manifest", rel, "-n", rel_ns, kubeconfig=kc).stdout) if o["kind"] == "Deployment"
        )

    def start_operator(n: int) -> LocalReplica:
        dep = manifest_deployment()
        sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        token = cp.create_token(rel_ns, sa)
        sa_kc = cp.write_token_kubeconfig(token, tmp_path / f"sa-{n}.kubeconfig")
        r = LocalReplica(dep, rel_ns, f"{rel}-{n}", sa_kc, tmp_path, webhook_port).start()
        # the validating configuration (the mutating one ships only with operator.mutateSpec, off here)
        wait_for(
            lambda: all(
                h.client_config.url and h.client_config.ca_bundle
                for h in adm.read_validating_webhook_configuration(cfg_name).webhooks
            ),
            60,
            what="the webhook configurations pointed at the operator",
        )
        return r

    def listed() -> tuple[str, str, str, str]:
        (r,) = json.loads(helm("list", "-n", rel_ns, "-o", "json", kubeconfig=kc).stdout)
        return r["chart"], r["app_version"], str(r["revision"]), r["status"]

    def server() -> dict:
        return co.get_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, name)

    def conds(obj: dict) -> dict[str, tuple[str, str]]:
        return {c["type"]: (c["status"], c.get("reason", "")) for c in (obj.get("status") or {}).get("conditions", [])}

    def core_conds(obj: dict) -> dict[str, tuple[str, str, str]]:
        return {
            c["type"]: (c["status"], c.get("reason", ""), c["lastTransitionTime"])
            for c in (obj.get("status") or {}).get("conditions", [])
        }

    def ready_server(replicas: int) -> dict | None:
        o = server()
        ok = conds(o).get("Ready", ("",))[0] == "True" and (o.get("status") or {}).get("readyReplicas") == replicas
        return o if ok else None

    body = yaml.safe_load(EXAMPLE.read_text())
    name = body["metadata"]["name"]
    body["metadata"]["namespace"] = watched
    try:
        helm("install", rel, oci, "--version", old_v, "--plain-http", "-n", rel_ns, "--create-namespace",
             "--take-ownership", "--force-conflicts", *sets, kubeconfig=kc)  # fmt: skip
        assert listed() == (f"gdn-operator-{old_v}", old_v, "1", "deployed")
        replica = start_operator(1)
        # the previous chart ships a MutatingWebhookConfiguration whatever operator.mutateSpec says; this checkout's
        # operator serves the mutating webhook only with it (off here), and its chart then ships none: the unserved
        # configuration (failurePolicy Fail) would refuse every write, so it goes, as the upgrade below removes it
        try:
            adm.delete_mutating_webhook_configuration(cfg_name)
        except ApiException as e:
            if e.status != 404:  # a previous chart that did not ship it
                raise

        def unserved_hook_gone() -> bool:
            """kube-apiserver drops a deleted webhook configuration from its admission cache a moment later (a
            loaded run once still called it): a dry-run create calls the webhooks too, and writes nothing."""
            try:
                co.create_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, body, dry_run="All")
            except ApiException as e:
                if e.status == 500 and "gdn-mitigate" in str(e.body):
                    return False
                raise
            return True

        wait_for(unserved_hook_gone, 30, what="the API server to stop calling the deleted mutating webhook")
        co.create_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, body)
        before = wait_for(lambda: ready_server(replicas=1), 120, what=f"{EXAMPLE.name} Ready under the {old_v} chart")
        assert conds(before)["Validated"][0] == "True"

        # -- helm upgrade to this checkout's chart, from the registry -----------------------------------
        # A rolling upgrade replaces the operator pod: stop this one first. In-cluster the operator patches only the
        # caBundle of the chart's webhook configurations (clientConfig.service stays); the local replica here points
        # them at a URL instead (GDN_WEBHOOK_MODE=local), which the chart's service entry cannot be merged with, so
        # they go back to what in-cluster mode leaves: the configurations as the chart made them (helm recreates
        # them, and the upgraded chart's operator points them at itself again).
        replica.stop()
        adm.delete_validating_webhook_configuration(cfg_name)  # (no mutating one: operator.mutateSpec is off)
        # --take-ownership: CRDs are cluster-wide and kept on uninstall (helm.sh/resource-policy: keep), so a CRD this
        # release adds (gdnguards, new in 0.2.0) may already exist, owned by another release on the same cluster (here:
        # test_chart_cluster's); an operator re-installing after an uninstall meets the same, and the chart's README says so
        res = helm("upgrade", rel, oci, "--version", new_v, "--plain-http", "-n", rel_ns, "--take-ownership",
                   "--force-conflicts", *sets, kubeconfig=kc)  # fmt: skip
        assert "has been upgraded" in res.stdout, res.stdout
        assert listed() == (f"gdn-operator-{new_v}", new_v, "2", "deployed")
        crd = admin.sanitize_for_serialization(ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}"))
        want = yaml.safe_load(GENERATED_CRD.read_text())

        def schema(c: dict) -> dict:
            return c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]

        assert schema(crd).get("description") == schema(want).get("description")
        assert set(schema(crd)["properties"]["spec"]["properties"]) == set(schema(want)["properties"]["spec"]["properties"]), (
            "helm upgrade did not apply this checkout's CRD"
        )
        assert crd["status"]["storedVersions"] == [VERSION]

        # the operator of the upgraded chart takes over (its command and environment)
        replica = start_operator(2)
        # positive evidence that it resumed the server: it wrote its status and found nothing to change
        wait_for(
            lambda: f"status written {watched}/{name}" in replica.text() and "reconciled: unchanged" in replica.text(),
            90,
            what=f"the upgraded chart's operator to resume {name} (log {replica.log})",
        )
        after = wait_for(lambda: ready_server(replicas=1), 60, what="Ready after the upgrade")
        assert after["metadata"]["uid"] == before["metadata"]["uid"], "the server was recreated"
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
        assert after["spec"] == before["spec"], "the upgrade changed the user's spec"
        kept = ("Validated", "Ready", "Progressing", "Overridden")
        assert {t: core_conds(after)[t] for t in kept} == {t: core_conds(before)[t] for t in kept}, (
            "status conditions (and their transition times) changed across the upgrade"
        )
        # what the server runs is unchanged; a release may add what it reports about it (0.2.0: each default's
        # measured cost, status.effective.defaults[].cost; the CUDA-graph implementation vLLM resolves,
        # status.effective.cudagraphImplementation), never change or drop what was there
        eff_before, eff_after = before["status"]["effective"], after["status"]["effective"]
        assert {k: eff_after.get(k) for k in eff_before if k != "defaults"} == {
            k: v for k, v in eff_before.items() if k != "defaults"
        }
        assert set(eff_after) - set(eff_before) <= {"cudagraphImplementation"}, sorted(set(eff_after) - set(eff_before))
        assert len(eff_after["defaults"]) == len(eff_before["defaults"])
        for old_d, new_d in zip(eff_before["defaults"], eff_after["defaults"], strict=True):
            assert {k: new_d[k] for k in old_d} == old_d, (old_d, new_d)
            assert set(new_d) - set(old_d) <= {"cost"} and new_d.get("cost"), new_d
        assert after["status"].get("readyReplicas") == 1

        co.delete_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, name)
        wait_for(
            lambda: (
                not co.list_namespaced_custom_object(GROUP, VERSION, watched, PLURAL, field_selector=f"metadata.name={name}")[
                    "items"
                ]
            ),
            60,
            what=f"{name} deleted",
        )
    finally:
        if replica is not None:
            replica.stop()
        helm("uninstall", rel, "-n", rel_ns, kubeconfig=kc, check=False)
        for ns in (watched, rel_ns):
            try:
                core.delete_namespace(ns)
            except ApiException:
                pass
        admin.close()
