"""Output probes, the wiring: each interval, send every probe of a GDNModelServer to each of its Ready
engine pods that runs the current spec, judge the answers (watch/probes.py), and report: status.probes,
the OutputConsistent condition (Degraded while it is False), an Event per transition, and the
gdn_probe_* metrics. On a failure that matches a silent-corruption rule the admission let through with a
warning, the diagnosis names the rule, and with `spec.remediation.mode: auto` the rule's mitigation is
recorded once per revision as an operator override (remediation.remediate_once) and rendered (overrides.reapply);
the spec and its generation do not change.

Counts, alarm and reference belong to one REVISION — the generation plus the remediation overrides in force
(api/overrides.revision) — not only to the generation: a remediation changes what the engine runs without a new
generation, so the probes start over on it (counts reset, reference re-learned from an engine of the new
revision, one remediation hook per revision), exactly as they do on a new generation.

Runtime state lives in one ProbeSupervisor, held by the runtime (handlers/runtime.py); handlers/main.py
feeds it GDNModelServer events, and it reads pods from the acceptance supervisor's view of kopf's index.

Load shape: one shared HTTP session and a global bound on requests in flight (watch/probe_client.py);
at most one round in flight per server — hence per pod; each server's first round is placed at a random
point of its interval and later rounds are jittered by ±10%, so many servers never fire together;
status is only written when something other than the round count changed.

Size (~530 lines): the supervisor (loop, rounds, metrics) and the per-revision configuration it parses are one
state machine; the remediation hook (remediate, diagnose) is the part that would move out first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gdn_operator import telemetry
from gdn_operator.api.overrides import live_overrides, revision
from gdn_operator.api.probes import ProbesSpec
from gdn_operator.handlers.core import conditions as st
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core.overrides import reapply
from gdn_operator.handlers.core.plan import PlanInputs, plan
from gdn_operator.handlers.core.pods import engine_fingerprint
from gdn_operator.handlers.core.remediation import change_from_mitigation, remediate_once, running_dict, vet_change
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.render.engine import CONTAINER, ENGINE_PORT
from gdn_operator.watch.probe_client import ProbeClient, completions_url
from gdn_operator.watch.probes import (
    ERROR,
    ERROR_REASONS,
    LEARNING,
    REASONS,
    Answer,
    Asked,
    Condition,
    Outcome,
    ProbeBook,
    judge_round,
)
from gdn_operator.watch.target import EngineTarget

log = logging.getLogger(__name__)

PROBE_REASONS = tuple(REASONS.values())  # OutputConsistent=False: gdn_output_inconsistent
NO_ANSWER_REASONS = tuple(dict.fromkeys(ERROR_REASONS.values()))  # Unknown, no answer: gdn_probe_failing


@dataclass
class ServerProbes:
    """What the supervisor knows about one GDNModelServer's probes (current revision)."""

    spec: ProbesSpec | None
    generation: int | None = None
    revision: str = ""  # generation + remediation overrides in force (api/overrides.revision); "" = the generation's
    image: str = ""
    model: str = ""
    engine: str = ""  # engine_fingerprint of the current spec's container ("" = any pod)
    warned: list[dict[str, Any]] = field(default_factory=list)  # silent-corruption findings admitted under warn
    remediation_auto: bool = False
    policy: str = "reject"  # the operator's default admission policy: a mitigation must pass admission under it
    book: ProbeBook | None = None
    reference: dict[str, Answer] = field(default_factory=dict)
    ref_meta: dict[str, Any] = field(default_factory=dict)
    next_due: float = 0.0
    task: asyncio.Task[None] | None = None
    written: str | None = None  # fingerprint of the last status written
    remediated: bool = False  # remediation hook already ran on this revision
    api_key: str | None = field(default=None, repr=False)  # spec.apiKeySecret's value, sent as a Bearer token
    api_key_problem: str = ""  # why spec.apiKeySecret could not be read (named when the engines answer 401)

    def __post_init__(self) -> None:
        if not self.revision:
            self.revision = str(self.generation)


