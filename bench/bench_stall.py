#!/usr/bin/env python3
"""Benchmark: CPU cost of the stall detector per scrape round of N engines, against today's scrape round
measured in the same run (issue 24: within 10 %).

Stand-in engines: ``--endpoints`` (default 1000) ports on 127.0.0.1 in ``--server-procs`` separate
processes (their CPU is not counted), each serving the real vLLM 0.22.0 exposition
(tests/fixtures/vllm-0.22.0-h200-trained/metrics-rendered.prom, rendered by tests/stall_replay.py) with
8 requests running: half the ports stalled (counters frozen), half progressing (+240 generation tokens
per hit).

One client process runs ``--rounds`` rounds every ``--interval`` s. Each round, CPU time (process_time) of:

* **today's round**: Scraper.scrape + AcceptanceTracker observe/retain/update_baseline/update_gauges/summary
  for every resource (``--pods-per-resource`` pods each), as handlers/engines/acceptance.py does;
* **detector**: ``StallDetector.observe`` on every result's snapshot (the scraper already parsed it), with a
  simulated clock advancing ``--sim-interval`` (15 s, the default scrape interval) per round, so a few
  seconds of rounds reach the steady state of a 120 s stallSeconds (2 x 120 / 15 = 16 samples per pod);
* **extra parse**: what the three families the detector added to the parser cost (prompt tokens, waiting,
  engine steps): parse_exposition with the current line filter minus the same with those families left
  out, per exposition, times N. It is inside today's round as measured, so it is moved from there to
  the detector's side of the ratio.

ratio = (detector + extra parse) / (today's round - extra parse), over the steady-state rounds (the last
half). It also checks the verdicts: every stalled port flagged, no progressing port flagged.

    .venv/bin/python bench/bench_stall.py                      # 1000 endpoints, 24 rounds every 2 s
    .venv/bin/python bench/bench_stall.py --endpoints 200 --rounds 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))

import _standins  # noqa: E402  (bench/ is on sys.path when run as a script)

RUNNING = 8
GEN_PER_HIT = 240  # progressing ports: 8 requests x 30 tokens/s x ... per scrape, far above the floor


def is_stalled(port: int) -> bool:
    """Half the ports (by port // 2: Linux hands out odd ports to bind(0))."""
    return (port // 2) % 2 == 0


def _point(stalled: bool, hit: int) -> dict:
    gen = 40000.0 + (0 if stalled else GEN_PER_HIT * hit)
    return {
        "running": RUNNING,
        "waiting": 2,
        "generation_tokens": gen,
        "prompt_tokens": 130000.0,
        "draft_tokens": gen * 2 / 3,
        "steps": gen / 3,
    }


def serve(n_ports: int) -> None:
    from stall_replay import exposition

    _standins.serve(n_ports, lambda port, hit: exposition(_point(is_stalled(port), hit)).encode())


def extra_parse_ms(n: int = 400) -> tuple[float, float]:
    """ms per exposition: parse_exposition as shipped, and with the detector's three families filtered out."""
    from gdn_operator.watch.acceptance import parse as parse_mod
    from stall_replay import exposition

    body = exposition(_point(False, 3)).encode()
    shipped = parse_mod._LINE_FILTER
    # the same filter with the detector's alternative unable to match (its group stays empty)
    alt = rb"((?:vllm[:_])?(?:num_requests_waiting|prompt_tokens_total|iteration_tokens_total_count)[ {\t][^\n]*))"
    assert alt in shipped.pattern
    without = re.compile(shipped.pattern.replace(alt, rb"((?!)))"))
    assert sum(1 for _, b in without.findall(b"\n" + body) if b) == 0 < sum(1 for _, b in shipped.findall(b"\n" + body) if b)
    out = []
    for rx in (shipped, without):
        parse_mod._LINE_FILTER = rx
        try:
            best = float("inf")
            for _ in range(5):  # best of 5 batches: the least disturbed by the other processes
                t0 = time.process_time()
                for _ in range(n):
                    parse_mod.parse_exposition(body, 0.0)
                best = min(best, (time.process_time() - t0) / n * 1e3)
            out.append(best)
        finally:
            parse_mod._LINE_FILTER = shipped
    return out[0], out[1]


async def _client(urls: list[str], args) -> dict:
    from gdn_operator.watch.acceptance import AcceptanceTracker
    from gdn_operator.watch.scraper import Scraper, Target, scrape_and_observe
    from gdn_operator.watch.stall import StallDetector
    from gdn_operator.watch.target import EngineTarget

    ports = [int(u.rsplit(":", 1)[1].split("/")[0]) for u in urls]
    targets = [
        Target(EngineTarget.server("bench", f"model-{i // args.pods_per_resource}"), f"pod-{i}", u) for i, u in enumerate(urls)
    ]
    resources = sorted({t.owner for t in targets}, key=lambda o: (o.namespace, o.name))
    tracker = AcceptanceTracker(window=300.0)
    detectors = {t.key: StallDetector(args.stall_seconds) for t in targets}
    today, det_cpu, errors = [], [], 0
    verdicts: dict = {}
    async with Scraper(timeout=5.0, concurrency=64) as scraper:
        t_start = time.monotonic()
        for i in range(args.rounds):
            tick = t_start + i * args.interval
            if tick > time.monotonic():
                await asyncio.sleep(tick - time.monotonic())
            c0 = time.process_time()
            results = await scrape_and_observe(tracker, scraper, targets)
            for owner in resources:
                tracker.update_baseline(owner)
                tracker.update_gauges(owner)
                tracker.summary(owner)
            c1 = time.process_time()
            now = i * args.sim_interval
            for r in results:
                verdicts[r.target.key] = detectors[r.target.key].observe(now, r.snapshot)
            c2 = time.process_time()
            today.append(c1 - c0)
            det_cpu.append(c2 - c1)
            errors += sum(1 for r in results if not r.ok)
    port_of = {t.key: p for t, p in zip(targets, ports, strict=False)}
    stalled_ok = sum(1 for k, v in verdicts.items() if is_stalled(port_of[k]) and v.stalled)
    false_alarms = sum(1 for k, v in verdicts.items() if not is_stalled(port_of[k]) and v.stalled)
    return {
        "today": today,
        "detector": det_cpu,
        "errors": errors,
        "stalled_flagged": stalled_ok,
        "stalled_total": sum(1 for p in ports if is_stalled(p)),
        "false_alarms": false_alarms,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", type=int, default=1000)
    ap.add_argument("--server-procs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--interval", type=float, default=2.0, help="wall seconds between rounds")
    ap.add_argument("--sim-interval", type=float, default=15.0, help="detector clock seconds per round")
    ap.add_argument("--stall-seconds", type=float, default=120.0)
    ap.add_argument("--pods-per-resource", type=int, default=10)
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    if args.client:
        urls = json.loads(sys.stdin.read())
        print(json.dumps(asyncio.run(_client(urls, args))), flush=True)
        return 0

    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--client",
        "--rounds",
        str(args.rounds),
        "--interval",
        str(args.interval),
        "--sim-interval",
        str(args.sim_interval),
        "--stall-seconds",
        str(args.stall_seconds),
        "--pods-per-resource",
        str(args.pods_per_resource),
    ]
    try:
        with _standins.servers(sys.executable, str(Path(__file__).resolve()), args.endpoints, args.server_procs) as urls:
            out = subprocess.run(cmd, input=json.dumps(urls), capture_output=True, text=True)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    if out.returncode != 0:
        print(f"bench_stall: client failed:\n{out.stderr}", file=sys.stderr)
        return 1
    r = json.loads(out.stdout.strip().splitlines()[-1])

    shipped_ms, without_ms = extra_parse_ms()
    extra = max(shipped_ms - without_ms, 0.0) / 1e3 * len(urls)
    steady = slice(len(r["today"]) // 2, None)
    today = sum(r["today"][steady]) / len(r["today"][steady])
    det = sum(r["detector"][steady]) / len(r["detector"][steady])
    ratio = (det + extra) / (today - extra)
    print(
        f"{len(urls)} endpoints, {args.rounds} rounds every {args.interval:g}s (detector clock "
        f"{args.sim_interval:g}s/round, stallSeconds {args.stall_seconds:g}); steady state = last "
        f"{len(r['today'][steady])} rounds"
    )
    print(
        f"  today's round (scrape+parse+tracker) {today * 1e3:8.1f} ms CPU  (of which the detector's "
        f"extra parse {extra * 1e3:.1f} ms: {shipped_ms:.3f} vs {without_ms:.3f} ms/exposition)"
    )
    print(f"  detector observe                     {det * 1e3:8.1f} ms CPU  ({det / len(urls) * 1e6:.1f} us/pod)")
    print(f"  detector cost / today's round        {ratio * 100:8.2f} %   (goal <= 10 %)")
    print(
        f"  verdicts: {r['stalled_flagged']}/{r['stalled_total']} stalled ports flagged, "
        f"{r['false_alarms']} false alarms, {r['errors']} scrape errors"
    )
    # failed scrapes (a loaded machine) are NoMetrics rounds: counted, and they must not cause a false alarm
    ok = ratio <= 0.10 and r["false_alarms"] == 0 and r["stalled_flagged"] == r["stalled_total"]
    print(f"  result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
