#!/usr/bin/env python3
"""Benchmark: the operator's CPU share and extra RSS for output probes, and the probe round latency.

``--servers`` (default 200) GDNModelServers with one Ready engine pod each and ``--probes`` (default 3)
probes every ``--interval`` seconds (default 30), run by the real ProbeSupervisor (handlers/engines/probes.py:
jittered scheduling, shared session, judge_round, the state machine, metrics, status fingerprinting).
The engines are stand-ins in a separate process (their CPU is not counted): one aiohttp server
listening on 127.0.1.1 … 127.0.1.N (one IP per pod, same port), answering greedy /v1/completions
with token ids like vLLM. Status writes go to a counting fake (in steady state there are none: status
is only written when something changes), so the numbers are the probing itself.

The client runs in a fresh process: RSS is measured after imports and set-up (baseline) and at the
end (VmRSS, VmHWM); CPU share = process CPU time / wall time over ``--duration`` seconds (includes
the idle time between rounds, like the real loop). Goal: < 0.1 core and < 100 MiB extra at
200 servers x 3 probes / 30 s.

    nice -n 10 .venv/bin/python bench/bench_probes.py                  # 200 x 3 / 30 s for 150 s
    nice -n 10 .venv/bin/python bench/bench_probes.py --duration 40    # quick run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

PROMPT_TOKENS = 16
MAX_TOKENS = 16


def ip_of(i: int) -> str:
    return f"127.0.1.{i + 1}" if i < 254 else f"127.0.{2 + (i - 254) // 254}.{(i - 254) % 254 + 1}"


def answer_for(prompt: list[int], max_tokens: int) -> list[int]:
    base = sum(prompt) % 1000
    return [(base + 7 * i) % 1000 + 1 for i in range(max_tokens)]


# ------------------------------------------------------------------------------ stand-in engines ---


def serve(n: int, port: int) -> None:
    from aiohttp import web

    async def completions(request: web.Request) -> web.Response:
        req = await request.json()
        ids = answer_for(req["prompt"], req["max_tokens"])
        return web.json_response(
            {
                "id": "cmpl-bench",
                "object": "text_completion",
                "model": req["model"],
                "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": len(ids)},
            }
        )

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for i in range(n):
            await web.TCPSite(runner, ip_of(i), port, backlog=256).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# ------------------------------------------------------------------------------------- client ---


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def client(n: int, probes: int, interval: int, duration: float, port: int) -> None:
    from gdn_operator.api.probes import ProbesSpec
    from gdn_operator.handlers.engines.probes import ProbeSupervisor, ServerProbes
    from gdn_operator.watch.probes import ProbeBook
    from gdn_operator.watch.target import EngineTarget

    writes = [0]

    def writer(target, s, body, cond):
        writes[0] += 1
        return None

    pods = {
        f"srv-{i}": [{"name": f"srv-{i}-0", "ip": ip_of(i), "ready": True, "engine": "e", "deleting": False}] for i in range(n)
    }
    sup = ProbeSupervisor(lambda target: pods[target.name], writer=writer, remediator=lambda *a: None, port=port, seed=7)
    spec = ProbesSpec.model_validate(
        {
            "intervalSeconds": interval,
            "timeoutSeconds": min(10, interval - 1),
            "failureThreshold": 3,
            "prompts": [
                {"name": f"p{j}", "promptTokenIds": [j * 100 + t for t in range(PROMPT_TOKENS)], "maxTokens": MAX_TOKENS}
                for j in range(probes)
            ],
        }
    )
    rounds: list[float] = []
    results: dict[str, int] = {}
    inner = sup.round

    async def timed_round(ns, name, s):
        t0 = time.perf_counter()
        cond = await inner(ns, name, s)
        rounds.append(time.perf_counter() - t0)
        return cond

    sup.round = timed_round  # type: ignore[method-assign]

    async def main() -> dict:
        for i in range(n):
            s = ServerProbes(
                spec,
                generation=1,
                image="img",
                model="m",
                engine="e",
                book=ProbeBook([p.name for p in spec.prompts], spec.failure_threshold),
            )
            sup.configure(EngineTarget.server("bench", f"srv-{i}"), s)
        rss0 = _status_kb("VmRSS")
        cpu0, wall0 = time.process_time(), time.perf_counter()
        task = asyncio.get_running_loop().create_task(sup.run())
        await asyncio.sleep(duration)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        from gdn_operator import telemetry

        for metric in telemetry.PROBES.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    results[sample.labels["result"]] = results.get(sample.labels["result"], 0) + int(sample.value)
        states = {}
        for s in sup.servers.values():
            states[s.book.condition.reason] = states.get(s.book.condition.reason, 0) + 1
        return {
            "rss0_kib": rss0,
            "rss_kib": _status_kb("VmRSS"),
            "hwm_kib": _status_kb("VmHWM"),
            "cpu_s": cpu,
            "wall_s": wall,
            "states": states,
        }

    out = asyncio.run(main())
    rounds.sort()

    def q(p: float) -> float:
        return rounds[min(len(rounds) - 1, int(p * len(rounds)))] if rounds else float("nan")

    out.update(
        rounds=len(rounds),
        writes=writes[0],
        results=results,
        round_p50=q(0.5),
        round_p95=q(0.95),
        round_max=rounds[-1] if rounds else float("nan"),
    )
    print(json.dumps(out))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=200)
    ap.add_argument("--probes", type=int, default=3)
    ap.add_argument("--interval", type=int, default=30)
    ap.add_argument("--duration", type=float, default=150.0)
    ap.add_argument("--role", choices=["main", "serve", "client"], default="main", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role == "serve":
        serve(a.servers, a.port)
        return
    if a.role == "client":
        client(a.servers, a.probes, a.interval, a.duration, a.port)
        return
    port = free_port()
    srv = subprocess.Popen(
        [sys.executable, __file__, "--role", "serve", "--servers", str(a.servers), "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = srv.stdout.readline()
        if line.strip() != "ready":
            sys.exit(f"stand-in engines did not start: {line!r}")
        res = subprocess.run(
            [
                sys.executable,
                __file__,
                "--role",
                "client",
                "--servers",
                str(a.servers),
                "--probes",
                str(a.probes),
                "--interval",
                str(a.interval),
                "--duration",
                str(a.duration),
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            sys.exit(res.stderr[-3000:])
        r = json.loads(res.stdout.strip().splitlines()[-1])
    finally:
        srv.terminate()
        srv.wait(10)
    extra = (r["rss_kib"] - r["rss0_kib"]) / 1024
    cores = r["cpu_s"] / r["wall_s"]
    print(
        f"output probes: {a.servers} servers x {a.probes} probes every {a.interval}s, {r['wall_s']:.0f}s ({os.cpu_count()} CPUs)"
    )
    print(f"  operator CPU        {cores:.4f} cores   (goal < 0.1)   [{r['cpu_s']:.2f}s CPU / {r['wall_s']:.1f}s]")
    print(
        f"  operator RSS        {r['rss_kib'] / 1024:.1f} MiB; extra for probing {extra:.1f} MiB (goal < 100); "
        f"peak {r['hwm_kib'] / 1024:.1f} MiB; baseline after set-up {r['rss0_kib'] / 1024:.1f} MiB"
    )
    print(
        f"  rounds              {r['rounds']} server rounds, {sum(r['results'].values())} probe requests "
        f"(= rounds x {a.probes}: {r['rounds'] * a.probes}); results {r['results']}"
    )
    print(
        f"  round latency       p50 {r['round_p50'] * 1000:.1f} ms, p95 {r['round_p95'] * 1000:.1f} ms, "
        f"max {r['round_max'] * 1000:.1f} ms ({a.probes} sequential requests to one pod)"
    )
    print(f"  status writes       {r['writes']} (first round learns; unchanged rounds write nothing); conditions {r['states']}")
    ok = cores < 0.1 and extra < 100 and not r["results"].get("error") and not r["results"].get("mismatch")
    print("  verdict             " + ("within goal" if ok else "OUTSIDE GOAL"))


if __name__ == "__main__":
    main()
