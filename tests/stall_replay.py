"""Replayed /metrics series for the stall detector's tests, bench and stand-in engine.

A *series* is a list of points ``{"t": seconds from the series' start, "running", "waiting",
"generation_tokens", "prompt_tokens", "draft_tokens", "steps" (optional), "start" (optional: the
engine's start time, its counters' ``_created``)}``, cumulative counters as vLLM exposes them. The
committed series (tests/fixtures/stall/*.json, README there) were made by :func:`series_from_log`
from the real engine logs in tests/fixtures/vllm-0.22.0-h100x2-tp2/ (vLLM's 10 s stats lines:
throughputs integrated over the lines' own timestamps) or written by hand for the shapes the captures
lack (idle, long prefill, slow decode, restart); ``tests/watch/test_stall.py`` checks the derived ones
still match their logs.

:func:`exposition` renders one point as the real vLLM 0.22.0 exposition captured on an H200
(tests/fixtures/vllm-0.22.0-h200-trained/metrics-rendered.prom) with the progress families' values
replaced, so the operator parses exactly what an engine serves.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from metrics_standin import MetricsServer
from paths import REPO

FIXTURES = REPO / "tests" / "fixtures"
SERIES_DIR = FIXTURES / "stall"
TP2_LOGS = FIXTURES / "vllm-0.22.0-h100x2-tp2"
TEMPLATE = FIXTURES / "vllm-0.22.0-h200-trained" / "metrics-rendered.prom"

_STATS = re.compile(
    r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[loggers\.py:\d+\] Engine \d+: Avg prompt throughput: ([\d.]+) tokens/s, "
    r"Avg generation throughput: ([\d.]+) tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs"
)
_DRAFTED = re.compile(r"INFO (\d\d-\d\d \d\d:\d\d:\d\d) \[metrics\.py:\d+\] SpecDecoding metrics: .*Drafted: (\d+) tokens")
_STARTED = re.compile(r"INFO:\s+Application startup complete")


def _ts(text: str) -> float:
    return dt.datetime.strptime("2025-" + text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()


#: vLLM's stats logger interval (VLLM_LOG_STATS_INTERVAL, default 10 s). Each line's ``Avg ... throughput``
#: is over one such interval even when lines in between were not printed (vLLM skips printing some idle
#: intervals): e.g. the stalled engine's 2.0 tokens/s line after a 70 s silence is one step of 8 requests
#: (8 + the 12 accepted drafts it reports = 20 tokens = 2.0 x 10 s), not 140 tokens.
LOG_INTERVAL = 10.0


def series_from_log(path: Path) -> list[dict[str, Any]]:
    """Cumulative counters from a vLLM serve log's stats lines (throughput x :data:`LOG_INTERVAL` per
    line; ``Drafted: N`` the drafts of that interval). t = 0 at the first line, which adds nothing."""
    points: list[dict[str, Any]] = []
    gen = prompt = drafts = 0.0
    prev_t: float | None = None
    pending_drafts: dict[float, int] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in lines:
        m = _DRAFTED.search(line)
        if m:
            pending_drafts[_ts(m.group(1))] = int(m.group(2))
    for line in lines:
        m = _STATS.search(line)
        if not m:
            continue
        t = _ts(m.group(1))
        p_rate, g_rate, running, waiting = float(m.group(2)), float(m.group(3)), int(m.group(4)), int(m.group(5))
        if prev_t is not None:
            gen += round(g_rate * LOG_INTERVAL)
            prompt += round(p_rate * LOG_INTERVAL)
        drafts += pending_drafts.get(t, 0)
        prev_t = t
        points.append(
            {
                "t": t,
                "running": running,
                "waiting": waiting,
                "generation_tokens": gen,
                "prompt_tokens": prompt,
                "draft_tokens": drafts,
            }
        )
    t0 = points[0]["t"] if points else 0.0
    for p in points:
        p["t"] -= t0
    return points


def load(name: str) -> dict[str, Any]:
    """One committed series file: ``{"source": ..., "points": [...]}``."""
    return json.loads((SERIES_DIR / f"{name}.json").read_text(encoding="utf-8"))


def point_at(points: list[dict[str, Any]], t: float) -> dict[str, Any]:
    """The last point at or before ``t`` (the first before the series starts, the last after it ends)."""
    best = points[0]
    for p in points:
        if p["t"] <= t:
            best = p
        else:
            break
    return best


_FAMILIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:iteration_tokens_total_count": "steps",
}
_SAMPLE = re.compile(r"^(?P<name>[^\s#{]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$", re.M)


def _template_parts() -> list[Any]:
    text = TEMPLATE.read_text(encoding="utf-8")
    parts: list[Any] = []
    pos = 0
    for m in _SAMPLE.finditer(text):
        name = m.group("name")
        key = _FAMILIES.get(name)
        if key is None and name.endswith("_created"):
            key = "start"
        if key is None:
            continue
        parts.append(text[pos : m.start("value")])
        parts.append((key,))
        pos = m.end("value")
    parts.append(text[pos:])
    return parts


_PARTS: list[Any] | None = None


def exposition(point: dict[str, Any], start: float = 1.7954433530e9) -> str:
    """The vLLM 0.22.0 exposition with this point's values (``steps`` defaults to the generation tokens
    divided by 3 — MTP k=2 at full acceptance — when the series does not carry it)."""
    global _PARTS
    if _PARTS is None:
        _PARTS = _template_parts()
    values = dict(point)
    values.setdefault("steps", float(int(values.get("generation_tokens", 0) // 3)))
    values["start"] = values.get("start", start)
    out = []
    for p in _PARTS:
        if isinstance(p, str):
            out.append(p)
        elif p[0] == "start":
            out.append(repr(float(values["start"])))
        else:
            out.append(f"{float(values[p[0]]):.1f}")
    return "".join(out)


class MetricsStandIn:
    """A stand-in vLLM engine for the stall tests: GET /metrics answers the exposition of a replayed series at
    ``offset + speed x (seconds since start or the last switch)`` (past its end: the last counters, idle), bound
    to ``ip:port`` (a kwok pod IP in the cluster tests); GET /health answers 200 throughout, like the stalled
    engines did. ``served_after_end`` counts the scrapes answered past the series' end (positive evidence
    that a whole series was seen)."""

    def __init__(self, ip: str, port: int, name: str, *, offset: float = 0.0, speed: float = 1.0) -> None:
        self.lock = threading.Lock()
        self.switch(name, offset=offset, speed=speed)
        self.http = MetricsServer(ip, port, self.render)

    def switch(self, name: str, *, offset: float = 0.0, speed: float = 1.0) -> None:
        with self.lock:
            self.points = load(name)["points"]
            self.offset, self.speed, self.started = offset, speed, time.monotonic()
            self.served_after_end = 0

    def render(self) -> str:
        with self.lock:
            t = self.offset + self.speed * (time.monotonic() - self.started)
            if t > self.points[-1]["t"]:  # the replay is over: its requests are done, the engine idles
                self.served_after_end += 1
                return exposition(dict(self.points[-1], running=0, waiting=0))
            return exposition(point_at(self.points, t))

    def close(self) -> None:
        self.http.close()


# --- the committed series (run ``python tests/stall_replay.py`` to write tests/fixtures/stall/ again) ------

DERIVED = {
    "stalled-fullgraph-tp2": (
        "stall-rerun-serve-base-cudagraph.log",
        "default CUDA graphs (FULL_AND_PIECEWISE), MTP k=2, TP=2, second machine; the load ends at t=60, then "
        "8, later 7, requests stay running at 0-2 tokens/s (one engine step every ~20 s) until the capture ends",
    ),
    "stalled-fullgraph-tp2-1step-per-min": (
        "compiled-serve-base-cudagraph.log",
        "default CUDA graphs, first machine; the load ends at t=110, then 8 requests stay running with one engine step a minute",
    ),
    "healthy-piecewise-tp2": (
        "stall-rerun-serve-base-cg-piecewise.log",
        "PIECEWISE graphs, the same load beside the stalled engine; drains to 0 running within 30 s of the "
        "load's end; 15 idle points appended after the last stats line (vLLM stops logging stats when idle)",
    ),
}


def _hand_made() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    out: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    out["idle"] = (
        "an engine after traffic, nothing in flight for 300 s: counters frozen, 0 running, 0 waiting",
        [
            {
                "t": 10.0 * i,
                "running": 0,
                "waiting": 0,
                "generation_tokens": 5120.0,
                "prompt_tokens": 20480.0,
                "draft_tokens": 6800.0,
                "steps": 1900.0,
            }
            for i in range(31)
        ],
    )
    pts = []
    gen, prompt, steps, drafts = 1000.0, 4000.0, 400.0, 1200.0
    for i in range(31):
        phase = i % 11  # 0..9: one 262144-token prompt prefilling alone; 10: it completes, decodes 300 tokens
        if phase == 10:
            prompt += 262144
            gen += 300
            steps += 100
            drafts += 200
        pts.append(
            {
                "t": 10.0 * i,
                "running": 1,
                "waiting": 1 if phase < 10 else 0,
                "generation_tokens": gen,
                "prompt_tokens": prompt,
                "draft_tokens": drafts,
                "steps": steps,
            }
        )
    out["long-prefill"] = (
        "lone 262144-token prompts, each prefilling for 100 s with one more waiting (vLLM counts a prompt only when "
        "its prefill completes, so nothing advances meanwhile); shorter than the default stallSeconds 120",
        pts,
    )
    pts = []
    gen = steps = 0.0
    for i in range(31):
        pts.append(
            {
                "t": 10.0 * i,
                "running": 8,
                "waiting": 4,
                "generation_tokens": gen,
                "prompt_tokens": 8192.0,
                "draft_tokens": round(gen * 2 / 1.5),
                "steps": steps,
            }
        )
        gen += 8 * 1.5 * 10
        steps += 10
    out["slow-decode"] = (
        "8 requests decoding at 1.5 tokens/s each (one engine step a second, 4 more waiting), 3x the floor: slow but progressing",
        pts,
    )
    pts = [
        {
            "t": 10.0 * i,
            "running": 8,
            "waiting": 0,
            "generation_tokens": 40000.0,
            "prompt_tokens": 130000.0,
            "draft_tokens": 78000.0,
            "steps": 9000.0,
            "start": 1795443353.0,
        }
        for i in range(10)
    ]
    pts += [
        {
            "t": 10.0 * i,
            "running": 8,
            "waiting": 0,
            "generation_tokens": 24.0,
            "prompt_tokens": 4096.0,
            "draft_tokens": 16.0,
            "steps": 2.0,
            "start": 1795443453.0,
        }
        for i in range(10, 20)
    ]
    out["restarting"] = (
        "frozen with 8 running for 90 s, then the engine restarts between two scrapes (counters reset, new "
        "_created time, 8 requests resubmitted at once) and is frozen again for 90 s: two 90 s spans, never one "
        "of 120 s",
        pts,
    )
    return out


def write_fixtures() -> None:
    def dump(name: str, source: str, note: str, points: list[dict[str, Any]]) -> None:
        body = json.dumps({"source": source, "note": note, "points": points})
        (SERIES_DIR / f"{name}.json").write_text(body.replace("}, {", "},\n {") + "\n", encoding="utf-8")

    for name, (log, note) in DERIVED.items():
        points = series_from_log(TP2_LOGS / log)
        if name == "healthy-piecewise-tp2":
            last = points[-1]
            points += [dict(last, t=last["t"] + 10.0 * i) for i in range(1, 16)]
        dump(name, f"{TP2_LOGS.name}/{log}", note, points)
    for name, (note, points) in _hand_made().items():
        dump(name, "hand-made", note, points)


if __name__ == "__main__":
    write_fixtures()
