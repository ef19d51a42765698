"""Helpers of the GDNGuard run-time tests (issue 35): the guard CRD (generated from api/guard.py), guards and
plain vLLM workloads as other tools create them (tests/builders.py's Guard and Workload), and the proof that the
operator wrote none of them (managedFields)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes
from kubernetes.client.rest import ApiException

from builders import Guard, Workload
from operator_harness import wait_for

from gdn_operator import GROUP, VERSION

GUARDS = "gdnguards"
#: the operator's writers: its client (handlers/core/kube.py: every write without ?fieldManager= is named after its
#: User-Agent) and kopf's own (User-Agent kopf/...)
OPERATOR_MANAGERS = {"gdn-operator", "kopf"}
#: the launch line of the tiny recall model as a plain workload runs it (the real CPU engine serves it on the pod IP)
LAUNCH = ["vllm", "serve", "/models/tiny-qwen3-next-recall", "--served-model-name", "recall", "--port", "8000",
          "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']  # fmt: skip


def guard_crd() -> dict[str, Any]:
    from gdn_operator.api.crd import guard_crd_manifest  # api/guard.py: the CRD's one source

    return guard_crd_manifest()


def install_guard_crd(api: kubernetes.client.ApiClient) -> None:
    ext = kubernetes.client.ApiextensionsV1Api(api)
    crd = copy.deepcopy(guard_crd())
    try:
        cur = ext.read_custom_resource_definition(crd["metadata"]["name"])
        crd["metadata"]["resourceVersion"] = cur.metadata.resource_version
        ext.replace_custom_resource_definition(crd["metadata"]["name"], crd)
    except ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(crd)
    co = kubernetes.client.CustomObjectsApi(api)
    wait_for(lambda: co.list_cluster_custom_object(GROUP, VERSION, GUARDS) is not None, 30, what="GDNGuard CRD served")


#: a plain vLLM Deployment as a user or another tool writes it: one replica, a sidecar beside the engine (as KServe
#: and llm-d have), the engine container launching LAUNCH on vLLM 0.32.0 with its log's tail as termination message
#: (name it and label it: ``PLAIN.name("x").labelled(labels).argv(argv).obj()``)
PLAIN = (
    Workload()
    .replicas(1)
    .sidecar("sidecar", "busybox:1.37", ["sleep", "inf"])
    .tag("v0.32.0")
    .argv(LAUNCH)
    .engine(terminationMessagePolicy="FallbackToLogsOnError")
)
#: a GDNGuard g for a namespaced create (no namespace in its body): ``GUARD.select(labels).obj()``
GUARD = Guard(namespace=None)


class Guards:
    def __init__(self, api: kubernetes.client.ApiClient):
        self.co = kubernetes.client.CustomObjectsApi(api)
        self.core = kubernetes.client.CoreV1Api(api)
        self.apps = kubernetes.client.AppsV1Api(api)

    def create(self, ns: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.co.create_namespaced_custom_object(GROUP, VERSION, ns, GUARDS, obj)

    def status(self, ns: str, name: str) -> dict[str, Any]:
        return self.co.get_namespaced_custom_object(GROUP, VERSION, ns, GUARDS, name).get("status") or {}

    def workload(self, ns: str, name: str, kind: str, wname: str) -> dict[str, Any] | None:
        return next(
            (w for w in self.status(ns, name).get("workloads") or [] if (w.get("kind"), w.get("name")) == (kind, wname)), None
        )

    def finding(self, ns: str, name: str, kind: str, wname: str, type_: str, timeout: float = 60) -> dict[str, Any]:
        def one() -> dict[str, Any] | None:
            w = self.workload(ns, name, kind, wname) or {}
            return next((f for f in w.get("findings") or [] if f.get("type") == type_), None)

        return wait_for(one, timeout, interval=0.5, what=f"{type_} finding on {kind} {ns}/{wname} in guard {name}")

    def running_pods(self, ns: str, selector: str, n: int = 1, timeout: float = 90) -> list[Any]:
        def ready() -> list[Any] | None:
            pods = [
                p
                for p in self.core.list_namespaced_pod(ns, label_selector=selector).items
                if p.status.phase == "Running" and p.status.pod_ip and not p.metadata.deletion_timestamp
                and any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
            ]  # fmt: skip
            return pods if len(pods) >= n else None

        return wait_for(ready, timeout, interval=0.5, what=f"{n} running pod(s) {selector} in {ns}")

    def events_on(self, ns: str, kind: str, name: str, reason: str) -> list[Any]:
        evs = self.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},involvedObject.kind={kind}").items
        return [e for e in evs if e.reason == reason]


def managers(obj: Any) -> set[str]:
    """The field managers of an object (client model or dict)."""
    meta = obj["metadata"] if isinstance(obj, dict) else obj.metadata
    entries = meta.get("managedFields") if isinstance(meta, dict) else meta.managed_fields
    return {(e.get("manager") if isinstance(e, dict) else e.manager) for e in entries or []}


def assert_not_written(g: Guards, ns: str) -> None:
    """Nothing in `ns` that is not the operator's carries the operator's field manager: Deployments, ReplicaSets,
    StatefulSets, pods (their status too: managedFields records subresource writers)."""
    objs = [
        *g.apps.list_namespaced_deployment(ns).items,
        *g.apps.list_namespaced_replica_set(ns).items,
        *g.apps.list_namespaced_stateful_set(ns).items,
        *g.core.list_namespaced_pod(ns).items,
    ]
    assert objs, f"nothing to check in {ns}"
    written = [f"{type(o).__name__} {o.metadata.name}: {managers(o)}" for o in objs if OPERATOR_MANAGERS & managers(o)]
    assert not written, f"the operator wrote foreign objects: {written}"
