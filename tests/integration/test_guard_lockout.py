"""A deny guard cannot lock a cluster out (issue 48), through the real API server: with the operator down, the pods
of a guarded running workload are still replaced (the API server never calls the webhook for them: they are judged
through their workload), a bare guarded pod is still refused (deny is never skipped), and the documented break-glass
lets it through. Its own module: the operator is killed, and no other operator may rewrite the guard configuration
meanwhile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kubernetes
import pytest
from kubernetes.client.rest import ApiException

from gdn_operator.handlers.guard.admission import BYPASS_LABEL
from operator_harness import running_webhook_operator, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
from _chart_helpers import tools  # noqa: E402

from builders import CLEAN_ARGS, Guard, Workload
from test_guard_hostile import ENV, _cleanup, _install, create, create_guard


@pytest.mark.tools
@pytest.mark.readme("kubectl label namespace NAMESPACE guard.gdn-operator.io/bypass=INCIDENT")
def test_pods_of_a_running_workload_do_not_depend_on_the_operator_and_the_break_glass_works(full_cluster, kube_api, ns, tmp_path):
    """A deny guard registers its webhook with failurePolicy Fail. With the operator down, a guarded Deployment still
    scales (its ReplicaSet's pods are judged through the Deployment: the API server does not call the webhook for
    them), a bare guarded pod is still refused (never skipped), and the documented break-glass (a namespace label)
    lets it through."""
    _install(kube_api)
    core, apps = kubernetes.client.CoreV1Api(kube_api), kubernetes.client.AppsV1Api(kube_api)
    try:
        with running_webhook_operator(full_cluster, kube_api, tmp_path, env=ENV) as p:
            create_guard(kube_api, ns, Guard("down", None).select({"app": "down"}).policy("deny").obj())
            status, _, _ = create(
                kube_api, ns, Workload("down").labelled({"app": "down"}).replicas(1).tag("v0.33.0").args(*CLEAN_ARGS).obj()
            )
            assert status == 201
            wait_for(lambda: len(core.list_namespaced_pod(ns, label_selector="app=down").items) == 1, 60, what="1 pod")
            p.kill()
            apps.patch_namespaced_deployment_scale("down", ns, {"spec": {"replicas": 3}})
            wait_for(
                lambda: len(core.list_namespaced_pod(ns, label_selector="app=down").items) == 3,
                60,
                what="3 pods made by the ReplicaSet while the operator is down",
            )
            pod = Workload("bare", "Pod").labels({"app": "down"}).tag("v0.33.0").args(*CLEAN_ARGS).obj()
            with pytest.raises(ApiException) as e:
                core.create_namespaced_pod(ns, pod)
            assert e.value.status == 500 and "failed calling webhook" in e.value.body  # deny: never skipped
            # the break-glass, as README.md and docs/guard-admission.md write it
            res = subprocess.run(
                [
                    tools()["kubectl"],
                    "--kubeconfig",
                    str(full_cluster.kubeconfig),
                    "label",
                    "namespace",
                    ns,
                    f"{BYPASS_LABEL}=INCIDENT",
                ],
                capture_output=True,
                text=True,
            )
            assert res.returncode == 0, res.stderr
            wait_for(lambda: _created(core, ns, pod), 30, interval=0.5, what="the bare pod admitted under the break-glass")
    finally:
        _cleanup(kube_api)


def _created(core, ns, pod):
    try:
        core.create_namespaced_pod(ns, pod)
        return True
    except ApiException as e:
        if e.status == 500 and "failed calling webhook" in (e.body or ""):
            return False  # the namespace label not seen by the API server's informer yet
        raise
