"""Crash watch: classify engine container deaths, report them, and stop deterministic crash loops.

Sources: the container's termination message (the kubelet puts the log tail there, since engine pods use
`terminationMessagePolicy: FallbackToLogsOnError`) and, while a container runs, a bounded streaming read
of its log (one follower task per running engine container, started from pod events). Each container death (pod uid, container, restart count) is
handled once, also across operator restarts (status.lastCrash remembers the last one handled).

Remediation: when one known signature repeats `spec.remediation.threshold` times on the same spec
generation, the catalogue's documented workaround is applied to the spec once (one remediation per
signature per generation; a change that is already in the spec is never re-applied, so it cannot loop; a
user edit starts a new generation and resets the count). A signature with a `remediation.ladder` (the
illegal-address signatures under TP >= 2, issue 18) first gets the ladder's settings that keep speculative
decoding on, in order, each tried once, with the step and its reason in status.remediations[].reason;
its own action (disable speculative decoding) is the last resort. A crash reported as a generic class
because the evidence for its upstream issue is missing (issue 16) carries action `investigate`: never
remediated automatically.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import kopf

from gdn_operator import telemetry
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.api.specpatch import merge as _merged_spec  # a merge patch applied as the API server does
from gdn_operator.handlers import kube
from gdn_operator.handlers import status as st
from gdn_operator.handlers.config import get_config
from gdn_operator.render.engine import CONTAINER, LABEL_SERVER
from gdn_operator.watch.groups import group_of, incident_members, same_incident
from gdn_operator.watch.guardline import SEARCH_BYTES as GUARD_SEARCH_BYTES
from gdn_operator.watch.guardline import GuardLine, check_patch_set, parse_guard_line
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.logstream import StreamClassifier
from gdn_operator.watch.signatures import ClassificationResult, best_result, classify_termination_message, default_catalogue
from gdn_operator.redact import redact

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- remediation map ---


@dataclass(frozen=True)
class Change:
    action: str  # human form, e.g. "asyncScheduling=false"
    patch: dict[str, Any]  # merge patch for .spec

    @classmethod
    def of(cls, change: SpecPatch | None) -> Change | None:
        return cls(change.describe(), change.merge_patch()) if change else None


def remediation_for(action: str, spec: GDNModelServerSpec) -> Change | None:
    """The spec change a catalogue remediation action makes (data/signatures.yaml `actions:`), or None when
    it needs a human (or is already in effect)."""
    return Change.of(default_catalogue().remedy_patch(action, spec))


# ----------------------------------------------------------------------------- crash handling ---


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


def deaths_in(pod: dict[str, Any]) -> list[Death]:
    """Container deaths visible in a pod's status (current terminated state or last terminated state)."""
    out = []
    meta, status = pod["metadata"], pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return []  # killed on purpose (rollout, scale-down, eviction): not an engine crash
    args = next((tuple(c.get("args") or ()) for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == CONTAINER), ())
    group = group_of(meta.get("labels") or {})
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") != CONTAINER:
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
                    container=CONTAINER,
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


class _Seen:
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


SEEN = _Seen()
#: Streamed-log classifications per (pod uid, restart count), consumed when the death is handled.
STREAMED: dict[tuple[str, int], ClassificationResult] = {}
_STREAMED_MAX = 4096


_STREAMED_LOCK = threading.Lock()


def remember_streamed(pod_uid: str, restart_count: int, result: ClassificationResult) -> None:
    with _STREAMED_LOCK:
        if len(STREAMED) >= _STREAMED_MAX and (pod_uid, restart_count) not in STREAMED:
            STREAMED.pop(next(iter(STREAMED)))
        STREAMED[(pod_uid, restart_count)] = result


def take_streamed(pod_uid: str, restart_count: int) -> ClassificationResult | None:
    with _STREAMED_LOCK:
        return STREAMED.pop((pod_uid, restart_count), None)


