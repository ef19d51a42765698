"""Admission for workloads a GDNGuard selects (issue 35): the known-crash rules on the vLLM launch line of
a Deployment, StatefulSet, LeaderWorkerSet or bare Pod that another tool created, warned or refused per the
guard's spec.admission.policy. It never mutates: the webhook is validating only, and the objects stay the
user's.

The scope is the API server's, not ours: the operator writes its own ValidatingWebhookConfiguration
(`guards.<GDN_WEBHOOK_CONFIG_NAME>`, ours: made and rewritten only here) with one webhook per guard whose
admission feature is on, each limited by an objectSelector (the guard's spec.selector) and a namespaceSelector
(the guard's namespace). A workload outside every guard is never sent to the webhook at all.

The requests arrive at the operator's webhook server on the path GUARD_WEBHOOK_ID, answered here without
kopf (kopf knows only GDNModelServer admission; webhook_limits.BoundedWebhookServer routes this path here),
after the same size and nesting bounds. failurePolicy: Ignore for a warn guard (an operator that does not
answer never holds up the user's workloads), Fail for a deny guard (a refusal is never skipped).

Pods a controller owns (ownerReferences controller: true) are admitted without judging: their workload was
judged; refusing them later would stop a running workload from replacing pods. An UPDATE that leaves every
pod template unchanged (scale, labels, status) is admitted, so a rule added later never wedges an object.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
from collections.abc import Iterable
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from gdn_operator import GROUP, GUARD_PLURAL, VERSION, telemetry
from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.handlers.kube import _json, api_client
from gdn_operator.handlers.webhookconfigs import NAMESPACE_LABEL, WEBHOOK_TIMEOUT_SECONDS
from gdn_operator.rules.workload import WorkloadVerdict, judge_workload, pod_specs

log = logging.getLogger(__name__)

#: the path of the guard webhook on the operator's webhook server (and the prefix of its configuration's name)
GUARD_WEBHOOK_ID = "gdn-guard-admission"
#: seconds between re-checks of the guard webhook configuration when nothing signalled a change
RESYNC_SECONDS = 60.0
#: what the guard webhook is called for (CREATE and UPDATE only: it never sees deletes)
GUARDED_RESOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("apps", "v1", ("deployments", "statefulsets")),
    ("", "v1", ("pods",)),
    ("leaderworkerset.x-k8s.io", "v1", ("leaderworkersets",)),
    ("serving.kserve.io", "v1alpha1", ("llminferenceservices",)),
    ("kaito.sh", "v1beta1", ("workspaces",)),
)


def guard_config_name(config_name: str) -> str:
    """The name of the operator's own guard webhook configuration."""
    return f"guards.{config_name}"


def handler_client_config(client_config: dict[str, Any]) -> dict[str, Any]:
    """The webhook server's clientConfig pointed at the guard path (a URL or a Service path gets /<id>)."""
    out = copy.deepcopy(dict(client_config))
    if out.get("url"):
        out["url"] = f"{str(out['url']).rstrip('/')}/{GUARD_WEBHOOK_ID}"
    if out.get("service"):
        svc = dict(out["service"])
        svc["path"] = f"{(svc.get('path') or '').rstrip('/')}/{GUARD_WEBHOOK_ID}"
        out["service"] = svc
    return out


def _key(guard: dict[str, Any]) -> str:
    meta = guard.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _spec(guard: dict[str, Any]) -> GDNGuardSpec | None:
    try:
        return GDNGuardSpec.model_validate(guard.get("spec") or {})
    except ValidationError as e:
        log.info("GDNGuard %s not in force for admission: %s", _key(guard), e.errors()[0].get("msg"))
        return None


