"""What the guard controller (handlers/guards.py) reads of a pod beyond rules/workload.py (the engine container,
its launch line, the release: shared with the GDNGuard admission webhook), as pure functions of its object:

* whether a guard's selector (a metav1.LabelSelector: matchLabels, matchExpressions In / NotIn / Exists /
  DoesNotExist) selects it; an empty selector selects nothing (api/guard.py refuses one);
* where its engine's API listens: the launch line's `--port` (default 8000), and the model name it answers to;
* what to say when its release is not known.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_PORT = 8000


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector selects an object with `labels` (an empty selector selects nothing)."""
    if not selector:
        return False
    match_labels = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or []
    if not match_labels and not exprs:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for e in exprs:
        key, op, values = e.get("key", ""), e.get("operator", ""), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an operator the API server would have refused
    return True


def port_of(argv: Sequence[str]) -> int:
    """The API port of a launch line (`--port N` / `--port=N`; default 8000)."""
    for i, a in enumerate(argv):
        raw = a.split("=", 1)[1] if a.startswith("--port=") else argv[i + 1] if a == "--port" and i + 1 < len(argv) else None
        if raw is not None and raw.strip().isdigit():
            return int(raw)
    return DEFAULT_PORT


def version_problem(source: str, image: str, annotation: str | None) -> str:
    """Why a guarded engine's release is not known, and the fix."""
    if source == "annotation" and annotation:
        return f"annotation {annotation} is not set to a vLLM release (X.Y.Z) on the pod or its template: set it"
    return (
        f"no vLLM release in image {image!r} nor annotation gdn-operator.io/vllm-version: set spec.vllmVersion.pinned, "
        "or the annotation on the workload's pod template"
    )


def served_name(argv: Sequence[str]) -> str | None:
    """The first `--served-model-name` of a launch line (what the engine's API answers to), None when unset: the
    model path or id is then the name."""
    for i, a in enumerate(argv):
        if a.startswith("--served-model-name="):
            return a.split("=", 1)[1] or None
        if a == "--served-model-name" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            return argv[i + 1]
    return None