def _current_args(obj: dict[str, Any]) -> set[tuple[str, ...]] | None:
    """The engine argvs the operator renders for the object's current spec: one for a Deployment, the
    leader's and the workers' for a LeaderWorkerSet (None: cannot tell)."""
    from gdn_operator.handlers.reconcile import expected_objects
    from gdn_operator.render.scaleout import engine_args

    objs = expected_objects(obj)
    if not objs:
        return None
    return engine_args(objs)


def evidence_for(namespace: str, name: str) -> Evidence | None:
    """What the operator knows about a server from the spec it rendered (model family, speculative decoding,
    GDN prefill backend, vLLM version): the classifier names an upstream issue only with that evidence
    (or the log's). None when the server cannot be read or its spec is invalid."""
    try:
        obj = kube.get_server(namespace, name)
        return Evidence.from_spec(parse_spec((obj or {}).get("spec") or {})) if obj else None
    except Exception as e:  # noqa: BLE001 - evidence is optional: classify without it
        log.debug("no spec evidence for %s/%s: %s", namespace, name, e)
        return None


def handle_death(namespace: str, name: str, death: Death) -> dict[str, Any] | None:
    """Classify one container death and record it. Returns the CR status after the update."""
    if not SEEN.add((death.pod_uid, death.restart_count)):
        return None
    evidence = evidence_for(namespace, name)
    result = best_result(
        classify_termination_message(death.message, evidence=evidence), take_streamed(death.pod_uid, death.restart_count)
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
    outcome: dict[str, Any] = {}
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
        current = _current_args(obj)
        stale = bool(death.args) and current is not None and tuple(death.args) not in current
        # One crash of a multi-node group kills several pods: a death in the same group shortly after the
        # last recorded one is the same incident. It counts once, and keeps the root cause the first pod
        # showed when it only has a generic one (the leader's engine dies when a worker's does).
        members = incident_members(prev)
        incident = same_incident(prev, death.group, death.pod, gen, finished)
        eff_sig = prev.get("signature") if incident and result.generic and prev.get("signature") else sig
        outcome["signature"] = eff_sig
        same = prev.get("signature") == eff_sig and prev.get("generation") == gen
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
                "remediationHint": hint if eff_sig == sig else prev.get("remediationHint"),
            }.items()
            if v is not None
        }
        looping = (death.crash_loop and not stale) or count >= 2
        label = f"{eff_sig} ({upstream})" if upstream and eff_sig == sig else eff_sig
        if looping:
            st.set_condition(
                status, st.CRASH_LOOPING, True, "RepeatedCrash", f"{count} crashes of {label} on generation {gen}", gen
            )
        st.set_condition(
            status, st.DEGRADED, True, "EngineCrashed", f"engine in pod {death.pod} died: {result.summary()}", gen
        )
        outcome.update(count=count, generation=gen, obj=obj)

    obj = kube.update_status(namespace, name, mutate)
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
    if not outcome.get("stale") and not outcome.get("incident"):
        maybe_remediate(namespace, name, obj, result, outcome["count"], outcome["generation"])
    sync_scale_up(namespace, name, obj)
    return obj.get("status")


def _admission_refusal(obj: dict[str, Any], change: Change) -> str | None:
    """Why the workaround would itself not pass admission (None: it would)."""
    from gdn_operator.rules import evaluate

    try:
        new_spec = parse_spec(_merged_spec(obj.get("spec") or {}, change.patch))
        if not evaluate(new_spec, default_policy=get_config().default_policy).allowed:
            return f"{change.action} would itself be refused by admission"
    except ManifestError as e:
        return f"{change.action} would make the spec invalid: {'; '.join(e.problems)}"
    return None


