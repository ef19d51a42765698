"""The decision for one GDNModelServer: its spec parsed, its operator-owned overrides (api/overrides.py)
applied, judged by the known-crash rules (unset fields resolved to their safe defaults), and rendered for
this cluster — or why nothing can be applied.

One computation shared by the reconciler, the drift corrector, the crash watch, the output probes and the
autoscaler's scale-up pause, so they can never disagree. It reads the operator's settings and which
optional APIs the cluster serves (`PlanInputs`: the runtime provides both), and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.overrides import CLEAR_ANNOTATION, CLEARED_KEY, apply_overrides, entries, live_overrides
from gdn_operator.api.pod import unsafe_refusals
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.kube import CrdCache
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.render import autoscale, lws, router
from gdn_operator.render.meta import RenderError
from gdn_operator.render.objects import render_all
from gdn_operator.render.scaleout import ScaleOutOptions
from gdn_operator.rules import Evaluation, evaluate
from gdn_operator.settings import Settings

PODMONITOR_CRD = "podmonitors.monitoring.coreos.com"


class ClusterFacts(Protocol):
    """What admission reads besides the object: the settings, and which optional CRDs the cluster serves (the
    operator's runtime, or the webhook front's own: front.py)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def crds(self) -> CrdCache: ...


class PlanInputs(ClusterFacts, Protocol):
    """What a plan reads besides the object: the cluster facts; and, for the handlers that plan, the one door to
    the servers (handlers/core/servers.py: the body to plan from, the status write of what they decided)."""

    @property
    def servers(self) -> Servers: ...


@dataclass
class Plan:
    """What the operator decides for an object."""

    spec: GDNModelServerSpec | None = None
    ev: Evaluation | None = None
    objects: list[dict[str, Any]] | None = None  # None: nothing to apply (invalid or rejected)
    problem: str = ""  # why there is nothing to apply
    monitoring: bool = False  # PodMonitors are managed (configured, and the CRD exists)
    overrides: list[dict[str, Any]] = field(default_factory=list)  # status.overrides to record (in force)
    ended: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # remediation overrides that ended, why
    cleared: str | None = None  # a new clear-overrides token acted on (status.overridesCleared)
    key: tuple[Any, ...] = ()  # plan_key of the body planned: a body with the same key plans the same

    @property
    def run_spec(self) -> GDNModelServerSpec | None:
        return (self.ev.run_spec if self.ev else None) or self.spec


def plan(body: dict[str, Any], inputs: PlanInputs) -> Plan:
    """The decision for `body` (a handler plans once per event and passes the plan down; plan_key says when a
    newer body needs another)."""
    out = _plan(body, inputs)
    out.key = plan_key(body)
    return out


def _plan(body: dict[str, Any], inputs: PlanInputs) -> Plan:
    cfg = inputs.settings
    meta = body["metadata"]
    try:
        spec = parse_spec(body.get("spec") or {})
    except ManifestError as e:
        return Plan(problem="; ".join(e.problems))
    user = body.get("spec") or {}
    status = body.get("status") or {}
    kept, ended, cleared = live_overrides(status, user, meta.get("annotations"))
    ev = None
    if kept:
        with contextlib.suppress(ValidationError):
            ev = evaluate(apply_overrides(spec, kept), default_policy=cfg.default_policy)
        if ev is None or not ev.allowed:  # e.g. rules changed since: the spec is judged on its own
            ended += [(o, "the override no longer passes admission") for o in kept]
            kept, ev = [], None
    if ev is None:
        ev = evaluate(spec, default_policy=cfg.default_policy)
    if not ev.allowed:
        return Plan(spec, ev, problem=ev.denial_message(), ended=ended, cleared=cleared)
    out = Plan(
        spec,
        ev,
        monitoring=cfg.pod_monitors and inputs.crds.exists(PODMONITOR_CRD),
        overrides=kept + mitigation_overrides(ev, status, meta.get("generation"), user),
        ended=ended,
        cleared=cleared,
    )
    run_spec = ev.run_spec or spec  # = out.run_spec: safe defaults filled in, mitigations applied
    unsafe = unsafe_refusals(run_spec, cfg.allow_unsafe)  # also at admission; here for servers admitted without it
    if unsafe:
        out.problem = "; ".join(unsafe)
        return out
    missing = missing_apis(run_spec, inputs)
    if missing:
        out.problem = missing
        return out
    try:
        out.objects = render_all(
            meta["name"],
            meta["namespace"],
            run_spec,
            meta.get("uid"),
            with_monitoring=out.monitoring,
            scaleout=scaleout_options(body, run_spec, inputs),
            monitor_labels=dict(cfg.pod_monitor_labels),
        )
    except RenderError as e:
        out.problem = str(e)
    return out


