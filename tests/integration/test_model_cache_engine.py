"""The model cache's download step and endpoint auth, with real processes (issue 29 parts 2 and 4).

The download step the operator renders (render/podparts.DOWNLOAD_SCRIPT: `hf download` at the pinned
revision with the include patterns, issue 38) runs as a real process with the `hf` CLI of the vLLM CPU
engine's environment (huggingface_hub, as the vLLM image carries it) against a local HTTP server serving the
trained tiny model in the Hub's file layout (tests/hub_server.py): it fills the cache with the files the
default include patterns name (not the model card or the held-out set), marks the download complete, a second
run fetches no file again (idempotent), a dropped connection is resumed with a Range request, and a repository
the Hub does not have fails with hf's reason at the end of the log (the termination message).
Then the Hub server is stopped and the real vLLM CPU engine starts OFFLINE from that cache, with the
environment the operator renders (HF_HUB_OFFLINE=1, VLLM_API_KEY): /health and /metrics answer without the
key, /v1/completions refuses requests without it (401) and answers the held-out prompts with it — through the
operator's own probe client, which sends the key as a Bearer token."""

from __future__ import annotations

import asyncio
import fnmatch
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from engine_fixtures import SERVED_NAME, require_engine_python, start_engine, stop_engine  # noqa: E402
from hub_server import HubServer  # noqa: E402
from recall import MODEL_DIR as MODEL  # noqa: E402
from recall import load_heldout  # noqa: E402

from gdn_operator.api.load import parse_spec  # noqa: E402
from gdn_operator import telemetry  # noqa: E402
from gdn_operator.api.probes import Probe, ProbesSpec  # noqa: E402
from gdn_operator.handlers.engines.probes import ProbeSupervisor, ServerProbes  # noqa: E402
from gdn_operator.render import podparts  # noqa: E402
from gdn_operator.render.engine import engine_env, vllm_args  # noqa: E402
from gdn_operator.watch.probe_client import ProbeClient, completions_url  # noqa: E402
from gdn_operator.watch.probes import ProbeBook  # noqa: E402
from gdn_operator.watch.target import EngineTarget  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

REPO = "gdn-tests/tiny-qwen3-next-recall"
COMMIT = HubServer.commit_of(REPO)
KEY = "sk-gdn-test-7f3a"
BODY = {
    "model": {"uri": f"hf://{REPO}", "revision": COMMIT},
    "image": {"tag": "v0.32.0", "vllmVersion": "0.32.0"},
    "apiKeySecret": {"name": "vllm-key", "key": "key"},
}
SPEC = parse_spec(BODY)


def download(python: Path, hf_home: Path, endpoint: str, spec=SPEC) -> subprocess.CompletedProcess:
    """The rendered init container's command, as a local process (its env: the rendered one, paths local,
    the engine environment's bin/ first on PATH: the image's `hf`)."""
    init = podparts.download_container(spec)
    env = {"PATH": f"{python.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HF_HUB_DISABLE_TELEMETRY": "1"}
    for e in init["env"]:
        env[e["name"]] = e.get("value", "")
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint)  # the pod's /cache/huggingface, the mirror here
    argv = [a.replace(podparts.HF_HOME, str(hf_home)) for a in init["command"]]  # sh -c SCRIPT $0 MARKER REPO ...
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def marker(hf_home: Path, spec=SPEC) -> Path:
    return Path(podparts.ready_marker(spec).replace(podparts.HF_HOME, str(hf_home)))


