"""Reconciler: GDNModelServer → Deployment + Service (+ PodMonitor), gated by the known-crash rules.

`reconcile_sync` is plain code (runs in a worker thread; handlers/main.py registers the kopf handlers
that call it) so it can be driven directly by tests. What to apply is decided by handlers/core/plan.py (shared
with the drift corrector, the crash watch and the probes); this module applies it and writes the status.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, Protocol, cast

import kopf

from gdn_operator.api.overrides import CLEARED_KEY, set_overrides
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.kube import ApiException
from gdn_operator.handlers.core.plan import Plan, PlanInputs, plan
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines.probes import probes_disabled
from gdn_operator.handlers.server.workloadstatus import record_workload_kind, workload_status
from gdn_operator.render import lws, podparts
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.render.objects import rendered_digest
from gdn_operator.render.scaleout import MANAGED_KINDS, owned_name
from gdn_operator.rules import Evaluation

log = logging.getLogger(__name__)

ANNOTATION_PREFIX = "kopf.serving.gdn-operator.io"


def _api_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)


#: server-side apply answers some invalid objects with HTTP 500 ("failed to create typed patch object
#: ...: field not declared in schema"); those never succeed on retry, like a 400/422
_INVALID_500 = ("failed to create typed patch object", "field not declared in schema", "is invalid", "invalid value")


def refused_as_invalid(e: ApiException) -> bool:
    """True when the API server refused an object for what it is (permanent), not for a passing fault."""
    if e.status in (400, 422):
        return True
    if e.status != 500:
        return False
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        body = {}
    text = f"{body.get('reason', '')} {body.get('message', '')}".lower() if isinstance(body, dict) else ""
    return (isinstance(body, dict) and body.get("reason") == "Invalid") or any(m in text for m in _INVALID_500)


#: status key: the optional kinds (MANAGED_KINDS) this server may own, so that prune asks only about those
OWNED_KINDS = "ownedKinds"
#: status key: the digest of the workload as last rendered (render.objects.rendered_digest)
RENDERED_DIGEST = "renderedDigest"


def prune_candidates(body: dict[str, Any], objects: list[dict[str, Any]], rt: PlanInputs) -> list[str]:
    """The managed kinds a server may still own but its spec no longer renders: those its status records
    (status.ownedKinds, written by every reconcile), or, for a server no reconcile recorded them for yet
    (one an older operator reconciled), every kind the operator may manage. A new server owns nothing."""
    status = body.get("status") or {}
    kept = {kind for _, kind in _managed(objects)}
    recorded = status.get(OWNED_KINDS)
    if recorded is None and not status.get("observedGeneration"):
        recorded = []  # never reconciled: nothing was created for it
    if recorded is None:
        cfg = rt.settings
        # only kinds the operator may manage (the chart grants RBAC per enabled feature): never a forbidden call
        enabled = {
            "Deployment": True,
            "PodDisruptionBudget": True,
            "PersistentVolumeClaim": True,
            lws.KIND: cfg.lws,
            "InferencePool": cfg.inference_pool,
            "HorizontalPodAutoscaler": cfg.hpa,
            "ScaledObject": bool(cfg.keda_prometheus_address),
        }
        recorded = [kind for _, kind in MANAGED_KINDS if enabled.get(kind)]
    return sorted({str(k) for k in recorded} - kept)


def _managed(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(o["apiVersion"], o["kind"]) for o in objects if (o["apiVersion"], o["kind"]) in MANAGED_KINDS]


def prune(body: dict[str, Any], candidates: list[str], rt: PlanInputs) -> list[str]:
    """Delete the optional objects this server owns but its spec no longer renders (a Deployment after a
    switch to a LeaderWorkerSet, an HPA replaced by a ScaledObject, a dropped InferencePool): one read per
    candidate kind (prune_candidates), none for a server whose kinds did not change."""
    meta = body["metadata"]
    gone = [
        kind
        for kind in candidates
        if kube.delete_owned(kind, meta["namespace"], owned_name(kind, meta["name"]), meta.get("uid"), rt.crds)
    ]
    if gone:
        log.info("%s/%s: deleted %s no longer in the spec", meta["namespace"], meta["name"], ", ".join(gone))
    return gone


def _not_validated(
    servers: Servers, body: dict[str, Any], reason: str, event: str, msg: str, ev: Evaluation | None = None
) -> None:
    """Record why nothing (new) is applied: Validated=False with the reason, findings, and an Event when
    that is news (a retry, a resumed handler or an operator restart repeats no Event). One status write,
    from the body the event delivered (read again only if the status changed meanwhile)."""
    meta = body["metadata"]
    gen = meta.get("generation")
    news = {"changed": False}

    def mutate(status: dict[str, Any], _obj: dict[str, Any]) -> None:
        news["changed"] = status.get("observedGeneration") != gen
        if OWNED_KINDS not in status and not status.get("observedGeneration"):
            status[OWNED_KINDS] = []  # nothing was ever created for it
        status["observedGeneration"] = gen
        if ev is not None:
            status["findings"], status["advisories"] = _findings(ev)
            status["effective"] = ev.effective.model_dump(by_alias=True, exclude_none=True, mode="json")
        if st.set_condition(status, st.VALIDATED, False, reason, msg, gen):
            news["changed"] = True
        if st.is_true(status, st.PROGRESSING):
            st.set_condition(status, st.PROGRESSING, False, reason, "Nothing is applied for this generation: " + msg, gen)
        probes_disabled(status, gen)  # nothing runs: nothing to probe (handlers/engines/probes.py would write the same)

    servers.update_status(meta["namespace"], meta["name"], mutate, obj=body)
    if news["changed"]:
        log.info("not applied %s/%s generation %s: %s: %s", meta["namespace"], meta["name"], gen, reason, msg[:300])
        kube.emit_event(body, event, msg, "Warning")


def _findings(ev: Evaluation) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(status.findings, status.advisories): advisories (no spec value avoids them) in their own list."""
    dump = [(f.action, f.model_dump(by_alias=True, exclude_none=True, mode="json")) for f in ev.findings]
    return [d for a, d in dump if a != "advisory"], [d for a, d in dump if a == "advisory"]