def mitigation_overrides(
    ev: Evaluation, status: dict[str, Any], generation: int | None, user: dict[str, Any]
) -> list[dict[str, Any]]:
    """status.overrides entries for the admission policy's mitigations (source mitigation), keeping the
    generation and time of an identical entry already recorded (no status churn on a resync)."""
    before = {
        (o.get("path"), json.dumps(o.get("value")), o.get("reason")): o
        for o in status.get("overrides") or []
        if o.get("source") == "mitigation"
    }
    out = []
    for f in ev.mitigated:
        for e in entries(
            SpecPatch.of(f.mitigation), reason=f.rule, source="mitigation", generation=generation, since=kube.now(), spec=user
        ):
            out.append(before.get((e["path"], json.dumps(e["value"]), e["reason"]), e))
    return out


def plan_key(body: dict[str, Any]) -> tuple[Any, ...]:
    """What a plan of `body` depends on besides the operator's inputs: the object, its generation, the overrides
    and the clear-overrides token, and CrashLooping (the autoscaler's scale-up pause). Two bodies with the same
    key plan the same: a conflict re-read re-plans only when its key moved (issue 37)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    return (
        meta.get("uid"),
        meta.get("generation"),
        json.dumps(status.get("overrides"), sort_keys=True),
        status.get(CLEARED_KEY),
        (meta.get("annotations") or {}).get(CLEAR_ANNOTATION),
        st.is_true(status, st.CRASH_LOOPING),
    )


def expected_objects(body: dict[str, Any], inputs: PlanInputs) -> list[dict[str, Any]] | None:
    """What the operator would have applied for this object now (None: invalid or rejected)."""
    return plan(body, inputs).objects


def may_read_api(spec: Any) -> bool:
    """Whether validating this raw spec may read from the API server (a blocking call): missing_apis (below) asks
    the CRD cache only for multi-node engines and InferencePools; kept beside it so the two conditions move
    together. Conservative: any such field, valid or not."""
    if not isinstance(spec, Mapping):
        return False
    nodes, routing = spec.get("nodes"), spec.get("router")
    return (nodes is not None and nodes != 1) or (isinstance(routing, Mapping) and routing.get("inferencePool") is not None)


def missing_apis(spec: GDNModelServerSpec, inputs: ClusterFacts) -> str:
    """Why the cluster cannot run this spec (an API it needs is not installed, or the operator does not manage
    it), or "". Admission warns with it (or refuses, GDN_MISSING_API_POLICY); the reconciler reports it."""
    cfg, crds = inputs.settings, inputs.crds
    if spec.nodes > 1 and not cfg.lws:
        return (
            f"spec.nodes {spec.nodes} needs LeaderWorkerSets, which this operator does not manage; set the chart "
            "value scaleOut.leaderWorkerSet.enabled=true (GDN_LWS) or set spec.nodes to 1"
        )
    if spec.router is not None and spec.router.inference_pool is not None and not cfg.inference_pool:
        return (
            "spec.router.inferencePool needs InferencePools, which this operator does not manage; set the chart value "
            "scaleOut.inferencePool.enabled=true (GDN_INFERENCE_POOL) or remove spec.router.inferencePool"
        )
    if spec.nodes > 1 and not crds.exists(lws.CRD):
        return (
            f"spec.nodes {spec.nodes} needs the LeaderWorkerSet API ({lws.CRD}), which is not installed; "
            "install LeaderWorkerSet (sigs.k8s.io/lws) or set spec.nodes to 1"
        )
    if spec.router is not None and spec.router.inference_pool is not None and not crds.exists(router.CRD):
        return (
            f"spec.router.inferencePool needs the Gateway API Inference Extension ({router.CRD}), which is not "
            "installed; install its CRDs or remove spec.router.inferencePool"
        )
    return ""


def scaleout_options(body: dict[str, Any], spec: GDNModelServerSpec, inputs: PlanInputs) -> ScaleOutOptions:
    """Cluster facts for the scale-out renderers: KEDA or HPA, and whether scale-up is paused (CrashLooping)."""
    if spec.autoscaling is None:
        return ScaleOutOptions()
    cfg = inputs.settings
    keda = bool(cfg.keda_prometheus_address) and inputs.crds.exists(autoscale.KEDA_CRD)
    return ScaleOutOptions(
        keda=keda,
        prometheus_address=cfg.keda_prometheus_address,
        scale_up_paused=st.is_true(body.get("status") or {}, st.CRASH_LOOPING),
    )
