"""Parse launch lines with vLLM's own `vllm serve` parser (no engine); run with the bundle on PYTHONPATH.

stdin: JSON list of argv lists (what follows `vllm serve`).  stdout (vLLM logs there too): one line
starting with MARK, then a JSON list, per argv
{"ok": bool, "error": str|None, "values": {dest: repr}} with the parsed values of every dest the argv
sets, after EngineArgs.from_cli_args (so type conversion of JSON/enum values is exercised too).
Builds the parser the way vllm/entrypoints/cli/main.py does (subcommand `serve`).
"""

import contextlib
import io
import json
import sys

MARK = "GDN-PARSE-PROBE-RESULT "


def build_parser():
    import vllm.entrypoints.cli.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM CLI")
    sub = parser.add_subparsers(required=False, dest="subparser")
    cmds = serve.cmd_init()
    for cmd in cmds:
        cmd.subparser_init(sub).set_defaults(dispatch_function=cmd.cmd)
    return parser, cmds[0]


def main() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs

    argvs = json.load(sys.stdin)
    parser, serve_cmd = build_parser()
    out = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = parser.parse_args(["serve", *argv])
            if hasattr(serve_cmd, "validate"):
                serve_cmd.validate(ns)  # what `vllm serve` runs after parsing
            if getattr(ns, "model_tag", None):
                ns.model = ns.model_tag
            ea = AsyncEngineArgs.from_cli_args(ns)
            values = {k: repr(v) for k, v in vars(ns).items()}
            values.update({f"engine_args.{k}": repr(v) for k, v in vars(ea).items()})
            out.append({"ok": True, "error": None, "values": values})
        except SystemExit as e:
            out.append({"ok": False, "error": f"exit {e.code}: {err.getvalue().strip()[-800:]}", "values": {}})
        except Exception as e:  # noqa: BLE001 - reported to the test
            out.append({"ok": False, "error": f"{type(e).__name__}: {e}"[-800:], "values": {}})
    print(MARK + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
