#!/usr/bin/env python3
"""Benchmark: CPU share and RSS of the operator's acceptance scraping of N engine pods.

Stand-in engines: ``--endpoints`` (default 1000) distinct URLs, one listening port each on
127.0.0.1, served by ``--server-procs`` separate processes (so their CPU is not counted). Each
serves the REAL captured vLLM 0.32.0 exposition (../shared/fixtures/vllm-0.32.0-cpu/metrics-mtp2.prom,
55 KB, ~600 lines) with the spec-decode counters advanced on every hit (acceptance 0.6 by
construction, checked at the end).

Two client phases run one after the other, each in a fresh process, scraping every target every
``--interval`` seconds (default 15, the operator's timer) for ``--rounds`` rounds:

* baseline: plain aiohttp GETs that read the body (no parsing) — the floor for any HTTP scraper;
* operator: gdn_operator.watch.scraper.Scraper + AcceptanceTracker.observe/retain/update_baseline/
  update_gauges/summary for every resource (``--pods-per-resource`` pods each), i.e. the real timer work.

CPU share = process CPU time / wall time over the rounds (includes the idle sleep between rounds,
like the real timer). RSS = VmRSS at the end and VmHWM (peak) of the client process.
Goal: operator < 0.5 core, every round inside its interval and < 300 MiB, at 1000 and at 10,000 endpoints
/ 15 s (issue 37 item 7: ``--endpoints 10000 --rounds 3``).

    .venv/bin/python bench/bench_scrape.py                 # 1000 endpoints, 15 s x 4 rounds
    .venv/bin/python bench/bench_scrape.py --interval 3 --rounds 3   # quick run
    .venv/bin/python bench/bench_scrape.py --prometheus --endpoints 10000   # the Prometheus path (watch/promsource.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GDN_SHARED_DIR", REPO.parent / "shared"))
FIXTURE = SHARED / "fixtures" / "vllm-0.32.0-cpu" / "metrics-mtp2.prom"
sys.path.insert(0, str(REPO / "operator"))

import _standins  # noqa: E402  (bench/ is on sys.path when run as a script)

# per hit: +100 drafts, +200 draft tokens, +120 accepted (80 at pos 0, 40 at pos 1), +300 gen tokens
_ADVANCE = {
    "vllm:spec_decode_num_drafts_total": (156, 100),
    "vllm:spec_decode_num_draft_tokens_total": (312, 200),
    "vllm:spec_decode_num_accepted_tokens_total": (0, 120),
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-qwen3-next",position="0"}': (0, 80),
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny-qwen3-next",position="1"}': (0, 40),
    "vllm:generation_tokens_total": (160, 300),
}
EXPECTED_ACCEPTANCE = 120 / 200


def _template(text: str) -> list:
    """Split the exposition into literal bytes and (base, step) slots for the advanced counters."""
    parts: list = []
    pos = 0
    for m in re.finditer(r"^(?P<series>[^\s#][^ ]*) (?P<value>\S+)$", text, re.M):
        series = m.group("series")
        name = series.split("{", 1)[0]
        adv = _ADVANCE.get(series) or (_ADVANCE.get(name) if "position" not in series else None)
        if adv is None:
            continue
        parts.append(text[pos : m.start("value")].encode())
        parts.append(adv)
        pos = m.end("value")
    parts.append(text[pos:].encode())
    return parts


def _render(parts: list, hit: int) -> bytes:
    return b"".join(p if isinstance(p, bytes) else b"%.1f" % (p[0] + p[1] * hit) for p in parts)


# --------------------------------------------------------------------------------------------------
# stand-in server process
# --------------------------------------------------------------------------------------------------


def serve(n_ports: int) -> None:
    parts = _template(FIXTURE.read_text())
    _standins.serve(n_ports, lambda _port, hit: _render(parts, hit))


# --------------------------------------------------------------------------------------------------
# client phases
# --------------------------------------------------------------------------------------------------


def _proc_status() -> dict[str, float]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0]) / 1024.0  # MiB
    return out


async def _phase(
    mode: str,
    urls: list[str],
    rounds: int,
    interval: float,
    concurrency: int,
    timeout: float,
    pods_per_resource: int,
    window: float,
) -> dict:
    import aiohttp

    rss_start = _proc_status()["VmRSS"]
    round_walls, round_cpus, errors = [], [], 0
    result_check = None

    if mode == "baseline":
        conn = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=60.0)
        session = aiohttp.ClientSession(connector=conn)
        sem = asyncio.Semaphore(concurrency)

        async def get(url):
            async with sem:
                try:
                    async with asyncio.timeout(timeout):
                        async with session.get(url) as r:
                            await r.read()
                            return r.status == 200
                except Exception:
                    return False

        async def one_round():
            ok = await asyncio.gather(*(get(u) for u in urls))
            return len(ok) - sum(ok)

        closer = session.close
    else:
        from gdn_operator.watch.acceptance import AcceptanceTracker
        from gdn_operator.watch.scraper import Scraper, Target, scrape_and_observe
        from gdn_operator.watch.target import EngineTarget

        targets = [
            Target(EngineTarget.server("bench", f"model-{i // pods_per_resource}"), f"pod-{i}", u) for i, u in enumerate(urls)
        ]
        resources = sorted({t.owner for t in targets}, key=lambda o: (o.namespace, o.name))
        tracker = AcceptanceTracker(window=window)
        scraper = Scraper(timeout=timeout, concurrency=concurrency)
        await scraper.__aenter__()

        async def one_round():
            results = await scrape_and_observe(tracker, scraper, targets)
            for owner in resources:
                tracker.update_baseline(owner)
                tracker.update_gauges(owner)
                tracker.summary(owner)
            return sum(1 for r in results if not r.ok)

        async def closer():
            await scraper.close()

    t_start, c_start = time.monotonic(), time.process_time()
    for i in range(rounds):
        tick = t_start + i * interval
        now = time.monotonic()
        if tick > now:
            await asyncio.sleep(tick - now)
        w0, c0 = time.monotonic(), time.process_time()
        errors += await one_round()
        round_walls.append(time.monotonic() - w0)
        round_cpus.append(time.process_time() - c0)
    # the last round's interval counts too (the timer would sleep until the next tick)
    end = t_start + rounds * interval
    now = time.monotonic()
    if end > now:
        await asyncio.sleep(end - now)
    wall = time.monotonic() - t_start
    cpu = time.process_time() - c_start
    if mode == "operator":
        s = tracker.summary(resources[0])
        result_check = {
            "acceptanceRate": s["acceptanceRate"],
            "state": s["state"],
            "meanAcceptedLength": s["meanAcceptedLength"],
            "pods": s["pods"]["total"],
        }
    await closer()
    st = _proc_status()
    return {
        "mode": mode,
        "endpoints": len(urls),
        "rounds": rounds,
        "interval_s": interval,
        "cpu_s": round(cpu, 3),
        "wall_s": round(wall, 2),
        "cpu_share_cores": round(cpu / wall, 4),
        "cpu_per_round_s": [round(c, 3) for c in round_cpus],
        "round_wall_s": [round(w, 3) for w in round_walls],
        "errors": errors,
        "rss_start_mib": round(rss_start, 1),
        "rss_end_mib": round(st["VmRSS"], 1),
        "rss_peak_mib": round(st["VmHWM"], 1),
        "check": result_check,
    }


def client(args) -> None:
    urls = json.loads(sys.stdin.read())
    res = asyncio.run(
        _phase(args.client, urls, args.rounds, args.interval, args.concurrency, args.timeout, args.pods_per_resource, args.window)
    )
    print(json.dumps(res), flush=True)


def parse_micro(n: int = 200) -> None:
    """Per-exposition parse cost: the operator's scanner (a fresh reader, and the Scraper's reader that keeps
    label sets across scrapes) vs. a full prometheus_client parse."""
    from gdn_operator.watch.acceptance import ExpositionReader, parse_exposition
    from prometheus_client.parser import text_string_to_metric_families

    body = FIXTURE.read_bytes()
    text = body.decode()
    t0 = time.process_time()
    for _ in range(n):
        parse_exposition(body, 0.0)
    fresh = (time.process_time() - t0) / n * 1e3
    reader = ExpositionReader()
    t0 = time.process_time()
    for _ in range(n):
        reader.parse(body, 0.0)
    kept = (time.process_time() - t0) / n * 1e3
    t0 = time.process_time()
    for _ in range(n // 4):
        list(text_string_to_metric_families(text))
    full = (time.process_time() - t0) / (n // 4) * 1e3
    print(
        f"parse: ExpositionReader {kept:.3f} ms/exposition (parse_exposition, fresh reader: {fresh:.3f} ms); "
        f"full text_string_to_metric_families {full:.2f} ms (x{full / kept:.0f})"
    )


def prometheus_micro(endpoints: int) -> None:
    """The Prometheus path's own cost per round at ``endpoints`` engines: PrometheusSource.scrape for every
    target against a local stand-in of Prometheus's query API answering with the real exposition's read
    series for each pod (the answer is encoded once, so the stand-in costs almost nothing)."""
    from aiohttp import web
    from gdn_operator.watch.acceptance import SAMPLE_NAMES
    from gdn_operator.watch.promsource import PrometheusSource
    from gdn_operator.watch.scraper import Target
    from gdn_operator.watch.target import EngineTarget
    from prometheus_client.parser import text_string_to_metric_families

    read = {n for n in SAMPLE_NAMES} | {"vllm:" + n for n in SAMPLE_NAMES}
    series = [
        (s.name, s.labels, s.value)
        for fam in text_string_to_metric_families(FIXTURE.read_text())
        for s in fam.samples
        if s.name in read
    ]
    now = time.time()
    samples, times = [], []
    for i in range(endpoints):
        pod = {"namespace": "bench", "pod": f"pod-{i}"}  # the query keeps these and the sample's own labels
        samples += [{"metric": {"__name__": n, **pod, **lab}, "value": [now, repr(v)]} for n, lab, v in series]
        times.append({"metric": {"namespace": "bench", "pod": f"pod-{i}"}, "value": [now, repr(now - 1)]})
    bodies = {
        kind: json.dumps({"status": "success", "data": {"resultType": "vector", "result": r}}).encode()
        for kind, r in (("samples", samples), ("times", times))
    }
    del samples, times

    async def handler(request):
        q = (await request.post())["query"]
        return web.Response(body=bodies["times" if q.startswith("max by") else "samples"], content_type="application/json")

    async def go():
        app = web.Application()
        app.router.add_post("/api/v1/query", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        source = PrometheusSource(f"http://127.0.0.1:{port}", timeout=60, max_age=0.001)
        targets = [Target(EngineTarget.server("bench", f"model-{i // 10}"), f"pod-{i}", "") for i in range(endpoints)]
        cpu, wall = [], []
        rss_before = _proc_status()["VmRSS"]
        with open("/proc/self/clear_refs", "w") as f:  # peak RSS from here: the rounds, not building the answer
            f.write("5")
        for _ in range(3):
            c0, w0 = time.process_time(), time.monotonic()
            results = await source.scrape(targets)
            cpu.append(time.process_time() - c0)
            wall.append(time.monotonic() - w0)
            assert all(r.ok for r in results), results[0].message
        await source.close()
        await runner.cleanup()
        return cpu, wall, rss_before

    cpu, wall, rss_before = asyncio.run(go())
    print(
        f"prometheus source: {endpoints} engines, {len(series)} series each, answer {len(bodies['samples']) / 2**20:.0f} MiB: "
        f"CPU per round {', '.join(f'{c:.2f}' for c in cpu)} s, wall {', '.join(f'{w:.2f}' for w in wall)} s; "
        f"RSS before the rounds {rss_before:.0f} MiB (the stand-in's answer included), peak in them "
        f"{_proc_status()['VmHWM']:.0f} MiB"
    )


# --------------------------------------------------------------------------------------------------
# orchestration
# --------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--server-procs", type=int, default=2)
    ap.add_argument("--interval", type=float, default=15.0, help="seconds between rounds (operator timer)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--pods-per-resource", type=int, default=10)
    ap.add_argument(
        "--window",
        type=float,
        default=300.0,
        help="tracker window (s); window/interval points are kept per pod, e.g. "
        "--interval 2 --window 40 --rounds 25 reaches the 15 s / 300 s steady state",
    )
    ap.add_argument("--prometheus", action="store_true", help="only the Prometheus path's cost per round at --endpoints engines")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client", choices=["baseline", "operator"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    if args.client:
        client(args)
        return 0
    if not FIXTURE.exists():
        print(f"bench_scrape: fixture not found: {FIXTURE} (set GDN_SHARED_DIR)", file=sys.stderr)
        return 2
    if args.prometheus:
        prometheus_micro(args.endpoints)
        return 0

    parse_micro()
    py = sys.executable
    me = str(Path(__file__).resolve())
    t0 = time.monotonic()
    try:
        with _standins.servers(py, me, args.endpoints, args.server_procs) as urls:
            print(
                f"stand-ins: {len(urls)} endpoints (distinct ports) on 127.0.0.1 in "
                f"{args.server_procs} server process(es), ready in {time.monotonic() - t0:.1f}s; "
                f"exposition {FIXTURE.stat().st_size} bytes"
            )
            return _compare(py, me, urls, args)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1


def _compare(py: str, me: str, urls: list[str], args: argparse.Namespace) -> int:
    """Both client phases against the running stand-ins; prints them and the verdict."""
    results = []
    for mode in ("baseline", "operator"):
        cmd = [
            py,
            me,
            "--client",
            mode,
            "--rounds",
            str(args.rounds),
            "--interval",
            str(args.interval),
            "--concurrency",
            str(args.concurrency),
            "--timeout",
            str(args.timeout),
            "--pods-per-resource",
            str(args.pods_per_resource),
            "--window",
            str(args.window),
        ]
        out = subprocess.run(cmd, input=json.dumps(urls), capture_output=True, text=True)
        if out.returncode != 0:
            print(f"bench_scrape: {mode} client failed:\n{out.stderr}", file=sys.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(
            f"\n[{mode}] {r['endpoints']} endpoints x {r['rounds']} rounds every {r['interval_s']:g}s, "
            f"concurrency {args.concurrency}" + (f", window {args.window:g}s" if mode == "operator" else "")
        )
        print(f"  CPU share      {r['cpu_share_cores']:.3f} cores  ({r['cpu_s']:.2f}s CPU / {r['wall_s']:.1f}s wall)")
        print(f"  CPU per round  {', '.join(f'{c:.2f}' for c in r['cpu_per_round_s'])} s")
        print(f"  round latency  {', '.join(f'{w:.2f}' for w in r['round_wall_s'])} s")
        print(
            f"  RSS            start {r['rss_start_mib']:.0f} MiB, end {r['rss_end_mib']:.0f} MiB, "
            f"peak {r['rss_peak_mib']:.0f} MiB"
        )
        print(f"  errors         {r['errors']}")
        if r["check"]:
            print(f"  check          {r['check']}")
    base, op = results
    print("\nsummary")
    print(
        f"  operator CPU share {op['cpu_share_cores']:.3f} cores (goal < 0.5), "
        f"baseline {base['cpu_share_cores']:.3f}, overhead of parse+window+status "
        f"{op['cpu_share_cores'] - base['cpu_share_cores']:+.3f} cores"
    )
    print(
        f"  operator / baseline CPU {op['cpu_share_cores'] / base['cpu_share_cores']:.2f}x; slowest round "
        f"{max(op['round_wall_s']):.2f} s of a {args.interval:g} s interval "
        f"({'every round inside it' if max(op['round_wall_s']) < args.interval else 'NOT inside it'})"
    )
    print(f"  operator peak RSS {op['rss_peak_mib']:.0f} MiB (goal < 300), baseline {base['rss_peak_mib']:.0f} MiB")
    ok = (
        op["cpu_share_cores"] < 0.5
        and max(op["round_wall_s"]) < args.interval
        and op["rss_peak_mib"] < 300
        and op["errors"] == 0
        and op["check"]
        and abs((op["check"]["acceptanceRate"] or 0) - EXPECTED_ACCEPTANCE) < 1e-3
    )
    print(f"  result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
