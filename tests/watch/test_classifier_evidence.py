"""Issue 16: precision (evidence before an upstream issue is named), tails, wording and prefix variants,
frame-alone evidence, `gdnctl classify-log --spec/--vllm-version`. Texts are real upstream log lines
(tests/fixtures/logs/upstream, source in expected.tsv and in each test id).

Size (~520 lines): the evidence cases of one issue (16) on the upstream corpus; they share its loaders.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from gdn_operator.api.load import ManifestError
from gdn_operator.cli import main
from gdn_operator.watch.catalogue import CatalogueError, default_catalogue, parse_catalogue
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.prefixes import parse_line
from gdn_operator.watch.signatures import TAIL_LINES, classify_termination_message, classify_text

UP = Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "upstream"
SPECS = UP / "specs"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "logs"))


def up(name: str) -> str:
    return (UP / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------
# prefixes seen in real logs


PREFIXES = [
    # (source, raw line, level, payload, process, logger source)
    (
        "vllm#6976 old header, table frame",
        "│ ERROR 09-27 06:46:46 engine.py:157] RuntimeError: CUDA error: an illegal memory access was encountered     │",
        "ERROR",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        None,
        "engine.py:157",
    ),
    (
        "vllm#11366 dated header, CR",
        "2024-12-19 21:40:35 ERROR 56542 [async_llm_engine.py:64] RuntimeError: Error in model execution: CUDA error: an illegal memory access was encountered\r",
        "ERROR",
        "RuntimeError: Error in model execution: CUDA error: an illegal memory access was encountered",
        None,
        "async_llm_engine.py:64",
    ),
    (
        "vllm#31709 caret ANSI, ^M",
        "^[[1;36m(EngineCore_DP0 pid=43065)^[[0;0m ERROR 01-04 04:31:09 [core.py:844] For debugging consider passing CUDA_LAUNCH_BLOCKING=1^M",
        "ERROR",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "EngineCore_DP0 pid=43065",
        "core.py:844",
    ),
    (
        "vllm#22793 ESC as text",
        "ESC[1;36m(EngineCore_0 pid=114)ESC[0;0m ERROR 08-12 14:37:44 [core.py:718] EngineCore failed to start.",
        "ERROR",
        "EngineCore failed to start.",
        "EngineCore_0 pid=114",
        "core.py:718",
    ),
    (
        "vllm#2734 ESC byte lost",
        " [36m(RayWorkerVllm pid=5085) [0m [E ProcessGroupNCCL.cpp:475] [Rank 4] Watchdog caught collective operation timeout",
        "ERROR",
        "[Rank 4] Watchdog caught collective operation timeout",
        "RayWorkerVllm pid=5085",
        "ProcessGroupNCCL.cpp:475",
    ),
    (
        "vllm#6042 piped, glog without timestamp",
        "  | [rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 2 Rank 0] Timeout at NCCL work: 2",
        "ERROR",
        "[PG 2 Rank 0] Timeout at NCCL work: 2",
        None,
        "ProcessGroupNCCL.cpp:1537",
    ),
    (
        "vllm#36122 double process prefix",
        "(Worker pid=357) (Worker_TP0 pid=357) ERROR 03-05 05:40:33 [multiproc_executor.py:880]     assert not (num_decodes > 0 and num_spec_decodes > 0), (",
        "ERROR",
        "    assert not (num_decodes > 0 and num_spec_decodes > 0), (",
        "Worker_TP0 pid=357",
        "multiproc_executor.py:880",
    ),
    (
        "vllm PR#38081 header without timestamp",
        "(Worker_TP0 pid=73635) ERROR [multiproc_executor.py:949]",
        "ERROR",
        "",
        "Worker_TP0 pid=73635",
        "multiproc_executor.py:949",
    ),
    (
        "vllm#18916 log-viewer timestamp",
        "2025-05-30 18:28:27.890 | RuntimeError: CUDA error: no kernel image is available for execution on the device",
        None,
        "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        None,
        None,
    ),
    (
        "vllm#17098 Ray C++ log",
        "[2025-04-15 00:31:11,815 E 808 17795] logging.cc:108: Unhandled exception: N3c1016DistBackendErrorE.",
        "ERROR",
        "logging.cc:108: Unhandled exception: N3c1016DistBackendErrorE.",
        None,
        None,
    ),
    (
        "speculators#266 rank prefix",
        "[1/8,TP1][pid=5510] ERROR 01-28 10:47:07.623 [forward_context.py:617] Traceback (most recent call last):",
        "ERROR",
        "Traceback (most recent call last):",
        "TP1",
        "forward_context.py:617",
    ),
    (
        "vllm-ascend#6611 path in the header",
        "(Worker_TP0 pid=911501) ERROR 02-07 18:18:59 [v1/executor/multiproc_executor.py:824] RuntimeError: NPU out of memory.",
        "ERROR",
        "RuntimeError: NPU out of memory.",
        "Worker_TP0 pid=911501",
        "v1/executor/multiproc_executor.py:824",
    ),
]


@pytest.mark.parametrize("raw,level,payload,proc,src", [p[1:] for p in PREFIXES], ids=[p[0] for p in PREFIXES])
def test_real_prefix_forms(raw, level, payload, proc, src) -> None:
    p = parse_line(raw)
    assert (p.level, p.payload, p.proc, p.src) == (level, payload, proc, src)


# ------------------------------------------------------------------------------------------------
# wording families, each on a real upstream text


WORDINGS = [
    (
        "vllm#26863 torch.OutOfMemoryError",
        "vllm-26863-oom-message-wrapped.log",
        "cuda-oom",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ),
    (
        "vllm-ascend#6611 RuntimeError: NPU out of memory",
        "vllm-ascend-6611-qwen3-next-npu-oom.log",
        "cuda-oom",
        "RuntimeError: NPU out of memory.",
    ),
    (
        "vllm-ascend#4678 c10 NPU out of memory",
        "vllm-ascend-4678-npu-oom-glog-pta.log",
        "cuda-oom",
        "NPU out of memory. NPUWorkspaceAllocator",
    ),
    (
        "vllm#27571 torch.AcceleratorError + hint",
        "vllm-27571-qwen3-next-illegal-address-transfer-sync.log",
        "cuda-illegal-address",
        "torch.AcceleratorError: CUDA error: an illegal memory access",
    ),
    (
        "vllm#40756 hint line alone",
        "vllm-40756-illegal-address-hint-only-tp.log",
        "cuda-illegal-address",
        "Search for `cudaErrorIllegalAddress'",
    ),
    (
        "vllm#11366 Error in model execution",
        "vllm-11366-illegal-address-custom-header-crlf.log",
        "cuda-illegal-address",
        "RuntimeError: Error in model execution: CUDA error: an illegal memory access",
    ),
    (
        "vllm#17098 Triton Error [CUDA]",
        "vllm-17098-triton-error-illegal-address-old-header.log",
        "cuda-illegal-address",
        "RuntimeError: Triton Error [CUDA]: an illegal memory access",
    ),
    (
        "vllm#8177 watchdog terminated with CUDA error",
        "vllm-8177-watchdog-terminated-illegal-address-glog.log",
        "cuda-illegal-address",
        "Process group watchdog thread terminated with exception: CUDA error",
    ),
    (
        "vllm#6042 NCCL watchdog (torch 2.3 glog)",
        "vllm-6042-nccl-watchdog-worker-died-piped.log",
        "nccl-watchdog-timeout",
        "[Rank 0] Watchdog caught collective operation timeout",
    ),
    (
        "vllm#8978 NCCL watchdog (torch 2.4 glog)",
        "vllm-8978-nccl-watchdog-llama-vision-hang.log",
        "nccl-watchdog-timeout",
        "[Rank 2] Watchdog caught collective operation timeout",
    ),
    (
        "vllm#2734 NCCL watchdog via Ray",
        "vllm-2734-nccl-watchdog-ray-lost-ansi.log",
        "nccl-watchdog-timeout",
        "[Rank 4] Watchdog caught",
    ),
    ("vllm#31709 cudaErrorAssert", "vllm-31709-device-assert-caret-ansi.log", "cuda-device-assert", "cudaErrorAssert"),
    (
        "vllm#25240 'Engine core proc ... died'",
        "vllm-25240-qwen3-next-mtp-died-no-traceback.log",
        "engine-dead",
        "Engine core proc EngineCore_DP0 died unexpectedly",
    ),
    (
        "vllm#26328 WorkerProc failed to start",
        "vllm-26328-eagle3-gpt-oss-workerproc-failed.log",
        "engine-dead",
        "WorkerProc failed to start.",
    ),
]


@pytest.mark.parametrize("name,sig,root", [w[1:] for w in WORDINGS], ids=[w[0] for w in WORDINGS])
def test_wording_family(name: str, sig: str, root: str) -> None:
    r = classify_text(up(name))
    assert r.signature == sig and r.upstream is None
    assert root in r.root_cause


# ------------------------------------------------------------------------------------------------
# precision: the evidence that ties a crash to an upstream issue


def test_nccl_watchdog_without_gdn_evidence_names_no_issue() -> None:
    # vllm#8978: Llama 3.2 vision hang; before issue 16 this was attributed to flashinfer#3329
    r = classify_text(up("vllm-8978-nccl-watchdog-llama-vision-hang.log"))
    assert r.signature == "nccl-watchdog-timeout" and r.upstream is None
    assert "flashinfer#3329" in r.candidates
    assert r.remediation.action == "investigate"
    assert any("flashinfer#3329" in n and "needs family=gdn-hybrid (unknown)" in n for n in r.attribution)


@pytest.mark.parametrize("backend,named", [("flashinfer", True), ("triton", False), (None, False)])
def test_rendered_spec_is_evidence_vllm_38916(backend, named) -> None:
    from gdn_operator.api.load import parse_spec

    spec = {
        "model": {"uri": "hf://Qwen/Qwen3.5-35B-A3B"},
        "image": {"tag": "v0.21.0", "vllmVersion": "0.21.0"},
        "tensorParallelSize": 2,
    }
    if backend:
        spec["gdnPrefillBackend"] = backend
    r = classify_text(up("vllm-38916-qwen3.5-flashinfer-gdn-timeout.log"), evidence=Evidence.from_spec(parse_spec(spec)))
    if named:
        assert r.signature == "gdn-prefill-hang" and r.upstream == "flashinfer#3329"
        assert r.remediation.action == "gdn-prefill-backend-triton"
        assert r.evidence["gdn_prefill_backend"] == "flashinfer (spec)"
    else:
        assert r.signature == "engine-rpc-timeout" and r.upstream is None and "flashinfer#3329" in r.candidates


def test_log_fact_flashinfer_backend_names_the_hang() -> None:
    # the log itself says which GDN prefill kernel runs (vLLM's `Using %s GDN prefill kernel` line)
    head = (
        "(EngineCore pid=2906234) INFO 04-01 22:00:00 [model.py:531] Resolved architecture: Qwen3_5MoeForConditionalGeneration\n"
        "(EngineCore pid=2906234) INFO 04-01 22:00:01 [qwen_gdn_linear_attn.py:228] Using FlashInfer GDN prefill kernel (requested=auto, head_k_dim=128).\n"
    )
    r = classify_text(head + up("vllm-38916-qwen3.5-flashinfer-gdn-timeout.log"))
    assert r.upstream == "flashinfer#3329"
    assert r.evidence["family"] == "gdn-hybrid (log)"


def test_other_family_in_the_log_rules_out_a_gdn_issue() -> None:
    frames = (
        '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1927, in _update_states_after_model_execute\n'
        "    self.num_accepted_tokens_event.synchronize()\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
    )
    assert classify_text(frames).upstream == "vllm#41190"  # the frame alone is #41190's evidence
    gemma = "(APIServer pid=1) INFO 05-10 10:00:00 [model.py:531] Resolved architecture: Gemma4ForCausalLM\n"
    r = classify_text(gemma + frames)  # #41190's thread shows Gemma4 hitting the same frame: not this issue
    assert r.signature == "cuda-illegal-address" and r.upstream is None and "vllm#41190" in r.candidates


def test_spec_decode_off_rules_out_b1() -> None:
    from gdn_operator.api.load import parse_spec

    spec = parse_spec(
        {
            "model": {"uri": "hf://Qwen/Qwen3.5-27B"},
            "image": {"tag": "v0.17.1", "vllmVersion": "0.17.1"},
            "speculativeDecoding": {"enabled": False},
        }
    )
    text = up("vllm-34871-gdn-assert-message-only.log")
    assert classify_text(text).upstream == "vllm#36917"
    r = classify_text(text, evidence=Evidence.from_spec(spec))
    assert r.signature == "gdn-metadata-assert" and r.upstream is None and "vllm#36917" in r.candidates
    assert r.root_cause == "AssertionError: num_decodes: 1, num_spec_decodes: 2"


# ------------------------------------------------------------------------------------------------
# a frame alone is evidence (lower confidence)


def test_frame_alone_vllm_36122() -> None:
    r = classify_text(up("vllm-36122-gdn-assert-frame-only.log"))
    assert r.signature == "gdn-mixed-spec-decode-assert" and r.upstream == "vllm#36917"
    assert r.confidence == "probable"
    full = up("vllm-36122-gdn-assert-frame-only.log") + (
        "(Worker pid=357) (Worker_TP0 pid=357) ERROR 03-05 05:40:33 [multiproc_executor.py:880] AssertionError: num_decodes: 1, num_spec_decodes: 2\n"
    )
    r = classify_text(full)
    assert r.confidence == "exact" and r.root_cause == "AssertionError: num_decodes: 1, num_spec_decodes: 2"


def test_frame_alone_v2_runner_pr_38081() -> None:
    r = classify_text(up("vllm-38081-v2-runner-frame-cut-assert.log"))
    assert r.signature == "v2-runner-hybrid-kv-cache-assert" and r.confidence == "probable"


# ------------------------------------------------------------------------------------------------
# tails: no traceback header, ERROR-level exception lines, process end


SHUTDOWN = (
    "INFO:     Shutting down\n"
    "INFO:     Waiting for application shutdown.\n"
    "INFO:     Application shutdown complete.\n"
    "INFO:     Finished server process [6434]\n"
)
ACCESS = 'INFO:     10.0.146.90:32768 - "GET /health HTTP/1.1" 200 OK\n'


def test_error_exception_then_application_shutdown_is_a_crash() -> None:
    # an exception no signature knows (vllm#42911's ValueError, used here before, has its own since issue 36)
    exc = up("vllm-33450-trtllm-assertion-worker-tail.log")
    far = exc + ACCESS * (TAIL_LINES + 50)
    assert not classify_text(far).crashed  # the server kept answering: not this exception's death
    r = classify_text(far + SHUTDOWN)
    assert r.crashed and r.signature == "engine-error-exit" and r.generic
    assert r.root_cause.startswith("AssertionError: TRTLLM decode requires uniform") and r.root_cause_line == 3
    # a clean shutdown long after a logged-and-survived exception is not that exception's crash
    from gdn_operator.watch.signatures import END_WINDOW

    assert not classify_text(exc + ACCESS * (END_WINDOW + 10) + SHUTDOWN).crashed


def test_request_error_at_the_end_is_not_a_crash() -> None:
    # a request handler's ERROR exception (serving_chat.py) is not an engine death, even at the very end
    line = "(APIServer pid=1) ERROR 02-10 15:10:20 [serving_chat.py:193] ValueError: This model's maximum context length is 32768 tokens.\n"
    assert not classify_text(line).crashed
    assert not classify_text(line + SHUTDOWN).crashed
    assert not classify_text(
        up("vllm-5881-healthy-asgi-exception.log") + "AttributeError: 'NoneType' object has no attribute 'x'\n"
    ).crashed


@pytest.mark.parametrize("name", sorted({p.name for p in UP.glob("*.log")}))
def test_termination_message_tail_keeps_the_verdict(name: str) -> None:
    """FallbackToLogsOnError keeps the last 2048 bytes / 80 lines; the verdict must not change (a longer log
    than that is cut mid-line at the start)."""
    text = up(name)
    data = text.encode()[-2048:]
    msg = b"\n".join(data.split(b"\n")[-80:]).decode("utf-8", errors="replace")
    whole, tail = classify_text(text), classify_termination_message(msg)
    assert tail.crashed == whole.crashed
    assert tail.upstream in (None, whole.upstream)


# ------------------------------------------------------------------------------------------------
# speed guard (deterministic): steady-state serving lines must not reach the per-line Python code


def test_prefilter_skips_steady_state_noise() -> None:
    import gdn_log_noise

    cat = default_catalogue()
    gen = gdn_log_noise.serving_lines(seed=3)
    lines = [next(gen) for _ in range(20000)]
    passed = [l for l in lines if cat.scan_regex.search(l)]
    assert len(passed) / len(lines) < 0.01, passed[:5]


# ------------------------------------------------------------------------------------------------
# catalogue validation of the new fields


def _cat(**over):
    sig = {
        "id": "x",
        "title": "t",
        "kind": "runtime-crash",
        "upstream": "vllm#1",
        "priority": 1,
        "keywords": ["boom"],
        "match": ["boom"],
        "remediation": {"action": "investigate", "hint": "h"},
    }
    sig.update(over)
    return {"schema": 1, "signatures": [sig]}


@pytest.mark.parametrize(
    "over,needle",
    [
        ({"attribution": {"needs": {"family": "gdn-hybrid"}}}, "needs an 'upstream' and a 'parent'"),
        ({"attribution": {"needs": {"family": "llama"}}, "parent": "x"}, "unknown fact or value family: 'llama'"),
        ({"attribution": {"needs": {"spec_decode": True}}, "parent": "x"}, "spec_decode: True"),  # YAML `on` unquoted
        ({"attribution": {"versions": "~1"}, "parent": "x"}, "attribution.versions"),
        ({"parent": "nope", "attribution": {}}, "parent 'nope' is neither a signature nor a class"),
    ],
)
def test_attribution_validation(over, needle) -> None:
    with pytest.raises(CatalogueError, match=re.escape(needle)):
        parse_catalogue(_cat(**over), "t.yaml")


def test_every_attributed_signature_has_a_generic_fallback() -> None:
    cat = default_catalogue()
    for s in cat.signatures:
        if s.upstream and s.attribution is not None:
            parent = s.parent
            assert parent in cat.classes or cat.get(parent).upstream is None, s.id


# ------------------------------------------------------------------------------------------------
# gdnctl classify-log --spec / --vllm-version


def test_cli_spec_flag_names_the_issue(capsys) -> None:
    log = str(UP / "vllm-38916-qwen3.5-flashinfer-gdn-timeout.log")
    assert main(["classify-log", log, "--output", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["upstream"] is None and "flashinfer#3329" in doc["candidates"] and doc["attribution"]
    assert main(["classify-log", log, "--output", "json", "--spec", str(SPECS / "qwen3.5-35b-flashinfer-gdn-tp2.yaml")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["upstream"] == "flashinfer#3329" and doc["evidence"]["vllm_version"] == "0.21.0 (spec)"
    assert (
        main(["classify-log", log, "--spec", str(SPECS / "qwen3.5-35b-flashinfer-gdn-tp2.yaml"), "--vllm-version", "0.25.0"]) == 0
    )
    out = capsys.readouterr().out
    assert "vllm_version=0.25.0 (spec)" in out and "upstream:    flashinfer#3329" in out


def test_cli_text_lists_candidates(capsys) -> None:
    assert main(["classify-log", str(UP / "vllm-8978-nccl-watchdog-llama-vision-hang.log")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CRASH: nccl-watchdog-timeout") and "upstream:" not in out
    assert "candidates:  flashinfer#3329" in out and "[investigate]" in out


def test_cli_bad_spec_exits_2_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: serving.gdn-operator.io/v1alpha1\nkind: GDNModelServer\nmetadata: {name: x}\nspec: {model: {}}\n")
    assert main(["classify-log", str(UP / "vllm-8978-nccl-watchdog-llama-vision-hang.log"), "--spec", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    with pytest.raises(ManifestError):
        Evidence.from_manifest(str(tmp_path / "missing.yaml"))


def test_cli_help_documents_the_flags(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["classify-log", "--help"])
    out = capsys.readouterr().out
    assert "--spec MANIFEST" in out and "--vllm-version X" in out and "evidence" in out


def test_fact_scan_cut_is_the_same_in_line_and_block_mode(monkeypatch) -> None:
    """After FACT_SCAN_LINES lines (or once every fact is known) fact-only lines are skipped (speed); the cut
    falls on the same line however the text is split, so line mode and block mode agree."""
    import gdn_operator.watch.signatures as sigmod

    monkeypatch.setattr(sigmod, "FACT_SCAN_LINES", 7)
    lines = (
        ["x"] * 5
        + ["(APIServer pid=1) INFO 03-18 08:50:31 [model.py:531] Resolved architecture: LlamaForCausalLM"]
        + ["y"] * 3
        + [
            "INFO 03-18 08:50:31 [api_server.py:972] vLLM API server version 0.8.0rc3.dev6+g53a0cf8b",  # vllm#15016
            "RuntimeError: CUDA error: an illegal memory access was encountered",
        ]
    )
    one = sigmod.LogClassifier()
    one.feed_lines(lines)
    assert one.facts == {"family": "other"}  # the version line came after the cut
    for cut in range(1, len(lines)):
        two = sigmod.LogClassifier()
        two.feed_text("\n".join(lines[:cut]) + "\n")
        two.feed_text("\n".join(lines[cut:]) + "\n")
        assert two.result().to_dict() == one.result().to_dict(), cut
    monkeypatch.setattr(sigmod, "FACT_SCAN_LINES", 50)
    assert classify_text("\n".join(lines)).evidence["vllm_version"] == "0.8.0rc3.dev6+g53a0cf8b (log)"


def test_remediation_ladder_validation_and_data() -> None:
    bad = _cat(
        upstream=None, remediation={"action": "disable-spec-decode", "hint": "h", "ladder": [{"action": "pray", "reason": "r"}]}
    )
    with pytest.raises(CatalogueError, match=re.escape("remediation.ladder[0]: needs 'action'")):
        parse_catalogue(bad, "t.yaml")
    bad = _cat(
        upstream=None,
        remediation={
            "action": "disable-spec-decode",
            "hint": "h",
            "ladder": [{"action": "disable-async-scheduling", "reason": "r", "min_tp": 0}],
        },
    )
    with pytest.raises(CatalogueError, match="min_tp"):
        parse_catalogue(bad, "t.yaml")
    # issue 18: the TP spec-decode illegal-address signatures keep MTP on before disabling it
    cat = default_catalogue()
    for sid in ("cuda-illegal-address-accepted-sync", "cuda-illegal-address-worker-execute"):
        rem = cat.get(sid).remediation
        assert rem.action == "disable-spec-decode"
        assert [s.action for s in rem.ladder] == ["drop-nccl-p2p-disable", "disable-async-scheduling"]
        assert all(s.min_tp == 2 and s.reason for s in rem.ladder)


# ------------------------------------------------------------------------------------------------
# issue 36: vllm#52069's start-up error names no model; the spec decides whether it is that issue


def test_pp_drafter_error_is_vllm_52069_only_for_a_gdn_hybrid_with_mtp_before_0_30() -> None:
    from gdn_operator.watch.evidence import Evidence

    line = (
        "(EngineCore pid=1) ERROR 08-12 10:00:00 [core.py:1100] NotImplementedError: Pipeline parallelism is not "
        "supported for this model. Supported models implement the `SupportsPP` interface.\n"
    )
    hit = classify_text(line, evidence=Evidence({"family": "gdn-hybrid", "spec_decode": "on"}, "0.26.0"))
    assert hit.crashed and hit.signature == "mtp-drafter-not-supportspp" and hit.upstream == "vllm#52069"
    for facts, version in (
        ({"family": "gdn-hybrid", "spec_decode": "on"}, "0.30.0"),  # PR #46994 released
        ({"family": "gdn-hybrid", "spec_decode": "off"}, "0.26.0"),  # no drafter: the target model's own PP
        ({"family": "other", "spec_decode": "on"}, "0.26.0"),
    ):
        other = classify_text(line, evidence=Evidence(facts, version))
        assert other.crashed and other.signature == "pp-unsupported-model" and other.upstream is None, (facts, version)
        assert "vllm#52069" in other.candidates
