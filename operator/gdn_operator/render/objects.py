"""The entry point of rendering: every object of one GDNModelServer, in apply order.

The engine workload (render/scaleout.py picks a Deployment or a LeaderWorkerSet), its Service, the
PodMonitor when metrics are on, the engine PodDisruptionBudget, the model-cache claim the operator owns, then
the scale-out objects (autoscaler, InferencePool). The reconciler
applies the list; `gdnctl render` prints it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render.engine import cache_claim, pod_disruption_budget, pod_monitor, service
from gdn_operator.render.scaleout import ScaleOutOptions, extra_objects, workload


def render_all(
    name: str,
    namespace: str,
    spec: GDNModelServerSpec,
    uid: str | None = None,
    *,
    with_monitoring: bool = True,
    scaleout: ScaleOutOptions | None = None,
    monitor_labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``monitor_labels``: extra labels on the PodMonitor (GDN_POD_MONITOR_LABELS)."""
    objs = [workload(name, namespace, spec, uid), service(name, namespace, spec, uid)]
    if with_monitoring and spec.metrics.enabled:
        objs.append(pod_monitor(name, namespace, spec, uid, monitor_labels))
    if spec.disruption_budget.enabled:
        objs.append(pod_disruption_budget(name, namespace, spec, uid))
    claim = cache_claim(name, namespace, spec, uid)
    if claim is not None:
        objs.append(claim)
    objs += extra_objects(name, namespace, spec, uid, scaleout or ScaleOutOptions())
    return objs


def rendered_digest(obj: Mapping[str, Any]) -> str:
    """A short, stable digest of one rendered object (its JSON with sorted keys): equal iff the rendering is."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
