"""Shared by the benchmark scripts (run as `python bench/<name>.py`, so this directory is on sys.path)."""

from __future__ import annotations

import os
from pathlib import Path


def pct(xs: list[float], p: float) -> float:
    """The p-th percentile (nearest rank on the sorted sample); NaN for an empty sample."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))]


def machine() -> str:
    """CPUs and load average (the machine may be shared: the tails reflect other processes)."""
    try:
        load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    except OSError:  # pragma: no cover
        load = "load average n/a"
    return f"machine: {os.cpu_count() or 0} CPUs, {load}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (its own threads; children not included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib(pid: int) -> dict[str, float]:
    """A process's resident memory now (VmRSS) and its peak (VmHWM), MiB."""
    out = {}
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = ln.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0]) / 1024
    return out


def child_pids(pid: int) -> list[int]:
    """The live children of a process (e.g. the operator's webhook front), from /proc."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out
