"""The real vLLM GPU engine for the GPU tier (tests/gpu, bench/bench_gpu_mtp.py).

Engines run from the offline bundle (hack/gpu/README.md): the host's python3 with
``PYTHONPATH=<bundle site>:<checkout>/operator``.  Their argv is what ``gdnctl render`` produces for
``examples/qwen3.5-27b-mtp.yaml`` adapted to the trained tiny model (``adapted_manifest``); the only
edits to the rendered argv are the listen address and port (``launch_argv``).

Env: GDN_GPU_MODEL (model directory, default tests/models/tiny-qwen3-next-recall),
GDN_GPU_STARTUP_TIMEOUT (seconds per engine start, default 420), GDN_GPU_PYTHON (default python3).

Stdlib only: the GPU host has no project venv.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# stdlib-only helpers shared with the CPU tiers: the held-out set loader and the free-port finder
for _d in (REPO / "tests" / "models", REPO / "tests" / "cluster"):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
from controlplane import free_port  # noqa: E402
from recall import load_heldout  # noqa: E402

OPERATOR_SRC = REPO / "operator"
EXAMPLE = REPO / "examples" / "qwen3.5-27b-mtp.yaml"
#: the bundle's release (GDN_GPU_VLLM_VERSION; the GPU tier's first captures are 0.22.0)
VLLM_VERSION = os.environ.get("GDN_GPU_VLLM_VERSION", "0.22.0")
SERVED_NAME = "tiny-recall"
PYTHON = os.environ.get("GDN_GPU_PYTHON", "python3")
# `vllm serve` without the console script (the bundle has none): what the `vllm` entry point runs.
SERVE = ["-m", "vllm.entrypoints.cli.main", "serve"]


# The GPU tier's engine configurations (tests/gpu/conftest.py documents them); all rendered by gdnctl.
CONFIGS = {
    "rendered": dict(mtp=True, async_scheduling=None),
    "mtp-async": dict(mtp=True, async_scheduling=True),
    "nomtp-async": dict(mtp=False, async_scheduling=True),
    "nomtp-sync": dict(mtp=False, async_scheduling=False),
}
GUARDED = "rendered"  # the configuration that runs with the gdn-guard plugin


def model_dir() -> Path:
    return Path(os.environ.get("GDN_GPU_MODEL", REPO / "tests" / "models" / "tiny-qwen3-next-recall")).resolve()


def heldout(limit: int | None = None) -> list[dict]:
    items = load_heldout(model_dir())
    return items[:limit] if limit else items


def adapted_manifest(
    *,
    mtp: bool = True,
    async_scheduling: bool | None = None,
    eager: bool = True,
    policy: str = "mitigate",
    gpu_memory_utilization: float = 0.15,
    kv_cache_memory: str | None = "4G",
    extra_args: list[str] | None = None,
    tensor_parallel_size: int = 1,
) -> dict:
    """examples/qwen3.5-27b-mtp.yaml adapted to the tiny model on one GPU with the offline bundle.

    Adaptations (each needed by the host, not by the operator): local model, vLLM 0.22.0, TP 1 (or
    ``tensor_parallel_size``: the tiny model's 4 attention / 2 KV / 2+4 GDN heads and 4 experts split over 2),
    short context, a GPU share small enough for several engines at once with a fixed KV-cache size
    (``--kv-cache-memory-bytes`` via extraArgs: vLLM then skips the profiling-based sizing, which
    miscounts when other engines allocate on the same GPU meanwhile), and — the bundle has no
    FlashInfer (hack/gpu/bundle.yaml) — the Triton GDN prefill backend plus
    VLLM_USE_FLASHINFER_SAMPLER=0 (../shared/docs/vllm-gpu-engine.md).
    """
    import yaml  # the host has PyYAML

    m = yaml.safe_load(EXAMPLE.read_text())
    m["metadata"]["name"] = "tiny-recall"
    s = m["spec"]
    s["model"] = {"uri": f"file://{model_dir()}", "servedName": SERVED_NAME, "architecture": "Qwen3NextForCausalLM"}
    s["image"]["tag"] = f"v{VLLM_VERSION}"  # stock vllm/vllm-openai: gdn-guard patches nothing on it
    s["image"]["vllmVersion"] = VLLM_VERSION
    s["tensorParallelSize"] = tensor_parallel_size
    s["maxModelLen"] = 2048
    s["gpuMemoryUtilization"] = gpu_memory_utilization
    s["gdnPrefillBackend"] = "triton"
    s["env"] = [{"name": "VLLM_USE_FLASHINFER_SAMPLER", "value": "0"}]
    s["speculativeDecoding"]["enabled"] = mtp
    if async_scheduling is not None:
        s["asyncScheduling"] = async_scheduling
    s["enforceEager"] = eager
    s["admissionPolicy"] = policy
    extra = (["--kv-cache-memory-bytes", kv_cache_memory] if kv_cache_memory else []) + list(extra_args or [])
    if extra:
        s["extraArgs"] = extra
    return m


@dataclass
class Rendered:
    argv: list[str]  # after `vllm serve`
    env: dict[str, str]
    notes: list[str]  # gdnctl's findings (stderr lines)


def render_objects(manifest: dict) -> tuple[list[dict], list[str]]:
    """Run `gdnctl render` (the operator's own CLI) on the manifest: the rendered objects and its stderr lines."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(OPERATOR_SRC), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [PYTHON, "-m", "gdn_operator.cli", "render", "-f", "-", "--output", "json"],
        input=json.dumps(manifest),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if p.returncode != 0:
        raise RuntimeError(f"gdnctl render exited {p.returncode}:\n{p.stderr}")
    return json.loads(p.stdout)["items"], p.stderr.splitlines()


def render(manifest: dict) -> Rendered:
    """The engine container of the manifest's rendered Deployment."""
    items, notes = render_objects(manifest)
    dep = next(o for o in items if o["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    if c["command"] != ["vllm", "serve"]:
        raise RuntimeError(f"rendered command is {c['command']}, expected ['vllm', 'serve']")
    renv = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return Rendered(list(c["args"]), renv, notes)


def flip(rendered: Rendered, old: str, new: str) -> Rendered:
    """The rendered launch line with exactly one flag replaced (for configurations the operator does not
    render, e.g. MTP + async scheduling at 0.22.0, which vllm#45100 makes it refuse)."""
    if rendered.argv.count(old) != 1:
        raise ValueError(f"{old} occurs {rendered.argv.count(old)} times in the rendered argv, expected once")
    return Rendered(
        [new if a == old else a for a in rendered.argv],
        dict(rendered.env),
        rendered.notes + [f"# flipped {old} -> {new} after rendering"],
    )


def config_rendered(mtp: bool, async_scheduling: bool | None, **kw) -> Rendered:
    """A test/bench configuration: rendered by gdnctl, policy mitigate.  async_scheduling=True with MTP is
    the rendered line with --no-async-scheduling flipped (the operator never renders it at 0.22.0)."""
    if mtp and async_scheduling:
        return flip(render(adapted_manifest(mtp=True, **kw)), "--no-async-scheduling", "--async-scheduling")
    return render(adapted_manifest(mtp=mtp, async_scheduling=async_scheduling, **kw))


def launch_argv(argv: list[str], port: int) -> list[str]:
    """The rendered argv with the listen address/port for this host (the pod's 0.0.0.0:8000)."""
    out = list(argv)
    for flag, value in (("--host", "127.0.0.1"), ("--port", str(port))):
        i = out.index(flag)
        out[i + 1] = value
    return out


@dataclass
class Engine:
    name: str
    argv: list[str]
    port: int
    log: Path
    proc: subprocess.Popen
    started: float
    ready_s: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def start(
    name: str,
    rendered: Rendered,
    logdir: Path,
    *,
    site_path: str | None = None,
    extra_pythonpath: list[str] = (),
    extra_env: dict | None = None,
    listen: bool = True,
    wrap: list[str] = (),
) -> Engine:
    """Start `vllm serve` (as `python3 -m vllm.entrypoints.cli.main serve`, what the console script runs).
    listen=False (a headless multi-node worker: no API server) keeps the rendered --host/--port as they are.
    wrap: a command prefix that execs the rest (multinode.py puts a "node" in its own IPC namespace)."""
    port = free_port() if listen else 0
    argv = launch_argv(rendered.argv, port) if listen else list(rendered.argv)
    logdir.mkdir(parents=True, exist_ok=True)
    log = logdir / f"serve-{name}.log"
    pp = [*extra_pythonpath, *(x for x in (site_path or os.environ.get("PYTHONPATH", "")).split(os.pathsep) if x)]
    env = dict(os.environ, **rendered.env, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(pp), **(extra_env or {}))
    env["HF_HOME"] = str(logdir / "hf-home")  # the pod's /cache volume does not exist on the host
    with open(log, "wb") as f:
        f.write(("# " + " ".join(["vllm", "serve", *argv]) + "\n").encode())
        f.flush()
        proc = subprocess.Popen(
            [*wrap, PYTHON, *SERVE, *argv], env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Engine(name, argv, port, log, proc, time.monotonic())


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def wait_ready(eng: Engine, timeout: float | None = None) -> float:
    """Seconds from start until /health is 200 and the model is listed; raises with the log tail if the
    engine exits or the timeout passes."""
    timeout = timeout or float(os.environ.get("GDN_GPU_STARTUP_TIMEOUT", "420"))
    while True:
        if eng.proc.poll() is not None:
            raise RuntimeError(
                f"engine {eng.name} exited {eng.proc.returncode} during start-up; log tail:\n"
                + "\n".join(eng.log_text().splitlines()[-40:])
            )
        if _get(eng.url + "/health")[0] == 200:
            code, body = _get(eng.url + "/v1/models")
            if code == 200 and SERVED_NAME in body:
                eng.ready_s = time.monotonic() - eng.started
                return eng.ready_s
        if time.monotonic() - eng.started > timeout:
            raise RuntimeError(
                f"engine {eng.name} not ready after {timeout:.0f}s; log tail:\n" + "\n".join(eng.log_text().splitlines()[-40:])
            )
        time.sleep(1.0)


def ready(engines: dict, name: str) -> Engine:
    """The started engine `name`, waiting for it to be Ready on first use."""
    eng = engines[name]
    if eng.ready_s is None:
        wait_ready(eng)
    return eng


def stop(eng: Engine, grace: float = 20.0) -> None:
    if eng.proc.poll() is None:
        try:
            os.killpg(eng.proc.pid, signal.SIGTERM)
            eng.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(eng.proc.pid, signal.SIGKILL)
            eng.proc.wait(10)
        except ProcessLookupError:
            pass


def metrics(eng: Engine) -> str:
    code, body = _get(eng.url + "/metrics", timeout=10)
    if code != 200:
        raise RuntimeError(f"GET {eng.url}/metrics: HTTP {code}")
    return body


def complete(
    eng: Engine, prompt_token_ids: list[int], max_tokens: int, *, ignore_eos: bool = False, timeout: float = 120.0
) -> dict:
    """Greedy completion of a token-id prompt. Returns {"text", "token_ids", "finish_reason", "completion_tokens"}."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt_token_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": ignore_eos,
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        eng.url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    ch = out["choices"][0]
    return {
        "text": ch["text"],
        "token_ids": ch.get("token_ids"),
        "finish_reason": ch.get("finish_reason"),
        "completion_tokens": out.get("usage", {}).get("completion_tokens"),
    }


def stream_chunks(port: int, body: dict, timeout: float, t0: float | None = None) -> Iterator[dict]:
    """POST a streamed /v1/completions (``body`` has ``"stream": True``) and yield each server-sent chunk, parsed; the
    whole request is capped at ``timeout`` seconds from ``t0`` (default: now). Raises OSError (socket, HTTP status),
    TimeoutError (the cap) or ValueError (bad JSON); the connection is closed whatever happens."""
    t0 = time.monotonic() if t0 is None else t0
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise OSError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"request capped at {timeout:.0f} s")
            yield json.loads(line[5:])
    finally:
        conn.close()


def eos_ids() -> set[int]:
    cfg = json.loads((model_dir() / "generation_config.json").read_text())
    eos = cfg.get("eos_token_id")
    return set(eos if isinstance(eos, list) else [eos])


def judge(item: dict, got: dict, eos: set[int] | frozenset = frozenset()) -> str:
    """ "exact" (the expected tokens, then EOS), "short" (a strict prefix of them, then a stop: early EOS),
    "wrong", or "error" (the request failed).  Compares token ids (a trailing EOS id removed) when the
    engine returns them, else text."""
    if "error" in got:
        return "error"
    if got.get("token_ids") is not None and "expected_token_ids" in item:
        out = list(got["token_ids"])
        if out and out[-1] in eos:
            out = out[:-1]
        exp = list(item["expected_token_ids"])
    else:
        out, exp = got["text"], item["expected"]
    if got["finish_reason"] != "stop":
        return "wrong"
    if out == exp:
        return "exact"
    if len(out) < len(exp) and exp[: len(out)] == out:
        return "short"
    return "wrong"


def run_requests(
    eng: Engine, items: list[dict], concurrency: int, *, keep_errors: bool = False, **kw
) -> tuple[list[dict], float]:
    """Send the items with `concurrency` in flight; returns (results in item order, wall seconds).
    A failed request raises, or with keep_errors=True becomes {"error": ..., "completion_tokens": 0}."""

    def one(it: dict) -> dict:
        try:
            return complete(eng, it["prompt_token_ids"], it["max_tokens"], **kw)
        except (OSError, ValueError, KeyError) as e:  # URLError/HTTPError/ConnectionError are OSErrors
            if not keep_errors:
                raise
            return {
                "error": f"{type(e).__name__}: {e}",
                "text": "",
                "token_ids": None,
                "finish_reason": None,
                "completion_tokens": 0,
            }

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(one, items))
    return res, time.monotonic() - t0


def install_guard_layout(dest: Path) -> Path:
    """images/gdn-guard as pip would install it into ``dest`` (for ``PYTHONPATH``): the package plus a dist-info
    whose entry points come from its pyproject.toml, so vLLM's ``vllm.general_plugins`` loader finds it in every
    process (API server, EngineCore, each TP worker) without building a wheel on a host that cannot."""
    import shutil
    import tomllib

    src = REPO / "images" / "gdn-guard"
    proj = tomllib.loads((src / "pyproject.toml").read_text())["project"]
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src / "src" / "gdn_guard", dest / "gdn_guard", ignore=shutil.ignore_patterns("__pycache__"))
    info = dest / f"gdn_guard-{proj['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {proj['name']}\nVersion: {proj['version']}\n")
    eps = "".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        for group, entries in proj["entry-points"].items()
    )
    (info / "entry_points.txt").write_text(eps)
    return dest


if __name__ == "__main__":  # pragma: no cover - manual smoke: print the rendered argv
    print(json.dumps(render(adapted_manifest()).__dict__, indent=1))
    sys.exit(0)