def guard_webhooks(guards: Iterable[dict[str, Any]], config_name: str, client_config: dict[str, Any]) -> list[dict[str, Any]]:
    """One webhook per guard with admission on: its selector as the objectSelector, its namespace as the
    namespaceSelector (sorted by guard, so an unchanged set of guards gives an unchanged list)."""
    out = []
    cc = handler_client_config(client_config)
    for guard in sorted(guards, key=_key):
        spec = _spec(guard)
        namespace = (guard.get("metadata") or {}).get("namespace")
        if spec is None or not spec.features.admission or not namespace:
            continue
        digest = hashlib.sha256(_key(guard).encode()).hexdigest()[:16]
        selector = spec.selector.dump()
        out.append(
            {
                "name": f"g{digest}.{GUARD_WEBHOOK_ID}.{config_name}",
                "sideEffects": "None",
                "failurePolicy": "Fail" if spec.admission.policy == "deny" else "Ignore",
                "matchPolicy": "Equivalent",
                "rules": [
                    {
                        "apiGroups": [g],
                        "apiVersions": [v],
                        "resources": list(r),
                        "operations": ["CREATE", "UPDATE"],
                        "scope": "Namespaced",
                    }
                    for g, v, r in GUARDED_RESOURCES
                ],
                "objectSelector": {k: v for k, v in selector.items() if v},
                "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}},
                "clientConfig": cc,
                "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
                "admissionReviewVersions": ["v1"],
            }
        )
    return out


def guard_configuration(guards: Iterable[dict[str, Any]], config_name: str, client_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": guard_config_name(config_name),
            "labels": {"app.kubernetes.io/managed-by": "gdn-operator", "app.kubernetes.io/part-of": "gdn-operator"},
        },
        "webhooks": guard_webhooks(guards, config_name, client_config),
    }


# ------------------------------------------------------------------------------------------ the answer ---


def selects(spec: GDNGuardSpec, labels: dict[str, str]) -> bool:
    """Whether a guard's selector selects an object with `labels` (metav1.LabelSelector semantics)."""
    sel = spec.selector
    if any(labels.get(k) != v for k, v in sel.match_labels.items()):
        return False
    for req in sel.match_expressions:
        has, value = req.key in labels, labels.get(req.key)
        op = req.operator
        if (
            (op == "In" and value not in req.values)
            or (op == "NotIn" and has and value in req.values)
            or (op == "Exists" and not has)
            or (op == "DoesNotExist" and has)
        ):
            return False
    return True


