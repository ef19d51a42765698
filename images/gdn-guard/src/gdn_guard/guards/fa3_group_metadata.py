"""Guard for G1 (docs/upstream-fa3-group-metadata.md): stale FlashAttention-3 scheduler metadata in the second
full-attention KV-cache group under FULL CUDA graphs.

Mechanism (V1 model runner, every release the catalogue covers, 0.17.0-0.33.0): when a model's full-attention
layers (a MTP drafter's attention layer counts) fall into two or more KV-cache groups of the same spec,
``GPUModelRunner._build_attention_metadata`` builds FlashAttention metadata for the first group only and hands
every later group a shallow copy through ``FlashAttentionMetadataBuilder.update_block_table`` (the copy keeps the
first builder's ``scheduler_metadata`` tensor).  CUDA-graph capture has no such cache: each group's FULL graph
was captured against its *own* builder's persistent FA3 ``scheduler_metadata`` buffer, which nothing writes
after capture.  Replays of the later groups' attention therefore read the schedule of the last capture, and
every row but the first of a batch of two or more is wrong (probe on an H100 with vLLM 0.22.0:
tests/fixtures/vllm-0.22.0-h100-g1-probe).

The guard wraps ``FlashAttentionMetadataBuilder.__init__``: when the builder is made with FULL CUDA graphs on
(``use_full_cuda_graph``), it sets the instance's ``supports_update_block_table`` to False, so the runner builds
every group's metadata itself -- which is what capture did -- and each builder rewrites its own buffer every
step.  Cost: one FA3 ``get_scheduler_metadata`` call per extra attention group per step.  A model with one
attention group is unaffected (nothing was reused).  PIECEWISE / eager builders keep the reuse (no buffer is
baked into a graph there).  The Model Runner V2 (the default for these models from 0.29.0) builds FlashAttention
metadata per group already; the guard changes nothing there.

General plugins are loaded in every vLLM process, the TP workers included, before any metadata builder exists,
so the guard reaches each rank (a monkeypatch in the parent would not).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gdn_guard.guards import Guard, GuardUnavailable
from gdn_guard.versions import VersionRange

logger = logging.getLogger("vllm.gdn_guard")

NAME = "fa3-group-metadata"
PATCH_ID = "gdn-guard/fa3-group-metadata"
MODULE = "vllm.v1.attention.backends.flash_attn"
CLASS = "FlashAttentionMetadataBuilder"
MARK = "__gdn_guard_fa3_group_metadata__"  # set on the wrapper function: makes apply() idempotent

_LOGGED = threading.Event()  # one INFO line per process, on the first builder the guard changes


def decide(builder: Any) -> tuple[bool, str]:
    """Whether this builder's metadata must not be handed to another KV-cache group, and why.

    ``use_full_cuda_graph`` unreadable counts as on: building every group is always correct, only the
    reuse is unsafe."""
    if not getattr(builder, "supports_update_block_table", False):
        return False, "the builder does not reuse metadata across groups"
    full = getattr(builder, "use_full_cuda_graph", None)
    if full is False:
        return False, "no FULL CUDA graphs (the reuse bakes nothing into a graph)"
    why = "FULL CUDA graphs" if full else "use_full_cuda_graph unreadable"
    return True, f"{why}: every KV-cache group builds its own FlashAttention metadata"


def _wrap_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        change, why = decide(self)
        if change:
            self.supports_update_block_table = False
            if not _LOGGED.is_set():
                _LOGGED.set()
                logger.info("gdn-guard %s (G1): %s (update_block_table reuse off)", NAME, why)

    __init__.__name__ = "__init__"
    __init__.__qualname__ = getattr(original, "__qualname__", f"{CLASS}.__init__")
    __init__.__doc__ = getattr(original, "__doc__", None)
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(__init__, MARK, True)
    return __init__


def builder_class() -> Any:
    """vLLM's FlashAttention metadata builder class, checked for the shape the guard hooks."""
    try:
        import importlib

        mod = importlib.import_module(MODULE)
    except Exception as e:  # pragma: no cover - depends on the vLLM install
        raise GuardUnavailable(f"cannot import {MODULE}: {type(e).__name__}: {e}") from e
    cls = getattr(mod, CLASS, None)
    if cls is None:
        raise GuardUnavailable(f"{MODULE} has no {CLASS}")
    if not callable(getattr(cls, "update_block_table", None)):
        raise GuardUnavailable(f"{CLASS} has no update_block_table (the reuse the guard turns off is gone)")
    if not isinstance(getattr(cls, "supports_update_block_table", None), bool):
        raise GuardUnavailable(f"{CLASS}.supports_update_block_table is not a class-level bool")
    if not callable(cls.__dict__.get("__init__")):
        raise GuardUnavailable(f"{CLASS}.__init__ is not defined on the class")
    return cls


def apply() -> None:
    """Wrap ``FlashAttentionMetadataBuilder.__init__`` (idempotent)."""
    cls = builder_class()
    current = cls.__dict__["__init__"]
    if getattr(current, MARK, False):
        return
    cls.__init__ = _wrap_init(current)


def is_applied() -> bool:
    try:
        import importlib

        cls = getattr(importlib.import_module(MODULE), CLASS)
    except Exception:
        return False
    return bool(getattr(cls.__dict__.get("__init__"), MARK, False))


GUARD = Guard(
    name=NAME,
    patch_id=PATCH_ID,
    upstream=(
        "gdn-operator/mtp-full-decode-cudagraph (G1; no upstream issue names it: docs/upstream-fa3-group-metadata.md; "
        "the same hazard class as vllm#34874 for Mamba builders)"
    ),
    # The reuse (FlashAttentionMetadataBuilder.supports_update_block_table = True + the V1 runner's per-spec cache,
    # with per-group capture) is in every wheel read, 0.17.0-0.33.0; no release fixes it. From 0.29.0 hybrids
    # default to the V2 runner, which is not affected, but VLLM_USE_V2_MODEL_RUNNER=0 brings the V1 path back up to
    # 0.33.x. vLLM 0.34.0 removed the V1 runner (the operator's rule ends there too: ends_in 0.34.0), so the guard's
    # range ends at 0.34.0: not a fix, nothing left to guard.
    versions=VersionRange(since=None, fixed_in="0.34.0"),
    summary="build every full-attention KV-cache group's FlashAttention metadata when FULL CUDA graphs are on",
    apply=apply,
)
