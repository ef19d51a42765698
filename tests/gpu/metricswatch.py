"""Poll an engine's /metrics, feed the operator's own stall detector, and keep a compact series (GPU tier).

Used by ``bench/bench_gpu_tp.py --stall`` and ``hack/gpu/multinode.py``. Each poll reads ``/metrics`` (and
``/health``) of one engine, hands the exposition text to ``gdn_operator.watch.stall.StallDetector`` — the
code the operator runs in its scrape loop — and records one sample line:

    {"t": seconds since the watch's reference time, "health": HTTP code, "set": {series: value, ...},
     "verdict": {"stalled": ..., "seconds_without_progress": ..., "running": ..., "waiting": ..., "reason": ...,
                 "rate": ..., "steps": ...}, "also": {"60": false}}

``also`` gives, per further threshold in ``also_seconds`` (a second detector on the same text), whether it
flags. ``set`` holds only the series whose value changed since the previous sample (the first sample holds all of
them), so a series of several minutes stays small. Series kept: every ``vllm:`` sample except histogram
buckets (``_bucket``; their ``_count``/``_sum`` stay: ``vllm:iteration_tokens_total_count`` counts engine
steps), plus ``process_start_time_seconds``. ``replay()`` turns the lines back into exposition text.

Stdlib only (the GPU host has no project venv); the detector comes from the checkout's ``operator/``.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


def series_of(text: str) -> dict[str, float]:
    """The kept samples of an exposition text: ``name{labels}`` -> value."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        key = m.group(1)
        name = key.split("{", 1)[0]
        if name.endswith("_bucket") or not (name.startswith("vllm:") or name == "process_start_time_seconds"):
            continue
        try:
            out[key] = float(m.group(2))
        except ValueError:
            continue
    return out


def replay(lines: list[dict[str, Any]]) -> list[tuple[float, str]]:
    """(t, exposition text) per sample of a recorded series (a sample without metrics gives "")."""
    state: dict[str, float] = {}
    out = []
    for rec in lines:
        if "t" not in rec or "mark" in rec:
            continue  # header, or a marker (load start, ...)
        if rec.get("set") is None:
            out.append((rec["t"], ""))
            continue
        state.update(rec["set"])
        out.append((rec["t"], "".join(f"{k} {v!r}\n" for k, v in state.items())))
    return out


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (OSError, ValueError):
        return 0, ""


@dataclass
class Watch:
    """One engine's /metrics watched every ``interval`` s in a thread until ``stop()``."""

    name: str
    url: str
    stall_seconds: float
    interval: float = 2.0
    t_ref: float = field(default_factory=time.monotonic)
    lines: list[dict[str, Any]] = field(default_factory=list)
    also_seconds: tuple[float, ...] = ()
    first_stalled_t: float | None = None
    also_first_stalled_t: dict[str, float | None] = field(default_factory=dict)
    flagged_samples: int = 0
    max_seconds_without_progress: float = 0.0
    _prev: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    detector: Any = None
    also: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from gdn_operator.watch.stall import StallDetector  # the operator's own detector

        self.detector = StallDetector(self.stall_seconds)
        self.also = {f"{s:g}": StallDetector(s) for s in self.also_seconds}
        self.also_first_stalled_t = {k: None for k in self.also}
        self.lines.append(
            {
                "engine": self.name,
                "interval_s": self.interval,
                "stall_seconds": self.stall_seconds,
                "also_stall_seconds": list(self.also),
                "wall_clock_at_t0": time.time() - (time.monotonic() - self.t_ref),
            }
        )

    def mark(self, label: str) -> float:
        t = round(time.monotonic() - self.t_ref, 2)
        self.lines.append({"mark": label, "t": t})
        return t

    def poll_once(self) -> dict[str, Any]:
        now = time.monotonic()
        health, _ = _get(self.url + "/health", timeout=3.0)
        code, text = _get(self.url + "/metrics", timeout=5.0)
        rec: dict[str, Any] = {"t": round(now - self.t_ref, 2), "health": health}
        if code != 200:
            rec["set"] = None
            rec["metrics_http"] = code
        else:
            cur = series_of(text)
            rec["set"] = {k: v for k, v in cur.items() if self._prev.get(k) != v}
            self._prev = cur
            v = self.detector.observe_text(now, text)
            rec["verdict"] = {
                "stalled": bool(v.stalled),
                "seconds_without_progress": round(float(v.seconds_without_progress or 0.0), 1),
                "running": v.running,
                "waiting": v.waiting,
                "reason": v.reason,
                "rate": getattr(v, "rate", None),
                "steps": getattr(v, "steps", None),
            }
            if self.also:
                rec["also"] = {k: bool(d.observe_text(now, text).stalled) for k, d in self.also.items()}
                for k, flagged in rec["also"].items():
                    if flagged and self.also_first_stalled_t[k] is None:
                        self.also_first_stalled_t[k] = rec["t"]
            self.max_seconds_without_progress = max(self.max_seconds_without_progress, rec["verdict"]["seconds_without_progress"])
            if v.stalled:
                self.flagged_samples += 1
                if self.first_stalled_t is None:
                    self.first_stalled_t = rec["t"]
        self.lines.append(rec)
        return rec

    def _loop(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - a broken poll is recorded, the watch goes on
                self.lines.append(
                    {"t": round(time.monotonic() - self.t_ref, 2), "set": None, "error": f"{type(e).__name__}: {e}"[:300]}
                )
            nxt += self.interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._loop, name=f"watch-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(15)

    def last_verdict(self) -> dict[str, Any] | None:
        for rec in reversed(self.lines):
            if rec.get("verdict"):
                return rec["verdict"]
        return None

    def health_codes(self, since: float = float("-inf")) -> dict[str, int]:
        out: dict[str, int] = {}
        for rec in self.lines:
            if "health" in rec and rec["t"] >= since:
                out[str(rec["health"])] = out.get(str(rec["health"]), 0) + 1
        return out

    def write(self, path) -> None:
        with open(path, "w") as f:
            for rec in self.lines:
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")

    def summary(self) -> dict[str, Any]:
        return {
            "samples": sum(1 for r in self.lines if "t" in r and "mark" not in r),
            "flagged_samples": self.flagged_samples,
            "first_stalled_t": self.first_stalled_t,
            "also_first_stalled_t": dict(self.also_first_stalled_t),
            "max_seconds_without_progress": self.max_seconds_without_progress,
            "last_verdict": self.last_verdict(),
        }
