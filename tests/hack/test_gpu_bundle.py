"""hack/gpu: the offline bundle's resolution walk (bundle.py plan), piece staging and the installer's
verification and conflict gate (install.py), on small synthetic bundles (CPU, no network)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack" / "gpu"
sys.path.insert(0, str(HACK))
import bundle  # noqa: E402

CFG = yaml.safe_load((HACK / "bundle.yaml").read_text())


def _item(name, version, requires=()):
    return {
        "metadata": {"name": name, "version": version, "requires_dist": list(requires)},
        "download_info": {
            "url": f"https://files.example/{name}-{version}-py3-none-any.whl",
            "archive_info": {"hashes": {"sha256": "0" * 64}},
        },
    }


REPORT = {
    "install": [
        _item(
            "vllm",
            "0.22.0",
            [
                "torch==2.11.0",
                "numpy<2.4",
                "pydantic>=2.12",
                "flashinfer-python==0.6.8",
                "uvicorn[standard]",
                "pywin32; sys_platform == 'win32'",
                "numba==0.65.0; python_version < '3.13'",
            ],
        ),
        _item("torch", "2.11.0", ["nvidia-cublas==13.0.0", "triton==3.6.0"]),
        _item("nvidia-cublas", "13.0.0"),
        _item("triton", "3.6.0"),
        _item("numpy", "2.3.5"),
        _item("numba", "0.65.0"),
        _item("pydantic", "2.14.3", ["pydantic-core==2.50.4", "typing-extensions>=4.14"]),
        _item("pydantic-core", "2.50.4", ["typing-extensions>=4.14"]),
        _item("typing-extensions", "4.15.0"),
        _item("flashinfer-python", "0.6.8", ["nvidia-cudnn-frontend>=1.0"]),
        _item("nvidia-cudnn-frontend", "1.1"),
        _item("uvicorn", "0.54.0", ["h11>=0.8", "httptools>=0.6; extra == 'standard'"]),
        _item("h11", "0.16.0"),
        _item("httptools", "0.9.0"),
        _item("pywin32", "311"),
    ]
}
BASE = {"torch": "2.11.0+cu130", "numpy": "2.5.2", "numba": None, "typing-extensions": "4.15.0", "h11": "0.16.0"}


def test_plan_stops_at_base_and_optional_packages_and_reports_conflicts():
    p = bundle.plan(REPORT, BASE, CFG, set())
    names = [x["name"] for x in p["packages"]]
    # torch is in the base, so neither it nor its CUDA wheels are bundled; flashinfer is optional.
    assert names == ["httptools", "pydantic", "pydantic-core", "uvicorn", "vllm"]
    assert set(p["excluded_optional"]) == {"flashinfer-python"}
    assert p["conflicts_with_base_file"] == [{"package": "numpy", "base": "2.5.2", "by": "vllm", "spec": "<2.4"}]
    assert [u["package"] for u in p["unverified_against_base_file"]] == ["numba"]
    assert {r["by"] for r in p["base_requirements"]["typing-extensions"]} == {"pydantic", "pydantic-core"}


def test_plan_with_opt_in_bundles_the_optional_kernel_and_rejects_unknown_names():
    p = bundle.plan(REPORT, BASE, CFG, {"flashinfer-python"})
    assert {"flashinfer-python"} <= {x["name"] for x in p["packages"]}
    assert "nvidia-cudnn-frontend" not in {x["name"] for x in p["packages"]}  # optional on its own
    with pytest.raises(SystemExit, match="not an optional package"):
        bundle.plan(REPORT, BASE, CFG, {"flashinfr"})


def test_plan_bundles_a_replaceable_base_package_whose_host_version_does_not_do():
    """vLLM 0.33.0 pins torch 2.14.0 on a host with 2.11.0 (issue 32): torch is bundled, and the walk goes on into
    its CUDA wheels where the host's version differs too; a host CUDA wheel that satisfies its pin stays the host's."""
    report = {"install": [dict(i) for i in REPORT["install"]]}
    report["install"][0] = _item("vllm", "0.33.0", ["torch==2.14.0", "pydantic>=2.12"])
    report["install"][1] = _item("torch", "2.14.0", ["nvidia-cublas==13.1.0", "triton==3.8.0"])
    report["install"][2] = _item("nvidia-cublas", "13.1.0")
    report["install"][3] = _item("triton", "3.8.0")
    base = dict(BASE, **{"nvidia-cublas": "13.0.0", "triton": "3.8.0"})
    p = bundle.plan(report, base, CFG, set())
    names = [x["name"] for x in p["packages"]]
    assert {"torch", "nvidia-cublas"} <= set(names) and "triton" not in names
    assert p["replaced_base"]["torch"] == {"base": "2.11.0+cu130", "spec": "==2.14.0", "by": "vllm"}
    assert p["replaced_base"]["nvidia-cublas"]["base"] == "13.0.0"
    assert "torch" not in p["base_requirements"] and p["conflicts_with_base_file"] == []
    # a base file without versions cannot show a difference: nothing is replaced, install.sh checks on the host
    bare = bundle.plan(report, dict.fromkeys(base), CFG, set())
    assert "torch" not in {x["name"] for x in bare["packages"]} and bare["replaced_base"] == {}
    # at the release the host's torch satisfies (0.22.0's report), nothing is replaced either
    assert bundle.plan(REPORT, BASE, CFG, set())["replaced_base"] == {}


def test_plan_bundles_a_base_package_that_pins_a_package_the_bundle_carries():
    """vLLM 0.34.0 asks huggingface-hub>=2.0.0; the host's 1.33.0 is replaced, and the host's transformers 5.17.0, which
    vLLM's own pin accepts, asks huggingface-hub<2.0 (its import-time check would fail): bundle.yaml's replace_together
    bundles transformers too, at the resolver's version, and walks into it. Without a replaced hub nothing changes."""
    report = {
        "install": [
            _item("vllm", "0.34.0", ["transformers<5.23.0,>=5.16.1", "huggingface-hub>=2.0.0", "numpy<2.4"]),
            _item("transformers", "5.22.2", ["huggingface-hub<3.0,>=1.31.0", "numpy>=1.17", "regex>=2025.10.22"]),
            _item("huggingface-hub", "2.4.0", ["httpx2<3,>=2.0.0"]),
            _item("httpx2", "2.17.0"),
            _item("regex", "2026.1.1"),
            _item("numpy", "2.3.5"),
        ]
    }
    base = {"transformers": "5.17.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "regex": "2026.1.1"}
    p = bundle.plan(report, base, CFG, set())
    names = {x["name"]: x["version"] for x in p["packages"]}
    assert names["huggingface-hub"] == "2.4.0" and names["transformers"] == "5.22.2" and "httpx2" in names
    assert "regex" not in names and "numpy" not in names  # transformers' other requirements stay the host's
    assert p["replaced_base"]["transformers"]["by"] == "replace_together (huggingface-hub)"
    assert "transformers" not in p["base_requirements"] and "regex" in p["base_requirements"]
    # a host whose hub already satisfies vLLM keeps its transformers
    kept = bundle.plan(report, dict(base, **{"huggingface-hub": "2.1.1"}), CFG, set())
    assert {"transformers", "huggingface-hub"}.isdisjoint({x["name"] for x in kept["packages"]})


def test_plan_keeps_the_hosts_cuda_library_of_the_same_release_series_only():
    """bundle.yaml keep_host (issue 32 item 1): torch 2.14.0 pins cuBLAS 13.1.1.3 (via cuda-toolkit 13.0.3) and cuSPARSELt
    0.8.1 where the H200 host has 13.1.0.3 and 0.8.0: the host's are kept and the pin is recorded on the base, with the
    host's version, for install.sh's accept list.  cuDNN (torch refuses an older runtime minor) and NCCL (torch imports
    symbols 2.28.9 lacks) are bundled; so is a host cuBLAS of another minor, and everything under --no-keep-host."""
    pins = {
        "nvidia-cublas": "13.1.1.3",
        "nvidia-cusparselt-cu13": "0.8.1",
        "nvidia-cudnn-cu13": "9.24.0.43",
        "nvidia-nccl-cu13": "2.30.7",
    }
    report = {
        "install": [
            _item("vllm", "0.33.0", ["torch==2.14.0"]),
            _item(
                "torch",
                "2.14.0",
                ["cuda-toolkit[cublas]==13.0.3", *(f"{k}=={v}" for k, v in pins.items() if k != "nvidia-cublas")],
            ),
            _item("cuda-toolkit", "13.0.3", ["nvidia-cublas==13.1.1.3.*; extra == 'cublas'"]),
            *(_item(k, v) for k, v in pins.items()),
        ]
    }
    host = {
        "torch": "2.11.0",
        "cuda-toolkit": "13.0.2",
        "nvidia-cublas": "13.1.0.3",
        "nvidia-cusparselt-cu13": "0.8.0",
        "nvidia-cudnn-cu13": "9.19.0.56",
        "nvidia-nccl-cu13": "2.28.9",
    }
    p = bundle.plan(report, host, CFG, set())
    names = {x["name"] for x in p["packages"]}
    assert names == {"vllm", "torch", "cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"}
    assert set(p["kept_host"]) == {"nvidia-cublas", "nvidia-cusparselt-cu13"}
    assert p["kept_host"]["nvidia-cublas"]["base"] == "13.1.0.3" and "cuBLAS 13.1" in p["kept_host"]["nvidia-cublas"]["why"]
    assert {(c["package"], c["base"], c["spec"]) for c in p["conflicts_with_base_file"]} == {
        ("nvidia-cublas", "13.1.0.3", "==13.1.1.3.*"),
        ("nvidia-cusparselt-cu13", "0.8.0", "==0.8.1"),
    }
    assert p["base_requirements"]["nvidia-cublas"] == [{"by": "cuda-toolkit", "spec": "==13.1.1.3.*"}]
    # another minor on the host (13.0 against 13.1): bundled
    older = bundle.plan(report, dict(host, **{"nvidia-cublas": "13.0.2.14"}), CFG, set())
    assert "nvidia-cublas" in {x["name"] for x in older["packages"]} and "nvidia-cublas" not in older["kept_host"]
    # --no-keep-host: the whole pinned stack is bundled, nothing is left as a conflict on the base
    full = bundle.plan(report, host, CFG, set(), keep_host=False)
    assert {x["name"] for x in full["packages"]} == names | {"nvidia-cublas", "nvidia-cusparselt-cu13"}
    assert full["kept_host"] == {} and full["conflicts_with_base_file"] == []


def test_parse_base_reads_pip_list_freeze_and_bare_names(tmp_path):
    f = tmp_path / "base.txt"
    f.write_text("Package    Version\n---------- -------\nTorch 2.11.0+cu130\nnumpy==2.5.2\nmy_pkg @ file:///x\nzipp\n")
    assert bundle.parse_base(f) == {"torch": "2.11.0+cu130", "numpy": "2.5.2", "my-pkg": None, "zipp": None}
    f.write_text("torch 2.11 extra words\n")
    with pytest.raises(SystemExit, match="base.txt:1"):
        bundle.parse_base(f)


PAYLOAD = random.Random(14).randbytes(1500)  # incompressible: the archive spans several pieces


def _fake_bundle(tmp_path: Path, base_requirements: dict, piece_size: int = 300, codec: str = "xz", **extra) -> Path:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in {"fakepkg/__init__.py": PAYLOAD, "fakepkg-1.0.dist-info/METADATA": b"Name: fakepkg\n"}.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    archive = gzip.compress(raw.getvalue(), 1) if codec == "gzip" else lzma.compress(raw.getvalue())
    out = tmp_path / "bundle"
    out.mkdir()
    pieces = []
    for i in range(0, len(archive), piece_size):
        chunk = archive[i : i + piece_size]
        name = f"site.tar.xz.{i // piece_size:02d}"
        (out / name).write_bytes(chunk)
        pieces.append({"file": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    assert len(pieces) >= 2
    manifest = {
        "vllm_version": "0.22.0",
        "target": {"python_version": "%d.%d" % sys.version_info[:2]},
        "archive_sha256": hashlib.sha256(archive).hexdigest(),
        "pieces": pieces,
        "packages": [{"name": "fakepkg", "version": "1.0"}],
        "base_requirements": base_requirements,
        "codec": codec,
        **extra,
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def _install(bundle_dir, target, *extra):
    return subprocess.run(
        ["bash", str(HACK / "install.sh"), str(bundle_dir), str(target), "--python", sys.executable, *extra],
        capture_output=True,
        text=True,
    )


@pytest.mark.readme("hack/gpu/install.sh")
def test_install_unpacks_verified_bundle_when_base_satisfies_it(tmp_path):
    b = _fake_bundle(tmp_path, {"pyyaml": [{"by": "fakepkg", "spec": ">=6"}]})
    r = _install(b, tmp_path / "site", "--accept", "")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "site" / "fakepkg" / "__init__.py").read_bytes() == PAYLOAD
    again = _install(b, tmp_path / "site", "--accept", "")
    assert again.returncode == 0 and "already holds this bundle" in again.stdout


def test_install_refuses_a_version_conflict_unless_accepted(tmp_path):
    import yaml as y

    b = _fake_bundle(tmp_path, {"pyyaml": [{"by": "fakepkg", "spec": "<6"}]})
    r = _install(b, tmp_path / "site", "--accept", "")
    assert r.returncode == 3 and "CONFLICT pyyaml" in r.stderr and "<6" in r.stderr
    assert not (tmp_path / "site").exists()
    # The check needs only the manifest: it runs before the pieces have arrived.
    for piece in b.glob("site.tar.xz.*"):
        piece.unlink()
    r = _install(b, tmp_path / "site", "--accept", "", "--check-only")
    assert r.returncode == 3 and "CONFLICT pyyaml" in r.stderr
    (tmp_path / "again").mkdir()
    b = _fake_bundle(tmp_path / "again", {"pyyaml": [{"by": "fakepkg", "spec": "<6"}]})
    acc = tmp_path / "accept.yaml"
    acc.write_text(
        y.safe_dump(
            {"accepted": [{"package": "PyYAML", "installed": f"=={y.__version__}", "vllm": "==0.22.0", "reason": "test"}]}
        )
    )
    r = _install(b, tmp_path / "site", "--accept", str(acc))
    assert r.returncode == 0, r.stderr
    assert "accepted conflict: pyyaml" in r.stdout
    # The acceptance is for the installed version it names, not for any version.
    acc.write_text(y.safe_dump({"accepted": [{"package": "pyyaml", "installed": "==0.0.1", "vllm": "==0.22.0", "reason": "t"}]}))
    assert _install(b, tmp_path / "site2", "--accept", str(acc)).returncode == 3


def test_install_accepts_a_kept_host_library_only_where_the_accept_list_names_it(tmp_path):
    """A bundle built with keep_host (gzip, as 0.33.0's is built) places the pin it left out on the base: install.sh
    refuses the host's other version and names keep_host, unless accept-conflicts.yaml lists that host version."""
    import yaml as y

    kept = {"pyyaml": {"base": y.__version__, "spec": "==0.0.2", "by": "fakepkg", "why": "test"}}
    b = _fake_bundle(tmp_path, {"pyyaml": [{"by": "fakepkg", "spec": "==0.0.2"}]}, codec="gzip", kept_host=kept)
    r = _install(b, tmp_path / "site", "--accept", "")
    assert r.returncode == 3 and "CONFLICT pyyaml" in r.stderr and "keep_host" in r.stderr
    assert not (tmp_path / "site").exists()
    acc = tmp_path / "accept.yaml"
    entry = {"package": "pyyaml", "installed": f"=={y.__version__}", "vllm": "==0.22.0", "reason": "same series"}
    acc.write_text(y.safe_dump({"accepted": [dict(entry, vllm="==0.33.0")]}))  # listed for another release only
    assert _install(b, tmp_path / "site", "--accept", str(acc)).returncode == 3
    acc.write_text(y.safe_dump({"accepted": [entry]}))
    r = _install(b, tmp_path / "site", "--accept", str(acc))
    assert r.returncode == 0, r.stderr
    assert "accepted conflict: pyyaml" in r.stdout
    assert (tmp_path / "site" / "fakepkg" / "__init__.py").read_bytes() == PAYLOAD


def test_install_refuses_missing_base_package_and_corrupt_or_missing_pieces(tmp_path):
    b = _fake_bundle(tmp_path, {"surely-not-installed-pkg": [{"by": "fakepkg", "spec": ""}]})
    r = _install(b, tmp_path / "site", "--accept", "")
    assert r.returncode == 3 and "MISSING base package surely-not-installed-pkg" in r.stderr
    (tmp_path / "second").mkdir()
    b2 = _fake_bundle(tmp_path / "second", {})
    first = sorted(b2.glob("site.tar.xz.*"))[0]
    first.write_bytes(b"corrupt" + first.read_bytes()[7:])
    r = _install(b2, tmp_path / "site3", "--accept", "")
    assert r.returncode == 2 and first.name in r.stderr and "corrupt" in r.stderr
    first.unlink()
    r = _install(b2, tmp_path / "site3", "--accept", "")
    assert r.returncode == 2 and "missing pieces" in r.stderr and first.name in r.stderr


@pytest.mark.readme("hack/gpu/stage-piece.sh")
def test_stage_piece_collects_pieces_across_calls(tmp_path):
    b = _fake_bundle(tmp_path, {})
    pieces = sorted(b.glob("site.tar.xz.*"))
    carried = tmp_path / "carried"
    stage = tmp_path / "stage"
    for i, piece in enumerate(pieces):
        carried.mkdir(exist_ok=True)
        for old in carried.glob("site.tar.xz.*"):
            old.unlink()
        (carried / "manifest.json").write_bytes((b / "manifest.json").read_bytes())
        (carried / piece.name).write_bytes(piece.read_bytes())
        r = subprocess.run(["bash", str(HACK / "stage-piece.sh"), str(carried), str(stage)], capture_output=True, text=True)
        last = i == len(pieces) - 1
        assert r.returncode == (0 if last else 4), r.stdout + r.stderr
        assert f"{i + 1}/{len(pieces)} pieces" in r.stdout
    assert _install(stage, tmp_path / "site", "--accept", "").returncode == 0
    (carried / pieces[0].name).write_bytes(b"garbage")
    for p in stage.glob("site.tar.xz.*"):
        p.unlink()
    r = subprocess.run(["bash", str(HACK / "stage-piece.sh"), str(carried), str(stage)], capture_output=True, text=True)
    assert r.returncode != 0 and "sha256 differs" in r.stderr


def _wait_for(path: Path, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.2)
    return False


def test_resolve_stands_in_for_an_optional_pin_the_index_does_not_serve(tmp_path):
    """vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not serve: pip's message names the pin, and the
    stand-in wheel is a wheel pip accepts for exactly that name and version (metadata only, no requirements)."""
    msg = "ERROR: No matching distribution found for flashinfer-python==0.7.3 (from vllm)\n"
    assert bundle._missing_pin(msg) == ("flashinfer-python", "0.7.3")
    assert bundle._missing_pin("ERROR: Could not find a version that satisfies the requirement torch>=9") is None
    whl = bundle.write_stub_wheel(tmp_path / "stubs", "flashinfer-python", "0.7.3")
    target = tmp_path / "t"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(whl.parent), "--target", str(target)]
        + ["--quiet", "flashinfer-python==0.7.3"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    (info,) = target.glob("flashinfer_python-0.7.3.dist-info")
    assert "Requires-Dist" not in (info / "METADATA").read_text()


@pytest.mark.timeout(240)
def test_lease_plan_runs_steps_in_order_and_stops_a_step_when_the_later_release_arrives(tmp_path):
    """hack/gpu/lease.sh's plan (one GPU, two releases in one lease): a step waits for its release's bundle; a step
    marked /0.34.0 is stopped once 0.34.0 is installed and keeps what it wrote; the next step then runs. The steps are
    the short-prompt probe's dry run (stand-in engines), so no GPU is needed."""
    cache = tmp_path / "cache"
    (cache / "gpu-site" / "vllm-0.26.0").mkdir(parents=True)
    (cache / "gpu-site" / "vllm-0.26.0" / ".installed-ok").touch()
    plan = tmp_path / "plan.txt"
    plan.write_text(
        "# a comment, then a blank line\n\n"
        "+0.26.0 60 shortprompt --dry-run -- --per-length 2 --max-len 2\n"
        "0.26.0 170/0.34.0 shortprompt --dry-run -- --per-length 2000 --max-len 10\n"
        "0.34.0 60 shortprompt --dry-run -- --per-length 2 --max-len 3\n"
    )
    import os
    import time

    env = dict(os.environ, GDN_CACHE_DIR=str(cache), GDN_GPU_PYTHON=sys.executable)
    p = subprocess.Popen(
        ["bash", str(REPO / "hack/gpu/lease.sh"), "plan", "0.34.0", str(plan), str(int(time.time()) + 200)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = cache / "lease-0.34.0" / "scratch" / "1-shortprompt" / "short-prompts.json"  # after the `+` step
    assert _wait_for(first, 60), "the 0.26.0 step never started"
    (cache / "gpu-site" / "vllm-0.34.0").mkdir(parents=True)
    (cache / "gpu-site" / "vllm-0.34.0" / ".installed-ok").touch()
    out, _ = p.communicate(timeout=200)
    assert p.returncode == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("lease plan:")]
    assert any("step 1: 0.34.0 installed, stopping shortprompt@0.26.0" in ln for ln in lines), out
    assert any("step 2 shortprompt@0.34.0" in ln for ln in lines) and lines[-1].endswith("step 2 done"), out
    stopped = json.loads((cache / "lease-0.34.0" / "steps" / "1-shortprompt-0.26.0" / "short-prompts.json").read_text())
    done = json.loads((cache / "lease-0.34.0" / "steps" / "2-shortprompt-0.34.0" / "short-prompts.json").read_text())
    assert stopped["vllm_version"] == "0.26.0" and done["vllm_version"] == "0.34.0"
    # the `+` step (beside the training in a lease) ran first and whole
    assert lines[0].startswith("lease plan:") and "step e1 shortprompt@0.26.0" in lines[0], out
    early = json.loads((cache / "lease-0.34.0" / "steps" / "e1-shortprompt-0.26.0" / "short-prompts.json").read_text())
    assert set(early["cells"]) == {"short", "chunk"}
    # the stopped step's 16,000 short prompts could not all be answered (one at a time); the second step's few were
    assert set(done["cells"]) == {"short", "chunk"}
    assert "chunk" not in stopped["cells"]
    # the stopped step's stand-in engines (sessions of their own) were ended with it: none still runs
    assert not _processes_with_env(f"GDN_LEASE_STEP={cache}")


def _processes_with_env(prefix: str) -> list[int]:
    found = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if any(v.startswith(prefix) for v in env.read_bytes().decode(errors="replace").split("\0")):
                found.append(int(env.parent.name))
        except OSError:
            continue
    return found
