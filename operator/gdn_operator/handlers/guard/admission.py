"""Admission for workloads a GDNGuard selects (issue 35): the known-crash rules on the vLLM launch line of
a Deployment, StatefulSet, ReplicaSet, DaemonSet, Job, CronJob, LeaderWorkerSet, KServe LLMInferenceService, KAITO
Workspace or bare Pod that another tool created, warned or refused per the guard's spec.admission.policy. It never
mutates: the webhook is validating only, and the objects stay the user's.

The scope is the API server's, not ours: the operator writes its own ValidatingWebhookConfiguration
(`guards.<GDN_WEBHOOK_CONFIG_NAME>`, ours: made and rewritten only here) with one webhook per guard whose
admission feature is on. The API server decides what it sends, without calling us (issue 48):

* namespaceSelector: the guard's namespace, never kube-system, kube-public, kube-node-lease or the operator's own
  (a guard there gets no webhook, and its status says so), and never a namespace labelled BYPASS_LABEL: the
  break-glass (docs/guard-admission.md), which only who may label namespaces can use;
* matchConditions: (1) the object is selected by the guard's selector through its own labels or its pod template's
  (where users put them), or was before this UPDATE (an UPDATE that drops the label is judged as the guarded object
  it was); (2) it is not made by a controller of a kind judged here (a ReplicaSet's pods, a Deployment's
  ReplicaSets, a CronJob's Jobs): their workload was judged, and a deny guard must never make the replacement of a
  running workload's pods depend on the operator being up.

So a workload outside every guard is never sent to the webhook at all, and what the guard covers is in its status
(condition Admission). The configuration stays far below the API server's object size limit: each guard's webhook is
bounded by the CRD (selector terms and values), and guards past CONFIG_BUDGET_BYTES are left out with a status that
says so, instead of a configuration the API server refuses for everyone.

The requests arrive at the operator's webhook server on the path GUARD_WEBHOOK_ID, answered here without kopf
(webhook/limits.BoundedWebhookServer routes this path here, after the same size, time and shape bounds), from the
guards held in memory (fed by GDNGuard events; no API read per review). failurePolicy: Ignore for a warn guard (an
operator that does not answer never holds up the user's workloads), Fail for a deny guard (a refusal is never
skipped). An UPDATE that leaves every pod template unchanged (scale, labels, status) is admitted, so a rule added
later never wedges an object.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gdn_operator import telemetry
from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.handlers.guard import client
from gdn_operator.handlers.webhook.configs import NAMESPACE_LABEL, WEBHOOK_TIMEOUT_SECONDS
from gdn_operator.handlers.webhook.limits import review_answer
from gdn_operator.redact import redact
from gdn_operator.rules.workload import WorkloadVerdict, judge_workload, pod_specs
from gdn_operator.watch import guarded

log = logging.getLogger(__name__)

#: the path of the guard webhook on the operator's webhook server (and the prefix of its configuration's name)
GUARD_WEBHOOK_ID = "gdn-guard-admission"
#: seconds between re-checks of the guard webhook configuration when nothing signalled a change
RESYNC_SECONDS = 60.0
#: seconds before the configuration is written again after a failure
RETRY_SECONDS = 5.0
#: what the guard webhook is called for (CREATE and UPDATE only: it never sees deletes): every kind whose pod
#: templates rules/workload.py judges
GUARDED_RESOURCES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("apps", "v1", ("deployments", "statefulsets", "replicasets", "daemonsets")),
    ("batch", "v1", ("jobs", "cronjobs")),
    ("", "v1", ("pods",)),
    ("leaderworkerset.x-k8s.io", "v1", ("leaderworkersets",)),
    ("serving.kserve.io", "v1alpha1", ("llminferenceservices",)),
    ("kaito.sh", "v1beta1", ("workspaces",)),
)
#: the kinds above, as status names them
GUARDED_KINDS = (
    "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job", "CronJob", "LeaderWorkerSet", "LLMInferenceService",
    "Workspace", "Pod",
)  # fmt: skip
#: an object a controller of one of these kinds made is judged through that workload, never on its own
JUDGED_OWNER_KINDS = tuple(k for k in GUARDED_KINDS if k != "Pod")
#: namespaces no guard ever reaches (the cluster's own), besides the operator's
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


def never_admitted(excluded: Iterable[str] = ()) -> list[str]:
    """The namespaces no guard webhook reaches: the system ones and `excluded` (the operator's own), sorted."""
    return sorted({*SYSTEM_NAMESPACES, *(n for n in excluded if n)})


#: the break-glass: a namespace carrying this label (any value) is left out of every guard webhook
BYPASS_LABEL = "guard.gdn-operator.io/bypass"
#: the most the guard webhooks may take in their configuration (the API server's limit on an object is ~1.5 MiB)
CONFIG_BUDGET_BYTES = 512 * 1024
#: why a guard has no webhook (status condition Admission False, this reason)
LEFT_OUT_NAMESPACE = "NamespaceExcluded"
LEFT_OUT_BUDGET = "ConfigurationFull"


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


_NOT_CONTROLLED = (
    "!has(object.metadata.ownerReferences) || !object.metadata.ownerReferences.exists(r, has(r.controller) && "
    "r.controller && r.kind in [" + ", ".join(f"'{k}'" for k in JUDGED_OWNER_KINDS) + "])"
)


@dataclass
class Scope:
    """The guard webhooks to write, and the guards left without one (key -> reason)."""

    webhooks: list[dict[str, Any]] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)