def choose_remediation(
    sig: str, result: ClassificationResult, spec: GDNModelServerSpec, obj: dict[str, Any]
) -> tuple[Change | None, str | None, str | None]:
    """(change, refusal, reason) for a repeated crash.

    A signature's `remediation.ladder` (data/signatures.yaml) lists settings that keep speculative decoding on;
    those that apply at the spec's tensorParallelSize are tried in order, each at most once for this signature
    (status.remediations remembers what was tried), before the signature's own action (the last resort).
    A step already in effect, or one admission would refuse, is passed over."""
    rem = result.remediation
    action = rem.action if rem else "investigate"
    steps = [st for st in (rem.ladder if rem else ()) if spec.tensor_parallel_size >= st.min_tp]
    tried = {r.get("action") for r in (obj.get("status") or {}).get("remediations") or [] if r.get("signature") == sig}
    refusal = None
    passed: list[str] = []
    for i, step in enumerate(steps):
        change = remediation_for(step.action, spec)
        if change is None:
            continue
        if change.action in tried:
            passed.append(f"{change.action} (tried before)")
            continue
        refusal = _admission_refusal(obj, change)
        if refusal:
            passed.append(refusal)
            continue
        last = "; ".join(passed)
        return change, None, (
            f"step {i + 1} of {len(steps)} that keep speculative decoding on: {change.action} ({step.reason})"
            + (f"; passed over: {last}" if last else "") + f"; last resort: {action}"
        )
    change = remediation_for(action, spec)
    if change is not None:
        refusal = _admission_refusal(obj, change)
        if refusal:
            return None, refusal, None
        why = None
        if steps:
            why = f"last resort after the settings that keep speculative decoding on ({'; '.join(passed) or 'none applicable'})"
        return change, None, why
    return None, refusal, None


def sync_scale_up(namespace: str, name: str, obj: dict[str, Any]) -> None:
    """An autoscaled server pauses scale-up while CrashLooping (and resumes when it clears): re-apply its
    autoscaler, which the renderer gives scaleUp.selectPolicy Disabled while the condition is True."""
    if not (obj.get("spec") or {}).get("autoscaling"):
        return
    from gdn_operator.handlers.reconcile import apply_autoscaler

    apply_autoscaler(namespace, name)


def maybe_remediate(
    namespace: str, name: str, obj: dict[str, Any], result: ClassificationResult, count: int, generation: int | None
) -> Change | None:
    try:
        spec = parse_spec(obj.get("spec") or {})
    except ManifestError:
        return None
    if spec.remediation.mode != "auto" or count < spec.remediation.threshold or result.generic:
        return None
    sig = result.signature or ""
    action = result.remediation.action if result.remediation else "investigate"
    change, refusal, why = choose_remediation(sig, result, spec, obj)
    hint = result.remediation.hint if result.remediation else "Investigate the engine log."
    trigger = f"{sig} crashed the engine {count} times on generation {generation}"

    def claimed_crash(status: dict[str, Any]) -> None:
        if change:
            st.set_condition(status, st.CRASH_LOOPING, True, "Remediated", f"applied {change.action} after {sig}", generation)

    return remediate_once(
        namespace, name, obj, signature=sig, upstream=result.upstream, generation=generation, change=change,
        reason=trigger + (f"; {why}" if change and why else "")
        + ("" if change else f"; no automatic workaround left ({refusal or action}): {hint}"),
        not_possible=f"{sig} repeated {count} times; no automatic workaround left ({refusal or action}): {hint}",
        applied=f"Applied {{action}} to stop repeated {sig}" + (f" ({result.upstream})" if result.upstream else "")
        + f" after {count} crashes; edit the spec to revert."
        + (f" {why[0].upper()}{why[1:]}." if why else ""),
        on_claim=claimed_crash,
    )


def change_from_mitigation(rule: str, mitigation: dict[str, Any] | None, spec: dict[str, Any]) -> Change | None:
    """A catalogue rule's `mitigation` (camelCase spec paths → value, None = unset) as a merge patch, or
    None when there is none or it is already in effect."""
    return Change.of(SpecPatch.of(mitigation).pending(spec))


def vet_change(obj: dict[str, Any], change: Change | None) -> tuple[Change | None, str | None]:
    """The change if the patched spec is valid and itself passes admission; else (None, why not)."""
    if change is None:
        return None, None
    refusal = _admission_refusal(obj, change)
    return (None, refusal) if refusal else (change, None)


