"""spec.autoscaling → a KEDA ScaledObject (Prometheus trigger) or an autoscaling/v2 HorizontalPodAutoscaler.

Both target the engine workload's scale subresource (the Deployment, or the LeaderWorkerSet of a multi-node
engine, whose scale selector picks group leaders), never the GDNModelServer: a scale event must not start a
new spec generation (that would reset the crash watch's per-generation counts), and spec.replicas stays
unset (mutually exclusive with autoscaling).

- KEDA (when its ScaledObject CRD is installed and the chart sets a Prometheus address): a `prometheus`
  trigger whose query sums (request metrics, target per engine: AverageValue) or averages (KV-cache usage,
  target as is: Value) the vLLM series of this server, selected by namespace and vLLM's `model_name` label.
- HPA otherwise: a Pods metric averaged over the engines that serve the API. The custom metrics API cannot
  carry ':' in a metric name, so prometheus-adapter must expose `vllm:<metric>` as `vllm_<metric>` (README).

While the server is CrashLooping the operator re-renders with `scale_up_paused` (scaleUp selectPolicy
Disabled): scaling down still works, but a crashing configuration is not multiplied.
"""

from __future__ import annotations

from typing import Any

from gdn_operator.api.scaleout import METRICS, AutoscalingSpec
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render.meta import object_meta

KEDA_GROUP = "keda.sh"
KEDA_VERSION = "v1alpha1"
KEDA_PLURAL = "scaledobjects"
KEDA_CRD = f"{KEDA_PLURAL}.{KEDA_GROUP}"
HPA_API_VERSION = "autoscaling/v2"


def _quantity(v: float) -> str:
    """A Kubernetes quantity for a target (milli-units for fractions: 0.8 → 800m)."""
    return str(int(v)) if float(v).is_integer() else f"{round(v * 1000)}m"


def _number(v: float) -> str:
    return f"{v:g}"


def hpa_metric_name(metric: str) -> str:
    return METRICS[metric][0].replace(":", "_")


def prometheus_query(namespace: str, served_name: str, metric: str) -> str:
    series, agg, _ = METRICS[metric]
    return f'{agg}({series}{{namespace="{namespace}",model_name="{served_name}"}})'


def _autoscaling(spec: GDNModelServerSpec) -> AutoscalingSpec:
    """spec.autoscaling; the renderers are called only for a spec that has it."""
    if spec.autoscaling is None:
        raise ValueError("spec.autoscaling is not set: nothing to autoscale")
    return spec.autoscaling


def behavior(spec: GDNModelServerSpec, scale_up_paused: bool) -> dict[str, Any]:
    a = _autoscaling(spec)
    out: dict[str, Any] = {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds}}
    if scale_up_paused:
        out["scaleUp"] = {"selectPolicy": "Disabled"}
    return out


def scaled_object(
    name: str,
    namespace: str,
    spec: GDNModelServerSpec,
    target_ref: dict[str, str],
    uid: str | None,
    *,
    server_address: str,
    scale_up_paused: bool = False,
) -> dict[str, Any]:
    a = _autoscaling(spec)
    served = spec.model.served_name or name
    per_engine = METRICS[a.metric][1] == "sum"
    return {
        "apiVersion": f"{KEDA_GROUP}/{KEDA_VERSION}",
        "kind": "ScaledObject",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "scaleTargetRef": target_ref,
            "minReplicaCount": a.min_replicas,
            "maxReplicaCount": a.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(spec, scale_up_paused)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "name": a.metric.replace("_", "-"),
                    "metricType": "AverageValue" if per_engine else "Value",
                    "metadata": {
                        "serverAddress": server_address,
                        "query": prometheus_query(namespace, served, a.metric),
                        "threshold": _number(a.target),
                    },
                }
            ],
        },
    }


def horizontal_pod_autoscaler(
    name: str,
    namespace: str,
    spec: GDNModelServerSpec,
    target_ref: dict[str, str],
    uid: str | None,
    *,
    scale_up_paused: bool = False,
) -> dict[str, Any]:
    a = _autoscaling(spec)
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "scaleTargetRef": target_ref,
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": hpa_metric_name(a.metric)},
                        "target": {"type": "AverageValue", "averageValue": _quantity(a.target)},
                    },
                }
            ],
            "behavior": behavior(spec, scale_up_paused),
        },
    }


def scale_up_paused(obj: dict[str, Any]) -> bool:
    """Whether a rendered or live ScaledObject/HPA has scale-up disabled."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "HorizontalPodAutoscaler":
        b = spec.get("behavior")
    else:
        b = ((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior")
    return ((b or {}).get("scaleUp") or {}).get("selectPolicy") == "Disabled"
