"""Stall watch: the stall detector (watch/stall.py) run on every round of the acceptance scrape loop (no poller
of its own), its verdicts in status.stall, condition Stalled (Degraded derives from it), the gdn_engine_* gauges,
and the once-per-generation ladder that ends a stall.

A pod is one detector (a multi-node group: its leader, the pod that serves /metrics; its verdict is the
group's, and restarting the leader makes the LeaderWorkerSet recreate the group). A round whose scrape of a
pod failed keeps that pod's last known verdict (MetricsAvailable says the scrape failed; a missing scrape never
starts or ends a stall).

The ladder (status.remediations, the crash watch's record, once per configuration revision — the generation
plus the remediation overrides in force; spec.remediation.mode auto only):

1. ``engine-stall``: delete the stalled pod(s) (the workload controller replaces them);
2. ``engine-stall/cudagraph``: stalled again on the same revision, with MTP and FULL decode CUDA graphs in the
   configuration that runs (the trigger of rule gdn-operator/mtp-full-decode-cudagraph, G1, whose evidence
   includes these stalls): G1's mitigation, CUDA-graph mode PIECEWISE (remedies data action
   ``cudagraph-piecewise``), as an operator-owned override (status.overrides; the spec is never written),
   rendered at once. It keeps MTP on, and makes a new revision: a stall after it starts the ladder again;
3. otherwise nothing automatic is left (Event RemediationNotPossible; disabling speculative decoding is the last
   resort, for a human).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gdn_operator import telemetry
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.overrides import live_overrides, revision
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.overrides import reapply
from gdn_operator.handlers.core.plan import PlanInputs
from gdn_operator.handlers.core.remediation import remediate_once, remediation_for, running_spec, vet_change
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.rules import effective_config, load_rules
from gdn_operator.settings import Settings
from gdn_operator.watch.stall import DEFAULT_STALL_SECONDS, StallDetector, StallVerdict
from gdn_operator.watch.target import EngineTarget

__all__ = ["DEFAULT_STALL_SECONDS", "PodVerdict", "StallWatch", "apply_condition", "end_stall", "g1_trigger", "stall_status"]

SIGNATURE = "engine-stall"
SIGNATURE_CUDAGRAPH = "engine-stall/cudagraph"
#: the rule whose trigger (MTP + FULL decode CUDA graphs) and mitigation (PIECEWISE) the ladder's second step uses
G1 = "gdn-operator/mtp-full-decode-cudagraph"
#: CUDA-graph modes with FULL graphs (effective value; auto = vLLM's FULL_AND_PIECEWISE default)
FULL_GRAPH_MODES = frozenset({"auto", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})
#: the remedies-data action (watch/data/signatures.yaml `actions:`) of the second step
PIECEWISE_ACTION = "cudagraph-piecewise"


@dataclass(frozen=True)
class PodVerdict:
    pod: str
    uid: str | None
    group: str | None
    verdict: StallVerdict
    since: float | None  # time.time() the progress stopped (stalled pods)


@dataclass
class _PodState:
    uid: str | None
    detector: StallDetector
    known: StallVerdict | None = None  # last verdict from a good scrape


class StallWatch:
    """Detectors per engine pod, by target (a GDNModelServer or a guarded workload; runtime state, held by the
    AcceptanceSupervisor)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._pods: dict[EngineTarget, dict[str, _PodState]] = {}
        self._clock = clock
        #: uids of the pods the ladder deleted (bounded: a uid is never reused)
        self.restarted: set[str] = set()

    def observe_round(
        self, target: EngineTarget, stall_seconds: float, pods: list[dict[str, Any]], results: list[Any]
    ) -> list[PodVerdict]:
        """Feed one scrape round (results of scraper.Scraper for `pods`); the verdict of every scraped pod."""
        now = self._clock()
        wall = time.time()
        by_name = {p["name"]: p for p in pods}
        namespace, name = target.namespace, target.name
        states = self._pods.setdefault(target, {})
        for pod in [p for p in states if p not in by_name or states[p].uid != by_name[p].get("uid")]:
            self._drop(target, pod, states)
        out = []
        for r in results:
            p = by_name.get(r.target.pod)
            if p is None:
                continue
            s = states.get(p["name"])
            if s is None or s.detector.stall_seconds != stall_seconds:
                s = states[p["name"]] = _PodState(p.get("uid"), StallDetector(stall_seconds))
            v = s.detector.observe(now, r.snapshot if r.ok else None)
            if v.known:
                s.known = v
            shown = v if v.known else (s.known or v)
            telemetry.ENGINE_STALLED.labels(namespace, name, p["name"]).set(1 if shown.stalled else 0)
            telemetry.ENGINE_SECONDS_WITHOUT_PROGRESS.labels(namespace, name, p["name"]).set(shown.seconds_without_progress)
            since = wall - shown.seconds_without_progress if shown.stalled else None
            out.append(PodVerdict(p["name"], p.get("uid"), p.get("group"), shown, since))
        return out

    def _drop(self, target: EngineTarget, pod: str, states: dict[str, _PodState]) -> None:
        states.pop(pod, None)
        for g in (telemetry.ENGINE_STALLED, telemetry.ENGINE_SECONDS_WITHOUT_PROGRESS):
            with contextlib.suppress(KeyError):
                g.remove(target.namespace, target.name, pod)

    def forget(self, target: EngineTarget) -> None:
        states = self._pods.pop(target, {})
        for pod in list(states):
            self._drop(target, pod, states)