def _probes_off(body: dict[str, Any]) -> bool:
    raw = (body.get("spec") or {}).get("probes")
    return not raw or raw.get("enabled") is False


@dataclass(frozen=True)
class Admitted:
    """What a reconcile decided for an admitted generation besides its plan: calculate_status's other input."""

    generation: int | None  # of the body planned (the status write may start from a newer one)
    reason: str  # Validated's reason: Admitted, Mitigated, AdmittedWithWarnings
    message: str
    owned: list[str]  # status.ownedKinds: the managed kinds rendered, and those still to prune
    workload: dict[str, Any] | None  # the engine workload rendered (Deployment or LeaderWorkerSet)
    digest: str | None  # its rendered_digest
    probes_off: bool


def calculate_status(status: dict[str, Any], obj: dict[str, Any], p: Plan, admitted: Admitted) -> bool:
    """The reconcile's status of an admitted generation, calculated from the plan and the decision alone (pure:
    edits `status` in place, reads nothing else; the status write reruns it on the newest body after a
    conflict, and writes only when it changed). True when the generation or Validated is news (log, Event)."""
    if p.ev is None or p.run_spec is None:
        raise ValueError("calculate_status needs the plan of an evaluated spec")
    meta = obj["metadata"]
    gen, run_spec, workload = admitted.generation, p.run_spec, admitted.workload
    news = bool(status.get("observedGeneration") != gen)
    # no workload was ever recorded: the one applied next is new, and its first event will say no more than
    # what a workload without status says, written here in the same patch (workloadstatus.workload_status)
    fresh = workload is not None and "workload" not in status and st.get_condition(status, st.READY) is None
    status["observedGeneration"] = gen
    status["findings"], status["advisories"] = _findings(p.ev)
    status["effective"] = p.ev.effective.model_dump(by_alias=True, exclude_none=True, mode="json")
    set_overrides(status, p.overrides)  # the spec is never written: what runs differently is listed here
    if p.cleared is not None:
        status[CLEARED_KEY] = p.cleared
    st.set_overridden(status, gen)
    status[OWNED_KINDS] = admitted.owned
    if admitted.digest is not None:
        status[RENDERED_DIGEST] = admitted.digest
    status["url"] = podparts.url(meta["name"], meta["namespace"], ENGINE_PORT)  # the engine Service is applied next
    if workload is not None:
        record_workload_kind(status, workload["kind"])  # workload events keep it (workloadstatus.workload_status)
    if st.set_condition(status, st.VALIDATED, True, admitted.reason, admitted.message, gen):
        news = True
    ready = int(status.get("readyReplicas") or 0)
    desired = (
        run_spec.replicas if run_spec.autoscaling is None else int(status.get("replicas") or run_spec.autoscaling.min_replicas)
    )
    st.set_replicas(status, desired, ready, gen)
    progressing = st.get_condition(status, st.PROGRESSING) or {}
    rolling = progressing.get("status") == "True" and progressing.get("observedGeneration") == gen
    if (ready < desired or not st.is_true(status, st.READY)) and not rolling:  # (a resume keeps RollingOut)
        st.set_condition(
            status, st.PROGRESSING, True, "Applying", "Applying the engine Deployment for this generation; waiting for pods.", gen
        )
    if fresh and workload is not None and (workload.get("spec") or {}).get("replicas") is not None:
        # (without spec.replicas, an autoscaler's, the API server's default decides: the event tells)
        workload_status(status, obj, {"kind": workload["kind"], "spec": workload["spec"]})
    if admitted.probes_off:  # what handlers/engines/probes.py writes for a server without probes, in this same write
        probes_disabled(status, gen)
    return news


