#!/usr/bin/env python3
"""Benchmark: crash-signature classifier throughput (lines/s on one core).

Log: the real vLLM 0.32.0 startup log, then steady-state serving lines in the same formats
(tests/fixtures/logs/gdn_log_noise.py), with every crash section of tests/fixtures/logs inserted at
random places (so tracebacks, ERROR lines and engine deaths are mixed in). Goal: > 1 M lines/s per core.

Baselines measured in the same run: a bare `for line in lines: pass` loop, and one precompiled regex
searched on every line (the cost of the most naive single-signature matcher).

    .venv/bin/python bench/bench_classifier.py [--mb 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "logs"))

import gdn_log_noise  # noqa: E402
from gdn_operator.watch.logstream import StreamClassifier  # noqa: E402
from gdn_operator.watch.signatures import LogClassifier, classify_text, default_catalogue  # noqa: E402

GOAL = 1_000_000


def build_log(mb: float, seed: int = 0) -> str:
    rnd = random.Random(seed)
    noise = gdn_log_noise.noise_text(int(mb * (1 << 20)), seed=seed).split("\n")
    tails = sorted((ROOT / "tests" / "fixtures" / "logs").glob("*.tail.log"))
    for p in tails:
        at = rnd.randint(len(noise) // 10, len(noise) - 1)
        noise[at:at] = p.read_text(encoding="utf-8").rstrip("\n").split("\n")
    return "\n".join(noise) + "\n"


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=20.0, help="log size in MiB (default 20)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    text = build_log(a.mb)
    data = text.encode()
    lines = text[:-1].split("\n")
    n = len(lines)
    default_catalogue()  # load + compile outside the timings
    one_rx = re.compile(r"AssertionError: num_decodes: \d+, num_spec_decodes: \d+")

    def loop() -> None:
        for _line in lines:
            pass

    def one_regex() -> None:
        s = one_rx.search
        for line in lines:
            s(line)

    def one_shot() -> None:
        classify_text(text)

    def streamed() -> None:
        sc = StreamClassifier()
        for i in range(0, len(data), 1 << 16):
            sc.feed(data[i : i + (1 << 16)])
        sc.close()
        sc.result()

    def per_line() -> None:
        c = LogClassifier()
        for line in lines:
            c.feed_line(line)
        c.result()

    r = classify_text(text)
    print(
        f"log: {len(data) / 2**20:.1f} MiB, {n:,} lines (avg {len(data) / n:.0f} B/line), "
        f"python {sys.version.split()[0]}, one core"
    )
    print(f"winning signature on the mixed log: {r.signature} (also: {', '.join(r.other_signatures)})")
    print(
        f"prefilter: {len(default_catalogue().scan_regex.pattern.split('|'))} keyword pieces, "
        f"{len(default_catalogue().signatures)} signatures"
    )
    print()
    rows = [
        ("baseline: for line in lines: pass", loop),
        ("baseline: one precompiled regex .search per line", one_regex),
        ("classify_text(whole log)", one_shot),
        ("StreamClassifier.feed(64 KiB byte chunks) incl. UTF-8 decode", streamed),
        ("LogClassifier.feed_line(line) per line", per_line),
    ]
    print(f"{'what':64s} {'seconds':>8s} {'lines/s':>14s} {'MiB/s':>8s}")
    results = {}
    for name, fn in rows:
        t = best(fn, a.repeat)
        results[name] = n / t
        print(f"{name:64s} {t:8.3f} {n / t:14,.0f} {len(data) / 2**20 / t:8.1f}")
    print()
    worst = min(results[k] for k in list(results)[2:])
    verdict = "PASS" if worst > GOAL else "FAIL"
    print(f"goal > {GOAL:,} lines/s per core: slowest classifier path {worst:,.0f} lines/s -> {verdict}")
    return 0 if worst > GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
