"""The model cache's download step with the `hf` CLI of the huggingface_hub release a vLLM 0.34.0 image carries
(issue 46): the init container runs `hf download` from the engine image (render/podparts.DOWNLOAD_SCRIPT), so it
meets whatever Hub client that image has, and vLLM 0.34.0 moved it to a new major version.

Which release that is, read on 2026-12-07:
- vLLM 0.34.0 requires ``huggingface_hub>=2.0.0`` (the wheel's METADATA, Requires-Dist; 0.33.0 allowed 1.x);
- PyPI serves 2.0.0 (2026-09-24), 2.1.1 (2026-10-01), 2.2.0, 2.3.0 and 2.4.0 (2026-10-29); 2.1.0 is yanked
  ("renamed CLI command in 2.1.1"), so no resolver picks it;
- the image is built by installing vLLM at its release (2026-11-16), when 2.4.0 was the newest release, and the
  offline GPU bundle for 0.34.0 resolved 2.4.0 as well (hack/gpu). 2.0.0 is the oldest the pin allows (an image
  rebuilt against a constrained index).

Each version's real CLI (installed once, outside the tree, by `hack/tools.sh hf-cli VERSION`) runs the rendered
init container's command with the exact argv the renderer produces (repository, --revision, one --include per
pattern) against the local Hub stand-in (tests/hub_server.py): the included files land at the pinned commit and
the completion marker is written; a second run fetches nothing; an absent repository fails with the reason last.
"""

from __future__ import annotations

import fnmatch
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from hub_server import HubServer  # noqa: E402
from recall import MODEL_DIR as MODEL  # noqa: E402

from gdn_operator.api.load import parse_spec  # noqa: E402
from gdn_operator.render import podparts  # noqa: E402
from gdn_operator.render.objects import render_all  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.tools, pytest.mark.timeout(600)]

#: huggingface_hub releases a vLLM 0.34.0 image can carry (see the module docstring): the one it gets, the floor
IMAGE_HUB_VERSIONS = ("2.4.0", "2.0.0")
REPO = "gdn-tests/tiny-qwen3-next-recall"
COMMIT = HubServer.commit_of(REPO)
BODY = {
    "model": {"uri": f"hf://{REPO}", "revision": COMMIT},
    "image": {"tag": "v0.34.0", "vllmVersion": "0.34.0"},
}


def hf_cli(version: str) -> Path:
    res = subprocess.run(
        ["bash", str(ROOT / "hack" / "tools.sh"), "hf-cli", version], capture_output=True, text=True, timeout=540
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return Path(res.stdout.strip().splitlines()[-1])


def rendered_init(body: dict) -> dict:
    """The download init container of the rendered Deployment (what the cluster runs), not a helper's output."""
    objs = render_all("srv", "default", parse_spec(body))
    [dep] = [o for o in objs if o["kind"] == "Deployment"]
    [init] = dep["spec"]["template"]["spec"]["initContainers"]
    assert init["name"] == podparts.DOWNLOAD_CONTAINER
    return init


def run_init(init: dict, hf: Path, hf_home: Path, endpoint: str) -> subprocess.CompletedProcess:
    """The init container's command as a local process: its rendered env (paths local), the Hub stand-in as
    HF_ENDPOINT, and this huggingface_hub's bin/ first on PATH (the image's `hf`)."""
    env = {"PATH": f"{hf.parent}:/usr/bin:/bin", "HF_HUB_DISABLE_TELEMETRY": "1", "HOME": str(hf_home.parent)}
    for e in init["env"]:
        env[e["name"]] = e.get("value", "")
    env.update(HF_HOME=str(hf_home), HF_ENDPOINT=endpoint)
    argv = [a.replace(podparts.HF_HOME, str(hf_home)) for a in init["command"]]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)


def file_gets(hub: HubServer) -> list[tuple[str, str, str]]:
    return [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]


@pytest.mark.parametrize("version", IMAGE_HUB_VERSIONS)
def test_the_rendered_download_step_fills_the_cache_with_the_image_hub_cli(version, tmp_path):
    hf = hf_cli(version)
    ver = subprocess.run(
        [str(hf.parent / "python"), "-c", "import huggingface_hub as h; print(h.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ver.stdout.strip() == version  # the CLI under test is that release's
    init = rendered_init(BODY)
    spec = parse_spec(BODY)
    # the exact argv the renderer produces: sh -c SCRIPT NAME MARKER REPO --revision COMMIT --include P ...
    assert init["command"][4:] == [podparts.ready_marker(spec), REPO, "--revision", COMMIT] + [
        a for p in spec.model.cache.include_patterns for a in ("--include", p)
    ]
    hf_home = tmp_path / "huggingface"
    with HubServer({REPO: MODEL}) as hub:
        first = run_init(init, hf, hf_home, hub.url)
        assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
        assert f"{REPO} is in the cache" in first.stdout
        fetched = {Path(p).name for _m, p, _r in file_gets(hub)}
        included = {f for f in hub.files(REPO) if any(fnmatch.fnmatch(f, p) for p in spec.model.cache.include_patterns)}
        assert fetched == included and {"config.json", "model.safetensors", "tokenizer.json"} <= fetched, fetched
        assert all(f"/resolve/{COMMIT}/" in p for _m, p, _r in file_gets(hub))  # the pinned revision
        hub.requests.clear()
        again = run_init(init, hf, hf_home, hub.url)
        assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
        assert file_gets(hub) == []  # idempotent: nothing fetched twice
    snapshots = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots"
    assert [d.name for d in snapshots.iterdir()] == [COMMIT]
    assert {f.name for f in (snapshots / COMMIT).iterdir()} == included
    assert Path(podparts.ready_marker(spec).replace(podparts.HF_HOME, str(hf_home))).is_file()


@pytest.mark.parametrize("version", IMAGE_HUB_VERSIONS)
def test_an_absent_repository_fails_with_the_reason_last_and_no_marker(version, tmp_path):
    hf = hf_cli(version)
    body = {**BODY, "model": {"uri": "hf://gdn-tests/absent"}}
    init = rendered_init(body)
    hf_home = tmp_path / "huggingface"
    with HubServer({REPO: MODEL}) as hub:
        run = run_init(init, hf, hf_home, hub.url)
    assert run.returncode == 1
    tail = (run.stdout + run.stderr)[-2048:]
    assert "download of gdn-tests/absent failed" in tail and ("404" in tail or "not found" in tail.lower()), tail
    assert not Path(podparts.ready_marker(parse_spec(body)).replace(podparts.HF_HOME, str(hf_home))).exists()
