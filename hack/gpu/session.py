#!/usr/bin/env python3
"""One GPU-session step inside a hard deadline, results (<= 8 flat files) in $OUT. Run through hack/gpu/session.sh.

    hack/gpu/session.sh STEP [--until EPOCH] [--budget SECONDS] [-- step args]

Steps (each assumes the offline bundle installed at ~/.cache/gdn-operator/gpu-site/vllm-0.22.0, or
$GDN_GPU_SITE; two GPUs of one host for stall and multinode):

  stall      bench/bench_gpu_stall.py: TP=2, MTP k=2, FULL_AND_PIECEWISE and PIECEWISE engines side by side
             under the mixed load, the operator's stall detector fed from /metrics (issue 24 item 5)
  multinode  hack/gpu/multinode.py: the LeaderWorkerSet leader + worker argv as two processes, one GPU
             each; recall, acceptance, stall detector, worker killed, logs classified (issue 25 item 5)
  check      no GPU: render both multi-node launch lines and import every step's code (a dry run)

Deadline: ``--until`` (epoch seconds) or now + ``--budget`` (default 560). The step gets ``--until`` 10 s
before it and is killed (process group) 5 s after it; then its files are trimmed into $OUT (or
.gpu-artifacts/session when OUT is unset). Every child gets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NVSHMEM_DISABLE_NVLS=1 (no NVLink multicast on these machines).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("GDN_GPU_SITE", Path.home() / ".cache" / "gdn-operator" / "gpu-site" / "vllm-0.22.0"))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MAX_FILES = 8
LOG_LIMIT = 1_500_000  # bytes per engine log kept in $OUT
_ACCESS = re.compile(r'"(?:POST|GET) /(?:v1/completions|health|metrics|v1/models) HTTP/1\.1" \d{3}')


def trim_log(text: str, limit: int = LOG_LIMIT) -> str:
    """Runs of HTTP access lines folded into one count line; past ``limit`` bytes the middle is cut."""
    out: list[str] = []
    run = 0
    for line in text.splitlines():
        if _ACCESS.search(line):
            run += 1
            if run <= 3:
                out.append(line)
            continue
        if run > 3:
            out.append(f"# [session: {run - 3} more access-log lines]")
        run = 0
        out.append(line)
    if run > 3:
        out.append(f"# [session: {run - 3} more access-log lines]")
    s = "\n".join(out) + "\n"
    if len(s) > limit:
        s = s[: limit // 3] + "\n# [session: middle cut]\n" + s[-(2 * limit) // 3:]
    return s


def _py(script: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / script), *args]


def step_cmd(step: str, work: Path, until: float, extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """The step's command and which of its outputs go to $OUT (source path under work -> name in $OUT)."""
    u = f"{until - 10:.0f}"
    if step == "stall":
        cmd = _py("bench/bench_gpu_stall.py", "--out", str(work), "--until", u, *extra)
        keep = {"stall.json": "stall.json",
                "stall-base-cudagraph.metrics.jsonl": "stall-full.metrics.jsonl",
                "stall-base-cg-piecewise.metrics.jsonl": "stall-piecewise.metrics.jsonl",
                "tp-logs/serve-base-cudagraph.log": "stall-full.log",
                "tp-logs/serve-base-cg-piecewise.log": "stall-piecewise.log"}
    elif step == "multinode":
        cmd = _py("hack/gpu/multinode.py", "--out", str(work), "--until", u, *extra)
        keep = {n: n for n in ("multinode.json", "multinode-leader.log", "multinode-worker.log",
                               "multinode-leader.metrics.jsonl")}
    elif step == "check":
        cmd = [sys.executable, "-c", "import runpy, sys; sys.argv=['multinode.py', '--dry-run']; "
               f"runpy.run_path({str(REPO / 'hack/gpu/multinode.py')!r}, run_name='__main__')"]
        keep = {}
    else:
        raise SystemExit(f"session: unknown step {step!r} (stall, multinode, check)")
    return cmd, keep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step")
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds")
    ap.add_argument("--budget", type=float, default=560.0, help="seconds from now when --until is not given")
    ap.add_argument("extra", nargs=argparse.REMAINDER, help="-- then arguments for the step's script")
    a = ap.parse_args(argv)
    until = a.until or time.time() + a.budget
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    out = Path(os.environ.get("OUT") or REPO / ".gpu-artifacts" / "session")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("GDN_SESSION_WORK", f"/tmp/gdn-session-{a.step}"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if a.step in ("stall", "multinode") and not (SITE / "vllm").is_dir():
        print(f"session: {SITE} has no vllm; install the bundle first (hack/gpu/install.sh STAGE {SITE})", file=sys.stderr)
        return 2
    cmd, keep = step_cmd(a.step, work, until, extra)
    env = dict(os.environ, **NO_MULTICAST, PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               PYTHONPATH=os.pathsep.join(x for x in [str(SITE) if SITE.is_dir() else "", str(REPO / "operator"),
                                                      os.environ.get("PYTHONPATH", "")] if x))
    left = until - time.time()
    print(f"session {a.step}: {left:.0f} s to the deadline; {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    stdout = out / f"{a.step}-stdout.log"
    with open(stdout, "wb") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert p.stdout is not None
        try:
            for line in iter(p.stdout.readline, b""):  # the step ends by its own --until; this is the backstop
                f.write(line)
                sys.stdout.buffer.write(line)
                sys.stdout.flush()
                if time.time() > until + 5:
                    break
            p.wait(max(1.0, until + 5 - time.time()))
        except subprocess.TimeoutExpired:
            pass
        if p.poll() is None:
            print(f"session: {a.step} passed its deadline: killing its process group", flush=True)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    rc = p.returncode
    kept = []
    for src, dst in keep.items():
        sp = work / src
        if not sp.exists() or len(kept) >= MAX_FILES - 1:
            continue
        data = sp.read_text(errors="replace")
        (out / dst).write_text(trim_log(data) if dst.endswith(".log") else data)
        kept.append(dst)
    print(f"session {a.step}: rc={rc} in {time.monotonic() - t0:.0f} s; in {out}: "
          + " ".join(f"{n} ({(out / n).stat().st_size // 1024} KiB)" for n in [stdout.name, *kept]))
    return rc if rc is not None else 124


if __name__ == "__main__":
    sys.exit(main())