def reconcile_sync(body: dict[str, Any], rt: PlanInputs) -> str:
    """Bring the cluster to the object's spec. Returns a short outcome word (for logs and tests).

    Requests per reconcile of a server whose kinds do not change: one status write (a JSON patch from the
    body kopf delivered: no read), one server-side apply per object, at most one Event; reads only to
    prune kinds the spec dropped (prune_candidates) and when the status changed under the write. For a new
    server that write also holds what its new workload's first event would write (workload_status), and
    the written object goes to rt.servers, which workload events read: that event then costs no request."""
    cfg = rt.settings
    meta = body["metadata"]
    ns, name, gen = meta["namespace"], meta["name"], meta.get("generation")

    p = plan(body, rt)
    ev = p.ev
    if ev is not None and not ev.allowed:
        existing = kube.get_deployment(ns, name) or (kube.get_object(lws.KIND, ns, name) if rt.crds.exists(lws.CRD) else None)
        tail = " The previously admitted configuration keeps running." if existing is not None else " Nothing was created."
        _not_validated(rt.servers, body, "KnownIssue", "Rejected", p.problem + tail, ev)
        return "rejected"
    if p.objects is None:
        _not_validated(rt.servers, body, "InvalidSpec", "InvalidSpec", p.problem, ev)
        return "invalid"
    if ev is None or p.spec is None or p.run_spec is None:  # plan() gives objects only for a parsed, allowed spec
        raise kopf.PermanentError(f"{ns}/{name}: internal error: objects planned without an evaluated spec")
    run_spec, objects = p.run_spec, p.objects
    policy = p.spec.admission_policy or cfg.default_policy

    mitigated = [f for f in ev.findings if f.action == "mitigated"]
    warned = [f for f in ev.findings if f.action == "warned"]
    for o, why in p.ended:
        log.info("override ended %s/%s: %s=%r (%s): %s", ns, name, o.get("path"), o.get("value"), o.get("reason"), why)

    reason = "Mitigated" if mitigated else ("AdmittedWithWarnings" if warned else "Admitted")
    vmsg = {
        "Mitigated": f"Admitted with mitigations (policy {policy}): " + ", ".join(f.rule for f in mitigated),
        "AdmittedWithWarnings": "Admitted; known issues to watch: " + ", ".join(f.rule for f in warned),
        "Admitted": "No known crash or corruption rule matches this configuration.",
    }[reason]
    workload = next((o for o in objects if o["kind"] in ("Deployment", lws.KIND)), None)
    digest = rendered_digest(workload) if workload is not None else None
    same_rendering = digest is not None and (body.get("status") or {}).get(RENDERED_DIGEST) == digest
    candidates = prune_candidates(body, objects, rt)
    owned = sorted({kind for _, kind in _managed(objects)} | set(candidates))  # until pruned

    admitted = Admitted(gen, reason, vmsg, owned, workload, digest, _probes_off(body))
    news = {"changed": False}

    def applied(status: dict[str, Any], obj: dict[str, Any]) -> None:
        news["changed"] = calculate_status(status, obj, p, admitted)

    # From the status write to the end of the apply a workload event shows the old workload against the new
    # status: the operator's own change, not drift (Servers.applying).
    with rt.servers.applying(ns, name):
        # The status says which generation this is and why it was admitted before the workload is applied, so a
        # client never sees Ready (from the Deployment) without observedGeneration.
        rt.servers.update_status(ns, name, applied, obj=body)  # rt.servers: what this server's workload events read
        if news["changed"]:
            log.info(
                "%s %s/%s generation %s (policy %s)%s",
                reason.lower(),
                ns,
                name,
                gen,
                policy,
                ": " + ", ".join(f"{f.rule} {f.action}" for f in mitigated + warned) if mitigated or warned else "",
            )
        changed = False
        try:
            for obj in objects:
                _out, obj_changed = kube.apply_changed(obj, same_rendering=obj is workload and same_rendering)
                changed = changed or (obj is workload and obj_changed)
        except ApiException as e:
            if e.status != 403 and not refused_as_invalid(e):
                raise  # transient (5xx, timeouts): kopf retries
            detail = _api_message(e)
            forbidden = e.status == 403
            _not_validated(
                rt.servers,
                body,
                "Forbidden" if forbidden else "InvalidSpec",
                "ApplyRefused",
                f"the API server refused the engine {obj['kind']}: {detail}",
            )
            if forbidden:
                # RBAC may be fixed: retry, slowly
                raise kopf.TemporaryError(f"RBAC refused the engine {obj['kind']}: {detail}", delay=300) from None
            return "refused"
    if p.monitoring and not run_spec.metrics.enabled:
        kube.delete_pod_monitor(ns, name)
    if candidates:
        prune(body, candidates, rt)
        final = sorted(kind for _, kind in _managed(objects))
        rt.servers.update_status(ns, name, lambda status, _obj: status.__setitem__(OWNED_KINDS, final))

    event = transition_event(objects, gen, mitigated, warned, workload_changed=changed, news=news["changed"])
    if event is not None:
        kube.emit_event(body, *event)
    if changed:  # the workload changed (a no-op apply writes nothing)
        log.info("applied %s/%s generation %s: %s", ns, name, gen, ", ".join(o["kind"] for o in objects))
        return "applied"
    return "unchanged"


