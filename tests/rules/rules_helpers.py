"""Shared builders for the rules tests (not a test module)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from gdn_operator.api.spec import GDNModelServerSpec

from builders import GMS

REPO = Path(__file__).resolve().parents[2]
#: G1 (rules/layout.py): the trained tiny model's config.json splits its attention layers (+ MTP) into 2 KV-cache groups
TINY_MODEL = f"file://{REPO / 'tests' / 'models' / 'tiny-qwen3-next-recall'}"
#: a Qwen3.5 name with no layer layout in data/checkpoints.yaml and no readable config.json: G1 as measured at 0.22.0
UNKNOWN_LAYOUT_MODEL = "hf://Qwen/Qwen3.5-9B"


def spec_dict(version: str = "0.33.0", model: str = "hf://Qwen/Qwen3.5-27B", **fields: Any) -> dict[str, Any]:
    return GMS().version(version).update(model={"uri": model}, **fields).spec()


def mk(
    version: str = "0.33.0", model: str = "hf://Qwen/Qwen3.5-27B", patches: list[str] | None = None, **fields: Any
) -> GDNModelServerSpec:
    d = spec_dict(version, model, **fields)
    if patches:
        d["image"]["patches"] = list(patches)
    return GDNModelServerSpec.model_validate(d)


def rules_of(ev, action: str | None = None) -> set[str]:
    return {f.rule for f in ev.findings if action is None or f.action == action}


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A minimal RFC 6902 applier (add / replace / remove on objects) to check the webhook patch."""
    out = copy.deepcopy(doc)
    for op in ops:
        parts = op["path"].lstrip("/").split("/")
        node = out
        for p in parts[:-1]:
            node = node[p]
        last = parts[-1]
        if op["op"] == "add":
            node[last] = copy.deepcopy(op["value"])
        elif op["op"] == "replace":
            assert last in node, f"replace of missing member {op['path']}"
            node[last] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            assert last in node, f"remove of missing member {op['path']}"
            del node[last]
        else:  # pragma: no cover
            raise AssertionError(op)
    return out
