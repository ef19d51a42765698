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
  prodmodel-train  tests/models/train_recall.py --preset prod on GPU 0: the production-geometry oracle model
             (issue 25 item 1) trained inside the deadline into $GDN_PROD_MODEL (default
             ~/.cache/gdn-operator/prod-model), weights' sha256 and the offline held-out figures in training.json
  prodmodel-serve  bench/bench_gpu_mtp_graphs.py on that model: MTP k=2 as rendered (GPU 0) vs MTP off with
             vLLM's defaults (GPU 1), CUDA graphs, then MTP k=2 with FULL graphs (GPU 1) if time remains
             (issue 25 item 3)
  graphs-tiny  bench/bench_gpu_tp.py --tp 1 on the tiny model at $GDN_GPU_VLLM_VERSION: MTP with vLLM's default
             FULL_AND_PIECEWISE graphs, with PIECEWISE, and MTP off, 60 s of mixed load each: does G1 (silent early
             EOS with MTP + FULL graphs, the tiny model's two attention KV-cache groups) hold at that release?
  release-serve  bench/bench_gpu_release.py on that model at $GDN_GPU_VLLM_VERSION: MTP as rendered, MTP off,
             MTP with vLLM's defaults, each default alone, k=1/3; repeated cells, TTFT/ITL, the shared-prefix
             workload (issues 32, 34)
  shortprompt  bench/probe_gpu_short_prompts.py on the tiny model at $GDN_GPU_VLLM_VERSION: prompts and final prefill
             chunks of exactly 1 + k tokens with MTP k = 1/2/3 against MTP off (issue 47 item 3: PR #32716's
             descendants)
  stepcost  bench/bench_gpu_stepcost.py on ONE GPU at $GDN_GPU_VLLM_VERSION: real Qwen3.5 geometry
             (tests/fixtures/models-geometry) with dummy weights, MTP off / k=1,2,3 as rendered and k=2 with vLLM's
             defaults, decode step cost at concurrency 1-64, the long-prompt mix, shared-prefix prefill; then every
             example started at real geometry (capacity read, no load) — one engine at a time (issue 50)
  g1-guard  bench/bench_gpu_g1_guard.py on the tiny model: FULL_AND_PIECEWISE + MTP without and with the gdn-guard
             plugin, and PIECEWISE, exact answers at concurrency 8 and 32 and tokens/s (issue 33); ``-- --tp 2``

``--dry-run`` (prodmodel-*, release-serve, shortprompt, stepcost): no GPU — the trainer on CPU with a tiny batch and the serve driver with stand-in
engines (tests/gpu/standin_engine.py), to prove arguments, deadlines and the files in $OUT.

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
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("GDN_GPU_SITE", Path.home() / ".cache" / "gdn-operator" / "gpu-site" / "vllm-0.22.0"))
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MAX_FILES = 8
PROD_MODEL = Path(os.environ.get("GDN_PROD_MODEL", Path.home() / ".cache" / "gdn-operator" / "prod-model"))
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
        s = s[: limit // 3] + "\n# [session: middle cut]\n" + s[-(2 * limit) // 3 :]
    return s


def _py(script: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / script), *args]