def remediate_once(
    namespace: str, name: str, obj: dict[str, Any], *, signature: str, upstream: str | None, generation: int | None,
    change: Change | None, reason: str, not_possible: str, applied: str,
    on_claim: Callable[[dict[str, Any]], None] | None = None,
) -> Change | None:
    """Record and apply one remediation per `signature` per generation (shared by the crash watch and the
    output probes). The decision is claimed atomically in status.remediations (resourceVersion), so two
    triggers at the same moment cannot both act; `change` None records that nothing automatic is left
    (Event RemediationNotPossible, message `not_possible`). `applied` is the Remediated Event's message,
    with {action} filled in."""
    record = {
        "time": kube.now(),
        "signature": signature,
        "upstream": upstream,
        "generation": generation,
        "action": change.action if change else "none",
        "changes": change.patch if change else {},
        "reason": reason,
    }
    claimed: list[bool] = []

    def claim(status: dict[str, Any], _obj: dict[str, Any]) -> None:
        claimed.clear()
        rem = list(status.get("remediations") or [])
        if any(r.get("signature") == signature and r.get("generation") == generation for r in rem):
            return
        rem.append({k: v for k, v in record.items() if v is not None})
        status["remediations"] = rem[-32:]
        if on_claim is not None:
            on_claim(status)
        claimed.append(True)

    kube.update_status(namespace, name, claim)
    if not claimed:
        return None
    if change is None:
        kube.emit_event(obj, "RemediationNotPossible", not_possible, "Warning")
        return None
    kube.patch_server(
        namespace,
        name,
        {"spec": change.patch, "metadata": {"annotations": {"serving.gdn-operator.io/last-remediation": f"{signature}: {change.action}"}}},
    )
    telemetry.REMEDIATIONS.labels(namespace, name, signature, change.action).inc()
    log.info("remediated %s/%s: %s for %s on generation %s", namespace, name, change.action, signature, generation)
    kube.emit_event(obj, "Remediated", applied.replace("{action}", change.action), "Warning")
    return change


#: How long engines must run without a crash before CrashLooping / Degraded(EngineCrashed) clear.
QUIET_SECONDS = float(os.environ.get("GDN_CRASH_QUIET_SECONDS", "600"))
#: How often the supervisor (handlers/acceptance.py) checks flagged servers for a quiet period.
QUIET_CHECK_SECONDS = 60.0


def _age_seconds(ts: str | None) -> float:
    if not ts:
        return float("inf")
    try:
        t = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (dt.datetime.now(dt.timezone.utc) - t).total_seconds()


def clear_crash_conditions(namespace: str, name: str) -> None:
    """Clear the crash conditions once the engines have run QUIET_SECONDS without a crash (a crash loop
    has ready phases between crashes, so a single ready pod must not clear them)."""

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        gen = obj["metadata"].get("generation")
        if _age_seconds((status.get("lastCrash") or {}).get("time")) < QUIET_SECONDS:
            return
        if not st.is_true(status, st.READY):
            return
        if st.is_true(status, st.CRASH_LOOPING):
            st.set_condition(status, st.CRASH_LOOPING, False, "EnginesRunning", "engines are running", gen)
        c = st.get_condition(status, st.DEGRADED)
        if c and c.get("reason") == "EngineCrashed" and c.get("status") == "True":
            st.set_condition(status, st.DEGRADED, False, "EnginesRunning", "", gen)

    obj = kube.update_status(namespace, name, mutate)
    if obj is not None:
        sync_scale_up(namespace, name, obj)


# ------------------------------------------------------------------------------------ kopf wiring ---


async def on_pod_event(type: str, namespace: str, server: str, pod: dict[str, Any]) -> None:
    """The crash watch's part of an engine pod event (called by workload.pod_event, which owns the one
    kopf handler for engine pods): classify deaths, and keep one log follower per running container."""
    if get_config().stream_logs:
        if type == "DELETED":
            FOLLOWERS.stop(pod["metadata"].get("uid", ""))
        else:
            FOLLOWERS.ensure(namespace, pod)
    if type == "DELETED":
        return
    for death in deaths_in(pod):
        await asyncio.to_thread(handle_death, namespace, server, death)