def _warned_rules(ev: Any) -> list[dict[str, Any]]:
    if ev is None:
        return []
    return [
        {"rule": f.rule, "title": f.title, "workaround": f.workaround, "mitigation": f.mitigation}
        for f in ev.findings
        if f.kind == "silent-corruption" and f.action == "warned"
    ]


def body_revision(body: dict[str, Any]) -> str:
    """The revision a GDNModelServer body runs: its generation plus the remediation overrides in force."""
    meta = body.get("metadata") or {}
    live = live_overrides(body.get("status") or {}, body.get("spec") or {}, meta.get("annotations"))[0]
    return revision(meta.get("generation"), live)


def _rev_of(saved: dict[str, Any]) -> str:
    """The revision a saved status entry belongs to (one written before revisions: its generation's)."""
    return str(saved.get("revision") or saved.get("generation"))


def _api_key(namespace: str, name: str, ref: Any) -> tuple[str | None, str]:
    """The API key the engines of a server with spec.apiKeySecret expect, and "" (None without one), or None
    and why it is unreadable: the probes then get HTTP 401, OutputConsistent=Unknown/ProbeUnauthorized."""
    if ref is None:
        return None, ""
    key, problem = kube.read_secret_key(namespace, ref.name, ref.key)
    if problem:
        log.info("output probes for %s/%s: cannot read spec.apiKeySecret %s/%s: %s", namespace, name, ref.name, ref.key, problem)
        problem = f"spec.apiKeySecret {ref.name}/{ref.key} cannot be read: {problem}"
    return key, problem


def _unauthorized_hint(s: ServerProbes) -> str:
    """What to do when the engines answer the probes with 401/403."""
    if s.api_key_problem:
        return s.api_key_problem
    if s.api_key is not None:
        return "the engines refused the key of spec.apiKeySecret (changed since the pods started?)"
    return "the engines ask for an API key and the server has no spec.apiKeySecret"


def server_from_body(body: dict[str, Any], rt: PlanInputs) -> ServerProbes:
    """Parse a GDNModelServer into the probe configuration of its current revision (blocking: renders)."""

    meta = body["metadata"]
    gen = meta.get("generation")
    rev = body_revision(body)
    raw = (body.get("spec") or {}).get("probes")
    if not raw or raw.get("enabled") is False:
        return ServerProbes(None, gen, rev)
    p = plan(body, rt)
    if p.objects is None or p.spec is None or p.spec.probes is None:
        return ServerProbes(None, gen, rev)  # invalid or rejected: nothing runs, nothing to probe
    dep = next(o for o in p.objects if o["kind"] == "Deployment")
    container = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER)
    run = p.run_spec or p.spec
    probes_spec = p.spec.probes  # s.spec: not None here
    api_key, api_key_problem = _api_key(meta["namespace"], meta["name"], run.api_key_secret)
    s = ServerProbes(
        probes_spec,
        gen,
        rev,
        image=container.get("image", ""),
        model=run.model.served_name or meta["name"],
        engine=engine_fingerprint(container),
        warned=_warned_rules(p.ev),
        remediation_auto=run.remediation.mode == "auto",
        policy=rt.settings.default_policy,
        api_key=api_key,
        api_key_problem=api_key_problem,
    )
    names = [q.name for q in probes_spec.prompts]
    status = body.get("status") or {}
    saved = status.get("probes") or {}
    if saved and _rev_of(saved) == rev:  # operator restart: carry counts, alarm and reference over
        s.book = ProbeBook.restore(
            names, probes_spec.failure_threshold, saved.get("results") or [], st.get_condition(status, st.OUTPUT_CONSISTENT)
        )
        ref = saved.get("reference") or {}
        if ref and _rev_of(ref) == rev and ref.get("image") == s.image:
            s.reference = {a["probe"]: Answer.from_status(a) for a in ref.get("answers") or [] if a.get("probe") in names}
            s.ref_meta = {k: ref.get(k) for k in ("generation", "revision", "image", "pod", "learnedAt")}
        s.remediated = any(
            _rev_of(r) == rev and str(r.get("reason", "")).startswith("output probes") for r in status.get("remediations") or []
        )
    else:
        s.book = ProbeBook(names, probes_spec.failure_threshold)
    return s