def guard_scope(
    guards: Iterable[dict[str, Any]], config_name: str, client_config: dict[str, Any], excluded: Iterable[str] = ()
) -> Scope:
    """One webhook per guard with admission on (sorted by guard, so an unchanged set of guards gives an unchanged
    list): its namespace (never a system namespace, one of `excluded`, or one labelled BYPASS_LABEL), and
    matchConditions for its selector (object or template labels, now or before the UPDATE) and for objects no
    judged controller made. Guards past CONFIG_BUDGET_BYTES are left out."""
    out = Scope()
    cc = handler_client_config(client_config)
    never = never_admitted(excluded)
    used = 0
    for guard in sorted(guards, key=_key):
        spec = _spec(guard)
        namespace = (guard.get("metadata") or {}).get("namespace")
        if spec is None or not spec.features.admission or not namespace:
            continue
        if namespace in never:
            out.left_out[_key(guard)] = LEFT_OUT_NAMESPACE
            continue
        digest = hashlib.sha256(_key(guard).encode()).hexdigest()[:16]
        selector = spec.selector.dump()
        selected = f"({guarded.selector_cel(selector, 'object')}) || (oldObject != null && ({guarded.selector_cel(selector, 'oldObject')}))"
        hook = {
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
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": NAMESPACE_LABEL, "operator": "In", "values": [namespace]},
                    {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": never},
                    {"key": BYPASS_LABEL, "operator": "DoesNotExist"},
                ]
            },
            "objectSelector": {},
            "matchConditions": [
                {"name": "selected-by-the-guard", "expression": selected},
                {"name": "not-made-by-a-judged-controller", "expression": _NOT_CONTROLLED},
            ],
            "clientConfig": cc,
            "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
        }
        size = len(json.dumps(hook))
        if used + size > CONFIG_BUDGET_BYTES:
            out.left_out[_key(guard)] = LEFT_OUT_BUDGET
            continue
        used += size
        out.webhooks.append(hook)
    return out


