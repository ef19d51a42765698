"""Operator failover on the real control plane (issue 38 item 6): two operator processes in one kopf peering
(the chart's two replicas, priorities drawn per pod), the active one SIGKILLed in the middle of a burst of
creates and updates. Measured: the time from the kill until the standby resumes (kopf's peering: the dead
replica's last keep-alive must expire, so GDN_PEERING_LIFETIME decides it) and until every server is
reconciled at its current generation. Checked: no server is left unreconciled, and none is written twice
(each engine Deployment changes at most once per generation of its server, and runs its latest spec)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from operator_harness import OperatorProcess, gms, install_crd, wait_for

ROOT = Path(__file__).resolve().parents[2]
PEERING_CRDS = ROOT / "charts" / "gdn-operator" / "crds" / "kopf.dev-peerings.yaml"


def install_peering(api, name: str) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api)
    for crd in yaml.safe_load_all(PEERING_CRDS.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        try:
            ext.create_custom_resource_definition(crd)
        except ApiException as e:
            if e.status != 409:
                raise
    co = kubernetes.client.CustomObjectsApi(api)

    def created() -> bool:
        try:
            co.create_cluster_custom_object(
                "kopf.dev",
                "v1",
                "clusterkopfpeerings",
                {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}},
            )
        except ApiException as e:
            if e.status == 404:
                return False  # the CRD is not served yet
            if e.status != 409:
                raise
        return True

    wait_for(created, 30, what="ClusterKopfPeering")


#: what kopf logs when a replica starts processing GDNModelServers (after the peers let it)
RESUMED = "Resuming the watch-stream for gdnmodelservers"


def replica(cluster, workdir: Path, peering: str, priority: int, lifetime: int) -> OperatorProcess:
    env = {"GDN_PEERING": peering, "GDN_PEERING_PRIORITY": str(priority), "GDN_PEERING_LIFETIME": str(lifetime)}
    return OperatorProcess(cluster, workdir, env=env)


def reconciled(k, ns: str, name: str) -> bool:
    obj = k.get(ns, name)
    return (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]


def log_has(proc: OperatorProcess, text: str) -> bool:
    return text in proc.log_path.read_text(errors="replace")


def deployment_generation(k, ns: str, name: str) -> int:
    return int(k.apps.read_namespaced_deployment(name, ns).metadata.generation)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("lifetime", [15])
def test_standby_takes_over_after_sigkill_mid_burst(full_cluster, kube_api, k, ns, tmp_path, lifetime):
    install_crd(kube_api)
    peering = f"gdn-failover-{uuid.uuid4().hex[:6]}"
    install_peering(kube_api, peering)
    active = replica(full_cluster, tmp_path / "active", peering, 200, lifetime).start()
    standby = replica(full_cluster, tmp_path / "standby", peering, 100, lifetime).start()
    try:
        wait_for(lambda: log_has(active, RESUMED), 60, what="the active replica runs")
        # the standby has seen the active peer: it has written its own keep-alive (kopf evaluates the peers on
        # every change of the peering object) and stays paused
        wait_for(lambda: standby.log_path.read_text(errors="replace").count("Keep-alive in") >= 2, 60, what="standby keep-alives")
        assert not log_has(standby, RESUMED)
        k.create(ns, gms("warm"))
        wait_for(lambda: reconciled(k, ns, "warm"), 60, what="the active replica reconciles")

        # the burst: creates and an update, the active replica killed in the middle of it
        names = [f"b{i}" for i in range(6)]
        for n in names[:3]:
            k.create(ns, gms(n))
        k.patch(ns, "warm", {"spec": {"maxNumSeqs": 64}})
        active.kill()
        killed = time.monotonic()
        for n in names[3:]:
            k.create(ns, gms(n))
        k.patch(ns, "b0", {"spec": {"maxNumSeqs": 32}})

        wait_for(lambda: log_has(standby, RESUMED), lifetime + 30, what="the standby resumes")
        resumed = time.monotonic() - killed
        wait_for(lambda: all(reconciled(k, ns, n) for n in ["warm", *names]), lifetime + 90, what="every server reconciled")
        settled = time.monotonic() - killed
        print(
            f"failover (lifetime {lifetime}s): standby resumed {resumed:.1f}s after SIGKILL, all servers reconciled at {settled:.1f}s"
        )
        assert resumed <= lifetime + 5, resumed  # the dead keep-alive expires within its lifetime (+ one poll)

        # never written twice: a Deployment changes at most once per generation of its server (a server the
        # killed replica had not reached yet is rendered once, at its latest spec), and runs the latest spec
        for n in ["warm", *names]:
            server_gen = k.get(ns, n)["metadata"]["generation"]
            assert 1 <= deployment_generation(k, ns, n) <= server_gen, (n, deployment_generation(k, ns, n), server_gen)
        for n, seqs in (("warm", "64"), ("b0", "32")):
            args = k.apps.read_namespaced_deployment(n, ns).spec.template.spec.containers[0].args
            assert args[args.index("--max-num-seqs") + 1] == seqs, (n, args)
    finally:
        active.kill()
        standby.stop()