def probes_status(s: ServerProbes, probed: int, skipped: int, diagnosis: dict[str, Any] | None) -> dict[str, Any]:
    if s.book is None:
        raise ValueError("probes_status of a server without probes")
    out: dict[str, Any] = {
        "state": s.book.state if probed or s.book.rounds else "NoReadyEngines",
        "generation": s.generation,
        "revision": s.revision,
        "podsProbed": probed,
        "podsSkipped": skipped,
        "results": s.book.results(),
    }
    if s.reference:
        out["reference"] = {
            **{k: v for k, v in s.ref_meta.items() if v is not None},
            "answers": [s.reference[n].to_status(n) for n in s.book.names if n in s.reference],
        }
    if diagnosis:
        out["diagnosis"] = diagnosis
    return out


def diagnose(s: ServerProbes, cond: Condition) -> dict[str, Any] | None:
    """Name the silent-corruption rules admitted under `warn` when the probes see wrong output."""
    if cond.value is not False or cond.failure == ERROR or not s.warned:
        return None
    rules = [w["rule"] for w in s.warned]
    first = s.warned[0]
    msg = (
        "wrong output on a configuration admitted with a silent-corruption warning: "
        + "; ".join(f"{w['rule']} ({w['title']})" for w in s.warned)
        + f". Workaround: {first['workaround']}"
    )
    return {"rules": rules, "message": msg[:1024]}


def write_status(
    servers: Servers, target: EngineTarget, s: ServerProbes, body: dict[str, Any], cond: Condition
) -> dict[str, Any] | None:
    """Write status.probes and the conditions of the GDNModelServer `target`; emit an Event per OutputConsistent
    transition."""
    events: list[tuple[str, str, str]] = []
    gen = s.generation

    def mutate(status: dict[str, Any], obj: dict[str, Any]) -> None:
        events.clear()
        if obj["metadata"].get("generation") != gen or body_revision({**obj, "status": status}) != s.revision:
            return  # the spec or the overrides changed under this round: its results belong to nobody
        status["probes"] = body
        prev = st.get_condition(status, st.OUTPUT_CONSISTENT) or {}
        msg = cond.message + (f" — {body['diagnosis']['message']}" if body.get("diagnosis") else "")
        changed = st.set_condition(status, st.OUTPUT_CONSISTENT, cond.value, cond.reason, msg, gen)
        new_status = "Unknown" if cond.value is None else str(cond.value)
        transition = changed and (prev.get("status") != new_status or prev.get("reason") != cond.reason)
        # False degrades the server (conditions.refresh_degraded); no answer (Unknown) warns without degrading
        if transition and (cond.value is False or cond.failure == ERROR):
            events.append(("Warning", cond.reason, msg))
        elif transition and cond.value is True:
            events.append(("Normal", "OutputConsistent", msg))

    obj = servers.update_status(target.namespace, target.name, mutate)
    if obj is not None:
        for type_, reason, message in events:
            kube.emit_event(obj, reason, message, type_)
    return obj