def file_gets(hub: HubServer) -> list[tuple[str, str, str]]:
    return [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    python = require_engine_python()
    hf_home = tmp_path_factory.mktemp("hf-cache") / "huggingface"
    with HubServer({REPO: MODEL}) as hub:
        first = download(python, hf_home, hub.url)
        assert first.returncode == 0, first.stderr[-2000:]
        assert f"{REPO} is in the cache" in first.stdout and marker(hf_home).is_file()
        fetched = {Path(p).name for _m, p, _r in file_gets(hub)}
        included = {f for f in hub.files(REPO) if any(fnmatch.fnmatch(f, p) for p in SPEC.model.cache.include_patterns)}
        assert fetched == included and {"config.json", "model.safetensors", "tokenizer.json"} <= fetched, fetched
        assert {"MODEL_CARD.md", "heldout.jsonl"} & fetched == set()  # not what vLLM loads: not fetched
        assert all(f"/resolve/{COMMIT}/" in p for _m, p, _r in file_gets(hub))  # the pinned revision

        hub.requests.clear()
        again = download(python, hf_home, hub.url)
        assert again.returncode == 0, again.stderr[-2000:]
        assert file_gets(hub) == []  # idempotent: nothing fetched twice
    return python, hf_home  # the Hub server is gone from here on


def test_the_cache_holds_the_included_files_at_the_pinned_commit(cache):
    _python, hf_home = cache
    snapshots = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert [d.name for d in snapshots.iterdir()] == [COMMIT]
    held = {f.name for f in (snapshots / COMMIT).iterdir()}
    assert held == {f.name for f in MODEL.iterdir() if any(fnmatch.fnmatch(f.name, p) for p in SPEC.model.cache.include_patterns)}
    assert "heldout.jsonl" not in held and "model.safetensors" in held


def test_download_resumes_a_dropped_transfer(tmp_path):
    """huggingface_hub writes in 10 MiB chunks and, when a connection drops mid-file, asks for the rest with a
    Range request; files completed by an earlier (killed) run are not fetched again."""
    python = require_engine_python()
    repo_dir = tmp_path / "repo"
    repo_dir.mkdir()
    for f in MODEL.iterdir():
        if f.is_file():
            (repo_dir / f.name).write_bytes(f.read_bytes())
    big = os.urandom(24 << 20)  # larger than the client's 10 MiB write chunk, as real shards are
    (repo_dir / "model-extra.safetensors").write_bytes(big)
    with HubServer({REPO: repo_dir}) as hub:
        hub.fail_after = 15 << 20  # the transfer of model-extra.safetensors drops after 15 MiB
        run = download(python, tmp_path / "huggingface", hub.url)
        assert run.returncode == 0, run.stderr[-2000:]
        extra = [r for r in file_gets(hub) if r[1].endswith("model-extra.safetensors")]
        assert len(extra) == 2 and extra[0][2] == "" and extra[1][2] == f"bytes={10 << 20}-", extra
    [got] = (tmp_path / "huggingface" / "hub").glob("models--*/snapshots/*/model-extra.safetensors")
    assert got.read_bytes() == big


def test_a_failed_download_exits_non_zero_with_the_reason_last_and_no_marker(tmp_path):
    """What status reports as ModelDownloadFailed: the init container's termination message is the end of
    its log (FallbackToLogsOnError), so the reason must be there, and no worker may start on a half cache."""
    python = require_engine_python()
    missing = parse_spec({**BODY, "model": {"uri": "hf://gdn-tests/absent"}})
    with HubServer({REPO: MODEL}) as hub:
        run = download(python, tmp_path / "huggingface", hub.url, missing)
    assert run.returncode == 1
    tail = (run.stdout + run.stderr)[-2048:]
    assert "download of gdn-tests/absent failed" in tail and ("404" in tail or "not found" in tail.lower()), tail
    assert not marker(tmp_path / "huggingface", missing).exists()


def test_engine_starts_offline_from_the_cache_and_guards_v1_with_the_key(cache, tmp_path):
    python, hf_home = cache
    rendered = {e["name"]: e for e in engine_env(SPEC)}
    assert rendered["HF_HUB_OFFLINE"]["value"] == "1" and rendered["HF_HOME"]["value"] == podparts.HF_HOME
    assert rendered["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "vllm-key", "key": "key"}
    env = {"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "VLLM_API_KEY": KEY, "HF_ENDPOINT": "http://127.0.0.1:9"}
    try:
        # the rendered engine's --revision: offline, vLLM loads the snapshot of that commit
        revision = SPEC.model.revision
        assert [a for a in vllm_args("srv", SPEC) if a in ("--revision", revision)] == ["--revision", revision]
        eng = start_engine(tmp_path, python, startup_timeout=400, extra_args=["--revision", revision], model=REPO, extra_env=env)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        assert eng.get("/health")[0] == 200  # kubelet probes: open
        status, body = eng.get("/metrics")
        assert status == 200 and b"vllm:" in body  # scraping: open
        assert eng.get("/v1/models")[0] == 401  # the API: guarded

        items = load_heldout(MODEL)[:3]
        probes = [
            Probe.model_validate(
                {
                    "name": f"p{i}",
                    "promptTokenIds": it["prompt_token_ids"],
                    "maxTokens": it["max_tokens"],
                    "expectedTokenIds": it["expected_token_ids"],
                }
            )
            for i, it in enumerate(items)
        ]

        async def ask(key):
            async with ProbeClient(4) as client:
                return await client.ask_pod(
                    completions_url("127.0.0.1", eng.port), SERVED_NAME, probes, "pod-0", 120, api_key=key
                )

        refused = asyncio.run(ask(None))
        assert all(a.error == "auth" and a.message.startswith("HTTP 401") for a in refused), refused
        answered = asyncio.run(ask(KEY))
        assert [a.error for a in answered] == [None] * len(items), answered
        for a, it in zip(answered, items):  # greedy answers of the trained model: its held-out continuation
            exp = it["expected_token_ids"][: it["max_tokens"]]
            assert list(a.answer.token_ids)[: len(exp)] == exp, (a, it["id"])

        # issue 38: the supervisor's verdict on this real engine. Without the key (the chart default may not read
        # the Secret): Unknown/ProbeUnauthorized naming the chart value, never OutputConsistent=False; with it: True.
        spec = ProbesSpec.model_validate(
            {
                "failureThreshold": 1,
                "intervalSeconds": 600,
                "timeoutSeconds": 120,
                # the held-out continuation is a prefix of what the engine generates up to maxTokens
                "prompts": [{**p.model_dump(by_alias=True, exclude_unset=True), "mode": "prefix"} for p in probes],
            }
        )
        pods = [{"name": "pod-0", "ip": "127.0.0.1", "ready": True, "engine": "", "deleting": False}]
        written: list[tuple] = []

        def writer(target, s, body, cond):
            written.append((body, cond))
            return None

        async def verdict(key, problem):
            sup = ProbeSupervisor(lambda target: pods, writer=writer, port=eng.port, seed=1)
            s = ServerProbes(spec, 1, model=SERVED_NAME, book=ProbeBook([p.name for p in probes], 1), api_key=key)
            s.api_key_problem = problem
            try:
                return await sup.round(EngineTarget.server("ns", "keyed"), s)
            finally:
                await sup.client.close()

        problem = "spec.apiKeySecret vllm-key/key cannot be read: the operator may not read Secrets here; set the chart value operator.readApiKeySecrets=true"
        c = asyncio.run(verdict(None, problem))
        assert (c.value, c.reason) == (None, "ProbeUnauthorized") and "operator.readApiKeySecrets=true" in c.message
        assert written[-1][0]["state"] == "NoAnswer"
        assert telemetry.PROBE_FAILING.labels("ns", "keyed", "GDNModelServer", "ProbeUnauthorized")._value.get() == 1
        assert telemetry.OUTPUT_INCONSISTENT.labels("ns", "keyed", "GDNModelServer", "ProbeMismatch")._value.get() == 0
        c = asyncio.run(verdict(KEY, ""))
        assert (c.value, c.reason) == (True, "ProbesPassing"), c
    finally:
        stop_engine(eng)