def guard_webhooks(guards: Iterable[dict[str, Any]], config_name: str, client_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The webhooks of guard_scope (no namespace excluded beyond the system ones)."""
    return guard_scope(guards, config_name, client_config).webhooks


def guard_configuration(webhooks: list[dict[str, Any]], config_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {
            "name": guard_config_name(config_name),
            "labels": {"app.kubernetes.io/managed-by": "gdn-operator", "app.kubernetes.io/part-of": "gdn-operator"},
        },
        "webhooks": webhooks,
    }


# ------------------------------------------------------------------------------------------ the answer ---


def _controlled(obj: dict[str, Any]) -> bool:
    """Made by a controller of a judged kind (the webhook's matchCondition keeps these from the API server's calls)."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("controller") and r.get("kind") in JUDGED_OWNER_KINDS for r in refs)


def _unjudged(kind: str, name: str, gname: str, spec: GDNGuardSpec, e: Exception) -> WorkloadVerdict:
    """The verdict on an object the rules could not read: refused under deny (what a deny guard cannot judge is not
    admitted, as its failurePolicy Fail would have it), a warning under warn."""
    why = redact(f"{type(e).__name__}: {e}")[:300]
    if spec.admission.policy == "deny":
        return WorkloadVerdict(
            denied=f"{kind} {name} refused by GDNGuard {gname} (admission policy deny): its vLLM launch line could not be "
            f"judged ({why}); set the guard's spec.admission.policy to warn to admit it unjudged, and report this",
            rules=["unjudged"],
        )
    return WorkloadVerdict(warnings=[f"not judged: its vLLM launch line could not be read ({why})"])


def review_response(review: dict[str, Any], guards: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The AdmissionReview answer for one request, given the guards of the request's namespace (in the one answer
    shape, webhook/limits.py `review_answer`)."""
    req = review.get("request") or {}
    uid = str(req.get("uid", ""))
    obj, old = req.get("object") or {}, req.get("oldObject")
    meta = obj.get("metadata") or {}
    namespace, name = req.get("namespace") or meta.get("namespace") or "", meta.get("name") or meta.get("generateName") or ""
    kind = obj.get("kind") or (req.get("kind") or {}).get("kind", "")
    if _controlled(obj) or (old is not None and pod_specs(old) == pod_specs(obj)):
        return review_answer(review, uid, [], None)
    warnings: list[str] = []
    warned: list[str] = []
    for guard in guards:
        spec = _spec(guard)
        if spec is None or not spec.features.admission:
            continue
        selector = spec.selector.dump()  # its own labels or its templates', now or before this UPDATE
        if not (guarded.selects_object(selector, obj) or (old is not None and guarded.selects_object(selector, old))):
            continue
        gname = _key(guard)
        try:
            v: WorkloadVerdict = judge_workload(obj, spec, gname)
        except Exception as e:  # noqa: BLE001 - what nothing here foresaw in a user's object: an answer, never an HTTP 500
            log.exception("guard admission of %s %s/%s (GDNGuard %s) failed", kind, namespace, name, gname)
            v = _unjudged(kind, name, gname, spec, e)
        warnings += [f"GDNGuard {gname}: {w}" for w in v.warnings]
        warned += [f.rule for ev in v.evaluations for f in ev.findings if f.action == "warned"]
        if not v.allowed:
            for rule in v.rules:
                telemetry.admission_decision(namespace, "denied", rule).inc()
            log.info("guard admission denied %s %s/%s (GDNGuard %s): %s", kind, namespace, name, gname, ", ".join(v.rules))
            return review_answer(review, uid, warnings, {"code": 403, "message": v.denied})
    rules = list(dict.fromkeys(warned))
    for rule in rules:
        telemetry.admission_decision(namespace, "warned", rule).inc()
    log.info("guard admission admitted %s %s/%s%s", kind, namespace, name, f" with warnings: {', '.join(rules)}" if rules else "")
    return review_answer(review, uid, warnings, None)


# ---------------------------------------------------------------------------------- runtime: the scope ---


class GuardAdmission:
    """The guard webhook's state (owned by the runtime): where the webhook server is reachable, the GDNGuards in
    force (fed by their events and a LIST every RESYNC_SECONDS: reviews read no API), the guards left without a
    webhook and why, and a signal to rewrite the guard webhook configuration."""

    def __init__(self, config_name: str, namespaces: Iterable[str] = (), excluded: Iterable[str] = ()) -> None:
        self.config_name = config_name
        self.namespaces = tuple(namespaces)
        #: namespaces besides SYSTEM_NAMESPACES no guard reaches: the operator's own
        self.excluded = tuple(n for n in excluded if n)
        self.client_config: dict[str, Any] | None = None
        self.changed = asyncio.Event()
        self.guards: dict[str, dict[str, Any]] = {}  # namespace/name -> the GDNGuard
        #: namespace/name -> (when, the GDNGuard or None when deleted) of the latest event: an event newer than a
        #: LIST's start wins over what the LIST returned (a guard deleted while the LIST ran stays deleted)
        self._events: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self.primed = False  # the guards above came from a LIST at least once
        self.left_out: dict[str, str] = {}  # namespace/name -> LEFT_OUT_NAMESPACE or LEFT_OUT_BUDGET

    def published(self, client_config: dict[str, Any]) -> None:
        """The webhook server's clientConfig (called at each (re)start of the server)."""
        self.client_config = dict(client_config)
        self.changed.set()

    def guard_changed(self, type_: str | None = None, body: dict[str, Any] | None = None) -> None:
        """A GDNGuard event: the guard held for reviews, and a rewrite of the configuration."""
        if body is not None and (body.get("metadata") or {}).get("name"):
            gone = type_ == "DELETED" or bool((body.get("metadata") or {}).get("deletionTimestamp"))
            self._events[_key(body)] = (time.monotonic(), None if gone else body)
            if gone:
                self.guards.pop(_key(body), None)
            else:
                self.guards[_key(body)] = body
        self.changed.set()

    def guards_in(self, namespace: str) -> list[dict[str, Any]]:
        return [g for k, g in sorted(self.guards.items()) if k.split("/", 1)[0] == namespace]

    async def answer(self, review: dict[str, Any]) -> dict[str, Any]:
        """Answer one guard admission request from the guards held in memory (a LIST only before the first)."""
        if not self.primed:
            await self._list()
        req = review.get("request") or {}
        namespace = req.get("namespace") or ((req.get("object") or {}).get("metadata") or {}).get("namespace") or ""
        return review_response(review, self.guards_in(str(namespace)))

    async def _list(self) -> list[dict[str, Any]]:
        started = time.monotonic()
        listed = {_key(g): g for g in await asyncio.to_thread(client.list_guards, list(self.namespaces) or None)}
        for key, (when, body) in list(self._events.items()):
            if when < started:
                del self._events[key]  # the LIST saw it
            elif body is None:
                listed.pop(key, None)
            else:
                listed[key] = body
        self.guards = listed
        self.primed = True
        return list(listed.values())

    def coverage(self, namespace: str, name: str) -> tuple[bool, str, str]:
        """(in force, reason, message) of a guard's admission, for its status condition Admission."""
        why = self.left_out.get(f"{namespace}/{name}")
        if namespace in never_admitted(self.excluded):
            why = LEFT_OUT_NAMESPACE  # known from the namespace alone: also before the first configuration is written
        if why == LEFT_OUT_NAMESPACE:
            return (
                False,
                why,
                (
                    f"namespace {namespace} is never guarded at admission (the cluster's own namespaces and the operator's): "
                    "run the workloads elsewhere; the run-time features still act here"
                ),
            )
        if why == LEFT_OUT_BUDGET:
            return (
                False,
                why,
                (
                    f"the guard webhook configuration holds {CONFIG_BUDGET_BYTES // 1024} KiB of guards and this one did not "
                    "fit: fewer guards, or fewer selector terms and values per guard"
                ),
            )
        kinds = ", ".join(GUARDED_KINDS[:-1])
        return (
            True,
            "Scoped",
            (
                f"CREATE and UPDATE of {kinds} and bare Pods in {namespace} whose labels or pod template labels the "
                f"selector matches (or matched before the UPDATE); objects their controllers make are judged through "
                f"the workload; not in namespaces labelled {BYPASS_LABEL}"
            ),
        )

    async def run(self) -> None:
        """Set the guard webhook configuration's webhooks whenever something they depend on changed, and every
        RESYNC_SECONDS (an upgrade of the chart, or someone, may have emptied them). Never ends on an error: any
        failure (the API, the network, a malformed answer) is logged and retried."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), RESYNC_SECONDS)
            self.changed.clear()
            if self.client_config is None:
                continue
            try:
                guards = await self._list()
                scope = guard_scope(guards, self.config_name, self.client_config, self.excluded)
                for key, why in sorted(scope.left_out.items()):
                    if self.left_out.get(key) != why:
                        log.info("guard admission: GDNGuard %s has no webhook (%s)", key, why)
                self.left_out = scope.left_out
                desired = guard_configuration(scope.webhooks, self.config_name)
                if await asyncio.to_thread(write_configuration, desired):
                    log.info(
                        "guard admission scope: %d guard webhook(s) in %s", len(desired["webhooks"]), desired["metadata"]["name"]
                    )
            except Exception as e:  # noqa: BLE001 - ApiException, urllib3's errors, anything: the scope is retried
                log.warning("guard admission scope not written (retrying in %.0fs): %s: %s", RETRY_SECONDS, type(e).__name__, e)
                await asyncio.sleep(RETRY_SECONDS)
                self.changed.set()


def write_configuration(desired: dict[str, Any]) -> bool:
    """Set the webhooks of the operator's guard webhook configuration (ours: never another's), creating it
    where the chart did not ship it (GDN_WEBHOOK_CONFIGS=managed). Returns whether anything was written."""
    name = desired["metadata"]["name"]
    live = client.read_webhook_configuration(name)
    if live is not None:
        if _comparable(live.get("webhooks") or []) == _comparable(desired["webhooks"]):
            return False
        if client.set_webhooks(name, desired["webhooks"]):
            return True
    client.create_webhook_configuration(desired)
    return True


def _comparable(hooks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Webhooks as written, without the fields the API server defaults (so a live list compares equal)."""
    keep = (
        "name", "failurePolicy", "rules", "objectSelector", "namespaceSelector", "matchConditions", "clientConfig",
        "timeoutSeconds",
    )  # fmt: skip
    out = []
    for h in hooks:
        d = {k: h.get(k) for k in keep}
        d["clientConfig"] = {k: v for k, v in (h.get("clientConfig") or {}).items() if v is not None}
        d["rules"] = [
            {k: r.get(k) for k in ("apiGroups", "apiVersions", "resources", "operations")} for r in h.get("rules") or []
        ]
        out.append(d)
    return out