def transition_event(
    objects: list[dict[str, Any]], gen: Any, mitigated: list[Any], warned: list[Any], *, workload_changed: bool, news: bool
) -> tuple[str, str, str] | None:
    """The one Event of a reconcile, (reason, message, type), or None: "Applied" when the workload changed
    (its message names the mitigations and known issues of the generation, and it is a Warning when there
    are any); otherwise, when the generation is news but the workload did not change, "Mitigated" or
    "KnownIssueWarning" if the generation has findings; nothing on a retry, a resumed handler or a restart."""
    notes = []
    if mitigated:
        notes.append("Mitigated: " + "; ".join(f.line() for f in mitigated))
    if warned:
        notes.append(
            f"{len(warned)} known issue(s) to watch: "
            + "; ".join(f"{f.rule} ({f.kind})" for f in warned)
            + ". Details in status.findings."
        )
    type_ = "Warning" if notes else "Normal"
    if workload_changed:
        kinds = [o["kind"] for o in objects]
        msg = (
            f"{', '.join(kinds[:-1])} and {kinds[-1]} applied for generation {gen}."
            if len(kinds) > 1
            else f"{kinds[0]} applied for generation {gen}."
        )
        return "Applied", " ".join([msg, *notes]), type_
    if news and notes:
        return ("Mitigated" if mitigated else "KnownIssueWarning"), " ".join(notes), type_
    return None


#: the metadata kopf reads to build an essence (AnnotationsDiffBaseStorage.build keeps labels and annotations,
#: and names its own annotation after the ownerReferences); the rest of metadata is dropped
_ESSENCE_METADATA = ("labels", "annotations", "ownerReferences")


