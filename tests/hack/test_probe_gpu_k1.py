"""bench/probe_gpu_k1.py (issue 47, vllm#53051): the GPU client finds the one prompt length an engine gets wrong.

A local /v1/completions stand-in plays the recall model: it answers every prompt right except those of a chosen
length (what an engine hit by vllm#53051 does at 1 + k tokens, and at C + 1 + k after a first chunk of C).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "probe_gpu_k1.py"


def _server(bad_lengths: set[int]) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["prompt"]
            answer = [*prompt[:-1], 1]  # the symbols, then EOS
            if len(prompt) in bad_lengths:
                answer = [prompt[0]] * (len(prompt) - 1) + [1]  # lost state: repeats the first symbol
            out = {"choices": [{"text": "", "token_ids": answer, "finish_reason": "stop"}]}
            data = json.dumps(out).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _run(url: str, tmp: Path, *extra: str) -> dict:
    out = tmp / "k1.json"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--url", url, "--model", "m", "--per-length", "4", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_the_fresh_and_the_final_chunk_lengths_are_found(tmp_path: Path) -> None:
    srv = _server({3, 131})
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        doc = _run(url, tmp_path, "--k", "2", "--chunk", "128", "--reference-url", url)
    finally:
        srv.shutdown()
    assert doc["suspect"] == [3, 131]
    assert doc["lengths"]["3"]["exact"] == 0 and doc["lengths"]["4"]["exact"] == doc["lengths"]["4"]["sent"] == 4
    assert doc["lengths"]["131"]["wrong_examples"] and doc["lengths"]["3"]["same_as_reference"] == 4


def test_a_clean_engine_has_no_suspect_length(tmp_path: Path) -> None:
    srv = _server(set())
    try:
        doc = _run(f"http://127.0.0.1:{srv.server_address[1]}", tmp_path, "--k", "3")
    finally:
        srv.shutdown()
    assert doc["suspect"] == [] and sorted(int(n) for n in doc["lengths"]) == list(range(2, 10))