def stall_status(
    verdicts: list[PodVerdict], stall_seconds: float, hang: Callable[[str], str], probe_timeouts: Callable[[str], int]
) -> dict[str, Any] | None:
    """status.stall (api.status.StallStatus) for the stalled pods; None when none is stalled."""
    stalled = [pv for pv in verdicts if pv.verdict.stalled]
    if not stalled:
        return None
    pods = []
    for pv in stalled[:64]:
        v = pv.verdict
        entry: dict[str, Any] = {
            "pod": pv.pod,
            "group": pv.group,
            "running": v.running,
            "waiting": v.waiting,
            "secondsWithoutProgress": round(v.seconds_without_progress),
            "tokensPerRequestSecond": v.rate,
            "engineSteps": v.steps,
            "hangEvidence": hang(pv.pod) or None,
            "probeTimeouts": probe_timeouts(pv.pod) or None,
            "since": kube.iso(pv.since) if pv.since is not None else None,
        }
        pods.append({k: x for k, x in entry.items() if x is not None})
    return {"stallSeconds": int(stall_seconds), "stalled": pods}


def condition_message(stall: dict[str, Any]) -> str:
    """Stalled's message: each stalled pod with what is stuck and for how long, with the supporting evidence."""
    parts = []
    for p in stall["stalled"]:
        what = (
            f"{p['pod']}"
            + (f" (group {p['group']})" if p.get("group") else "")
            + f": {p['running']} running, {p['waiting']} waiting, no progress for {p['secondsWithoutProgress']}s"
        )
        if p.get("tokensPerRequestSecond") is not None:
            what += f" ({p['tokensPerRequestSecond']:.2f} tokens/s per running request"
            what += f", {p['engineSteps']:.0f} engine steps)" if p.get("engineSteps") is not None else ")"
        if p.get("hangEvidence"):
            what += f"; log: {p['hangEvidence']}"
        if p.get("probeTimeouts"):
            what += f"; output probes timed out {p['probeTimeouts']}x"
        parts.append(what)
    return "; ".join(parts) + f" (stallSeconds {stall['stallSeconds']}, /health still answers)"


def apply_condition(status: dict[str, Any], stall: dict[str, Any] | None, generation: int | None) -> list[tuple[str, str, str]]:
    """Set status.stall and condition Stalled; the Events of a transition (one per transition)."""
    prev = st.get_condition(status, st.STALLED) or {}
    events: list[tuple[str, str, str]] = []
    if stall is not None:
        status["stall"] = stall
        msg = condition_message(stall)
        st.set_condition(status, st.STALLED, True, st.STALL_REASON, msg, generation)
        if prev.get("status") != "True":
            events.append(("Warning", st.STALL_REASON, msg))
    else:
        status.pop("stall", None)
        if prev.get("status") == "True":
            st.set_condition(status, st.STALLED, False, "EnginesProgressing", "no engine is stalled", generation)
            events.append(("Normal", "StallEnded", "no engine is stalled any more"))
    return events


def metrics_disabled(status: dict[str, Any], generation: int | None) -> None:
    """Metrics turned off: no status.stall, and Stalled (if ever set) Unknown: no stall detection."""
    status.pop("stall", None)
    if st.get_condition(status, st.STALLED) is not None:
        st.set_condition(
            status, st.STALLED, None, "MetricsDisabled", "spec.metrics.enabled is false: no stall detection", generation
        )


