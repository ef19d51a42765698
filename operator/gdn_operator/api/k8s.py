"""Kubernetes value checks for the spec, so admission refuses what the API server would refuse at apply.

Pod-template parts (affinity, tolerations) are validated with the Kubernetes client's own models (the
pinned client, kubernetes 37, ships them as strict pydantic models generated from the API's OpenAPI
schema: unknown fields and wrong types are errors), must round-trip in the API's camelCase form, and
pass the API server's semantic pod-validation rules (bottom of this file). Names, label
parts and quantities use Kubernetes' grammars with whole-string matching (`re.fullmatch`, so a
trailing newline is never accepted the way `$` accepts it).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

#: DNS-1123 label (namespaces, most names), DNS-1035 label (Service names), DNS-1123 subdomain.
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
LABEL_KEY_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: resource.Quantity: <signed number><suffix>, suffix one of binary SI, decimal SI or a decimal exponent.
#: Not kubernetes.utils.parse_quantity: api/ runs without the client (gdnctl; the import-linter contract), and
#: parse_quantity takes whatever Decimal takes (`16\n`, `1_0`), which the API server refuses.
#: tests/api/test_k8s_values.py shows both decide alike on the grammar and that this never takes more.
QUANTITY = re.compile(r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")
#: An image repository (registry[:port]/path) and tag, as the container runtime parses references.
IMAGE_REPOSITORY = re.compile(
    r"(?:[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?)*(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
)
IMAGE_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}|sha256:[a-f0-9]{64}")  # "+": version-shaped tags


def dns1123_label(value: str) -> bool:
    return len(value) <= 63 and DNS1123_LABEL.fullmatch(value) is not None


def dns1035_label(value: str) -> bool:
    return len(value) <= 63 and DNS1035_LABEL.fullmatch(value) is not None


def dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and DNS1123_SUBDOMAIN.fullmatch(value) is not None


def label_value(value: str) -> bool:
    return len(value) <= 63 and LABEL_VALUE.fullmatch(value) is not None


def label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and not dns1123_subdomain(prefix):
        return False
    return len(name) <= 63 and LABEL_KEY_NAME.fullmatch(name) is not None


def service_name_problem(name: str) -> str | None:
    """Why `name` (metadata.name) cannot name the engine Service (a DNS-1035 label), or None."""
    if dns1035_label(name):
        return None
    return (
        f"metadata.name {name!r} cannot name the engine Service: it must be a DNS-1035 label "
        "(lowercase letters, digits and '-', starting with a letter, at most 63 characters); "
        "recreate the GDNModelServer with a shorter name"
    )


def client_missing(field: str) -> str:
    """The error a validator gives when the Kubernetes client it checks `field` with is not installed
    (`gdnctl` may run without it: GPU hosts with only the offline vLLM bundle)."""
    return (
        f"{field} is checked with the Kubernetes Python client's models, which are not installed here; "
        "install them (pip install 'kubernetes>=37,<38') and run again"
    )


def check_name(value: str, what: str = "object name") -> str:
    """`value` if it is an object name (DNS-1123 subdomain); else the ValueError a field validator raises."""
    if not dns1123_subdomain(value):
        raise ValueError(f"{value!r} is not a valid {what} (lowercase letters, digits, '-' and '.')")
    return value


def check_key(value: str, what: str) -> str:
    """`value` if it is a Secret/ConfigMap data key; else the ValueError a field validator raises."""
    if not SECRET_KEY.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid {what} (letters, digits, '-', '_' and '.')")
    return value


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    """`labels` if every key and value is a valid label key and value; else a field validator's ValueError."""
    for key, value in labels.items():
        if not label_key(key):
            raise ValueError(f"key {key!r} is not a valid label key")
        if not label_value(value):
            raise ValueError(f"value {value!r} of {key!r} is not a valid label value")
    return labels


def positive_quantity(value: str) -> bool:
    m = QUANTITY.fullmatch(value)
    return m is not None and float(m.group("num")) > 0


def _first_difference(given: Any, canonical: Any, path: str) -> str | None:
    if isinstance(given, dict) and isinstance(canonical, dict):
        for key in given:
            if key not in canonical:
                return f"{path}.{key}"
            deeper = _first_difference(given[key], canonical[key], f"{path}.{key}")
            if deeper:
                return deeper
        return None
    if isinstance(given, list) and isinstance(canonical, list):
        for i, (g, c) in enumerate(zip(given, canonical, strict=False)):  # a prefix: canonical may add items
            deeper = _first_difference(g, c, f"{path}[{i}]")
            if deeper:
                return deeper
        return None
    return None if given == canonical else path