def remediate(servers: Servers, target: EngineTarget, s: ServerProbes, cond: Condition, obj: dict[str, Any]) -> bool:
    """Record the mitigation of the first warned silent-corruption rule with one as an override, once per
    revision. True when one was recorded (the caller re-applies the workload)."""
    if not s.warned:
        return False
    running = running_dict(obj, s.policy)  # what runs: overrides in force, safe defaults filled in
    rule = next((w for w in s.warned if w.get("mitigation")), s.warned[0])
    change, refusal = vet_change(obj, change_from_mitigation(rule["rule"], rule.get("mitigation"), running), s.policy)
    trigger = f"output probes: {cond.reason} on generation {s.generation} matches {rule['rule']}"
    why = refusal or (
        "the rule has no automatic mitigation" if not rule.get("mitigation") else "its mitigation is already in effect"
    )
    return (
        remediate_once(
            servers,
            target.namespace,
            target.name,
            obj,
            signature=rule["rule"],
            upstream=rule["rule"],
            generation=s.generation,
            change=change,
            reason=trigger + ("" if change else f"; no automatic workaround left ({why}): {rule['workaround']}"),
            not_possible=f"{trigger}; no automatic workaround left ({why}): {rule['workaround']}",
            applied=f"Applied {{action}} ({rule['rule']}: {rule['title']}) after output probes failed ({cond.reason}); "
            "as an operator override (status.overrides; the spec is unchanged); the probes re-learn.",
        )
        is not None
    )


def _fingerprint(body: dict[str, Any], cond: Condition) -> str:
    return json.dumps([body, cond.value, cond.reason, cond.message], sort_keys=True, default=str)


