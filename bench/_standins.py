"""Stand-in engine /metrics servers shared by the benchmark scripts (bench_scrape, bench_stall).

Each benchmark re-runs itself as ``--serve N`` in ``procs`` separate processes (so the servers' CPU is
not counted on the client's side); a server process binds N ports on 127.0.0.1 and prints
``{"ports": [...]}`` once they listen. ``body(port, hit)`` gives the exposition for the hit-th request
on that port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path


def serve(n_ports: int, body: Callable[[int, int], bytes]) -> None:
    """Serve /metrics on `n_ports` ports of 127.0.0.1 until killed (run in a `--serve` process)."""
    from aiohttp import web

    hits: dict[int, int] = {}

    async def handler(request):
        port = request.transport.get_extra_info("sockname")[1]
        h = hits.get(port, 0)
        hits[port] = h + 1
        return web.Response(body=body(port, h), content_type="text/plain", charset="utf-8")

    async def main():
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        ports = []
        for _ in range(n_ports):
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=256)
            await site.start()
            ports.append(site._server.sockets[0].getsockname()[1])
        print(json.dumps({"ports": ports}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


@contextlib.contextmanager
def servers(py: str, script: str, endpoints: int, procs: int) -> Iterator[list[str]]:
    """Start `procs` `script --serve N` processes for `endpoints` ports in all; yields their /metrics URLs
    (RuntimeError when one fails to start); stops them on exit."""
    per = [endpoints // procs + (1 if i < endpoints % procs else 0) for i in range(procs)]
    started: list[subprocess.Popen[str]] = []
    try:
        for n in per:
            started.append(
                subprocess.Popen([py, script, "--serve", str(n)], stdout=subprocess.PIPE, text=True, start_new_session=True)
            )
        urls: list[str] = []
        for p in started:
            line = p.stdout.readline() if p.stdout else ""
            if not line:
                raise RuntimeError(f"{Path(script).name}: stand-in server failed to start")
            urls += [f"http://127.0.0.1:{port}/metrics" for port in json.loads(line)["ports"]]
        yield urls
    finally:
        for p in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
        for p in started:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
