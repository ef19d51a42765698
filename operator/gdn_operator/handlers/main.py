"""Every kopf registration of the operator, in one place: decorators and one-line delegations, typed as kopf
calls them. The bodies live in their modules (below, in the order an object meets them; server/ is the GDNModelServer
path, guard/ the GDNGuard path, engines/ the run-time watch of engine pods, webhook/ admission, core/ what all share).

| handler | kopf | body |
| --- | --- | --- |
| startup / cleanup | on.startup, on.cleanup | startup.configure; runtime.Runtime |
| reconcile | on.resume/create/update GDNModelServer (spec) | server/reconcile.reconcile |
| converge_generation | on.event GDNModelServer | server/reconcile.converge_generation |
| track_servers | on.event GDNModelServer | runtime.servers; acceptance / probes / quiet-period supervisors |
| engine_pods | index pods (managed) | core/pods.engine_pods |
| pod_event | on.event pods (managed) | engines/crashwatch.on_pod_event, then server/workload.pod_event (pod status) |
| deployment_event | on.event deployments (managed) | server/workload.deployment_event |
| leader_worker_set_event | on.event LeaderWorkerSets, registered at start-up when GDN_LWS | server/workload.deployment_event |
| inference_pool_event | on.event InferencePools, registered at start-up when GDN_INFERENCE_POOL | server/router.inference_pool_event |
| node_event | on.event nodes, registered at start-up when GDN_WATCH_NODES | server/disruption.drain_mark, then server/workload.pod_event |
| guard_event / guarded_pod_event | on.event GDNGuards, on.event pods (all), registered at start-up when GDN_GUARDS | guard/supervisor.GuardSupervisor |
| mitigate / admission | on.mutate (only with GDN_MUTATE_SPEC) / on.validate, registered at start-up when a webhook server is configured | webhook/admission.* |

Why some are registered at start-up, not at import: kopf refuses to run with admission handlers but no
admission server (kopf/_core/engines/admission.py: "Admission handlers exist, but no admission
server/tunnel is configured"), and the chart grants RBAC for LeaderWorkerSets and InferencePools only when
enabled; whether either applies is a setting, known only once the settings are parsed. kopf starts its
resource observer and webhook server only after the startup handlers finished, so handlers registered
here are seen like those registered at import.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from gdn_operator import GROUP, GUARD_PLURAL, KIND, PLURAL, VERSION
from gdn_operator.handlers import startup as starter
from gdn_operator.handlers.core import kopfcompat, kube, pods
from gdn_operator.handlers.engines import crashwatch
from gdn_operator.handlers.runtime import MEMO_KEY, Runtime, runtime_of
from gdn_operator.handlers.server import disruption, router, workload
from gdn_operator.handlers.server import reconcile as reconciler
from gdn_operator.handlers.webhook import admission
from gdn_operator.labels import LABEL_SERVER, MANAGED
from gdn_operator.render import lws
from gdn_operator.render import router as router_render
from gdn_operator.settings import Settings, SettingsError
from gdn_operator.watch.target import EngineTarget

log = logging.getLogger(__name__)

#: where __main__ puts the settings it parsed before kopf.run (so they are parsed once)
SETTINGS_MEMO_KEY = "gdn_settings"


# ------------------------------------------------------------------------------ start-up / clean-up ---


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, logger: kopf.Logger, memo: kopf.Memo, **_: Any) -> None:
    rt = memo.get(MEMO_KEY)
    if not isinstance(rt, Runtime):
        try:
            cfg = memo.get(SETTINGS_MEMO_KEY) or Settings.from_env()  # `kopf run -m gdn_operator.handlers` parses here
        except SettingsError as e:
            raise kopf.PermanentError(str(e)) from None
        rt = Runtime(cfg)
        memo[MEMO_KEY] = rt
    server = starter.configure(settings, logger, rt)
    register_optional(rt, webhook=server is not None)
    narrow_essences(rt, kopf.get_default_registry())
    rt.start_supervisors()  # each one not running yet (start-up may have started other tasks of the runtime)


def narrow_essences(rt: Runtime, registry: kopf.OperatorRegistry) -> None:
    """kopf's diff base is read only for the resources with changing handlers: when those are GDNModelServers
    alone (this module's registrations), HandledSpecs builds no essence of any other kind's events."""
    selected = kopfcompat.essence_resources(registry)
    rt.handled.essential_kinds = frozenset({KIND}) if selected <= {(GROUP, PLURAL)} else None
    log.info("kopf essences built for: %s", "GDNModelServers" if rt.handled.essential_kinds else f"every kind ({selected})")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime_of(memo).stop()


def register_optional(rt: Runtime, *, webhook: bool, registry: kopf.OperatorRegistry | None = None) -> list[str]:
    """Register the handlers that exist only with some settings (once per runtime). Returns their ids."""
    if rt.optional_handlers:
        return rt.optional_handlers
    reg = registry if registry is not None else kopf.get_default_registry()
    ids = []
    if rt.settings.lws:  # RBAC for LeaderWorkerSets exists only when the chart enables them
        kopf.on.event(lws.GROUP, lws.VERSION, lws.PLURAL, labels=MANAGED, registry=reg)(leader_worker_set_event)
        ids.append("leader_worker_set_event")
    if rt.settings.inference_pool:  # likewise InferencePools
        kopf.on.event(router_render.GROUP, router_render.VERSION, router_render.PLURAL, labels=MANAGED, registry=reg)(
            inference_pool_event
        )
        ids.append("inference_pool_event")
    if rt.settings.guards:  # GDNGuard: its resource, and every pod (a guard selects pods of any creator)
        kopf.on.event(GROUP, VERSION, GUARD_PLURAL, id="guard-event", registry=reg)(guard_event)
        kopf.on.event("", "v1", "pods", id="guarded-pod-event", registry=reg)(guarded_pod_event)
        ids += ["guard-event", "guarded-pod-event"]
    if rt.settings.watch_nodes:  # the chart grants node get/list/watch only with operator.watchNodes
        kopf.on.event("", "v1", "nodes", registry=reg)(node_event)
        ids.append("node_event")
    if webhook:
        ids += register_admission(reg, mutate_spec=rt.settings.mutate_spec)
    if webhook and rt.settings.guards:
        kopf.on.event(GROUP, VERSION, GUARD_PLURAL, id="guard-admission-scope", registry=reg)(guard_scope_event)
        ids.append("guard-admission-scope")
    rt.optional_handlers = ids or ["(none)"]
    return ids


async def guard_scope_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A GDNGuard changed: the guards its reviews read, and the guard webhook configuration's scope
    (handlers/guard/admission.py)."""
    runtime_of(memo).guard_admission.guard_changed(type, kube.plain_object(body))


def register_admission(registry: kopf.OperatorRegistry, *, mutate_spec: bool) -> list[str]:
    """The admission webhooks into `registry` (also what the chart's shipped webhook configurations are
    checked against: tests/charts/test_chart_webhooks.py): the validating one always, the mutating one only with
    GDN_MUTATE_SPEC (chart operator.mutateSpec, which also ships its MutatingWebhookConfiguration). Without it
    the mutating webhook would change nothing, yet the API server would call it for every write and wait for its
    answer (bench/bench_admission.py). Persistent: a replica that stops (HA hand-over) must not strip the
    webhooks from the configuration the active replica serves."""
    ids = []
    if mutate_spec:
        kopf.on.mutate(
            GROUP, VERSION, PLURAL, id=admission.MITIGATE_ID, operations=["CREATE", "UPDATE"], persistent=True, registry=registry
        )(mitigate)
        ids.append(admission.MITIGATE_ID)
    kopf.on.validate(
        GROUP, VERSION, PLURAL, id=admission.VALIDATE_ID, operations=["CREATE", "UPDATE"], persistent=True, registry=registry
    )(validate)
    return [*ids, admission.VALIDATE_ID]


# ------------------------------------------------------------------------------------ GDNModelServer ---


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def reconcile(body: kopf.Body, logger: kopf.Logger, memo: kopf.Memo, **_: Any) -> None:
    await reconciler.reconcile(body, logger, runtime_of(memo))


@kopf.on.event(GROUP, VERSION, PLURAL, id="converge-generation")
async def converge_generation(body: kopf.Body, logger: kopf.Logger, memo: kopf.Memo, **_: Any) -> None:
    await reconciler.converge_generation(body, logger, runtime_of(memo))


@kopf.on.event(GROUP, VERSION, PLURAL, id="acceptance-registry")
async def track_servers(type: str, body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    rt = runtime_of(memo)
    rt.acceptance.pods_index = kwargs["engine_pods"]  # kopf passes each index by its name; a live view
    ns = kube.require_namespace(namespace)
    plain = kube.plain_object(body)
    if type == "DELETED":
        rt.servers.forget(ns, name)
        rt.handled.forget(str(body["metadata"].get("uid")))
    else:
        rt.servers.put(plain)  # what Deployment events and acceptance rounds read instead of a GET
    if type == "DELETED" or body["metadata"].get("deletionTimestamp"):
        rt.acceptance.forget(ns, name)
        rt.probes.forget(EngineTarget.server(ns, name))
        rt.quiet.forget(ns, name)
        return
    rt.acceptance.track(ns, name, plain)
    rt.quiet.track(ns, name, plain)
    await rt.probes.track(ns, name, plain)


# -------------------------------------------------------------------------------- engine workloads ---


@kopf.index("", "v1", "pods", labels=MANAGED, id="engine_pods")
def engine_pods(body: kopf.Body, namespace: str | None, labels: Mapping[str, str], **_: Any) -> dict[tuple[str, str], Any]:
    return pods.engine_pods(body, namespace, labels)


@kopf.on.event("", "v1", "pods", labels=MANAGED)
async def pod_event(
    type: str, body: kopf.Body, namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any
) -> None:
    """The one handler for engine pod events, fanned out: the crash watch's part, then the server's
    pod-derived status (from all of its pods in kopf's index, also when the crash watch failed)."""
    ns, name = kube.require_namespace(namespace), labels.get(LABEL_SERVER)
    if not name:
        return
    try:
        await crashwatch.on_pod_event(runtime_of(memo), type, ns, name, kube.plain_object(body))
    finally:
        rt = runtime_of(memo)
        marks = dict(rt.draining.marks)  # a copy: the status write runs in a thread while node events arrive
        await workload.pod_event(ns, name, pods.pods_of(kwargs["engine_pods"], ns, name), rt.servers, marks)


@kopf.on.event("apps", "v1", "deployments", labels=MANAGED)
async def deployment_event(type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta, memo: kopf.Memo, **_: Any) -> None:
    await workload.deployment_event(runtime_of(memo), type, body, namespace, meta)


# registered by register_optional
async def leader_worker_set_event(
    type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> None:
    await workload.deployment_event(runtime_of(memo), type, body, namespace, meta, kind=lws.KIND)


async def node_event(type: str, body: kopf.Body, name: str, memo: kopf.Memo, **kwargs: Any) -> None:
    """A node marked for a drain (cordon, autoscaler taints) or unmarked: the servers with engine pods on it
    recompute DisruptionBlocked (handlers/server/disruption.py)."""
    rt = runtime_of(memo)
    mark = None if type == "DELETED" else disruption.drain_mark(kube.plain_object(body))
    if not rt.draining.observe(name, mark):
        return
    index = kwargs["engine_pods"]
    for ns, server in [key for key in index if any(p.get("node") == name for p in index[key])]:
        await workload.pod_event(ns, server, pods.pods_of(index, ns, server), rt.servers, dict(rt.draining.marks))


async def guard_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await runtime_of(memo).guards.on_guard_event(type, kube.plain_object(body))


async def guarded_pod_event(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    await runtime_of(memo).guards.on_pod_event(type, kube.plain_object(body))


async def inference_pool_event(
    type: str, body: kopf.Body, namespace: str | None, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> None:
    await router.inference_pool_event(runtime_of(memo).servers, type, body, namespace, meta)


# --------------------------------------------------------------------------------------- admission ---


# kopf passes `old` (None on CREATE) to admission handlers although its WebhookFn protocol omits it. Both are
# coroutines: they do no I/O, so kopf runs them on its event loop instead of queueing them for a worker thread
# behind the reconciles' blocking API calls and handing the answer back across threads (bench/bench_admission.py);
# admission.admit names the one exception.
async def mitigate(
    spec: kopf.Spec,
    patch: kopf.Patch,
    warnings: list[str],
    namespace: str | None,
    memo: kopf.Memo,
    name: str | None = None,
    old: kopf.Body | None = None,
    **_: Any,
) -> None:
    cfg = runtime_of(memo).settings
    if cfg.mutate_spec:  # opt-in; by default mitigations are status.overrides and the spec stays as written
        admission.mitigate(spec, patch, warnings, namespace, name, old, cfg.default_policy)


async def validate(
    spec: kopf.Spec,
    warnings: list[str],
    namespace: str | None,
    memo: kopf.Memo,
    name: str | None = None,
    old: kopf.Body | None = None,
    **_: Any,
) -> None:
    await admission.admit(spec, warnings, namespace, name, old, runtime_of(memo))
