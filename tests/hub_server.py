"""A local HTTP server that serves model directories in the Hugging Face Hub's file layout, for the model
cache's download step (render/podparts.DOWNLOAD_SCRIPT) run as a real process with the Hub client the vLLM
image carries (huggingface_hub, pointed here with HF_ENDPOINT).

Routes (what huggingface_hub's snapshot_download asks for):
    GET  /api/models/<org>/<name>[/revision/<rev>]   repo info: commit sha and file list (siblings)
    GET  /api/models/<org>/<name>/tree/<rev>         the file tree (sizes, git and LFS object ids)
    HEAD|GET /<org>/<name>/resolve/<rev>/<file>      the file, with X-Repo-Commit, ETag, Content-Length;
                                                     GET honours `Range: bytes=N-` (resumed downloads)
Every request is recorded in `requests` (method, path, Range); `fail_after` makes the next file GET longer than that
stop after that many bytes (a dropped connection, once), to test resuming.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class HubServer:
    def __init__(self, repos: dict[str, Path]):
        self.repos = {repo: Path(d) for repo, d in repos.items()}
        self.sha = {repo: self.commit_of(repo) for repo in repos}
        self.requests: list[tuple[str, str, str]] = []  # method, path, Range header
        self.fail_after: int | None = None
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, head=True)

            def do_GET(self) -> None:
                hub._serve(self, head=False)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def commit_of(repo: str) -> str:
        """The commit hash this server reports for `repo` (any revision asked for resolves to it)."""
        return hashlib.sha1(repo.encode()).hexdigest()

    def files(self, repo: str) -> list[str]:
        return sorted(p.name for p in self.repos[repo].iterdir() if p.is_file())

    def _serve(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        self.requests.append((h.command, path, h.headers.get("Range") or ""))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m and m.group(1) in self.repos:
            repo = m.group(1)
            body = json.dumps(
                {
                    "id": repo,
                    "modelId": repo,
                    "sha": self.sha[repo],
                    "private": False,
                    "siblings": [{"rfilename": f} for f in self.files(repo)],
                }
            ).encode()
            return self._send(h, 200, body, {"Content-Type": "application/json"}, head)
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path)
        if m and m.group(1) in self.repos:
            repo = m.group(1)
            entries = []
            for f in self.files(repo):
                data = (self.repos[repo] / f).read_bytes()
                entry: dict[str, Any] = {
                    "type": "file",
                    "path": f,
                    "size": len(data),
                    "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                }
                if f.endswith(".safetensors"):  # stored with LFS on the Hub
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(entry)
            return self._send(h, 200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and m.group(1) in self.repos and (self.repos[m.group(1)] / m.group(3)).is_file():
            repo, _rev, name = m.groups()
            data = (self.repos[repo] / name).read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            headers = {
                "X-Repo-Commit": self.sha[repo],
                "ETag": f'"{etag}"',
                "Content-Type": "application/octet-stream",
                "Accept-Ranges": "bytes",
            }
            start = 0
            rng = h.headers.get("Range")
            if rng and not head:
                start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            part = data[start:]
            if head:
                headers["Content-Length"] = str(len(data))
                return self._send(h, 200, b"", headers, head=True)
            if self.fail_after is not None and len(part) > self.fail_after:
                headers["Content-Length"] = str(len(part))
                h.send_response(206 if start else 200)
                for k, v in headers.items():
                    h.send_header(k, v)
                h.end_headers()
                h.wfile.write(part[: self.fail_after])
                h.wfile.flush()
                h.close_connection = True
                self.fail_after = None  # once
                return None
            return self._send(h, 206 if start else 200, part, headers, head)
        return self._send(
            h,
            404,
            b'{"error":"Repository not found"}',
            {"Content-Type": "application/json", "X-Error-Code": "RepoNotFound"},
            head,
        )

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, code: int, body: bytes, headers: dict[str, str], head: bool) -> None:
        h.send_response(code)
        for k, v in headers.items():
            h.send_header(k, v)
        if "Content-Length" not in headers:
            h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)
