"""Crash watch: classify engine container deaths, report them, and hand repeated ones to remediation.

Sources: the container's termination message (the kubelet puts the log tail there, since engine pods use
`terminationMessagePolicy: FallbackToLogsOnError`) and, while a container runs, a bounded streaming read
of its log (handlers/engines/logfollow.py: one follower per running engine container, started from pod events).
Each container death (pod uid, container, restart count) is handled once, also across operator restarts
(status.lastCrash remembers the last one handled).

The rest of the crash watch: handlers/core/remediation.py (the spec change for a repeated crash),
handlers/engines/quiet.py (clearing the crash conditions after a quiet period), handlers/engines/patchset.py (the
gdn-guard patch-set check), handlers/core/autoscaler.py (scale-up paused while CrashLooping).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gdn_operator import telemetry
from gdn_operator.api.overrides import live_overrides, revision
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.autoscaler import sync_scale_up
from gdn_operator.handlers.core.overrides import reapply
from gdn_operator.handlers.core.plan import PlanInputs, expected_objects, plan_key
from gdn_operator.handlers.core.remediation import maybe_remediate
from gdn_operator.handlers.engines.logfollow import LogFollowers, StreamedResults, evidence_for
from gdn_operator.redact import redact
from gdn_operator.render.engine import CONTAINER
from gdn_operator.render.scaleout import engine_args
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.groups import group_of, incident_members, same_incident
from gdn_operator.watch.result import ClassificationResult, best_result
from gdn_operator.watch.signatures import classify_termination_message

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Death:
    pod: str
    pod_uid: str
    container: str
    restart_count: int
    exit_code: int | None
    reason: str | None
    message: str
    finished_at: str | None
    crash_loop: bool
    args: tuple[str, ...] = ()
    group: str | None = None  # "<LeaderWorkerSet>/<group index>" for a pod of a multi-node engine


def deaths_in(pod: dict[str, Any], container: str = CONTAINER) -> list[Death]:
    """Deaths of the engine container `container` visible in a pod's status (current or last terminated state)."""
    out = []
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return []  # killed on purpose (rollout, scale-down, eviction): not an engine crash
    args = next(
        (tuple(c.get("args") or ()) for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == container), ()
    )
    group = group_of(meta.get("labels") or {})
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != container:
            continue
        restarts = int(cs.get("restartCount") or 0)
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        waiting = state.get("waiting") or {}
        crash_loop = waiting.get("reason") == "CrashLoopBackOff"
        for term, count in ((state.get("terminated"), restarts + 1), (last.get("terminated"), restarts)):
            if not term:
                continue
            if term.get("exitCode") == 0 and term.get("reason") == "Completed":
                continue
            out.append(
                Death(
                    pod=meta["name"],
                    pod_uid=meta.get("uid", ""),
                    container=container,
                    restart_count=count,
                    exit_code=term.get("exitCode"),
                    reason=term.get("reason"),
                    message=term.get("message") or "",
                    finished_at=term.get("finishedAt"),
                    crash_loop=crash_loop,
                    args=args,
                    group=group,
                )
            )
    return out


class SeenDeaths:
    """Deaths already handled (bounded), so re-delivered pod events never count a crash twice."""

    def __init__(self, size: int = 4096):
        self._d: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def add(self, key: tuple[str, int]) -> bool:
        with self._lock:
            if key in self._d:
                return False
            self._d[key] = None
            if len(self._d) > self._size:
                self._d.popitem(last=False)
            return True


class CrashWatchState(PlanInputs, Protocol):
    """What the crash watch reads and keeps besides the plan's inputs (the runtime provides all of it)."""

    @property
    def seen_deaths(self) -> SeenDeaths: ...

    @property
    def streamed(self) -> StreamedResults: ...

    @property
    def followers(self) -> LogFollowers: ...


def _current_args(obj: dict[str, Any], rt: PlanInputs) -> set[tuple[str, ...]] | None:
    """The engine argvs the operator renders for the object's current spec: one for a Deployment, the
    leader's and the workers' for a LeaderWorkerSet (None: cannot tell)."""
    objs = expected_objects(obj, rt)
    if not objs:
        return None
    return engine_args(objs)


