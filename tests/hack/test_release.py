"""The release pipeline as code (issue 39), checked here because the workflow cannot run on this machine:

- one version everywhere (Chart.yaml version = appVersion = pyproject = gdn_operator.__version__ = the operator
  Dockerfile's VERSION), SemVer, with its upgrade page; the CHANGELOG keeps Keep a Changelog's shape;
- .github/workflows/release.yml passes actionlint (built from the Go module proxy), and actionlint does fail a
  broken copy; the workflow runs the scripts below, builds arm64 for the operator and signs keyless;
- the scripts it runs, run here: the chart is packaged and pushed to a real OCI registry (`crane registry
  serve`) and pulled back by digest; the SBOM of this checkout's Python environment lists what is installed;
  the release notes are cut from CHANGELOG.md and a tag without its section fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "hack" / "release"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
CHART = ROOT / "charts" / "gdn-operator"
CHANGELOG = ROOT / "CHANGELOG.md"
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
sys.path.insert(0, str(ROOT / "tests" / "charts"))

from _chart_helpers import ToolError, tools  # noqa: E402


@pytest.fixture(scope="module")
def chart_tools() -> dict[str, str]:
    """helm (hack/tools.sh, as tests/charts/ use it); a failed install is a test error, not a skip."""
    try:
        return tools()
    except ToolError as e:
        pytest.fail(str(e), pytrace=False)


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])


# ------------------------------------------------------------------------------------------ versions --


def test_one_version_for_operator_image_and_chart():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = str(chart["version"])
    assert SEMVER.match(version), f"Chart.yaml version {version!r} is not SemVer X.Y.Z"
    dockerfile = (ROOT / "images" / "operator" / "Dockerfile").read_text()
    found = {
        "Chart.yaml appVersion": str(chart["appVersion"]),
        "pyproject.toml [project] version": tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"],
        "gdn_operator.__version__": re.search(
            r'^__version__ = "([^"]+)"', (ROOT / "operator" / "gdn_operator" / "__init__.py").read_text(), re.M
        )[1],
        "images/operator/Dockerfile ARG VERSION": re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.M)[1],
        "hack/release/images.py version": _run(sys.executable, str(RELEASE / "images.py"), "version").stdout.strip(),
    }
    assert found == dict.fromkeys(found, version), f"every place must say {version} (Chart.yaml version): {found}"
    assert (ROOT / "docs" / "upgrade" / f"{version}.md").is_file(), f"no upgrade page docs/upgrade/{version}.md"
    # the pinned registry install lines users copy name this version
    for doc in (ROOT / "README.md", CHART / "README.md"):
        pins = re.findall(r"oci://ghcr\.io/gdn-operator/charts/gdn-operator\s+--version (\S+?)`?\s", doc.read_text())
        pins = [p for p in pins if p != "X.Y.Z"]  # the upgrade line's placeholder
        assert pins and set(pins) == {version}, f"{doc.relative_to(ROOT)} pins {pins}, not {version}"


def test_changelog_keeps_a_changelog_shape_and_the_api_policy_exists():
    text = CHANGELOG.read_text()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "[Unreleased]", f"the first section must be [Unreleased], not {headings[0]!r}"
    for h in headings[1:]:
        assert re.match(r"^\[\d+\.\d+\.\d+\] - (\d{4}-\d{2}-\d{2}|never published)$", h), f"bad release heading {h!r}"
    for sub in re.findall(r"^### (.+)$", text, re.M):
        assert sub in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, f"not a Keep a Changelog type: {sub}"
    prev = yaml.safe_load((RELEASE / "previous.yaml").read_text())
    assert f"## [{prev['version']}]" in text, "hack/release/previous.yaml names a version the CHANGELOG does not list"
    policy = (ROOT / "docs" / "api-policy.md").read_text()
    for needle in ("v1alpha1", "v1beta1", "conversion", "storedVersions", "Deprecate"):
        assert needle in policy, f"docs/api-policy.md does not cover {needle!r}"


def test_release_notes_come_from_the_changelog_and_a_missing_section_fails(tmp_path):
    log = tmp_path / "CHANGELOG.md"
    log.write_text(
        "# Changelog\n\n## [Unreleased]\n\n### Added\n\n- next\n\n"
        "## [1.2.0] - 2026-12-01\n\n### Fixed\n\n- the thing (vllm#36917)\n\n"
        "## [1.1.0] - 2026-11-01\n\n- older\n\n[1.2.0]: https://example.invalid/1.2.0\n"
    )
    notes = RELEASE / "notes.py"
    res = _run(sys.executable, str(notes), "1.2.0", str(log))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "### Fixed\n\n- the thing (vllm#36917)\n"
    res = _run(sys.executable, str(notes), "1.3.0", str(log))
    assert res.returncode != 0 and "no section '## [1.3.0] - YYYY-MM-DD'" in res.stderr, res.stderr
    log.write_text("## [Unreleased]\n\n## [1.3.0]\n\n- undated\n")
    res = _run(sys.executable, str(notes), "1.3.0", str(log))
    assert res.returncode != 0 and "has no release date" in res.stderr, res.stderr
    # this checkout has not been released yet: its version's section does not exist, so a tag would fail here
    res = _run(sys.executable, str(notes), chart_version())
    assert res.returncode != 0 and "move the Unreleased entries" in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------- workflow --


@pytest.mark.tools
@pytest.mark.readme("tests/cluster/build.sh release")
def test_release_workflow_passes_actionlint_and_actionlint_fails_a_broken_copy(release_bins, tmp_path):
    shellcheck = subprocess.run(["bash", str(ROOT / "hack" / "tools.sh")], capture_output=True, text=True, timeout=240)
    assert shellcheck.returncode == 0, shellcheck.stderr
    sc = dict(ln.split("=", 1) for ln in shellcheck.stdout.splitlines() if "=" in ln)["SHELLCHECK"]
    assert Path(sc).is_file(), f"hack/tools.sh installed no shellcheck: {sc}"
    lint = [release_bins["actionlint"], "-no-color", f"-shellcheck={sc}"]
    res = _run(*lint, str(WORKFLOW))
    assert res.returncode == 0, res.stdout + res.stderr
    text = WORKFLOW.read_text()
    # an expression naming an output that does not exist (actionlint's own check)
    broken = tmp_path / "release.yml"
    assert "needs.check.outputs.version" in text
    broken.write_text(text.replace("needs.check.outputs.version", "needs.check.outputs.verison", 1))
    res = _run(*lint, str(broken))
    assert res.returncode != 0 and "verison" in res.stdout, res.stdout + res.stderr
    # a shell bug inside a run: script (shellcheck through actionlint: SC2086, an unquoted expansion)
    assert 'cosign sign --yes "${IMAGE}"' in text
    broken.write_text(text.replace('cosign sign --yes "${IMAGE}"', "cosign sign --yes ${IMAGE}", 1))
    res = _run(*lint, str(broken))
    assert res.returncode != 0 and "SC2086" in res.stdout, res.stdout + res.stderr


def test_release_workflow_builds_signs_and_publishes_with_the_tested_scripts():
    wf = yaml.safe_load(WORKFLOW.read_text())
    on = wf.get("on", wf.get(True))  # PyYAML reads the key `on` as True
    assert on == {"push": {"tags": ["v[0-9]+.[0-9]+.[0-9]+"]}}
    jobs = wf["jobs"]
    runs = {name: "\n".join(s.get("run", "") for s in job["steps"]) for name, job in jobs.items()}
    uses = {name: [s.get("uses", "") for s in job["steps"]] for name, job in jobs.items()}
    # the locally tested scripts are what the workflow runs
    assert "hack/release/images.py version" in runs["check"] and "hack/release/notes.py" in runs["check"]
    assert "hack/release/images.py matrix" in runs["check"]
    assert "hack/release/sbom.py" in runs["operator-image"]
    assert "hack/release/chart.sh push dist" in runs["chart"]
    assert "hack/release/notes.py" in runs["release"]
    # operator: amd64 + arm64; vllm-gdn: amd64, one build per patched vLLM release
    build = {
        n: next(s["with"] for s in j["steps"] if s.get("uses", "").startswith("docker/build-push-action"))
        for n, j in jobs.items()
        if n.endswith("image") or n.endswith("images")
    }
    assert build["operator-image"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["vllm-gdn-images"]["platforms"] == "linux/amd64"
    assert build["vllm-gdn-images"]["tags"] == "${{ matrix.image }}"
    # SBOM (syft) and keyless signing (OIDC token) wherever something is pushed
    for name in ("operator-image", "vllm-gdn-images", "chart"):
        assert jobs[name]["permissions"]["id-token"] == "write", f"{name}: keyless cosign needs id-token: write"
        assert any(u.startswith("sigstore/cosign-installer") for u in uses[name]), name
        assert "cosign sign --yes" in runs[name], name
    for name in ("operator-image", "vllm-gdn-images"):
        assert any(u.startswith("anchore/sbom-action") for u in uses[name]), f"{name}: no syft SBOM"
        assert "cosign attest --yes --type cyclonedx" in runs[name], f"{name}: SBOM not attached to the image"
    assert jobs["release"]["permissions"] == {"contents": "write"}
    assert wf["permissions"] == {"contents": "read"}


# ----------------------------------------------------------------------------------------- scripts --


@pytest.mark.tools
@pytest.mark.readme("hack/release/chart.sh")
def test_chart_is_packaged_pushed_to_a_real_oci_registry_and_pulled_back(chart_tools, oci_registry, tmp_path):
    env = {**os.environ, "HELM": chart_tools["helm"]}
    res = _run("bash", str(RELEASE / "chart.sh"), "push", str(tmp_path / "dist"), oci_registry.host, "--plain-http", env=env)
    assert res.returncode == 0, res.stderr
    version = chart_version()
    ref = res.stdout.strip()
    m = re.fullmatch(rf"{re.escape(oci_registry.host)}/charts/gdn-operator:{re.escape(version)}@(sha256:[0-9a-f]{{64}})", ref)
    assert m, ref
    # the registry itself answers the same digest for the tag (what cosign signs is what helm pulls)
    crane = oci_registry.crane
    res = _run(crane, "digest", "--insecure", f"{oci_registry.host}/charts/gdn-operator:{version}")
    assert res.returncode == 0 and res.stdout.strip() == m[1], res.stdout + res.stderr
    res = _run(crane, "ls", "--insecure", f"{oci_registry.host}/charts/gdn-operator")
    assert res.stdout.split() == [version]
    pulled, again = tmp_path / "pulled", tmp_path / "again"
    pulled.mkdir()
    again.mkdir()
    res = _run(
        chart_tools["helm"], "pull", f"oci://{oci_registry.host}/charts/gdn-operator", "--version", version,
        "--plain-http", "--destination", str(pulled),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = _run(chart_tools["helm"], "show", "chart", str(pulled / f"gdn-operator-{version}.tgz"))
    shown = yaml.safe_load(res.stdout)
    assert (shown["version"], shown["appVersion"]) == (version, version)
    assert f"Digest: {m[1]}" in _run(
        chart_tools["helm"], "pull", f"oci://{oci_registry.host}/charts/gdn-operator", "--version", version,
        "--plain-http", "--destination", str(again),
    ).stderr  # fmt: skip


@pytest.mark.tools
def test_chart_package_refuses_a_version_that_differs_from_app_version(chart_tools, tmp_path):
    chart = tmp_path / "gdn-operator"
    shutil.copytree(CHART, chart)
    meta = (chart / "Chart.yaml").read_text()
    (chart / "Chart.yaml").write_text(re.sub(r"^appVersion: .*$", 'appVersion: "9.9.9"', meta, flags=re.M))
    env = {**os.environ, "HELM": chart_tools["helm"], "CHART_DIR": str(chart)}
    res = _run("bash", str(RELEASE / "chart.sh"), "package", str(tmp_path / "dist"), env=env)
    assert res.returncode != 0
    assert f"version ({chart_version()}) must equal appVersion (9.9.9)" in res.stderr, res.stderr
    assert not (tmp_path / "dist").exists()


def test_sbom_of_the_operators_python_environment(tmp_path):
    out = tmp_path / "sbom.json"
    res = _run(sys.executable, str(RELEASE / "sbom.py"), sys.executable, str(out))
    assert res.returncode == 0, res.stderr
    bom = json.loads(out.read_text())
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.5")
    assert bom["metadata"]["component"]["purl"] == f"pkg:pypi/gdn-operator@{chart_version()}"
    purls = {c["purl"] for c in bom["components"]}
    for dist in ("kopf", "kubernetes", "pydantic", "pyyaml"):
        assert f"pkg:pypi/{dist}@{dist_version(dist)}" in purls, f"{dist} missing from the SBOM"
    assert len({c["bom-ref"] for c in bom["components"]}) == len(bom["components"])


def test_sbom_refuses_an_environment_without_this_operator(tmp_path):
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    res = _run(sys.executable, str(RELEASE / "sbom.py"), str(venv / "bin" / "python"), str(tmp_path / "x.json"))
    assert res.returncode != 0
    assert f"gdn-operator in {venv / 'bin' / 'python'} is not installed; this checkout is {chart_version()}" in res.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("missing", ["package", "push"])
def test_chart_script_names_its_usage(missing):
    res = _run("bash", str(RELEASE / "chart.sh"), missing)
    assert res.returncode != 0 and f"usage: chart.sh {missing}" in res.stderr, res.stderr
