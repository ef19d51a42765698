"""Every call the guard path (handlers/guard/) makes to the API server: plain functions over plain dicts, blocking
(run them in a thread), built on handlers/core/kube.py's process client (`api_client`: its pool, timeout and field
manager) and its raw-response reading (no model deserialisation). The other guard modules never import the
Kubernetes client; a test stands in for the cluster by replacing these functions (tests/handlers/guard/).

What a guard reads: its pods (a LIST by the guard's selector), the owner chain of a pod (ReplicaSet, Deployment,
StatefulSet metadata), the GDNGuards themselves (for admission). What it writes is the operator's own: the guard's
status subresource, the namespace's PolicyReport, the guard webhook configuration, Events (new objects), and the one
opt-in write to what it guards, a pod's deletion (`remediation: deletePod`).
"""

from __future__ import annotations

import logging
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from gdn_operator import GROUP, GUARD_PLURAL, VERSION
from gdn_operator.handlers.core import kube

log = logging.getLogger(__name__)

#: where the namespace's PolicyReport lives (the CRD Kyverno and the Trivy operator use)
POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL = "wgpolicyk8s.io", "v1alpha2", "policyreports"
#: the owner kinds whose metadata `owner_metadata` reads (the rest of an owner chain is named, never read)
OWNER_KINDS = ("ReplicaSet", "Deployment", "StatefulSet")


def emit_event(obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
    """An Event on the object `obj` names (a guarded workload): the shared core's writer (kube.emit_event), which
    never raises."""
    kube.emit_event(obj, reason, message, type_)


def delete_pod(namespace: str, name: str, uid: str | None) -> bool:
    """Delete one pod instance (kube.delete_pod: the uid precondition). False when it is gone or was replaced."""
    return kube.delete_pod(namespace, name, uid)


def list_pods(namespace: str, label_selector: str) -> list[dict[str, Any]]:
    """The pods of `namespace` that `label_selector` (the list call's string form) selects."""
    core = kubernetes.client.CoreV1Api(kube.api_client())
    resp: Any = core.list_namespaced_pod(namespace, label_selector=label_selector, _preload_content=False)
    return list(kube._json(resp).get("items") or [])


def owner_metadata(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The metadata of a ReplicaSet, Deployment or StatefulSet (OWNER_KINDS); None when it is gone or the operator
    may not read it (the owner chain stops there)."""
    apps = kubernetes.client.AppsV1Api(kube.api_client())
    read = {
        "ReplicaSet": apps.read_namespaced_replica_set,
        "Deployment": apps.read_namespaced_deployment,
        "StatefulSet": apps.read_namespaced_stateful_set,
    }[kind]
    try:
        meta: dict[str, Any] = kube._json(read(name, namespace, _preload_content=False))["metadata"]
    except ApiException as e:
        if e.status not in (403, 404):
            raise
        log.debug("owner %s %s/%s not readable (%s): the chain stops there", kind, namespace, name, e.status)
        return None
    return meta


def list_guards(namespaces: list[str] | None) -> list[dict[str, Any]]:
    """The GDNGuards of `namespaces` (None: every namespace); none when the GDNGuard CRD is not installed."""
    co = kubernetes.client.CustomObjectsApi(kube.api_client())
    items: list[dict[str, Any]] = []
    try:
        if namespaces is None:
            items += kube._json(co.list_cluster_custom_object(GROUP, VERSION, GUARD_PLURAL, _preload_content=False))["items"]
        else:
            for ns in namespaces:
                resp = co.list_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, _preload_content=False)
                items += kube._json(resp)["items"]
    except ApiException as e:
        if e.status == 404:  # the GDNGuard CRD is not installed: nothing is guarded
            return []
        raise
    return items


def write_status(namespace: str, name: str, status: dict[str, Any]) -> bool:
    """Merge-patch a guard's status subresource (lists are replaced whole). False when the guard is gone."""
    try:
        r: Any = kubernetes.client.CustomObjectsApi(kube.api_client()).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, GUARD_PLURAL, name, {"status": status}, _preload_content=False
        )
        r.release_conn()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def apply_policy_report(report: dict[str, Any]) -> bool:
    """Server-side apply of a PolicyReport (the operator's object; keys set to None are left out). False when the
    cluster serves no PolicyReport CRD, or the operator may not write one (the chart grants it with the guards)."""
    report = {k: v for k, v in report.items() if v is not None}
    meta = report["metadata"]
    try:
        r: Any = kubernetes.client.CustomObjectsApi(kube.api_client()).patch_namespaced_custom_object(
            POLICY_GROUP,
            POLICY_VERSION,
            meta["namespace"],
            POLICY_PLURAL,
            meta["name"],
            report,
            field_manager=kube.FIELD_MANAGER,
            force=True,
            _content_type=kube.APPLY,
            _preload_content=False,
        )
        r.release_conn()
    except ApiException as e:
        if e.status in (403, 404):
            return False
        raise
    return True


def read_webhook_configuration(name: str) -> dict[str, Any] | None:
    """A ValidatingWebhookConfiguration; None when there is none of that name."""
    adm = kubernetes.client.AdmissionregistrationV1Api(kube.api_client())
    try:
        return kube._json(adm.read_validating_webhook_configuration(name, _preload_content=False))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def set_webhooks(name: str, webhooks: list[dict[str, Any]]) -> bool:
    """Replace a ValidatingWebhookConfiguration's whole webhook list (a JSON patch: a strategic merge would keep the
    webhooks left out, the list merges by name). False when the configuration is gone."""
    adm = kubernetes.client.AdmissionregistrationV1Api(kube.api_client())
    try:
        adm.patch_validating_webhook_configuration(name, [{"op": "add", "path": "/webhooks", "value": webhooks}])
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def create_webhook_configuration(body: dict[str, Any]) -> None:
    """Create a ValidatingWebhookConfiguration."""
    adm = kubernetes.client.AdmissionregistrationV1Api(kube.api_client())
    adm.create_validating_webhook_configuration(body)  # type: ignore[arg-type]  # the client takes the dict as is