def step_cmd(step: str, work: Path, until: float, extra: list[str], dry_run: bool = False) -> tuple[list[str], dict[str, str]]:
    """The step's command and which of its outputs go to $OUT (source path under work, or absolute -> name in $OUT)."""
    u = f"{until - 10:.0f}"
    if step == "prodmodel-train":
        dev = (
            ["--device", "cpu", "--threads", "2", "--batch", "2", "--n-max", "16", "--eval-limit", "8", "--eval-every", "0"]
            if dry_run
            else ["--device", "cuda", "--threads", "8", "--eval-every", "250"]
        )
        cmd = _py("tests/models/train_recall.py", "--preset", "prod", "--out", str(PROD_MODEL), "--until", u, *dev, *extra)
        keep = {str(PROD_MODEL / "training.json"): "training.json"}
    elif step == "prodmodel-serve":
        cmd = _py(
            "bench/bench_gpu_mtp_graphs.py",
            "--out",
            str(work),
            "--until",
            u,
            "--model",
            str(PROD_MODEL),
            *(["--dry-run"] if dry_run else []),
            *extra,
        )
        keep = {
            "mtp-graphs.json": "mtp-graphs.json",
            "logs/serve-mtp.log": "serve-mtp.log",
            "logs/serve-nomtp.log": "serve-nomtp.log",
            "logs/serve-mtp-full.log": "serve-mtp-full.log",
        }
    elif step == "release-serve":
        cmd = _py(
            "bench/bench_gpu_release.py",
            "--out",
            str(work),
            "--until",
            u,
            "--model",
            str(PROD_MODEL),
            "--vllm-version",
            os.environ.get("GDN_GPU_VLLM_VERSION", "0.22.0"),
            *(["--dry-run"] if dry_run else []),
            *extra,
        )
        keep = {
            "release.json": "release.json",
            **{f"logs/serve-{n}.log": f"serve-{n}.log" for n in ("a", "f", "p", "q", "r", "p3")},
        }
    elif step == "stepcost":
        cmd = _py(
            "bench/bench_gpu_stepcost.py",
            "--out",
            str(work),
            "--until",
            u,
            "--vllm-version",
            os.environ.get("GDN_GPU_VLLM_VERSION", "0.22.0"),
            *(["--dry-run"] if dry_run else []),
            *extra,
        )
        keep = {"stepcost.json": "stepcost.json", "stepcost-engines.log": "stepcost-engines.log"}
    elif step == "graphs-tiny":
        budget = max(60.0, until - 10 - time.time())
        cmd = _py(
            "bench/bench_gpu_tp.py",
            "--tp",
            "1",
            "--configs",
            "base-cudagraph,base-cg-piecewise,nomtp-cudagraph",
            "--duration",
            "60",
            "--parallel",
            "3",
            "--time-budget",
            f"{budget:.0f}",
            "--out",
            str(work),
            *extra,
        )
        keep = {"bench-gpu-tp.json": "graphs-tiny.json"}
    elif step == "shortprompt":
        cmd = _py(
            "bench/probe_gpu_short_prompts.py", "--out", str(work), "--until", u, *(["--dry-run"] if dry_run else []), *extra
        )
        keep = {"short-prompts.json": "short-prompts.json", "logs/serve-k2.log": "short-serve-k2.log"}
    elif step == "g1-guard":
        cmd = _py("bench/bench_gpu_g1_guard.py", "--out", str(work), "--until", u, "--variants", "base,guard,piecewise", *extra)
        keep = {"g1-guard.json": "g1-guard.json", "logs/serve-guard.log": "g1-serve-guard.log"}
    elif step == "stall":
        cmd = _py("bench/bench_gpu_stall.py", "--out", str(work), "--until", u, *extra)
        keep = {
            "stall.json": "stall.json",
            "stall-base-cudagraph.metrics.jsonl": "stall-full.metrics.jsonl",
            "stall-base-cg-piecewise.metrics.jsonl": "stall-piecewise.metrics.jsonl",
            "tp-logs/serve-base-cudagraph.log": "stall-full.log",
            "tp-logs/serve-base-cg-piecewise.log": "stall-piecewise.log",
        }
    elif step == "multinode":
        cmd = _py("hack/gpu/multinode.py", "--out", str(work), "--until", u, *extra)
        keep = {
            n: n for n in ("multinode.json", "multinode-leader.log", "multinode-worker.log", "multinode-leader.metrics.jsonl")
        }
    elif step == "check":
        cmd = [
            sys.executable,
            "-c",
            "import runpy, sys; sys.argv=['multinode.py', '--dry-run']; "
            f"runpy.run_path({str(REPO / 'hack/gpu/multinode.py')!r}, run_name='__main__')",
        ]
        keep = {}
    else:
        raise SystemExit(
            f"session: unknown step {step!r} (stall, multinode, check, prodmodel-train, prodmodel-serve, release-serve, graphs-tiny, g1-guard, shortprompt, stepcost)"
        )
    return cmd, keep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step")
    ap.add_argument("--until", type=float, default=None, help="hard deadline, epoch seconds")
    ap.add_argument("--budget", type=float, default=560.0, help="seconds from now when --until is not given")
    ap.add_argument("--dry-run", action="store_true", help="prodmodel-*: no GPU (CPU trainer, stand-in engines)")
    # everything after a bare "--" goes to the step's script; the session's own options may come before or after
    # the step name (argparse's REMAINDER would swallow options written after it, --until included)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    a = ap.parse_args(own)
    until = a.until or time.time() + a.budget
    out = Path(os.environ.get("OUT") or REPO / ".gpu-artifacts" / "session")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("GDN_SESSION_WORK", Path(tempfile.gettempdir()) / f"gdn-session-{a.step}"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if a.step == "prodmodel-train":  # never report a stale result as this run's
        (PROD_MODEL / "training.json").unlink(missing_ok=True)
    if (
        a.step in ("stall", "multinode", "prodmodel-serve", "release-serve", "graphs-tiny", "g1-guard", "shortprompt", "stepcost")
        and not a.dry_run
        and not (SITE / "vllm").is_dir()
    ):
        print(f"session: {SITE} has no vllm; install the bundle first (hack/gpu/install.sh STAGE {SITE})", file=sys.stderr)
        return 2
    cmd, keep = step_cmd(a.step, work, until, extra, a.dry_run)
    env = dict(
        os.environ,
        **NO_MULTICAST,
        **({"CUDA_VISIBLE_DEVICES": "0"} if a.step == "prodmodel-train" else {}),
        PYTHONUNBUFFERED="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONPATH=os.pathsep.join(
            x for x in [str(SITE) if SITE.is_dir() else "", str(REPO / "operator"), os.environ.get("PYTHONPATH", "")] if x
        ),
    )
    left = until - time.time()
    print(f"session {a.step}: {left:.0f} s to the deadline; {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    stdout = out / f"{a.step}-stdout.log"
    with open(stdout, "wb") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        assert p.stdout is not None
        # SIGTERM (lease.sh stops a step early when a later step's bundle has arrived): pass it on to the step, which
        # stops its engines (each in a process group of its own) and keeps what it wrote; the deadline backstop below
        # still applies
        signal.signal(signal.SIGTERM, lambda *_: os.killpg(p.pid, signal.SIGTERM))
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
    print(
        f"session {a.step}: rc={rc} in {time.monotonic() - t0:.0f} s; in {out}: "
        + " ".join(f"{n} ({(out / n).stat().st_size // 1024} KiB)" for n in [stdout.name, *kept])
    )
    return rc if rc is not None else 124


if __name__ == "__main__":
    sys.exit(main())
