"""Object metadata every rendered object carries: label values, the selector and common labels, the owner
reference and `metadata` block, the name checks, and `RenderError` (a spec that cannot become a workload).
The lowest floor of render/: engine.py, lws.py, router.py and autoscale.py build on it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from gdn_operator import API_VERSION, KIND
from gdn_operator.api import k8s
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.labels import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_PART_OF,
    LABEL_SERVER,
    LABEL_VERSION,
    LEADER_SELECTOR,
    MANAGED_BY,
)


class RenderError(ValueError):
    """The object cannot be turned into a workload; the message names the field and the fix."""


def safe_label_value(value: str) -> str:
    """A valid label value: ≤63 chars; long values are shortened with a stable hash suffix."""
    if k8s.label_value(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[:54].strip("-_.")
    return f"{cleaned}-{digest}"


def selector_labels(name: str) -> dict[str, str]:
    return {LABEL_SERVER: safe_label_value(name), LABEL_MANAGED_BY: MANAGED_BY}


def api_selector(name: str, spec: GDNModelServerSpec) -> dict[str, str]:
    """Labels of the pods that serve the OpenAI API and /metrics: every engine pod, or only the group
    leaders of a multi-node engine (workers run headless)."""
    labels = selector_labels(name)
    if spec.nodes > 1:
        labels.update(LEADER_SELECTOR)
    return labels


def common_labels(name: str, spec: GDNModelServerSpec) -> dict[str, str]:
    return {
        LABEL_NAME: "vllm",
        LABEL_INSTANCE: safe_label_value(name),
        LABEL_COMPONENT: "engine",
        LABEL_PART_OF: "gdn-operator",
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_VERSION: safe_label_value(spec.image.vllm_version),
        LABEL_SERVER: safe_label_value(name),
    }


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(name: str, namespace: str, uid: str | None, spec: GDNModelServerSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": common_labels(name, spec)}
    if uid:
        meta["ownerReferences"] = [owner_reference(name, uid)]
    return meta


def check_names(name: str) -> None:
    problem = k8s.service_name_problem(name)
    if problem:
        raise RenderError(problem)
