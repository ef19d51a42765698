"""vLLM's real `vllm serve` parser as a line-oriented oracle (run with the engine venv's python).

Reads one JSON array of arguments (what follows `vllm serve`) per stdin line; answers one JSON object per
line: {"ok": true, "ns": {dest: repr(value)}} or {"ok": false, "error": "..."}. The parser is built once,
by the same function hack/gen_vllm_options.py generates the option table with.
"""

import contextlib
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))

from gen_vllm_options import build_serve_parser  # noqa: E402


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    top, _serve = build_serve_parser()
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        argv = json.loads(line)
        sink = io.StringIO()
        try:
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                ns = top.parse_args(["serve", *argv])
            reply = {"ok": True, "ns": {k: repr(v) for k, v in sorted(vars(ns).items()) if k != "dispatch_function"}}
        except SystemExit:
            reply = {"ok": False, "error": sink.getvalue()[-400:]}
        except Exception as e:  # vLLM's own preprocessing raises (IndexError, ValueError, AssertionError)
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"[:400]}
        out.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