PATCH_SET = "PatchSetVerified"


def report_patch_check(namespace: str, name: str, pod: str, line: GuardLine | None) -> None:
    """Compare what the gdn-guard plugin reported in the engine log with spec.image.patches."""
    events: list[tuple[str, str]] = []

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        image = (obj.get("spec") or {}).get("image") or {}
        check = check_patch_set(image.get("patches") or [], line, str(image.get("vllmVersion", "")))
        if line is None and check.ok:
            return  # nothing declared, no plugin: nothing to say
        gen = obj["metadata"].get("generation")
        msg = f"pod {pod}: {check.message}"
        if st.set_condition(status, PATCH_SET, check.ok, check.reason, msg, gen) and not check.ok:
            events.append((check.reason, msg))
        if not check.ok:
            st.set_condition(status, st.DEGRADED, True, check.reason, msg, gen)
        else:
            d = st.get_condition(status, st.DEGRADED)
            if d and d.get("status") == "True" and d.get("reason") in ("PatchSetMismatch", "GuardLineMissing", "VersionMismatch"):
                st.set_condition(status, st.DEGRADED, False, "PatchSetVerified", "", gen)

    obj = kube.update_status(namespace, name, mutate)
    if obj is not None:
        for reason, msg in events:
            kube.emit_event(obj, reason, msg, "Warning")


#: Log streams hold a thread for as long as the engine runs: they get their own pool, so they can never
#: starve the pool that status writes and reconciles use.
LOG_POOL = ThreadPoolExecutor(max_workers=int(os.environ.get("GDN_MAX_LOG_STREAMS", "256")), thread_name_prefix="gdn-log")


@dataclass
class StreamState:
    """What survives a reconnect of one container instance's log stream."""

    classifier: StreamClassifier
    last_read: float | None = None  # time.time() of the last chunk
    guard_done: bool = False
    searched: int = 0
    carry: str = ""


def _stream_once(
    namespace: str, pod: str, restart_count: int, pod_uid: str, stop: Callable[[], bool],
    on_guard: Callable[[GuardLine | None], None], state: StreamState,
) -> str:
    """Follow one container instance's log until the stream ends. Returns why it ended."""
    import kubernetes

    core = kubernetes.client.CoreV1Api(kube.api_client())
    kw: dict[str, Any] = {}
    if state.last_read is not None:  # reconnect: do not read the whole log again
        kw["since_seconds"] = max(1, math.ceil(time.time() - state.last_read) + 1)
    # the raw urllib3 response (_preload_content=False), not the str the client's annotation promises
    resp: Any = core.read_namespaced_pod_log(
        pod, namespace, container=CONTAINER, follow=True, _preload_content=False, _request_timeout=(10, 600), **kw
    )
    sc = state.classifier
    try:
        for chunk in resp.stream(64 * 1024):
            state.last_read = time.time()
            sc.feed(chunk)
            if sc.crashed:
                # keep the diagnosis as soon as it is there: the process may be killed before EOF,
                # and the instance that ran with restartCount N dies as death number N+1 (deaths_in)
                remember_streamed(pod_uid, restart_count + 1, sc.result())
            if not state.guard_done:
                text = state.carry + chunk.decode("utf-8", errors="replace")
                found = parse_guard_line(text)
                state.searched += len(chunk)
                if found is not None or state.searched >= GUARD_SEARCH_BYTES:
                    on_guard(found)
                    state.guard_done = True
                state.carry = text[-1024:]
            if stop():
                return "stopped"
        return "eof"
    finally:
        resp.release_conn()


