"""One HTTP server for the stand-in engines that only expose metrics (the acceptance and stall cluster tests).

``MetricsServer(ip, port, render)`` binds ``ip:port`` at once (OSError when the address is taken: a kwok pod
IP held by another stand-in), answers GET /metrics with ``render()`` (called per scrape) and GET /health
with 200, in a daemon thread until ``close()``. ``close()`` also cuts the kept-alive connections: with HTTP/1.1 a
scraper's pooled connection would otherwise go on being served by its handler thread after the listener closed,
and a "stopped" engine would keep answering.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus text exposition


class MetricsServer:
    def __init__(self, ip: str, port: int, render: Callable[[], str]) -> None:
        conns: set[socket.socket] = set()
        self.conns, self.conns_lock = conns, threading.Lock()
        lock = self.conns_lock

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with lock:
                    conns.add(self.connection)

            def finish(self) -> None:
                with lock:
                    conns.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/metrics":
                    body, ctype = render().encode(), CONTENT_TYPE
                elif self.path == "/health":
                    body, ctype = b"", "text/plain"
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: object) -> None:
                pass

        self.server = ThreadingHTTPServer((ip, port), H)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.conns_lock:
            open_conns = list(self.conns)
        for c in open_conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the peer
