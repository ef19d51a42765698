"""MTP under pipeline parallelism (issue 36 sweep, U1 = vllm#44697, U2 = vllm#52069): both sides of each rule.

The ranges come from the release wheels (rules.yaml evidence): before 0.30.0 no runner starts a Qwen3.5 MTP head
under PP (the draft config copied the target's PP, Qwen3_5MTP lacked SupportsPP: vllm#52069); from 0.30.0 the V2
runner carries PR #46994 while the V1 runner still diverges silently (RFC vllm#44697, fix PR #44698 open);
Qwen3-Next's head (Qwen3NextMTP) asserts on the last stage in every release read.
"""

from __future__ import annotations

from typing import Any

import pytest
from rules_helpers import mk, rules_of

from gdn_operator.rules.evaluator import evaluate
from gdn_operator.rules.launchline import evaluate_launch

QWEN35 = "hf://Qwen/Qwen3.5-397B-A17B"
QWEN3_NEXT = "hf://Qwen/Qwen3-Next-80B-A3B-Instruct"


def _pp(pp: int = 2, **fields: Any) -> dict[str, Any]:
    """Two nodes of 8 GPUs per engine: TP=8 x PP=2, or TP=16 x PP=1."""
    return {
        "tensorParallelSize": 16 // pp,
        "pipelineParallelSize": pp,
        "nodes": 2,
        "resources": {"gpusPerNode": 8},
        **fields,
    }


@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.33.0"])
def test_v1_runner_with_pp_and_mtp_is_refused_where_the_v2_runner_is_fixed(version):
    ev = evaluate(mk(version, QWEN35, **_pp(modelRunner="v1")))
    assert "vllm#44697" in rules_of(ev, "rejected")
    assert "vllm#52069" not in rules_of(ev)
    f = next(f for f in ev.findings if f.rule == "vllm#44697")
    assert "spec.pipelineParallelSize" in f.fields and "PR #46994" in f.message


@pytest.mark.parametrize("version", ["0.30.0", "0.33.0"])
def test_mitigate_policy_moves_pp_mtp_to_the_v2_runner(version):
    ev = evaluate(mk(version, QWEN35, **_pp(modelRunner="v1")), policy="mitigate")
    assert "vllm#44697" in rules_of(ev, "mitigated")
    assert ev.run_spec is not None and ev.run_spec.model_runner == "v2"
    assert ev.run_spec.speculative_decoding.enabled  # MTP stays on


@pytest.mark.parametrize(
    "version, fields",
    [
        ("0.33.0", _pp()),  # unset runner: V2 from 0.29.0, fixed from 0.30.0
        ("0.30.0", _pp(modelRunner="v2")),
        ("0.33.0", _pp(1, modelRunner="v1")),  # one stage: no PP
        ("0.33.0", _pp(modelRunner="v1", speculativeDecoding={"enabled": False})),
    ],
)
def test_no_pp_mtp_finding_without_the_trigger(version, fields):
    ev = evaluate(mk(version, QWEN35, **fields))
    assert not {"vllm#44697", "vllm#52069"} & rules_of(ev), [f.rule for f in ev.findings]


@pytest.mark.parametrize("version", ["0.25.0", "0.27.0", "0.29.0"])
@pytest.mark.parametrize("runner", ["v1", "v2", None])
def test_no_runner_starts_the_qwen35_mtp_head_under_pp_before_0_30(version, runner):
    fields = _pp() if runner is None else _pp(modelRunner=runner)
    ev = evaluate(mk(version, QWEN35, **fields))
    assert "vllm#52069" in rules_of(ev, "rejected")
    assert "vllm#44697" not in rules_of(ev)  # one finding per cause: the V1 rule starts where V2 is fixed


def test_pp1_across_nodes_before_0_30_is_not_refused_for_pp():
    ev = evaluate(mk("0.29.0", QWEN35, **_pp(1)))
    assert not {"vllm#44697", "vllm#52069"} & rules_of(ev)