def _instance_running(namespace: str, pod: str, uid: str, restart: int) -> bool | None:
    """Whether this container instance still runs; None when the API server cannot say (outage)."""
    import kubernetes
    from kubernetes.client.rest import ApiException

    p: Any  # the raw HTTP response (_preload_content=False)
    try:
        p = kubernetes.client.CoreV1Api(kube.api_client()).read_namespaced_pod(pod, namespace, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return False
        return None if e.status >= 500 or e.status == 429 else False
    except Exception:  # noqa: BLE001 - connection refused/reset, timeouts: the API server is away, not the pod
        return None
    body = json.loads(p.data)
    p.release_conn()
    if body["metadata"].get("uid") != uid or body["metadata"].get("deletionTimestamp"):
        return False
    cs: dict[str, Any] = next(
        (c for c in (body.get("status") or {}).get("containerStatuses") or [] if c.get("name") == CONTAINER), {})
    return int(cs.get("restartCount") or 0) == restart and bool((cs.get("state") or {}).get("running"))


class LogFollowers:
    """One bounded log-follow task per running engine container instance, started from pod events.

    (Not a kopf daemon: daemons make kopf put a finalizer on every engine pod, which would block pod
    deletion whenever the operator is down.)"""

    def __init__(self) -> None:
        self.tasks: dict[str, tuple[int, asyncio.Task[None]]] = {}

    def ensure(self, namespace: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"].get("uid", "")
        cs = next((c for c in (pod.get("status") or {}).get("containerStatuses") or [] if c.get("name") == CONTAINER), None)
        running = bool(cs and (cs.get("state") or {}).get("running"))
        restart = int((cs or {}).get("restartCount") or 0)
        current = self.tasks.get(uid)
        if current and (not current[1].done()) and current[0] == restart and running:
            return
        if current and not current[1].done() and current[0] != restart:
            current[1].cancel()
        if not running or pod["metadata"].get("deletionTimestamp"):
            return
        name = pod["metadata"]["name"]
        server = (pod["metadata"].get("labels") or {}).get(LABEL_SERVER, "")
        task = asyncio.get_running_loop().create_task(self._follow(namespace, name, uid, restart, server))
        self.tasks[uid] = (restart, task)

    def stop(self, uid: str) -> None:
        cur = self.tasks.pop(uid, None)
        if cur:
            cur[1].cancel()

    def stop_all(self) -> None:
        for uid in list(self.tasks):
            self.stop(uid)

    async def _follow(self, namespace: str, pod: str, uid: str, restart: int, server: str) -> None:
        stop = threading.Event()
        backoff = 1.0
        checked: list[bool] = []

        def on_guard(line: GuardLine | None) -> None:
            if not checked:  # once per container instance, also across reconnects
                checked.append(True)
                report_patch_check(namespace, server, pod, line)

        loop = asyncio.get_running_loop()
        evidence = await loop.run_in_executor(LOG_POOL, evidence_for, namespace, server) if server else None
        state = StreamState(StreamClassifier(evidence=evidence))
        try:
            while True:  # until this container instance ends; a restart starts a new task
                try:
                    why = await loop.run_in_executor(
                        LOG_POOL, _stream_once, namespace, pod, restart, uid, stop.is_set, on_guard, state
                    )
                    if why == "stopped":
                        return
                    backoff = 1.0  # a clean end: the API server closed the stream (or the container ended)
                except Exception as e:  # noqa: BLE001 - disconnects, 4xx from fake nodes: retry with backoff
                    log.debug("log stream of %s/%s interrupted: %s", namespace, pod, e)
                running = await loop.run_in_executor(LOG_POOL, _instance_running, namespace, pod, uid, restart)
                if running is False:
                    state.classifier.close()
                    if state.classifier.crashed:
                        remember_streamed(uid, restart + 1, state.classifier.result())
                    if not state.guard_done and state.searched:
                        try:
                            on_guard(None)
                        except Exception as e:  # noqa: BLE001 - best effort: the patch check is a report
                            log.warning("patch-set check of %s/%s not recorded: %s", namespace, pod, e)
                    return
                # running, or unknown during an API-server outage: follow again after the backoff
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 120.0)
        finally:
            stop.set()


FOLLOWERS = LogFollowers()


@kopf.on.cleanup()
async def stop_followers(**_: Any) -> None:
    FOLLOWERS.stop_all()
