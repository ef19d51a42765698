#!/usr/bin/env python3
"""Stand-in for `vllm serve` in GPU drivers' ``--dry-run`` (no GPU, no vLLM): proves a driver's phases, deadlines and
output files on any machine. NOT an engine and never evidence: it answers the recall copy task by echoing the prompt
tokens before the separator (then EOS id 1), exposes /health, /v1/models and a /metrics page with spec-decode
counters that grow with the tokens served (``--mtp``), and becomes Ready after ``--ready-after`` seconds.
Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SEP, EOS = 3, 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ready-after", type=float, default=3.0)
    ap.add_argument("--served-name", default="tiny-recall")
    ap.add_argument("--mtp", action="store_true")
    a = ap.parse_args()
    t0 = time.monotonic()
    lock = threading.Lock()
    c = {"drafts": 0.0, "draft_tokens": 0.0, "accepted": 0.0, "generation": 0.0}

    class H(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            if time.monotonic() - t0 < a.ready_after:
                return self._send(503, b"{}")
            if self.path == "/health":
                return self._send(200, b"")
            if self.path == "/v1/models":
                return self._send(200, json.dumps({"data": [{"id": a.served_name}]}).encode())
            if self.path == "/metrics":
                with lock:
                    lines = [f'vllm:generation_tokens_total{{engine="0"}} {c["generation"]}']
                    if a.mtp:
                        lines += [
                            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {c["drafts"]}',
                            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {c["draft_tokens"]}',
                            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {c["accepted"]}',
                        ]
                        lines += [
                            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{p}"}} '
                            f"{c['drafts'] if p == 0 else c['accepted'] - c['drafts']}"
                            for p in (0, 1)
                        ]
                return self._send(200, ("\n".join(lines) + "\n").encode(), "text/plain")
            return self._send(404, b"{}")

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            prompt = body["prompt"]
            answer = prompt[: prompt.index(SEP)] if SEP in prompt else []
            out = (answer + [EOS])[: body["max_tokens"]]
            if body.get("ignore_eos"):  # fixed-length output: the answer, then filler ids up to max_tokens
                out = (answer + [5 + i % 7 for i in range(body["max_tokens"])])[: body["max_tokens"]]
            time.sleep(0.002 * len(out))
            with lock:
                c["generation"] += len(out)
                c["drafts"] += len(out) / 3
                c["draft_tokens"] += 2 * len(out) / 3
                c["accepted"] += 2 * len(out) / 3
            reason = "stop" if out and out[-1] == EOS else "length"
            text = "".join(chr(96 + (t % 26)) for t in out if t != EOS)
            if body.get("stream"):  # server-sent events, two tokens a chunk, then usage and [DONE]; closes after
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(0, len(out), 2):
                    part = out[i : i + 2]
                    ch = {"text": "".join(chr(96 + (t % 26)) for t in part if t != EOS), "token_ids": part}
                    ch["finish_reason"] = reason if i + 2 >= len(out) else None
                    self.wfile.write(b"data: " + json.dumps({"choices": [ch]}).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.001)  # chunks a step apart, as an engine streams them
                usage = {"choices": [], "usage": {"completion_tokens": len(out)}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                return
            self._send(
                200,
                json.dumps(
                    {
                        "choices": [{"text": text, "token_ids": out, "finish_reason": reason}],
                        "usage": {"completion_tokens": len(out)},
                    }
                ).encode(),
            )

        def log_message(self, fmt, *args) -> None:  # an access line per request, like the engine's
            print(f'INFO: "{self.command} {self.path} HTTP/1.1" {args[1] if len(args) > 1 else ""}', flush=True)

    print(f"standin engine on 127.0.0.1:{a.port} (not vLLM)", flush=True)
    ThreadingHTTPServer.request_queue_size = 256  # 32+ concurrent clients
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()


if __name__ == "__main__":
    main()
