"""Kubernetes value checks for the spec, so admission refuses what the API server would refuse at apply.

Pod-template parts (affinity, tolerations) are validated with the Kubernetes client's own models
(kubernetes>=35 ships them as strict pydantic models generated from the API's OpenAPI schema: unknown
fields and wrong types are errors), and must round-trip in the API's camelCase form. Names, label
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
LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: resource.Quantity: <signed number><suffix>, suffix one of binary SI, decimal SI or a decimal exponent.
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
    return len(name) <= 63 and LABEL_NAME.fullmatch(name) is not None


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
        for i, (g, c) in enumerate(zip(given, canonical)):
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