def check_k8s(model: type[BaseModel], value: Any, what: str) -> list[str]:
    """Problems (one line each, with the field path under `what`) of `value` as a Kubernetes `model`."""
    try:
        parsed = model.model_validate(value)
    except ValidationError as e:
        out = []
        for err in e.errors(include_url=False)[:5]:
            loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ()))
            msg = "unknown field" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid")
            out.append(f"{what}{loc}: {msg} (Kubernetes {model.__name__.removeprefix('V1')})")
        return out
    odd = _first_difference(value, parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"), what)
    if odd:
        return [f"{odd}: not a Kubernetes field name here (the API uses camelCase names, e.g. nodeAffinity)"]
    return []


#: Deepest nesting of an admitted object (the GDNModelServer schema needs < 20; Kubernetes allows 10000). The
#: webhook refuses deeper ones before decoding them (handlers/webhook/limits.py), `gdnctl validate` alike
#: (api/load.py), with the same message (`nested_too_deep`).
MAX_OBJECT_DEPTH = 64
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}:,]')


def _token_path(frames: list[list[Any]]) -> str:
    out = ""
    for kind, key in frames:
        if key is None:
            continue
        out += f"[{key}]" if kind == "[" else (f".{key}" if out else str(key))
    return out


def too_deep_in_text(text: str, limit: int = MAX_OBJECT_DEPTH) -> str | None:
    """Scan raw JSON without recursion: the path where nesting first exceeds `limit`, or None."""
    frames: list[list[Any]] = []  # [kind, key-or-index]
    pending_key: str | None = None
    for m in _TOKENS.finditer(text):
        tok = m.group()
        if tok[0] == '"':
            pending_key = tok[1:-1]
        elif tok == ":":
            if frames and frames[-1][0] == "{":
                frames[-1][1] = pending_key
        elif tok == ",":
            if frames and frames[-1][0] == "[":
                frames[-1][1] += 1
        elif tok in "{[":
            frames.append([tok, 0 if tok == "[" else None])
            if len(frames) > limit:
                return _token_path(frames[:limit])
        else:
            if frames:
                frames.pop()
    return None


def nested_too_deep(where: str) -> str:
    """The refusal of an object nested deeper than MAX_OBJECT_DEPTH at `where` (a path in the object:
    `spec.affinity.x[0]...`), naming the field a user can fix (`spec.affinity`)."""
    parts = re.split(r"(?=[.\[])", where)
    field = "".join(parts[:2]).lstrip(".") or "(object)"
    return f"{field}: nested deeper than {MAX_OBJECT_DEPTH} levels (at {where[:200]}); no GDNModelServer field needs that"