def g1_trigger(spec: GDNModelServerSpec) -> bool:
    """MTP with FULL decode CUDA graphs on a GDN hybrid in the configuration that runs, at any version and any layer
    layout. Broader than G1's `when` (two full-attention KV-cache groups, V1 runner): the ladder reacts to a stall it
    saw, and the TP=2 stall of that configuration is not shown to need the split (rules.yaml G1 evidence)."""
    if load_rules().rule(G1) is None:
        return False
    v = effective_config(spec).values
    return bool(v["gdn_hybrid"] and v["mtp"] and v["cudagraph_mode"] in FULL_GRAPH_MODES)


def end_stall(
    namespace: str,
    name: str,
    obj: dict[str, Any],
    stalled: list[PodVerdict],
    message: str,
    restarted: set[str],
    inputs: PlanInputs | None,
    servers: Servers,
) -> str | None:
    """The ladder's next step for the pods stalled this round (module docstring); returns what was done.
    `restarted`: uids of pods this operator deleted (runtime state): a pod on its way out is not a new stall.
    `inputs` (the runtime) renders an override now; None: it is recorded and rendered by the next reconcile."""
    stalled = [pv for pv in stalled if pv.uid not in restarted]
    if not stalled:
        return None
    try:
        spec = parse_spec(obj.get("spec") or {})
    except ManifestError:
        return None
    if spec.remediation.mode != "auto":
        return None
    policy = inputs.settings.default_policy if inputs is not None else Settings().default_policy
    gen = obj["metadata"].get("generation")
    status = obj.get("status") or {}
    rev = revision(gen, live_overrides(status, obj.get("spec") or {}, (obj.get("metadata") or {}).get("annotations"))[0])
    done = {
        r.get("signature")
        for r in status.get("remediations") or []
        if r.get("generation") == gen and r.get("revision", str(gen)) == rev
    }
    where = ", ".join(pv.pod + (f" (group {pv.group})" if pv.group else "") for pv in stalled)
    may_delete = inputs.settings.stall_restart if inputs is not None else Settings().stall_restart
    if SIGNATURE not in done and may_delete:  # (operator.stallRestart false: no pod delete is granted; next step)
        action = "restart " + ", ".join(pv.pod for pv in stalled)

        def restart() -> bool:
            gone = False
            for pv in stalled:
                if pv.uid:
                    restarted.add(pv.uid)
                gone = kube.delete_pod(namespace, pv.pod, pv.uid) or gone
            return gone

        remediate_once(
            servers,
            namespace,
            name,
            obj,
            signature=SIGNATURE,
            upstream=None,
            generation=gen,
            change=None,
            reason=f"engine stalled on generation {gen}: {message}",
            not_possible="",
            applied=f"Restarted the stalled engine pod(s) {where}: {message}",
            act=(action, restart),
        )
        return action
    if SIGNATURE_CUDAGRAPH in done:
        return None
    running = running_spec(obj, policy)
    change, refusal = (None, None)
    if g1_trigger(running):
        change, refusal = vet_change(obj, remediation_for(PIECEWISE_ACTION, running), policy)
    if change is not None:
        remediate_once(
            servers,
            namespace,
            name,
            obj,
            signature=SIGNATURE_CUDAGRAPH,
            upstream=G1,
            generation=gen,
            change=change,
            reason=(
                f"{where} stalled again after the restart ({message}); MTP with FULL decode CUDA graphs is the "
                f"trigger of rule {G1}, whose mitigation keeps MTP on"
            ),
            not_possible="",
            applied=(
                f"Applied {{action}} (rule {G1}, keeps MTP on) as an operator override: {where} "
                f"stalled again after its restart ({message}). Edit the spec to revert."
            ),
        )
        if inputs is not None:
            reapply(namespace, name, inputs)  # the override is in status; render and apply it now
        return change.action
    advice = (
        f"{where} stalled again after the restart on generation {gen} ({message}); no automatic step is left"
        + (f" ({refusal})" if refusal else "")
        + ": collect the engine log; disabling speculative decoding is the last resort, for a human."
    )
    remediate_once(
        servers,
        namespace,
        name,
        obj,
        signature=SIGNATURE_CUDAGRAPH,
        upstream=None,
        generation=gen,
        change=None,
        reason=advice,
        not_possible=advice,
        applied="",
    )
    return "advice"
