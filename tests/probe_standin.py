"""A stand-in vLLM engine for the output-probe tests: answers POST /v1/completions (token-id prompts)
like a greedy engine that returns token ids, and can be switched to answer wrongly, stop early, or not
answer in time. Bound to a given IP (a kwok pod IP in the cluster tests) and port.

The "correct" answer is a fixed function of the prompt (answer_for), so tests compute the expected
tokens independently of the operator.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CORRECT, WRONG, EARLY, SLOW = "correct", "wrong", "early", "slow"
WRONG_AT = 3  # the token a wrong answer changes


def answer_for(prompt: list[int], max_tokens: int) -> list[int]:
    base = sum(prompt) % 1000
    return [(base + 7 * i) % 1000 + 1 for i in range(max_tokens)]


class ProbeStandIn:
    def __init__(
        self,
        ip: str,
        port: int,
        mode: str = CORRECT,
        slow_seconds: float = 30.0,
        delay: float = 0.0,
        api_key: str | None = None,
    ):
        """`api_key`: answer 401 without `Authorization: Bearer <api_key>`, as vLLM does with VLLM_API_KEY."""
        self.mode = mode
        self.api_key = api_key
        self.unauthorized = 0
        self.slow_seconds = slow_seconds
        self.delay = delay
        self.requests = 0
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self._release = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - /metrics etc.: not this stand-in's business
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/completions":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if outer.api_key is not None and self.headers.get("Authorization") != f"Bearer {outer.api_key}":
                    body = b'{"error":"Unauthorized"}'
                    with outer.lock:
                        outer.unauthorized += 1
                    self.send_response(401)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                req = json.loads(raw)
                with outer.lock:
                    outer.requests += 1
                    outer.bodies.append(req)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    mode = outer.mode
                try:
                    if outer.delay:
                        time.sleep(outer.delay)
                    if mode == SLOW:
                        outer._release.wait(outer.slow_seconds)
                    ids = answer_for(req["prompt"], req["max_tokens"])
                    finish = "length"
                    if mode == WRONG:
                        ids[WRONG_AT] = (ids[WRONG_AT] + 500) % 1000
                    elif mode == EARLY:
                        ids, finish = ids[:2], "stop"
                    body = json.dumps(
                        {
                            "id": "cmpl-standin",
                            "object": "text_completion",
                            "model": req["model"],
                            "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}],
                            "usage": {
                                "prompt_tokens": len(req["prompt"]),
                                "completion_tokens": len(ids),
                                "total_tokens": len(req["prompt"]) + len(ids),
                            },
                        }
                    ).encode()
                    try:
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                    except OSError:
                        pass  # the client gave up (timeout)
                finally:
                    with outer.lock:
                        outer.in_flight -= 1

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer((ip, port), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set(self, mode: str) -> None:
        with self.lock:
            self.mode = mode
        if mode != SLOW:
            self._release.set()
            self._release = threading.Event()

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
