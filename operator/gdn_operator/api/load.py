"""Reading GDNModelServer manifests with one clear line per problem (field path + what to do)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gdn_operator import API_VERSION, KIND
from gdn_operator.api import k8s as _k8s
from gdn_operator.api.resource import GDNModelServer
from gdn_operator.api.spec import GDNModelServerSpec


class ManifestError(Exception):
    """Input that cannot be used. `problems` holds one human line per problem."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def _loc_to_path(prefix: str, loc: Iterable[Any]) -> str:
    path = prefix
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.startswith("function-"):
            continue  # pydantic validator frames are not fields
        else:
            path += f".{part}" if path else str(part)
    return path


def _describe(err: ErrorDetails) -> str:
    typ = err.get("type", "")
    msg = err.get("msg", "invalid value")
    inp = err.get("input")
    if typ == "extra_forbidden":
        return "unknown field (check the spelling; fields are camelCase, see `gdnctl crd`)"
    if typ == "missing":
        return "required field is missing"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if typ.startswith(("greater", "less", "too_", "enum", "literal", "int_", "float_", "bool_", "string_", "dict_", "list_")):
        shown = repr(inp) if not isinstance(inp, (dict, list)) else type(inp).__name__
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{msg} (got {shown})"
    return msg


def format_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    """One line per pydantic error: `<field.path>: <problem>`."""
    lines = []
    for err in exc.errors(include_url=False):
        path = _loc_to_path(prefix, err.get("loc", ()))
        lines.append(f"{path or '(document)'}: {_describe(err)}")
    return lines


def parse_object(obj: Any, source: str = "") -> GDNModelServer:
    where = f"{source}: " if source else ""
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}expected a mapping (a Kubernetes object), got {type(obj).__name__}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if kind != KIND or api_version != API_VERSION:
        raise ManifestError(
            f"{where}apiVersion/kind: expected {API_VERSION} {KIND}, got {api_version or '(none)'} {kind or '(none)'}"
        )
    try:
        return GDNModelServer.model_validate(obj)
    except ValidationError as e:
        raise ManifestError([where + line for line in format_validation_error(e)]) from None


def parse_spec(spec: Any) -> GDNModelServerSpec:
    """Validate a bare spec (as the webhook and reconciler see it); paths start with `spec`."""
    if not isinstance(spec, dict):
        raise ManifestError("spec: expected a mapping")
    try:
        return GDNModelServerSpec.model_validate(spec)
    except ValidationError as e:
        raise ManifestError(format_validation_error(e, prefix="spec")) from None


def _json_document(text: str) -> list[Any] | None:
    """A JSON object decoded as the webhook decodes its requests (None: not JSON; read as YAML)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        return None


def load_documents(text: str, source: str = "<input>") -> list[Any]:
    """The YAML (or JSON) documents of `text`. An object nested deeper than the webhook admits is refused with
    the webhook's message (api/k8s.py `nested_too_deep`), before a recursive parser could exhaust the stack."""
    try:
        docs = _json_document(text)
        if docs is None:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except RecursionError:  # as the webhook: find the place without recursion
        deep = _k8s.too_deep_in_text(text, _k8s.MAX_OBJECT_DEPTH) or "(object)"
        raise ManifestError(f"{source}: {_k8s.nested_too_deep(deep)}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ManifestError(f"{where}: malformed YAML: {problem}") from None
    if not docs:
        raise ManifestError(f"{source}: no YAML document found")
    for i, doc in enumerate(docs):
        deep_at = _k8s.too_deep(doc, _k8s.MAX_OBJECT_DEPTH)
        if deep_at is not None:
            raise ManifestError(f"{source if len(docs) == 1 else f'{source}[doc {i}]'}: {_k8s.nested_too_deep(deep_at)}")
    return docs


def read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ManifestError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ManifestError(f"{path}: is a directory, expected a YAML file") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ManifestError(f"{path}: cannot read: {e.strerror}") from None


def load_file(path: str) -> list[GDNModelServer]:
    """All GDNModelServer documents in a file; every problem in every document is reported."""
    source = "<stdin>" if path == "-" else path
    docs = load_documents(read_text(path), source)
    out, problems = [], []
    for i, doc in enumerate(docs):
        label = source if len(docs) == 1 else f"{source}[doc {i}]"
        try:
            out.append(parse_object(doc, label))
        except ManifestError as e:
            problems.extend(e.problems)
    if problems:
        raise ManifestError(problems)
    return out
