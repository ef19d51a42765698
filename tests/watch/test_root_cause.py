"""The root cause is the line that says what went wrong (issue 26): pydantic's message under its header,
a message on the line after `RuntimeError:`, the first exception of a chain, and prefix forms seen in real
upstream text (a worker prefix without pid, a bare level, a leading Markdown backtick).

Real whole logs of these kinds are in tests/fixtures/logs/upstream (vllm-ascend#4206, vllm#26161,
vllm#41190, sglang#38793); the texts below are shaped like them, each cut to what the case needs.
"""

from __future__ import annotations

import pytest

from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.prefixes import parse_line
from gdn_operator.watch.signatures import LogClassifier, classify_text

PYDANTIC_FIELD = """\
Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 1400, in create_engine_config
pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig
num_speculative_tokens
  Input should be greater than 0 [type=greater_than, input_value=0, input_type=int]
    For further information visit https://errors.pydantic.dev/2.12/v/greater_than
"""

NEXT_LINE = """\
(Worker_TP1) ERROR Traceback (most recent call last):
(Worker_TP1) ERROR RuntimeError:
(Worker_TP1) ERROR   npu_fusion_attention: NPU function error: call aclnnFlashAttentionVarLenScore failed, error code is 161001
(EngineCore_DP0 pid=9) ERROR 01-02 03:04:05 [core.py:1] EngineCore encountered a fatal error.
"""

CHAINED = """\
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] EngineCore failed to start.
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700]   File "/v/vllm/model_executor/models/qwen3_5.py", line 900, in load_weights
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] KeyError: 'layers.0.linear_attn.A_log'
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700]
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] The above exception was the direct cause of the following exception:
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700]
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] Traceback (most recent call last):
(EngineCore_DP0 pid=7) ERROR 05-01 10:00:00 [core.py:700] RuntimeError: Failed to load weights of Qwen3_5ForConditionalGeneration
(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""


def test_pydantic_root_is_the_message_not_the_header() -> None:
    r = classify_text(PYDANTIC_FIELD)
    assert r.crashed and r.root_cause == "Input should be greater than 0"
    assert r.root_cause_line == 5


def test_message_on_the_line_after_the_exception_type() -> None:
    r = classify_text(NEXT_LINE)
    assert r.crashed
    assert r.root_cause.startswith("RuntimeError: npu_fusion_attention: NPU function error"), r.root_cause
    assert r.root_cause_line == 2


def test_chained_exception_root_is_the_cause() -> None:
    r = classify_text(CHAINED)
    assert r.crashed and r.signature == "engine-dead"
    assert r.root_cause == "KeyError: 'layers.0.linear_attn.A_log'" and r.root_cause_line == 4


def test_a_later_unrelated_exception_is_not_chained() -> None:
    text = CHAINED.replace("The above exception was the direct cause of the following exception:", "(retrying)")
    r = classify_text(text)
    assert r.root_cause.startswith("RuntimeError: Failed to load weights")


@pytest.mark.parametrize("text", [PYDANTIC_FIELD, NEXT_LINE, CHAINED])
def test_line_by_line_feeding_gives_the_same_root(text: str) -> None:
    whole = classify_text(text)
    c = LogClassifier()
    for ln in text.split("\n"):
        c.feed_line(ln)
    r = c.result()
    assert (r.root_cause, r.root_cause_line) == (whole.root_cause, whole.root_cause_line)


def test_message_split_across_fed_chunks() -> None:
    lines = PYDANTIC_FIELD.split("\n")
    c = LogClassifier()
    c.feed_text("\n".join(lines[:3]) + "\n")
    c.feed_text("\n".join(lines[3:]))
    assert c.result().root_cause == "Input should be greater than 0"


@pytest.mark.parametrize(
    ("raw", "level", "payload"),
    [
        ("(Worker_TP1) ERROR RuntimeError: boom", "ERROR", "RuntimeError: boom"),
        ("(Worker_TP1) ERROR [multiproc_executor.py:962] x", "ERROR", "x"),
        ("`(EngineCore_DP0 pid=1) ERROR 01-02 10:00:00 [core.py:1] ValueError: x`", "ERROR", "ValueError: x"),
        ("`AssertionError: initial_state must be float32`", None, "AssertionError: initial_state must be float32"),
        ("(most recent call last)", None, "(most recent call last)"),
        ("(Worker_TP1) INFO hello", "INFO", "hello"),
    ],
)
def test_prefix_forms(raw: str, level: str | None, payload: str) -> None:
    p = parse_line(raw)
    assert (p.level, p.payload) == (level, payload)


def test_frames_reveal_the_family_and_a_disagreeing_spec_is_reported() -> None:
    r = classify_text(CHAINED)
    assert r.evidence["family"] == "gdn-hybrid (log)"  # the qwen3_5.py frame
    ev = Evidence({"family": "other"}, None, "spec")
    r = classify_text(CHAINED, evidence=ev)
    assert any("family: the log says gdn-hybrid, the spec says other" in n for n in r.attribution), r.attribution
