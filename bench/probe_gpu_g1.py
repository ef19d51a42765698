#!/usr/bin/env python3
"""GPU host: the G1 probe -- read the attention metadata builders of a running vLLM engine (issue 33).

What tests/fixtures/vllm-0.22.0-h100-g1-probe captured (with that folder's probe.py): an offline engine on the
trained tiny Qwen3-Next (2 GDN + 2 attention layers + 1 MTP layer), MTP k=2, async scheduling off, greedy batches of
1, 2 and 8 recall prompts whose answers are known (bench/bench_gpu_mtp.py fixed_requests). After start-up and after
each batch it reads, on rank 0, every attention group's builder: KV-cache group, class, layers, whether it hands its
metadata to the next group of the same spec (``supports_update_block_table``) and the first 40 ints of its FA3
``scheduler_metadata`` buffer (docs/upstream-fa3-group-metadata.md: under FULL graphs the second group's buffer never
moves). Variants:

  base       vLLM's defaults (FULL_AND_PIECEWISE, FA3 on Hopper)
  guard      the same with the gdn-guard plugin on the path (its entry point runs in this process and in every
             TP worker: the guard fa3-group-metadata, not a monkeypatch)
  fa2        ``attention_config.flash_attn_version=2``
  triton     ``attention_backend=TRITON_ATTN`` (does not reach the MTP layer)
  piecewise  ``compilation_config.cudagraph_mode=PIECEWISE``

The worker stays in-process at TP=1 (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and the builders are read with
``collective_rpc`` at any TP. A ``G1PARTIAL <json>`` line goes to stderr after every stage (a hang still leaves
what was measured); the final JSON goes to ``--out``. Compare with the capture: tests/rules/test_gpu_g1_probe_capture.py.

    PYTHONPATH=~/.cache/gdn-operator/gpu-site/vllm-0.22.0 python3 bench/probe_gpu_g1.py base --out $OUT/g1-base.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("base", "guard", "fa2", "triton", "piecewise")


def engine_kwargs(variant: str, tp: int, model: str) -> dict:
    kw: dict = {
        "model": model,
        "tensor_parallel_size": tp,
        "max_model_len": 2048,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
        "gpu_memory_utilization": 0.12,
        "kv_cache_memory_bytes": 2 << 30,
        "enable_prefix_caching": False,
        "async_scheduling": False,
        "gdn_prefill_backend": "triton",  # the offline bundle has no FlashInfer (hack/gpu/bundle.yaml)
    }
    if variant == "piecewise":
        kw["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    elif variant == "fa2":
        kw["attention_config"] = {"flash_attn_version": 2}
    elif variant == "triton":
        kw["attention_backend"] = "TRITON_ATTN"
    return kw


def builders(worker) -> list[dict]:  # runs in each worker (collective_rpc); rank 0's answer is kept
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    rows = []
    for gid, groups in enumerate(runner.attn_groups):
        for ag in groups:
            b = ag.get_metadata_builder()
            sm = getattr(b, "scheduler_metadata", None)
            rows.append(
                {
                    "gid": gid,
                    "builder": type(b).__name__,
                    "layers": list(ag.layer_names),
                    "reuse": bool(b.supports_update_block_table),
                    "sched": None if sm is None else sm[:40].tolist(),
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variant", choices=VARIANTS)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=os.environ.get("GDN_GPU_MODEL", str(REPO / "tests" / "models" / "tiny-qwen3-next-recall")))
    a = ap.parse_args()
    t0 = time.time()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc of a function at TP>=2
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    sys.path[:0] = [str(REPO / "bench"), str(REPO / "tests" / "gpu")]
    import harness

    if a.variant == "guard":  # the plugin as an installed dist: found by vLLM's loader here and in TP workers
        site = harness.install_guard_layout(Path(tempfile.mkdtemp(prefix="g1-probe-")) / "gdn-guard")
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    else:
        os.environ["GDN_GUARD_DISABLE"] = "all"  # an image with the plugin installed must not guard the others

    import bench_gpu_mtp as mb
    from vllm import LLM, SamplingParams

    t1 = time.time()
    llm = LLM(**engine_kwargs(a.variant, a.tp, a.model))
    t2 = time.time()
    res: dict = {
        "variant": a.variant,
        "tp": a.tp,
        "builders@start": llm.collective_rpc(builders)[0],
        "t_import_s": round(t1 - t0, 1),
        "t_init_s": round(t2 - t1, 1),
    }

    def partial() -> None:
        print("G1PARTIAL " + json.dumps(res), file=sys.stderr, flush=True)

    partial()
    items = mb.fixed_requests(8, 64, 25)
    sp = SamplingParams(temperature=0.0, max_tokens=65)
    for n in (1, 2, 8):  # n prompts in one batch: FULL decode graphs with n rows
        t = time.time()
        outs = llm.generate([{"prompt_token_ids": it["prompt_token_ids"]} for it in items[:n]], sp)
        detail = []
        for o, it in zip(outs, items, strict=False):
            got, exp = list(o.outputs[0].token_ids), it["expected_token_ids"]
            k = 0
            while k < min(len(got), len(exp)) and got[k] == exp[k]:
                k += 1
            detail.append({"id": it["id"], "prefix_ok": k, "n_out": len(got), "finish": o.outputs[0].finish_reason})
        res[f"exact@{n}"] = f"{sum(d['prefix_ok'] >= 64 for d in detail)}/{n}"
        res[f"t_gen@{n}_s"] = round(time.time() - t, 2)
        res[f"detail@{n}"] = detail
        res[f"builders@{n}"] = llm.collective_rpc(builders)[0]
        partial()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k.startswith(("exact", "t_"))}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
