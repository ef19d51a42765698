"""`gdnctl classify-log FILE [--output text|json]` through the real CLI entry points."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gdn_operator.cli import main
from paths import CPU_CAPTURES, gdnctl

FIXTURE = CPU_CAPTURES / "serve-startup-mtp2.log"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
GDNCTL = gdnctl()


def crash_log(tmp_path: Path, name: str) -> Path:
    text = FIXTURE.read_text(encoding="utf-8")
    head = text[: text.index("INFO:     Application startup complete.")]
    p = tmp_path / f"full-{name}"
    p.write_text(head + (LOGS / name).read_text(encoding="utf-8"), encoding="utf-8")
    return p


def test_healthy_fixture_exit_3_text(capsys) -> None:
    rc = main(["classify-log", str(FIXTURE)])
    out = capsys.readouterr().out
    assert rc == 3
    assert out.startswith("no crash:") and "206 lines" in out


def test_healthy_fixture_json(capsys) -> None:
    rc = main(["classify-log", str(FIXTURE), "--output", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 3
    assert doc["crashed"] is False and doc["signature"] is None and doc["file"] == str(FIXTURE)


@pytest.mark.parametrize(
    "name,sig,upstream,kind,root",
    [
        (
            "b1-gdn-assert-tp2-interleaved.tail.log",
            "gdn-mixed-spec-decode-assert",
            "vllm#36917",
            "runtime-crash",
            "AssertionError: num_decodes: 1, num_spec_decodes: 7",
        ),
        (
            "b4-illegal-address-accepted-sync-tp2.tail.log",
            "cuda-illegal-address-accepted-sync",
            "vllm#41190",
            "runtime-crash",
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        ),
        ("b14-negative-token-budget.tail.log", "negative-token-budget", "vllm#50708", "config-error", None),
        ("unknown-crash-keyerror.tail.log", "engine-dead", None, "generic", "KeyError: 'model.layers.0.mlp.experts.w13_weight'"),
    ],
)
def test_crash_json(tmp_path: Path, capsys, name, sig, upstream, kind, root) -> None:
    rc = main(["classify-log", str(crash_log(tmp_path, name)), "--output", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["crashed"] is True
    assert doc["signature"] == sig
    assert doc["upstream"] == upstream
    assert doc["kind"] == kind
    if root:
        assert doc["root_cause"] == root
    assert doc["root_cause_line"] > 100  # after the real startup section
    assert doc["remediation"]["hint"]


def test_crash_text_has_diagnosis_and_hint(tmp_path: Path, capsys) -> None:
    rc = main(["classify-log", str(crash_log(tmp_path, "b6-gdn-attn-237.tail.log"))])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("CRASH: cuda-illegal-address-gdn-spec-state")
    assert "vllm#37035" in out and "https://github.com/vllm-project/vllm/issues/37035" in out
    assert "root cause:" in out and "illegal memory access" in out
    assert "[lower-num-speculative-tokens]" in out and "numSpeculativeTokens <= 4" in out


def test_unknown_crash_text_says_generic(tmp_path: Path, capsys) -> None:
    rc = main(["classify-log", str(crash_log(tmp_path, "worker-died-no-exception.tail.log"))])
    out = capsys.readouterr().out
    assert rc == 0
    assert "CRASH: engine-dead" in out and "generic" in out
    assert "Worker proc VllmWorker-0 died unexpectedly" in out


@pytest.mark.parametrize("make", ["missing", "directory", "unreadable"])
def test_unreadable_file_exit_2_one_line(tmp_path: Path, capsys, make: str) -> None:
    if make == "missing":
        target = tmp_path / "nope.log"
    elif make == "directory":
        target = tmp_path
    else:
        target = tmp_path / "secret.log"
        target.write_text("x")
        target.chmod(0)
        if os.access(target, os.R_OK):  # running as root: permissions do not apply
            pytest.skip("root can read a mode-000 file")
    rc = main(["classify-log", str(target)])
    cap = capsys.readouterr()
    assert rc == 2
    assert cap.out == ""
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read log file") and str(target) in lines[0]
    assert "Traceback" not in cap.err


def test_binary_garbage_is_not_a_crash(tmp_path: Path, capsys) -> None:
    p = tmp_path / "garbage.bin"
    p.write_bytes(bytes(range(256)) * 100)
    assert main(["classify-log", str(p)]) == 3
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.skipif(GDNCTL is None, reason="gdnctl console script not installed")
def test_console_script_stdin(tmp_path: Path) -> None:
    data = crash_log(tmp_path, "cpu-align-kernel.tail.log").read_bytes()
    p = subprocess.run([GDNCTL, "classify-log", "-", "--output", "json"], input=data, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["signature"] == "cpu-align-kernel-unsupported"
    assert doc["root_cause"] == "TypeError: 'function' object is not subscriptable"
    assert doc["file"] == "<stdin>"


@pytest.mark.skipif(GDNCTL is None, reason="gdnctl console script not installed")
def test_console_script_errors_and_no_crash() -> None:
    p = subprocess.run([GDNCTL, "classify-log", "/nonexistent/vllm.log"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = subprocess.run([GDNCTL, "classify-log", str(FIXTURE)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and p.stdout.startswith("no crash:")
