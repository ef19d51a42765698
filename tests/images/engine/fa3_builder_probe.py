"""Run inside the vLLM CPU venv: build REAL FlashAttentionMetadataBuilder objects and report their reuse flag.

vLLM's own ``load_general_plugins()`` loads whatever ``vllm.general_plugins`` entry points are on the path (gdn-guard
when its site is on PYTHONPATH, unless GDN_GUARD_DISABLE says otherwise). Then, per CUDA-graph mode, a real
``VllmConfig`` for the model directory in argv[1] and a real full-attention KV-cache spec make one builder the way
the V1 runner does; its ``supports_update_block_table`` decides whether the runner hands its metadata to the next
KV-cache group of the same spec (G1). The mode is set on the config after construction: the CPU platform would
otherwise turn FULL graphs off, and the builder only reads ``compilation_config.cudagraph_mode``.

Prints one JSON line: {mode: {"reuse": bool, "full": bool}, "init_wrapped": bool}.
"""

from __future__ import annotations

import json
import sys

import torch
from vllm.config import CompilationConfig, ModelConfig, VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.plugins import load_general_plugins
from vllm.v1.kv_cache_interface import FullAttentionSpec


def main() -> None:
    import vllm.logger

    if hasattr(vllm.logger, "configure_logging"):  # >= 0.3x: entrypoints configure logging explicitly
        from vllm.config.logging import LoggingConfig

        vllm.logger.configure_logging(LoggingConfig())
    load_general_plugins()
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder as Builder

    out: dict = {"init_wrapped": hasattr(Builder.__dict__["__init__"], "__wrapped__")}
    for mode in ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE", "NONE"):
        cfg = VllmConfig(
            model_config=ModelConfig(model=sys.argv[1], max_model_len=256, dtype="float32"),
            compilation_config=CompilationConfig(),
        )
        cfg.compilation_config.cudagraph_mode = CUDAGraphMode[mode]
        spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=128, dtype=torch.float32)
        b = Builder(spec, ["model.layers.3.self_attn.attn"], cfg, torch.device("cpu"))
        out[mode] = {"reuse": bool(b.supports_update_block_table), "full": bool(b.use_full_cuda_graph)}
    out["class_reuse"] = bool(Builder.supports_update_block_table)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