def _controlled(obj: dict[str, Any]) -> bool:
    return any(ref.get("controller") for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def review_response(review: dict[str, Any], guards: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The AdmissionReview answer for one request, given the guards of the request's namespace."""
    req = review.get("request") or {}
    uid = str(req.get("uid", ""))
    obj, old = req.get("object") or {}, req.get("oldObject")
    meta = obj.get("metadata") or {}
    namespace, name = req.get("namespace") or meta.get("namespace") or "", meta.get("name") or meta.get("generateName") or ""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    answer = {"apiVersion": review.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    kind = obj.get("kind") or (req.get("kind") or {}).get("kind", "")
    if (kind == "Pod" and _controlled(obj)) or (old is not None and pod_specs(old) == pod_specs(obj)):
        return answer
    labels = meta.get("labels") or {}
    warnings: list[str] = []
    warned: list[str] = []
    for guard in guards:
        spec = _spec(guard)
        if spec is None or not spec.features.admission or not selects(spec, labels):
            continue
        gname = _key(guard)
        v: WorkloadVerdict = judge_workload(obj, spec, gname)
        warnings += [f"GDNGuard {gname}: {w}" for w in v.warnings]
        warned += [f.rule for ev in v.evaluations for f in ev.findings if f.action == "warned"]
        if not v.allowed:
            for rule in v.rules:
                telemetry.ADMISSION_DECISIONS.labels(namespace, "denied", rule).inc()
            log.info("guard admission denied %s %s/%s (GDNGuard %s): %s", kind, namespace, name, gname, ", ".join(v.rules))
            response.update(allowed=False, status={"code": 403, "message": v.denied})
            if warnings:
                response["warnings"] = warnings
            return answer
    if warnings:
        response["warnings"] = warnings
    rules = list(dict.fromkeys(warned))
    for rule in rules:
        telemetry.ADMISSION_DECISIONS.labels(namespace, "warned", rule).inc()
    log.info("guard admission admitted %s %s/%s%s", kind, namespace, name, f" with warnings: {', '.join(rules)}" if rules else "")
    return answer


# ---------------------------------------------------------------------------------- runtime: the scope ---


class GuardAdmission:
    """The guard webhook's state (owned by the runtime): where the webhook server is reachable, and a
    signal to rewrite the guard webhook configuration (a GDNGuard changed, or the server's clientConfig)."""

    def __init__(self, config_name: str, namespaces: Iterable[str] = ()) -> None:
        self.config_name = config_name
        self.namespaces = tuple(namespaces)
        self.client_config: dict[str, Any] | None = None
        self.changed = asyncio.Event()

    def published(self, client_config: dict[str, Any]) -> None:
        """The webhook server's clientConfig (called at each (re)start of the server)."""
        self.client_config = dict(client_config)
        self.changed.set()

    def guard_changed(self) -> None:
        self.changed.set()

    async def answer(self, review: dict[str, Any]) -> dict[str, Any]:
        """Answer one guard admission request (reads the GDNGuards of the request's namespace)."""
        req = review.get("request") or {}
        namespace = req.get("namespace") or ((req.get("object") or {}).get("metadata") or {}).get("namespace") or ""
        guards = await asyncio.to_thread(list_guards, [namespace])
        return review_response(review, guards)

    async def run(self) -> None:
        """Set the guard webhook configuration's webhooks whenever something they depend on changed, and every
        RESYNC_SECONDS (an upgrade of the chart, or someone, may have emptied them)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), RESYNC_SECONDS)
            self.changed.clear()
            if self.client_config is None:
                continue
            try:
                guards = await asyncio.to_thread(list_guards, list(self.namespaces) or None)
                desired = guard_configuration(guards, self.config_name, self.client_config)
                if await asyncio.to_thread(write_configuration, desired):
                    log.info(
                        "guard admission scope: %d guard webhook(s) in %s", len(desired["webhooks"]), desired["metadata"]["name"]
                    )
            except (ApiException, OSError) as e:
                log.warning("guard admission scope not written (retrying in 5s): %s", e)
                await asyncio.sleep(5)
                self.changed.set()


def list_guards(namespaces: list[str] | None) -> list[dict[str, Any]]:
    """The GDNGuards of `namespaces` (None: every namespace). Blocking: run it in a thread."""
    co = kubernetes.client.CustomObjectsApi(api_client())
    items: list[dict[str, Any]] = []
    try:
        if namespaces is None:
            items += _json(co.list_cluster_custom_object(GROUP, VERSION, GUARD_PLURAL, _preload_content=False))["items"]
        else:
            for ns in namespaces:
                items += _json(co.list_namespaced_custom_object(GROUP, VERSION, ns, GUARD_PLURAL, _preload_content=False))[
                    "items"
                ]
    except ApiException as e:
        if e.status == 404:  # the GDNGuard CRD is not installed: nothing is guarded
            return []
        raise
    return items


def write_configuration(desired: dict[str, Any]) -> bool:
    """Set the webhooks of the operator's guard webhook configuration (ours: never another's), creating it
    where the chart did not ship it (GDN_WEBHOOK_CONFIGS=managed). Returns whether anything was written."""
    adm = kubernetes.client.AdmissionregistrationV1Api(api_client())
    name = desired["metadata"]["name"]
    try:
        live = _json(adm.read_validating_webhook_configuration(name, _preload_content=False))
        if _comparable(live.get("webhooks") or []) == _comparable(desired["webhooks"]):
            return False
        # a JSON patch: a strategic merge would keep the webhooks of deleted guards (the list merges by name)
        adm.patch_validating_webhook_configuration(name, [{"op": "add", "path": "/webhooks", "value": desired["webhooks"]}])
    except ApiException as e:
        if e.status != 404:
            raise
        adm.create_validating_webhook_configuration(desired)  # type: ignore[arg-type]  # the client takes the dict as is
    return True


def _comparable(hooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Webhooks as written, without the fields the API server defaults (so a live list compares equal)."""
    keep = ("name", "failurePolicy", "rules", "objectSelector", "namespaceSelector", "clientConfig", "timeoutSeconds")
    out = []
    for h in hooks:
        d = {k: h.get(k) for k in keep}
        d["clientConfig"] = {k: v for k, v in (h.get("clientConfig") or {}).items() if v is not None}
        d["rules"] = [
            {k: r.get(k) for k in ("apiGroups", "apiVersions", "resources", "operations")} for r in h.get("rules") or []
        ]
        out.append(d)
    return out