class ProbeSupervisor:
    """Holds the probe state of every tracked target and runs the probing loop. A target is a GDNModelServer (the
    runtime's supervisor) or a guarded workload (handlers/guard/supervisor.py's), keyed by EngineTarget (kind included);
    `pods_of`, the writer and the remediator are called with it."""

    def __init__(
        self,
        pods_of: Callable[[EngineTarget], list[dict[str, Any]]],
        *,
        writer: Callable[..., dict[str, Any] | None] | None = None,
        remediator: Callable[..., Any] | None = None,
        concurrency: int = 64,
        seed: int | None = None,
        port: int = ENGINE_PORT,
        rt: PlanInputs | None = None,
    ) -> None:
        self.pods_of = pods_of
        self.port = port
        #: the one door to the servers (handlers/core/servers.py): the runtime's; a fresh one without a runtime
        self.door: Servers = rt.servers if rt is not None else Servers()
        self.writer = writer or functools.partial(write_status, self.door)
        self.remediator = remediator or functools.partial(remediate, self.door)
        self.servers: dict[EngineTarget, ServerProbes] = {}
        self.client = ProbeClient(concurrency)
        self.rt = rt  # parses server bodies (render, rules); None: configure() only (tests, benchmarks)
        self.rng = random.Random(seed)
        self.task: asyncio.Task[None] | None = None
        self._remediating: set[asyncio.Task[None]] = set()  # held: the loop keeps only weak references
        self.tick = 0.25
        #: consecutive rounds whose probes of a pod timed out, by (target, pod): supporting evidence of a stall
        #: (handlers/engines/stall.py), never a trigger
        self.timeouts: dict[tuple[EngineTarget, str], int] = {}

    def timeouts_of(self, target: EngineTarget, pod: str) -> int:
        return self.timeouts.get((target, pod), 0)

    # ------------------------------------------------------------------ configuration (from events) --

    async def track(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """A GDNModelServer event: (re)configure its probes when its revision changed."""
        target = EngineTarget.server(namespace, name)
        cur = self.servers.get(target)
        if cur is not None and cur.revision == body_revision(body):
            return  # a status-only event that changed no override: nothing changed for the probes
        if self.rt is None:
            raise RuntimeError("ProbeSupervisor.track needs the runtime (rt=) to parse servers")
        s = await asyncio.to_thread(server_from_body, body, self.rt)
        self.configure(target, s, body)

    def configure(self, target: EngineTarget, s: ServerProbes, body: dict[str, Any] | None = None) -> None:
        namespace, name = target.namespace, target.name
        old = self.servers.get(target)
        if old is not None and old.task is not None and not old.task.done():
            old.task.cancel()  # a round of the previous revision reports nothing
        if s.spec is not None:
            s.next_due = time.monotonic() + self.rng.uniform(0, s.spec.interval_seconds)
            log.info(
                "output probes for %s/%s: %d probe(s) every %ss on revision %s%s",
                namespace,
                name,
                len(s.spec.prompts),
                s.spec.interval_seconds,
                s.revision,
                f", reference of revision {s.revision} kept" if s.reference else "",
            )
        self.servers[target] = s
        if s.spec is None and body is not None:
            status = body.get("status") or {}
            if status.get("observedGeneration") != body["metadata"].get("generation"):
                return  # the reconcile of this generation writes the same in its status write (reconcile.py)
            cond = st.get_condition(status, st.OUTPUT_CONSISTENT)
            if cond is None or cond.get("status") != "Unknown" or cond.get("reason") != "ProbesDisabled":
                self._clear_metrics(target)
                s.task = asyncio.get_running_loop().create_task(asyncio.to_thread(mark_disabled, self.door, namespace, name))

    def forget(self, target: EngineTarget) -> None:
        for key in [k for k in self.timeouts if k[0] == target]:
            del self.timeouts[key]
        s = self.servers.pop(target, None)
        if s is not None and s.task is not None and not s.task.done():
            s.task.cancel()
        self._clear_metrics(target)

    def _clear_metrics(self, target: EngineTarget) -> None:
        for gauge, reasons in ((telemetry.OUTPUT_INCONSISTENT, PROBE_REASONS), (telemetry.PROBE_FAILING, NO_ANSWER_REASONS)):
            for reason in reasons:
                with contextlib.suppress(KeyError):
                    gauge.remove(*target.series(), reason)

    # ------------------------------------------------------------------------------------ the loop --

    async def run(self) -> None:
        try:
            while True:
                now = time.monotonic()
                for key, s in list(self.servers.items()):
                    if s.spec is None or not s.spec.enabled or s.next_due > now:
                        continue
                    if s.task is not None and not s.task.done():
                        continue  # never two rounds of one server (so of one pod) at once
                    s.next_due = now + s.spec.interval_seconds * self.rng.uniform(0.9, 1.1)
                    s.task = asyncio.get_running_loop().create_task(self._guarded_round(key, s))
                await asyncio.sleep(self.tick)
        finally:
            await self.client.close()

    async def _guarded_round(self, target: EngineTarget, s: ServerProbes) -> None:
        try:
            await self.round(target, s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a failed round is retried next interval
            log.warning("probe round for %s failed: %s", target, e)

    async def round(self, target: EngineTarget, s: ServerProbes) -> Condition | None:
        """One round of one target. Returns the condition after it (None: nothing was probed)."""
        if s.spec is None or s.book is None:
            return None  # probes off for this generation: the loop never schedules such a server
        namespace, name = target.namespace, target.name
        t0 = time.perf_counter()
        ready = [p for p in self.pods_of(target) if p.get("ready") and p.get("ip") and not p.get("deleting")]
        current = sorted((p for p in ready if not s.engine or p.get("engine") == s.engine), key=lambda p: p["name"])
        skipped = len(ready) - len(current)
        timeout = float(s.spec.timeout_seconds)
        per_pod = await asyncio.gather(
            *(
                self.client.ask_pod(
                    completions_url(p["ip"], p.get("port") or self.port),  # a guarded pod's own --port
                    s.model,
                    s.spec.prompts,
                    p["name"],
                    timeout,
                    api_key=s.api_key,
                )
                for p in current
            )
        )
        asked: list[Asked] = [a for pod in per_pod for a in pod]
        for p in current:
            key = (target, p["name"])
            if any(a.error == "timeout" for a in asked if a.pod == p["name"]):
                self.timeouts[key] = self.timeouts.get(key, 0) + 1
            else:
                self.timeouts.pop(key, None)
        outcomes, learned = judge_round(s.spec.prompts, s.reference, asked)
        now = kube.now()
        if learned:
            for probe, (_pod, answer) in learned.items():
                s.reference[probe] = answer
            s.ref_meta = {
                "generation": s.generation,
                "revision": s.revision,
                "image": s.image,
                "pod": next(iter(learned.values()))[0],
                "learnedAt": now,
            }
            log.info(
                "output probes for %s/%s learned %d reference answer(s) from pod %s on revision %s",
                namespace,
                name,
                len(learned),
                s.ref_meta["pod"],
                s.revision,
            )
        self._record(target, outcomes)
        before = s.book.condition
        cond = s.book.observe(outcomes, now) if outcomes else (s.book.condition if s.book.rounds else LEARNING)
        telemetry.PROBE_ROUND_DURATION.observe(time.perf_counter() - t0)
        if cond.value is None and cond.reason == "ProbeUnauthorized":
            cond = Condition(cond.value, cond.reason, f"{cond.message}; {_unauthorized_hint(s)}", cond.failure)
        for reason in PROBE_REASONS:
            telemetry.OUTPUT_INCONSISTENT.labels(*target.series(), reason).set(
                1.0 if cond.value is False and cond.reason == reason else 0.0
            )
        for reason in NO_ANSWER_REASONS:
            telemetry.PROBE_FAILING.labels(*target.series(), reason).set(
                1.0 if cond.value is None and cond.failure == ERROR and cond.reason == reason else 0.0
            )
        diagnosis = diagnose(s, cond)
        body = probes_status(s, len(current), skipped, diagnosis)
        fp = _fingerprint(body, cond)
        if fp != s.written:
            if (before.value, before.reason) != (cond.value, cond.reason):
                log.info(
                    "output probes for %s/%s: OutputConsistent %s (%s): %s",
                    namespace,
                    name,
                    "Unknown" if cond.value is None else cond.value,
                    cond.reason,
                    cond.message,
                )
            obj = await asyncio.to_thread(self.writer, target, s, body, cond)
            s.written = fp
            if (
                obj is not None
                and cond.value is False
                and diagnosis
                and s.remediation_auto
                and not s.remediated
                and obj["metadata"].get("generation") == s.generation
                and body_revision(obj) == s.revision
            ):
                s.remediated = True
                # shielded: the override's own status write starts a new revision, whose tracking cancels this
                # round; recording the override and rendering it must still both happen
                task = asyncio.get_running_loop().create_task(self._remediate(target, s, cond, obj))
                self._remediating.add(task)
                task.add_done_callback(self._remediating.discard)
                await asyncio.shield(task)
        return cond

    async def _remediate(self, target: EngineTarget, s: ServerProbes, cond: Condition, obj: dict[str, Any]) -> None:
        try:
            if await asyncio.to_thread(self.remediator, target, s, cond, obj) and self.rt is not None:
                await asyncio.to_thread(reapply, target.namespace, target.name, self.rt)  # the override, rendered now
        except Exception as e:  # noqa: BLE001 - logged; the next revision's probes still run
            log.warning("output-probe remediation for %s failed: %s", target, e)

    @staticmethod
    def _record(target: EngineTarget, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            telemetry.PROBES.labels(target.namespace, target.name, o.probe, o.result).inc()
            telemetry.PROBE_DURATION.observe(o.duration)


def probes_disabled(status: dict[str, Any], generation: int | None) -> None:
    """No probes for this generation: OutputConsistent is Unknown, and an earlier probe alarm no longer holds
    (also written by the reconciler, in its status write of the generation)."""
    status.pop("probes", None)
    st.set_condition(status, st.OUTPUT_CONSISTENT, None, "ProbesDisabled", "spec.probes is not set (or not enabled)", generation)


def mark_disabled(servers: Servers, namespace: str, name: str) -> None:
    """probes_disabled as a status write of its own (a server the reconciler has already recorded)."""
    servers.update_status(namespace, name, lambda status, obj: probes_disabled(status, obj["metadata"].get("generation")))
