"""Which model family a server runs: evidence from every source a user has, in one documented order.

The family is the checkpoint's HF architecture class (api/enums.py Architecture). Sources, strongest first;
the strongest source that names a class decides:

  1. ``--architecture`` (gdnctl) or ``spec.model.architecture``: what the user states;
  2. ``--hf-overrides`` / ``--additional-config`` ``architectures`` (or ``model_type``): what vLLM loads on top
     of the checkpoint's config;
  3. a readable local ``config.json`` (the model path, or ``--hf-config-path``): what the checkpoint declares;
  4. the model id in the table of published checkpoints (data/checkpoints.yaml, each entry cited from its Hub
     page): products and fine-tunes whose name says nothing (``Qwen/Qwen3-Coder-Next``);
  5. the model name (Qwen3-Next / Qwen3.5 / 3.6 / 3.8 / Qwen3-Coder-Next patterns);
  6. ``--served-model-name``: a label the user chose (a table entry or the patterns above).

A name (5, 6) never outranks a config (2, 3). A source that names another class than the deciding one is a
contradiction: it is reported (``FamilyDecision.conflicts``, shown as a note), never dropped. A config naming a
class outside the GDN hybrids (``LlamaForCausalLM``) is evidence too: the model is then known NOT to be a GDN
hybrid, whatever its name says.

For logs (``gdnctl classify-log``) the log's own lines are the evidence: the resolved-architecture line and
``qwen3_next.py`` / ``qwen3_5.py`` frames (watch/data/signatures.yaml ``facts: family``); a spec that disagrees
with the log is reported there (watch/evidence.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from gdn_operator.api.enums import Architecture
from gdn_operator.datafiles import load_yaml, once

GDN_CLASSES = {a.value.lower(): a.value for a in Architecture}
#: config.json `model_type` values of the GDN hybrids (the configs cited in data/checkpoints.yaml)
MODEL_TYPES = {"qwen3_next": Architecture.QWEN3_NEXT.value, "qwen3_5": Architecture.QWEN3_5.value}

_SEP = r"[-_. ]?"
_FAMILY_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"qwen3" + _SEP + r"next(?![a-z])"), "qwen3-next"),
    # Qwen3-Coder-Next is built on Qwen3-Next-80B-A3B (its model card; data/checkpoints.yaml)
    (re.compile(r"qwen3" + _SEP + r"coder" + _SEP + r"next(?![a-z])"), "qwen3-next"),
    # Qwen3.5 / 3.6 / 3.8 need a '.' or '_' separator: "Qwen3-8B" is the dense Qwen3, not a hybrid.
    (re.compile(r"qwen3[._]([568])(?![0-9])"), "qwen3.5"),
]
_MOE_RE = re.compile(r"(?:^|[-_./])a\d+(?:\.\d+)?b(?:$|[-_./])|moe")

#: source ranks (the module docstring's order)
EXPLICIT, OVERRIDES, CONFIG, CHECKPOINT, MODEL_NAME, SERVED_NAME = range(1, 7)


LAYER_KEYS = ("full_attention", "linear_attention", "mtp")


@once
def _checkpoint_entries() -> dict[str, dict[str, Any]]:
    """repo id (lower case) -> its data/checkpoints.yaml entry, checked."""
    ref = resources.files("gdn_operator.rules").joinpath("data/checkpoints.yaml")
    data = load_yaml(ref.read_text(encoding="utf-8"))
    out: dict[str, dict[str, Any]] = {}
    for entry in data["checkpoints"]:
        if GDN_CLASSES.get(str(entry["architecture"]).lower()) is None:
            raise ValueError(f"data/checkpoints.yaml: {entry['id']}: {entry['architecture']!r} is not a GDN hybrid class")
        layers = entry.get("layers")
        if layers is not None and (
            not isinstance(layers, dict)
            or set(layers) - set(LAYER_KEYS)
            or not all(isinstance(layers.get(k), int) and layers[k] >= 0 for k in LAYER_KEYS[:2])
            or not isinstance(layers.get("mtp", 0), int)
        ):
            raise ValueError(
                f"data/checkpoints.yaml: {entry['id']}: layers must map {', '.join(LAYER_KEYS)} to counts, got {layers!r}"
            )
        out[str(entry["id"]).lower()] = dict(entry)
    return out


def published_checkpoints() -> dict[str, tuple[str, str]]:
    """repo id (lower case) -> (architecture class, source) from data/checkpoints.yaml."""
    return {k: (GDN_CLASSES[str(e["architecture"]).lower()], str(e["source"])) for k, e in _checkpoint_entries().items()}


@functools.lru_cache(maxsize=1024)  # admission asks per configuration (several per spec); bounded: names are input
def checkpoint_entry(name: str) -> dict[str, Any] | None:
    """The table's entry for a Hub repo id, or for a path ending in ORG/NAME (a local copy of it). Read-only."""
    parts = [p for p in name.strip().lower().split("/") if p]
    return _checkpoint_entries().get("/".join(parts[-2:])) if len(parts) >= 2 else None


def _checkpoint(name: str) -> str | None:
    """The table's class for a Hub repo id, or for a path ending in ORG/NAME (a local copy of it)."""
    entry = checkpoint_entry(name)
    return GDN_CLASSES[str(entry["architecture"]).lower()] if entry else None


