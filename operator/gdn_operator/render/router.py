"""spec.router.inferencePool → a Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1).

The pool selects the pods that serve the OpenAI API (every engine pod, or only group leaders for
multi-node engines) on the engine port, and names the Endpoint Picker the gateway consults (llm-d's
inference scheduler, KServe's gateway). The GIE controller reports `Accepted` / `ResolvedRefs` per parent
gateway in status.parents; handlers/server/router.py mirrors them onto the GDNModelServer.
"""

from __future__ import annotations

from typing import Any

from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render.engine import ENGINE_PORT
from gdn_operator.render.meta import api_selector, object_meta

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
CRD = f"{PLURAL}.{GROUP}"


def inference_pool(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    if spec.router is None or spec.router.inference_pool is None:
        raise ValueError("spec.router.inferencePool is not set: no InferencePool to render")
    epp = spec.router.inference_pool.endpoint_picker
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferencePool",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "selector": {"matchLabels": api_selector(name, spec)},
            "targetPorts": [{"number": ENGINE_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp.name,
                "port": {"number": epp.port},
                "failureMode": epp.failure_mode,
            },
        },
    }
