"""What the guard controller (handlers/guard/supervisor.py) and the guard admission webhook (handlers/guard/admission.py) read
of an object beyond rules/workload.py (the engine container, its launch line, the release), as pure functions of it:

* whether a guard's selector (a metav1.LabelSelector: matchLabels, matchExpressions In / NotIn / Exists /
  DoesNotExist) selects it; an empty selector selects nothing (api/guard.py refuses one). A workload is selected by
  its own labels or by its pod template's (where users put them: `selects_object`), and the API server applies the
  same test before it calls the webhook (`selector_cel`, the webhook's matchCondition) and when it lists a guard's
  pods (`selector_query`, the list call's labelSelector): the one home of a guard's selector;
* what to say when its release is not known.

Where its engine's API listens and the name it answers to are the launch line's (rules/launchline.py `Endpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: where an object's labels are: its own, then its pod templates' for every kind a guard judges (Deployment,
#: StatefulSet, ReplicaSet, DaemonSet, Job: spec.template; CronJob: spec.jobTemplate.spec.template; LeaderWorkerSet:
#: its leader and worker templates; KAITO Workspace: inference.template)
LABEL_PATHS: tuple[tuple[str, ...], ...] = (
    ("metadata", "labels"),
    ("spec", "template", "metadata", "labels"),
    ("spec", "jobTemplate", "spec", "template", "metadata", "labels"),
    ("spec", "leaderWorkerTemplate", "leaderTemplate", "metadata", "labels"),
    ("spec", "leaderWorkerTemplate", "workerTemplate", "metadata", "labels"),
    ("inference", "template", "metadata", "labels"),
)


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


def selector_query(selector: Mapping[str, Any]) -> str:
    """A LabelSelector as a list call's `labelSelector` string (the API server applies it as `selects` does)."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        key, op, vals = e.get("key"), e.get("operator"), ",".join(e.get("values") or [])
        parts.append({"In": f"{key} in ({vals})", "NotIn": f"{key} notin ({vals})", "Exists": f"{key}"}.get(op, f"!{key}"))
    return ",".join(parts)


def label_sets(obj: Mapping[str, Any] | None) -> list[Mapping[str, str]]:
    """The label maps of an object at LABEL_PATHS (its own first)."""
    out = []
    for path in LABEL_PATHS:
        cur: Any = obj
        for key in path:
            cur = cur.get(key) if isinstance(cur, Mapping) else None
        if isinstance(cur, Mapping):
            out.append(cur)
    return out


def selects_object(selector: Mapping[str, Any] | None, obj: Mapping[str, Any] | None) -> bool:
    """Whether a selector selects an object by its own labels or by any of its pod templates' labels."""
    return any(selects(selector, labels) for labels in label_sets(obj))


def _q(text: str) -> str:
    """A CEL string literal (label keys and values are validated before, but quote them whatever they hold)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def _labels_cel(selector: Mapping[str, Any], labels: str) -> str:
    terms = [
        f"({_q(k)} in {labels} && {labels}[{_q(k)}] == {_q(v)})" for k, v in sorted((selector.get("matchLabels") or {}).items())
    ]
    for e in selector.get("matchExpressions") or []:
        key, op = _q(str(e.get("key", ""))), e.get("operator")
        values = "[" + ", ".join(_q(str(v)) for v in e.get("values") or []) + "]"
        terms.append(
            {
                "In": f"({key} in {labels} && {labels}[{key}] in {values})",
                "NotIn": f"(!({key} in {labels}) || !({labels}[{key}] in {values}))",
                "Exists": f"({key} in {labels})",
                "DoesNotExist": f"!({key} in {labels})",
            }.get(str(op), "false")
        )
    return " && ".join(terms) or "false"


def selector_cel(selector: Mapping[str, Any], var: str) -> str:
    """A CEL expression (the API server's matchCondition language) that is true when `selector` selects the object
    `var` (`object`, `oldObject`) as `selects_object` does; it never errors on an object the API server admits (each
    field is tested with has() before it is read)."""
    alternatives = []
    for path in LABEL_PATHS:
        steps = [var + "".join(f".{p}" for p in path[: i + 1]) for i in range(len(path))]
        present = " && ".join(f"has({s})" for s in steps)
        alternatives.append(f"({present} && {_labels_cel(selector, steps[-1])})")
    return " || ".join(alternatives)


def version_problem(source: str, image: str, annotation: str | None) -> str:
    """Why a guarded engine's release is not known, and the fix."""
    if source == "annotation" and annotation:
        return f"annotation {annotation} is not set to a vLLM release (X.Y.Z) on the pod or its template: set it"
    return (
        f"no vLLM release in image {image!r} nor annotation gdn-operator.io/vllm-version: set spec.vllmVersion.pinned, "
        "or the annotation on the workload's pod template"
    )