def essence_source(body: kopf.Body, extra_fields: Any = None) -> kopf.Body:
    """`body` without the parts kopf's essence drops (status, and the metadata kopf does not read:
    _ESSENCE_METADATA): a shallow view, nothing copied. With an extra field (a handler's `field`, kopf's FieldPath tuple) in status or
    metadata (none of ours: the update handler's is spec) the whole body, so it is still there to pick."""
    if any(field and field[0] in ("metadata", "status") for field in extra_fields or ()):
        return body
    meta = body.get("metadata") or {}
    out: dict[str, Any] = {k: body[k] for k in body.keys() if k not in ("metadata", "status")}  # noqa: SIM118
    out["metadata"] = {k: meta[k] for k in _ESSENCE_METADATA if k in meta}
    return kopf.Body(cast(kopf.RawBody, out))


class HandledSpecs(kopf.DiffBaseStorage):
    """kopf's diff base (the essence of the last spec its handlers completed: what tells an update from a
    no-op), held in the operator's memory (one per runtime; startup.configure installs it) instead of an
    annotation on the server: that annotation was one PATCH of every server per handled change, 1 of the 8
    requests a new server cost (issue 37, bench/bench_reconcile.py). The annotation an earlier operator wrote
    is still read until this one handles the object. After a restart or a hand-over to the other replica
    nothing is held: kopf sees each server as created and runs the create handler, the same idempotent
    reconcile its resume handler runs."""

    def __init__(self) -> None:
        super().__init__()
        #: what operators before issue 37 kept the diff base in (read, never written)
        self.annotations = kopf.AnnotationsDiffBaseStorage(prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
        self._held: dict[str, kopf.BodyEssence] = {}
        #: the kinds whose essence kopf reads (their changing handlers diff it); None: every kind. main.startup
        #: narrows it to GDNModelServers once the registry shows no other kind has such handlers
        #: (kopfcompat.essence_resources): the Deployments, pods and nodes watched only for events then cost no
        #: deep copy of their spec per event.
        self.essential_kinds: frozenset[str] | None = None

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """kopf's essence (AnnotationsDiffBaseStorage.build, without the old annotation) of the body without what
        it drops anyway: kopf deep-copies the body it is given, and status and managedFields are most of it. For a
        kind no changing handler watches (essential_kinds), an empty essence: kopf hands it to no handler."""
        if self.essential_kinds is not None and body.get("kind") not in self.essential_kinds:
            return cast(kopf.BodyEssence, {})
        return self.annotations.build(body=essence_source(body, extra_fields), extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        held = self._held.get(str(body.metadata.uid))
        return cast(kopf.BodyEssence, kube.plain(held)) if held is not None else self.annotations.fetch(body=body)

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._held[str(body.metadata.uid)] = kube.plain(essence)  # nothing added to kopf's patch: no write

    def forget(self, uid: str) -> None:
        self._held.pop(uid, None)


class ReconcileState(PlanInputs, Protocol):
    """What converge_generation reads besides the plan's inputs (the runtime provides it)."""

    @property
    def handled(self) -> HandledSpecs: ...


async def reconcile(body: kopf.Body, logger: kopf.Logger, rt: PlanInputs) -> None:
    """kopf's create/update/resume handler (handlers/main.py): reconcile in a worker thread."""
    outcome = await asyncio.to_thread(reconcile_sync, kube.plain_object(body), rt)
    logger.info("reconciled: %s", outcome)


async def converge_generation(body: kopf.Body, logger: kopf.Logger, rt: ReconcileState) -> None:
    """status.observedGeneration reaches metadata.generation whatever kopf coalesces.

    kopf calls the update handler only when the spec differs from the last one it handled; patches
    A → B → A in quick succession are coalesced into "no change", leaving observedGeneration behind for
    good although the cluster runs A. When the generation moved but the spec is the one kopf last
    handled (so no handler will run), reconcile now: idempotent, writes the current generation."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    if gen is None or observed is None or observed >= gen or meta.get("deletionTimestamp"):
        return
    handled = rt.handled.fetch(body=body)
    if handled is None or handled.get("spec") != kube.plain(body.get("spec")):  # fetch gives a plain copy
        return  # the spec changed: kopf's update handler runs for it (and writes the generation)
    outcome = await asyncio.to_thread(reconcile_sync, kube.plain_object(body), rt)
    logger.info("generation %s carries the spec already handled; status converged (%s)", gen, outcome)