def too_deep(value: Any, limit: int) -> str | None:
    """The path where a decoded JSON value nests deeper than `limit` (None when it does not). Iterative:
    a hostile 10000-deep value cannot exhaust the interpreter's recursion limit."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in node.items()]
        elif isinstance(node, list):
            items = [(f"{path}[{i}]", v) for i, v in enumerate(node)]
        else:
            continue
        if depth > limit:
            return path
        stack.extend((v, p, depth + 1) for p, v in items)
    return None


# ------------------------------------------------------------- semantic checks (what apiserver validates) ---
# The client models check structure and types; these are the rules of the API server's pod validation
# (k8s.io/kubernetes pkg/apis/core/validation) for the parts a GDNModelServer passes through.

_NODE_OPS = {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}
_LABEL_OPS = {"In", "NotIn", "Exists", "DoesNotExist"}
_EFFECTS = {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}


def _requirement(req: dict[str, Any], path: str, ops: set[str], out: list[str]) -> None:
    op, values, key = req.get("operator"), req.get("values") or [], req.get("key", "")
    if not label_key(key):
        out.append(f"{path}.key: {key!r} is not a valid label key")
    if op not in ops:
        out.append(f"{path}.operator: {op!r} is not one of {', '.join(sorted(ops))}")
    elif op in ("In", "NotIn") and not values:
        out.append(f"{path}.values: must be non-empty with operator {op}")
    elif op in ("Exists", "DoesNotExist") and values:
        out.append(f"{path}.values: must be empty with operator {op}")
    elif op in ("Gt", "Lt") and (len(values) != 1 or not re.fullmatch(r"-?[0-9]+", str(values[0]))):
        out.append(f"{path}.values: operator {op} takes exactly one integer value")


def _node_term(term: dict[str, Any], path: str, out: list[str]) -> None:
    for i, req in enumerate(term.get("matchExpressions") or []):
        _requirement(req, f"{path}.matchExpressions[{i}]", _NODE_OPS, out)
    for i, req in enumerate(term.get("matchFields") or []):
        _requirement(req, f"{path}.matchFields[{i}]", {"In", "NotIn"}, out)
        if req.get("key") != "metadata.name" or len(req.get("values") or []) != 1:
            out.append(f"{path}.matchFields[{i}]: only metadata.name with exactly one value is supported")


def _label_selector(sel: dict[str, Any] | None, path: str, out: list[str]) -> None:
    if not sel:
        return
    for k, v in (sel.get("matchLabels") or {}).items():
        if not label_key(k) or not label_value(str(v)):
            out.append(f"{path}.matchLabels: {k!r}: {v!r} is not a valid label")
    for i, req in enumerate(sel.get("matchExpressions") or []):
        _requirement(req, f"{path}.matchExpressions[{i}]", _LABEL_OPS, out)


def label_selector_problems(sel: dict[str, Any] | None, path: str) -> list[str]:
    """What the API server would refuse in a metav1.LabelSelector (`path` names it in the messages)."""
    out: list[str] = []
    _label_selector(sel, path, out)
    return out


def _pod_term(term: dict[str, Any], path: str, out: list[str]) -> None:
    if not label_key(term.get("topologyKey") or ""):
        out.append(f"{path}.topologyKey: must be a non-empty label key")
    _label_selector(term.get("labelSelector"), f"{path}.labelSelector", out)
    _label_selector(term.get("namespaceSelector"), f"{path}.namespaceSelector", out)
    for ns in term.get("namespaces") or []:
        if not dns1123_label(ns):
            out.append(f"{path}.namespaces: {ns!r} is not a namespace name")


def _weight(w: Any, path: str, out: list[str]) -> None:
    if not isinstance(w, int) or not 1 <= w <= 100:
        out.append(f"{path}.weight: must be 1..100")


def affinity_problems(aff: dict[str, Any], what: str = "affinity") -> list[str]:
    out: list[str] = []
    node = aff.get("nodeAffinity") or {}
    req = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    if req is not None:
        terms = req.get("nodeSelectorTerms") or []
        if not terms:
            out.append(f"{what}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: must be non-empty")
        for i, t in enumerate(terms):
            _node_term(t, f"{what}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", out)
    for i, p in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        path = f"{what}.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
        _weight(p.get("weight"), path, out)
        _node_term(p.get("preference") or {}, f"{path}.preference", out)
    for kind in ("podAffinity", "podAntiAffinity"):
        pa = aff.get(kind) or {}
        for i, t in enumerate(pa.get("requiredDuringSchedulingIgnoredDuringExecution") or []):
            _pod_term(t, f"{what}.{kind}.requiredDuringSchedulingIgnoredDuringExecution[{i}]", out)
        for i, p in enumerate(pa.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
            path = f"{what}.{kind}.preferredDuringSchedulingIgnoredDuringExecution[{i}]"
            _weight(p.get("weight"), path, out)
            _pod_term(p.get("podAffinityTerm") or {}, f"{path}.podAffinityTerm", out)
    return out


def toleration_problems(t: dict[str, Any], what: str) -> list[str]:
    out: list[str] = []
    key, op, value, effect = t.get("key") or "", t.get("operator") or "Equal", t.get("value") or "", t.get("effect") or ""
    if key and not label_key(key):
        out.append(f"{what}.key: {key!r} is not a valid label key")
    if not key and op != "Exists":
        out.append(f"{what}.operator: must be Exists when key is empty")
    if op not in ("Equal", "Exists"):
        out.append(f"{what}.operator {op!r} must be Equal or Exists")
    if op == "Exists" and value:
        out.append(f"{what}.value: must be empty with operator Exists")
    if op == "Equal" and value and not label_value(value):
        out.append(f"{what}.value: {value!r} is not a valid label value")
    if effect not in _EFFECTS:
        out.append(f"{what}.effect: {effect!r} must be NoSchedule, PreferNoSchedule or NoExecute")
    if t.get("tolerationSeconds") is not None and effect != "NoExecute":
        out.append(f"{what}.effect: must be NoExecute when tolerationSeconds is set")
    return out