@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.33.0"])
def test_qwen3_next_mtp_head_under_pp_is_refused_in_every_release(version):
    ev = evaluate(mk(version, QWEN3_NEXT, **_pp(modelRunner="v2")))
    assert "vllm#52069" in rules_of(ev, "rejected")
    ok = evaluate(mk(version, QWEN3_NEXT, **_pp(1, modelRunner="v2")))
    assert "vllm#52069" not in rules_of(ok)


def test_no_default_turns_mtp_off_for_pp():
    """Unset means safe, but a default never turns MTP off: U2 stays a refusal naming the fix."""
    ev = evaluate(mk("0.29.0", QWEN35, **_pp()))
    assert ev.run_spec is None and "vllm#52069" in rules_of(ev, "rejected")
    assert "pipelineParallelSize 1" in ev.denial_message()


# vllm#36643's own launch line (Qwen3.5-35B-A3B, PP=4, qwen3_next_mtp k=2; reported 2026-03-10, vLLM 0.17.x),
# then the same line with one stage: the healthy control.
LINE_36643 = [
    "python3", "-m", "vllm.entrypoints.openai.api_server",
    "--served-model-name", "Qwen3.5-35B-A3B", "--model", "/athena/Qwen3.5-35B-A3B",
    "--gpu-memory-utilization", "0.9", "--tensor-parallel-size", "1", "--pipeline-parallel-size", "4",
    "--moe-backend", "marlin", "--max-model-len", "160000", "--max-num-batched-tokens", "4096",
    "--max-num-seqs", "32", "--distributed-executor-backend", "ray", "--enable-log-requests",
    "--enable-log-outputs", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
    "--enable-prefix-caching", "--reasoning-parser", "qwen3",
    "--speculative-config", '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
]  # fmt: skip


def _line(pp: str) -> list[str]:
    out = list(LINE_36643)
    out[out.index("--pipeline-parallel-size") + 1] = pp
    return out


@pytest.mark.parametrize("version", ["0.18.0", "0.26.0"])
def test_reported_launch_line_36643_and_its_healthy_control(version):
    _, ev = evaluate_launch(_line("4"), vllm_version=version, architecture="Qwen3_5MoeForConditionalGeneration")
    assert "vllm#52069" in rules_of(ev, "rejected")
    _, ok = evaluate_launch(_line("1"), vllm_version=version, architecture="Qwen3_5MoeForConditionalGeneration")
    assert "vllm#52069" not in rules_of(ok)
    assert "vllm#43559" in rules_of(ok)  # the line's prefix caching + MTP is still refused, for its own reason


# ------------------------------------------------------------------------------------------------ U3 --
OFFLOAD = ["--kv-offloading-size", "64"]
NIXL = ["--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']


@pytest.mark.parametrize("version", ["0.17.0", "0.20.0", "0.21.0"])
@pytest.mark.parametrize("args", [OFFLOAD, NIXL], ids=["offloading", "nixl"])
def test_a_kv_connector_on_a_gdn_hybrid_before_0_22_is_refused(version, args):
    ev = evaluate(mk(version, extraArgs=args))
    assert "vllm#41830" in rules_of(ev, "rejected"), [f.message for f in ev.findings]
    f = next(f for f in ev.findings if f.rule == "vllm#41830")
    assert "spec.extraArgs" in f.fields and "0.22.0" in f.message


@pytest.mark.parametrize("version", ["0.22.0", "0.26.0", "0.33.0"])
def test_a_kv_connector_from_0_22_is_not_refused_for_hma(version):
    ev = evaluate(mk(version, extraArgs=NIXL))
    assert "vllm#41830" not in rules_of(ev)


def test_no_kv_connector_no_hma_finding():
    assert "vllm#41830" not in rules_of(evaluate(mk("0.21.0")))