def _name_pattern(name: str) -> str | None:
    low = name.lower()
    for pat, family in _FAMILY_PATTERNS:
        if pat.search(low):
            if family == "qwen3-next":
                return Architecture.QWEN3_NEXT.value
            if _MOE_RE.search(low):
                return Architecture.QWEN3_5_MOE.value
            return Architecture.QWEN3_5.value
    return None


@functools.lru_cache(maxsize=1024)  # a pure function of the name over the packaged table and patterns
def infer_architecture(model_name: str) -> str | None:
    """HF architecture class from a model name (published-checkpoint table, then name patterns), or None."""
    return _checkpoint(model_name) or _name_pattern(model_name)


@dataclass(frozen=True)
class Claim:
    """One source's answer: `named` is the class it names; `architecture` is that class when it is a GDN
    hybrid, None when it is another family."""

    rank: int
    source: str
    named: str
    architecture: str | None


@dataclass
class FamilyDecision:
    architecture: str | None = None  # the deciding GDN class; None: unknown, or not a GDN hybrid
    source: str | None = None
    not_gdn: str | None = None  # the non-GDN class a config names, when that decided
    claims: list[Claim] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        return self.architecture is not None or self.not_gdn is not None


def _class_claim(rank: int, source: str, named: str) -> Claim:
    return Claim(rank, source, named, GDN_CLASSES.get(named.lower()))


def _config_claim(rank: int, source: str, cfg: dict[str, Any]) -> Claim | None:
    """A claim from a config-shaped dict (config.json, --hf-overrides): `architectures[0]`, else `model_type`."""
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return _class_claim(rank, f"{source} architectures", archs[0])
    mtype = cfg.get("model_type")
    if isinstance(mtype, str) and mtype:
        arch = MODEL_TYPES.get(mtype.lower())
        return Claim(rank, f"{source} model_type", mtype, arch)
    return None


def read_local_config(path: str) -> dict[str, Any] | None:
    """The config.json of a local checkpoint directory (or the file itself), None when unreadable."""
    if not path or "://" in path:
        return None
    p = os.path.expanduser(path)
    if os.path.isdir(p):
        p = os.path.join(p, "config.json")
    if not p.endswith(".json") or not os.path.isfile(p):
        return None
    try:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def decide_family(
    *,
    explicit: str | None = None,
    overrides: dict[str, Any] | None = None,
    additional: dict[str, Any] | None = None,
    model: str | None = None,
    hf_config_path: str | None = None,
    served_names: tuple[str, ...] = (),
    read_config: Callable[[str], dict[str, Any] | None] = read_local_config,
) -> FamilyDecision:
    """Collect every source's claim and decide by the module docstring's order."""
    claims: list[Claim] = []
    if explicit:
        claims.append(_class_claim(EXPLICIT, "--architecture", explicit))
    for flag, cfg in (("--hf-overrides", overrides), ("--additional-config", additional)):
        c = _config_claim(OVERRIDES, flag, cfg or {})
        if c is not None:
            claims.append(c)
    for where in (hf_config_path, model):
        if where:
            cfg = read_config(where)
            if cfg is not None:
                c = _config_claim(CONFIG, f"config.json at {where}", cfg)
                if c is not None:
                    claims.append(c)
                    break
    if model:
        arch = _checkpoint(model)
        if arch:
            claims.append(Claim(CHECKPOINT, f"published checkpoint {model}", arch, arch))
        arch = _name_pattern(model)
        if arch:
            claims.append(Claim(MODEL_NAME, f"inferred from model name {model!r}", arch, arch))
    for name in served_names:
        arch = infer_architecture(name)
        if arch:
            claims.append(Claim(SERVED_NAME, f"--served-model-name {name!r}", arch, arch))
    return _decide(claims)


def _same_family(a: Claim, b: Claim) -> bool:
    """Same family: both name the same non-GDN class, or GDN classes of one family (a name pattern cannot
    tell Qwen3_5ForConditionalGeneration from Qwen3_5ForCausalLM: not a contradiction)."""
    if a.architecture is None or b.architecture is None:
        return a.named.lower() == b.named.lower()
    return _family_of(a.architecture) == _family_of(b.architecture)


def _family_of(arch: str) -> str:
    if arch == Architecture.QWEN3_NEXT.value:
        return "qwen3-next"
    return "qwen3.5-moe" if "Moe" in arch else "qwen3.5"


def _decide(claims: list[Claim]) -> FamilyDecision:
    d = FamilyDecision(claims=sorted(claims, key=lambda c: c.rank))
    if not d.claims:
        return d
    top = d.claims[0]
    d.source = top.source
    if top.architecture is not None:
        d.architecture = top.architecture
    else:
        d.not_gdn = top.named
    for c in d.claims[1:]:
        if not _same_family(top, c):
            d.conflicts.append(
                f"model family: {c.source} says {c.named}, but {top.source} says {top.named}; "
                f"{top.source} decides (order: --architecture, --hf-overrides/--additional-config, config.json, "
                "published checkpoint, model name, --served-model-name)"
            )
    return d
