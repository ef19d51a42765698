"""How a GDN hybrid's full-attention layers fall into vLLM's KV-cache groups (G1's trigger, issue 33).

vLLM's hybrid KV-cache manager (``_get_kv_cache_groups_uniform_page_size`` in ``vllm/v1/core/kv_cache_utils.py``,
the same in every wheel read from 0.18.0 to 0.29.0) groups the layers of each KV-cache spec into groups of one
size: the smallest layer count of any spec, or -- from 0.18.0, when the largest count is below 1.5 times the
smallest -- the largest (0.17.0 always takes the smallest). Here the specs are the full-attention layers (a MTP
drafter's attention layer has the target's spec and counts) and the GDN layers. Two or more full-attention groups
of one spec are G1's trigger: the V1 runner hands the second group a copy of the first group's FlashAttention
metadata, stale under FULL CUDA graphs (docs/upstream-fa3-group-metadata.md).

  tiny model + MTP      3 attention : 2 GDN  -> group size 2 -> 2 attention groups (the probe saw exactly these)
  Qwen3-Next-80B + MTP 13 attention : 36 GDN -> group size 13 -> 1 attention group

The layout comes from a readable local ``config.json`` (``layer_types``, else ``num_hidden_layers`` and
``full_attention_interval``; the MTP layers from ``mtp_num_hidden_layers`` / ``num_nextn_predict_layers``; a
multimodal config's ``text_config``), else from the published checkpoints' ``layers`` in data/checkpoints.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gdn_operator.rules import family
from gdn_operator.versions import Version, require_version

#: the 1.5x "pad up to the largest" heuristic of _get_kv_cache_groups_uniform_page_size
PAD_UP_FROM = require_version("0.18.0")


@dataclass(frozen=True)
class LayerLayout:
    full_attention: int
    linear_attention: int
    mtp: int
    source: str


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def layout_from_config(cfg: dict[str, Any], source: str) -> LayerLayout | None:
    """The layer layout a config.json declares, None when it does not say."""
    nested = cfg.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else cfg
    mtp = _count(text.get("mtp_num_hidden_layers"))
    if mtp is None:
        mtp = _count(text.get("num_nextn_predict_layers")) or 0
    types = text.get("layer_types")
    if isinstance(types, list) and types and all(isinstance(t, str) for t in types):
        full, linear = types.count("full_attention"), types.count("linear_attention")
        if full + linear != len(types):
            return None  # a layer kind this reader does not know (sliding window, ...): no guess
        return LayerLayout(full, linear, mtp, f"{source} layer_types")
    n, interval = _count(text.get("num_hidden_layers")), _count(text.get("full_attention_interval"))
    if n and interval:
        full = n // interval  # layers i with (i + 1) % interval == 0, as vLLM's Qwen3-Next config derives them
        return LayerLayout(full, n - full, mtp, f"{source} num_hidden_layers / full_attention_interval")
    return None


def model_layout(uri: str) -> LayerLayout | None:
    """The layout of the model at ``uri``: its local config.json when readable, else the published checkpoint's."""
    scheme, _, path = uri.rpartition("://")
    if scheme in ("", "file"):
        cfg = family.read_local_config(path)
        if cfg is not None:
            lay = layout_from_config(cfg, f"config.json at {path}")
            if lay is not None:
                return lay
    entry = family.checkpoint_entry(path)
    layers = entry.get("layers") if entry else None
    if isinstance(layers, dict) and entry is not None:
        return LayerLayout(
            int(layers["full_attention"]),
            int(layers["linear_attention"]),
            int(layers.get("mtp", 0)),
            f"published checkpoint {entry['id']} (rules/data/checkpoints.yaml)",
        )
    return None


def _groups(attention: int, others: int, pad_up: bool) -> int:
    if attention == 0:
        return 0
    if others == 0:
        return 1  # one spec: one group
    lo, hi = min(attention, others), max(attention, others)
    size = hi if pad_up and hi < lo * 1.5 else lo
    return -(-attention // size)


def attention_groups(layout: LayerLayout, *, mtp: bool, version: Version | None) -> int:
    """Full-attention KV-cache groups vLLM forms (the MTP layers counted when MTP is on). An unknown version
    takes the larger answer of the two grouping rules."""
    attention = layout.full_attention + (layout.mtp if mtp else 0)
    if version is None:
        return max(_groups(attention, layout.linear_attention, p) for p in (True, False))
    return _groups(attention, layout.linear_attention, version >= PAD_UP_FROM)
