"""What a GDNGuard reads of the pods it selects, as pure functions of their objects (no cluster access): whether a
pod is selected, which container is the engine, the vLLM release it runs and where its API listens.

Used by the guard controller (handlers/guards.py) for every pod event; the guard's spec is read as the plain
dict of its object (api/guard.py validates it at admission and in the CRD schema).

* selector: a metav1.LabelSelector (matchLabels, matchExpressions In / NotIn / Exists / DoesNotExist); an empty
  selector selects nothing here (a guard over every pod of a namespace must say so with an Exists expression).
* the engine container: the one `spec.container` names; else the first whose command + args is a vLLM launch
  line (rules/launchline.py); else the first with no command whose image is a vLLM image (the vllm-openai image's
  entrypoint is the api_server: its args are the flags).
* the vLLM release (`spec.vllmVersion`): pinned; an annotation (pod, else its workload's); or by default the image
  tag (`vX.Y.Z` / `X.Y.Z`, or `imageTag.pattern` with one group), falling back to the annotation
  ``gdn-operator.io/vllm-version``.
* the port: the launch line's `--port` (default 8000).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from gdn_operator.rules import is_launch_line

#: the annotation the version falls back to (and the default of `vllmVersion.annotation`)
VERSION_ANNOTATION = "gdn-operator.io/vllm-version"
DEFAULT_PORT = 8000
_TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+)")


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


def argv_of(container: Mapping[str, Any]) -> list[str]:
    return [str(a) for a in (container.get("command") or [])] + [str(a) for a in (container.get("args") or [])]


def engine_container(pod_spec: Mapping[str, Any], named: str | None = None) -> dict[str, Any] | None:
    """The engine container of a pod (spec) or pod template, by the rules in the module docstring; None: none."""
    containers = list(pod_spec.get("containers") or [])
    if named:
        return next((c for c in containers if c.get("name") == named), None)
    for c in containers:
        if is_launch_line(argv_of(c)):
            return dict(c)
    for c in containers:
        if not c.get("command") and "vllm" in str(c.get("image") or "").rsplit("/", 1)[-1].lower():
            return dict(c)
    return None


def launch_argv(container: Mapping[str, Any]) -> list[str]:
    """The container's launch line as the rules read it (an args-only vllm-openai container: `vllm serve` +
    its args)."""
    argv = argv_of(container)
    return argv if container.get("command") else ["vllm", "serve", *argv]


def port_of(argv: Sequence[str]) -> int:
    """The API port of a launch line (`--port N` / `--port=N`; default 8000)."""
    for i, a in enumerate(argv):
        raw = a.split("=", 1)[1] if a.startswith("--port=") else argv[i + 1] if a == "--port" and i + 1 < len(argv) else None
        if raw is not None and raw.strip().isdigit():
            return int(raw)
    return DEFAULT_PORT


def image_tag(image: str) -> str:
    """The tag of an image reference ('' when it has none): registry ports and digests are not tags."""
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def vllm_version(spec: Mapping[str, Any], image: str, annotations: Mapping[str, str]) -> tuple[str | None, str, str | None]:
    """(release, where it came from: pinned / annotation / imageTag, a problem to report or None)."""
    how = spec.get("vllmVersion") or {}
    if how.get("pinned"):
        return str(how["pinned"]), "pinned", None
    if how.get("annotation"):
        key = str(how["annotation"])
        value = annotations.get(key)
        return (value, "annotation", None) if value else (None, "annotation", f"annotation {key} is not set")
    pattern = (how.get("imageTag") or {}).get("pattern")
    tag = image_tag(image)
    try:
        m = re.search(pattern, tag) if pattern else _TAG_VERSION.match(tag)
    except re.error as e:
        return None, "imageTag", f"vllmVersion.imageTag.pattern {pattern!r} is not a regular expression: {e}"
    if m and (m.groups() and m.group(1) or not m.groups() and m.group(0)):
        return (m.group(1) if m.groups() else m.group(0)).lstrip("v"), "imageTag", None
    if annotations.get(VERSION_ANNOTATION):
        return annotations[VERSION_ANNOTATION], "annotation", None
    return (
        None,
        "imageTag",
        f"no vLLM release in image tag {tag or '(none)'!r} nor annotation {VERSION_ANNOTATION}: set "
        "spec.vllmVersion.pinned, or the annotation on the workload",
    )
