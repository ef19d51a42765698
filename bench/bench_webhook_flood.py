#!/usr/bin/env python3
"""Benchmark: the webhook front under a hostile flood (issue 48), this tree against another commit's, same run.

    nice -n 10 .venv/bin/python bench/bench_webhook_flood.py --compare-tree DIR [--seconds 5]

DIR is another commit's tree exported outside the repo (`git archive 91606ed | tar -x -C DIR`). For each tree in
turn the real front process starts (`python -m gdn_operator.front` with PYTHONPATH=<tree>/operator,
TLS on a loopback port, as the operator starts it; no kopf server behind it: the flood goes to the GDNModelServer
validation path the front answers itself), and the same phases run against it:

  idle      legitimate reviews only;
  sizes     6 clients looping 6 MiB reviews (one long string: cheap to decode) and 2 looping 15 MiB ones (under the
            old 16 MiB cap, past the new one);
  slow      200 connections that send their headers and 16 bytes of a 64 KiB body, then one byte a second (this
            phase lasts at least 12 s: past the new 10 s read deadline);
  many      64 clients looping 200 KiB reviews at once;
  heavy     4 clients looping 1.5 MiB reviews of 15 000 env entries (the issue's 1.6 MiB review: costly to judge).

Through every phase a probe (a process of its own, so that the flood's clients do not delay its timing) sends a
legitimate GDNModelServer review every 100 ms, one at a time, and times its answer as the API server would (it gives up after 10 s: a failure). Per phase: the front's peak resident memory (VmRSS
sampled every 20 ms, and VmHWM at the end), the probe's p50 / p99 / max latency and failures, and the flood's
answers by HTTP status. A flood that the front refuses quickly (413, 408, 503) instead of reading and judging it
costs the legitimate reviews nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "tests"))  # builders.server_review: the review the tests send too

import aiohttp  # noqa: E402
from _stats import machine, pct  # noqa: E402  (bench/ is on sys.path when run as a script)
from builders import server_review  # noqa: E402
from gdn_operator.handlers.webhook import certs  # noqa: E402

FINE = {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "t", "vllmVersion": "0.32.0"}}
PATH = "/gdn-admission"


def review(spec: dict[str, Any], uid: str = "u") -> bytes:
    return json.dumps(server_review(spec, uid, namespace="flood", username="flood")).encode()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Front:
    """The front process of one tree, and its memory sampled in a thread."""

    def __init__(self, tree: Path, certdir: Path):
        self.port = free_port()
        ca, crt, key = certs.new_bundle(["127.0.0.1"]).write(certdir)
        self.ca = str(ca)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GDN_")}
        env["PYTHONPATH"] = str(tree / "operator")
        args = ["--listen", f"127.0.0.1:{self.port}", "--backend", str(free_port()), "--cert", str(crt), "--key", str(key)]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gdn_operator.front", *args, "--ca", str(ca)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if b"ready" not in line:
            raise SystemExit(f"the front of {tree} did not start: {line!r}")
        self.peak = 0
        self.stop = False
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self, field: str = "VmRSS") -> int:
        for ln in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if ln.startswith(field + ":"):
                return int(ln.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self.stop and self.proc.poll() is None:
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:
                return
            time.sleep(0.02)

    def end(self) -> None:
        self.stop = True
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def post(session: aiohttp.ClientSession, url: str, body: bytes, timeout: float) -> int:
    try:
        async with session.post(url, data=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.read()
            return r.status
    except TimeoutError:
        return -1  # no answer in time
    except aiohttp.ClientError:
        return -2  # connection cut


async def probe(session: aiohttp.ClientSession, url: str, until: float, out: list[float], fails: list[int]) -> None:
    body = review(FINE, "probe")
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        t0 = loop.time()
        status = await post(session, url, body, 10.0)
        dt = loop.time() - t0
        out.append(dt)
        if status != 200:
            fails.append(status)
        await asyncio.sleep(max(0.0, 0.1 - dt))


def probe_process(url: str, ca: str, deadline: float, out: Any) -> None:
    """The probe in a process of its own (the flood's clients in this process would delay its timing otherwise):
    sends the latencies and failures back through `out` (a multiprocessing pipe end)."""

    async def go() -> tuple[list[float], list[int]]:
        ctx = ssl.create_default_context(cafile=ca)
        lat: list[float] = []
        fails: list[int] = []
        conn = aiohttp.TCPConnector(ssl=ctx, force_close=True)
        async with aiohttp.ClientSession(connector=conn) as session:
            await probe(session, url, asyncio.get_running_loop().time() + deadline - time.time(), lat, fails)
        return lat, fails

    out.send(asyncio.run(go()))
    out.close()


async def loop_posts(session: aiohttp.ClientSession, url: str, body: bytes, until: float, answers: Counter[int]) -> None:
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        answers[await post(session, url, body, 30.0)] += 1


async def slow_conn(port: int, ctx: ssl.SSLContext, until: float, answers: Counter[int]) -> None:
    loop = asyncio.get_running_loop()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
        head = f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 65536\r\n\r\n"
        writer.write(head.encode() + b'{"request": {"u')
        await writer.drain()
        read = asyncio.ensure_future(reader.readline())
        while loop.time() < until and not read.done():
            await asyncio.wait([read], timeout=1.0)
            if not read.done():
                writer.write(b" ")
                await writer.drain()
        if read.done():
            line = read.result()
            answers[int(line.split()[1]) if line.count(b" ") >= 2 else -2] += 1
        else:
            read.cancel()
            answers[0] += 1  # still held open by the front when the phase ended
        writer.close()
    except (OSError, ConnectionError):
        answers[-2] += 1


async def phase(front: Front, name: str, seconds: float, bodies: dict[str, bytes]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=front.ca)
    url = f"https://127.0.0.1:{front.port}{PATH}"
    conn = aiohttp.TCPConnector(ssl=ctx, limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        loop = asyncio.get_running_loop()
        until = loop.time() + (max(seconds, 12.0) if name == "slow" else seconds)
        front.peak = front.rss()
        answers: Counter[int] = Counter()
        here, there = multiprocessing.Pipe(duplex=False)
        prober = multiprocessing.get_context("spawn").Process(
            target=probe_process, args=(url, front.ca, time.time() + until - loop.time(), there), daemon=True
        )
        prober.start()
        tasks: list[asyncio.Task[Any]] = []
        if name == "sizes":
            tasks += [asyncio.create_task(loop_posts(session, url, bodies["6m"], until, answers)) for _ in range(6)]
            tasks += [asyncio.create_task(loop_posts(session, url, bodies["15m"], until, answers)) for _ in range(2)]
        elif name == "slow":
            tasks += [asyncio.create_task(slow_conn(front.port, ctx, until, answers)) for _ in range(200)]
        elif name == "many":
            tasks += [asyncio.create_task(loop_posts(session, url, bodies["200k"], until, answers)) for _ in range(64)]
        elif name == "heavy":
            tasks += [asyncio.create_task(loop_posts(session, url, bodies["heavy"], until, answers)) for _ in range(4)]
        await asyncio.gather(*tasks)
        got = await asyncio.to_thread(here.recv)
        lat, fails = got
        prober.join(10)
    alive = front.proc.poll() is None
    return {
        "phase": name,
        "peak_mib": front.peak / 2**20,
        "p50_ms": pct(lat, 50) * 1000,
        "p99_ms": pct(lat, 99) * 1000,
        "max_ms": max(lat) * 1000 if lat else float("nan"),
        "probes": len(lat),
        "fails": len(fails),
        "answers": dict(sorted(answers.items())),
        "alive": alive,
    }


def bodies() -> dict[str, bytes]:
    env = [{"name": f"E{i:05d}", "value": "x" * 60} for i in range(15000)]
    return {
        "6m": review({**FINE, "pad": "x" * (6 * 2**20)}),
        "15m": review({**FINE, "pad": "x" * (15 * 2**20)}),
        "200k": review({**FINE, "pad": "x" * (200 * 2**10)}),
        "heavy": review({**FINE, "env": env}),
    }


def run_tree(label: str, tree: Path, seconds: float, b: dict[str, bytes]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="gdn-flood-") as d:
        front = Front(tree, Path(d))
        rows = []
        try:
            for name in ("idle", "sizes", "slow", "many", "heavy"):
                rows.append({"tree": label, **asyncio.run(phase(front, name, seconds, b))})
                if front.proc.poll() is not None:
                    break
            hwm = front.rss("VmHWM") if front.proc.poll() is None else 0
        finally:
            front.end()
        for r in rows:
            r["hwm_mib"] = hwm / 2**20
        return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare-tree", metavar="DIR", required=True, help="another commit's exported tree (the baseline)")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per phase")
    a = ap.parse_args()
    other = Path(a.compare_tree).resolve()
    if not (other / "operator" / "gdn_operator").is_dir():
        raise SystemExit(f"--compare-tree {other}: no operator/gdn_operator there")
    print(machine())
    b = bodies()
    print("bodies: " + ", ".join(f"{k} {len(v) / 2**20:.2f} MiB" for k, v in b.items()))
    rows = run_tree("base", other, a.seconds, b) + run_tree("this", ROOT, a.seconds, b)
    print(
        f"{'tree':5} {'phase':6} {'peakMiB':>8} {'hwmMiB':>7} {'p50ms':>8} {'p99ms':>8} {'maxms':>8} {'probes':>6} {'fails':>5}  answers"
    )
    for r in rows:
        print(
            f"{r['tree']:5} {r['phase']:6} {r['peak_mib']:8.0f} {r['hwm_mib']:7.0f} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} "
            f"{r['max_ms']:8.1f} {r['probes']:6d} {r['fails']:5d}  {r['answers']}{'' if r['alive'] else '  (front died)'}"
        )
    print("answers: HTTP status -> count (-1: no answer within 30 s, -2: connection cut, 0: still held open at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