def classify_death(rt: CrashWatchState, death: Death, evidence: Callable[[], Evidence | None]) -> ClassificationResult | None:
    """The diagnosis of one container death: its termination message and what its log stream showed, classified
    (`evidence`: what is known of the engine's configuration, read only for a death not seen before). None when
    this death was handled already (a re-delivered pod event). The one classification of every target's deaths:
    a GDNModelServer's (handle_death) and a guarded workload's (handlers/guard/supervisor.py)."""
    if not rt.seen_deaths.add((death.pod_uid, death.restart_count)):
        return None
    result = best_result(
        classify_termination_message(death.message, evidence=evidence()), rt.streamed.take(death.pod_uid, death.restart_count)
    )
    if not result.crashed:
        # Killed without a recognisable log (OOMKilled by the kernel, SIGKILL, ...): still a crash.
        result = ClassificationResult(
            crashed=True,
            signature="engine-dead" if death.reason != "OOMKilled" else "oom-killed",
            title="Engine container terminated",
            kind="generic",
            generic=True,
            root_cause=f"container exited with code {death.exit_code} ({death.reason or 'no reason'})",
        )
    return result


def handle_death(rt: CrashWatchState, namespace: str, name: str, death: Death) -> dict[str, Any] | None:
    """Classify one container death and record it. Returns the CR status after the update."""
    result = classify_death(rt, death, lambda: evidence_for(rt.servers, namespace, name))
    if result is None:
        return None
    outcome: dict[str, Any] = {}
    plans: dict[tuple[Any, ...], set[tuple[str, ...]] | None] = {}  # by plan_key: a conflict re-read re-plans only
    # when the generation or the overrides moved
    sig = result.signature or "engine-dead"
    upstream = result.upstream
    hint = result.remediation.hint if result.remediation else None

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        outcome.clear()
        gen = obj["metadata"].get("generation")
        prev = status.get("lastCrash") or {}
        prev_time = prev.get("time") or ""
        finished = death.finished_at or ""
        if prev.get("pod") == death.pod and int(prev.get("restartCount") or -1) >= death.restart_count:
            outcome["duplicate"] = True  # handled before an operator restart
            return
        if finished and prev_time and finished < prev_time and prev.get("pod") != death.pod:
            # another pod's death older than the last one recorded: replayed by the watch after an
            # operator restart (same-pod replays are caught by the restart count above)
            outcome["duplicate"] = True
            return
        # A pod still running a previous spec (rollout in progress) is reported, but its crashes do not
        # count toward remediating the current generation.
        key = plan_key(obj)
        if key not in plans:
            plans[key] = _current_args(obj, rt)
        current = plans[key]
        stale = bool(death.args) and current is not None and tuple(death.args) not in current
        # One crash of a multi-node group kills several pods: a death in the same group shortly after the
        # last recorded one is the same incident. It counts once, and keeps the root cause the first pod
        # showed when it only has a generic one (the leader's engine dies when a worker's does).
        members = incident_members(prev)
        incident = same_incident(prev, death.group, death.pod, gen, finished)
        eff_sig = prev.get("signature") if incident and result.generic and prev.get("signature") else sig
        outcome["signature"] = eff_sig
        # crashes count per revision: the generation plus the remediation overrides in force (a remediation
        # changes what runs without a new generation; the ladder's next step counts the new configuration's)
        rev = revision(gen, live_overrides(status, obj.get("spec") or {}, obj["metadata"].get("annotations"))[0])
        same = prev.get("signature") == eff_sig and prev.get("generation") == gen and prev.get("revision", str(gen)) == rev
        if stale or incident:
            count = int(prev.get("count") or 0) if same or incident else 0
            count = max(count, 0 if stale else 1)
        else:
            count = int(prev.get("count") or 0) + 1 if same else 1
        outcome["stale"] = stale
        outcome["incident"] = incident
        status["lastCrash"] = {
            k: v
            for k, v in {
                "time": death.finished_at or kube.now(),
                "pod": death.pod,
                "container": death.container,
                "group": death.group,
                "incidentPods": (members + [death.pod])[-16:] if incident else ([death.pod] if death.group else None),
                "signature": eff_sig,
                "upstream": upstream if eff_sig == sig else prev.get("upstream"),
                "kind": result.kind if eff_sig == sig else prev.get("kind"),
                "rootCause": (redact(result.root_cause or "")[:1024] or None) if eff_sig == sig else prev.get("rootCause"),
                "exitCode": death.exit_code,
                "restartCount": death.restart_count,
                "count": count,
                "generation": gen,
                "revision": rev,
                "remediationHint": hint if eff_sig == sig else prev.get("remediationHint"),
            }.items()
            if v is not None
        }
        looping = (death.crash_loop and not stale) or count >= 2
        label = f"{eff_sig} ({upstream})" if upstream and eff_sig == sig else eff_sig
        died = f"engine in pod {death.pod} died: {result.summary()}"
        if looping:
            st.set_condition(
                status,
                st.CRASH_LOOPING,
                True,
                "RepeatedCrash",
                f"{count} crashes of {label} on generation {gen}; last: {died}",
                gen,
            )
        elif not st.is_true(status, st.CRASH_LOOPING):
            # one crash: not a loop yet, but Degraded (EngineCrashed) until the quiet period clears it
            st.set_condition(status, st.CRASH_LOOPING, False, "EngineCrashed", died, gen)
        outcome.update(count=count, generation=gen, obj=obj)

    obj = rt.servers.update_status(namespace, name, mutate)  # from the newest body seen: no read
    if obj is None or outcome.get("duplicate") or "obj" not in outcome:
        return None
    telemetry.CRASHES.labels(namespace, name, sig, upstream or "").inc()
    msg = f"Engine in pod {death.pod} died (restart {death.restart_count}, exit {death.exit_code}): {result.summary()}"
    if death.group:
        msg = f"Engine group {death.group}: " + msg
    if outcome.get("stale"):
        msg += " (the pod runs a previous spec; not counted for the current one)"
    if outcome.get("incident"):
        msg += f" (same group crash as {outcome['signature']}; counted once)"
    if hint:
        msg += f". Remedy: {hint}"
    kube.emit_event(obj, "EngineCrashed", msg, "Warning")
    log.info(
        "engine crash on %s/%s generation %s: pod %s restart %s, %s, count %s%s",
        namespace,
        name,
        outcome["generation"],
        death.pod,
        death.restart_count,
        outcome["signature"],
        outcome["count"],
        " (previous spec, not counted)" if outcome.get("stale") else " (same group incident)" if outcome.get("incident") else "",
    )
    planned = None
    with rt.servers.applying(namespace, name):  # from the override's status write to its apply: not drift
        if (
            not outcome.get("stale")
            and not outcome.get("incident")
            and maybe_remediate(
                rt.servers,
                namespace,
                name,
                obj,
                result,
                outcome["count"],
                outcome["generation"],
                policy=rt.settings.default_policy,
            )
            is not None
        ):
            planned = reapply(namespace, name, rt)  # the override is in status; render and apply it now
    sync_scale_up(namespace, name, obj, rt, planned)  # the autoscaler from the same plan (no second one)
    return obj.get("status")


async def on_pod_event(rt: CrashWatchState, type: str, namespace: str, server: str, pod: dict[str, Any]) -> None:
    """The crash watch's part of an engine pod event (handlers/main.py fans each out here, then to the
    workload's status): classify deaths, and keep one log follower per running container."""
    if rt.settings.stream_logs:
        if type == "DELETED":
            rt.followers.stop(pod["metadata"].get("uid", ""))
        else:
            rt.followers.ensure(namespace, pod)
    if type == "DELETED":
        return
    for death in deaths_in(pod):
        await asyncio.to_thread(handle_death, rt, namespace, server, death)
