"""Which workload and which scale-out objects a spec gets (what render/objects.render_all adds to the Service).

- workload: a Deployment (one pod per engine), or a LeaderWorkerSet when spec.nodes > 1 (render/lws.py);
- autoscaler: KEDA ScaledObject or HPA when spec.autoscaling is set (render/autoscale.py);
- InferencePool when spec.router.inferencePool is set (render/router.py).

The reconciler deletes the kinds a spec no longer needs (`MANAGED_KINDS` minus what was rendered).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render import autoscale, lws, podparts, router
from gdn_operator.render.engine import deployment


@dataclass(frozen=True)
class ScaleOutOptions:
    """Cluster facts render needs (the reconciler fills them; `gdnctl render` uses the defaults or flags)."""

    keda: bool = False  # KEDA's ScaledObject CRD is installed and a Prometheus address is configured
    prometheus_address: str = ""
    scale_up_paused: bool = False  # the server is CrashLooping


#: (apiVersion, kind) of every optional object a server may own, for clean-up when a spec drops one.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    (lws.API_VERSION, lws.KIND),
    (f"{autoscale.KEDA_GROUP}/{autoscale.KEDA_VERSION}", "ScaledObject"),
    (autoscale.HPA_API_VERSION, "HorizontalPodAutoscaler"),
    (f"{router.GROUP}/{router.VERSION}", "InferencePool"),
    ("policy/v1", "PodDisruptionBudget"),
    ("v1", "PersistentVolumeClaim"),
)
WORKLOAD_KINDS = ("Deployment", lws.KIND)


def owned_name(kind: str, server: str) -> str:
    """The name of the object of a managed `kind` a server owns (the server's name, but the cache claim's)."""
    return podparts.cache_claim_name(server) if kind == "PersistentVolumeClaim" else server


def workload(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    obj = lws.leader_worker_set(name, namespace, spec, uid) if spec.nodes > 1 else deployment(name, namespace, spec, uid)
    return podparts.apply_workload_meta(obj, spec)


def target_ref(name: str, spec: GDNModelServerSpec) -> dict[str, str]:
    if spec.nodes > 1:
        return {"apiVersion": lws.API_VERSION, "kind": lws.KIND, "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def extra_objects(
    name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None, opts: ScaleOutOptions
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if spec.autoscaling is not None:
        ref = target_ref(name, spec)
        if opts.keda:
            out.append(
                autoscale.scaled_object(
                    name, namespace, spec, ref, uid, server_address=opts.prometheus_address, scale_up_paused=opts.scale_up_paused
                )
            )
        else:
            out.append(autoscale.horizontal_pod_autoscaler(name, namespace, spec, ref, uid, scale_up_paused=opts.scale_up_paused))
    if spec.router is not None and spec.router.inference_pool is not None:
        out.append(router.inference_pool(name, namespace, spec, uid))
    return out


def workload_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine workload among rendered objects."""
    return next(o for o in objects if o["kind"] in WORKLOAD_KINDS)


def engine_args(objects: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    """Every engine argv the rendered workload runs (one for a Deployment; leader and worker for an LWS)."""
    w = workload_of(objects)
    if w["kind"] == lws.KIND:
        t = w["spec"]["leaderWorkerTemplate"]
        templates = [t["leaderTemplate"], t["workerTemplate"]]
    else:
        templates = [w["spec"]["template"]]
    return {tuple(tp["spec"]["containers"][0]["args"]) for tp in templates}
