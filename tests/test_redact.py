"""Credential-looking text is redacted before it is copied into status, Events or messages (issue 11 §5)."""

import pytest

from gdn_operator.handlers.core import conditions as st
from gdn_operator.redact import MASK, redact
from gdn_operator.rules import evaluate
from gdn_operator.api.load import parse_spec


@pytest.mark.parametrize(
    "text, secret",
    [
        ("OSError: 401 for url with token hf_AbCdEfGhIjKlMnOpQrStUv", "hf_AbCdEfGhIjKlMnOpQrStUv"),
        ("Authorization: Bearer abc.def-ghi_123", "abc.def-ghi_123"),
        ("HF_TOKEN=supersecretvalue123 python -m vllm", "supersecretvalue123"),
        ('{"api_key": "k-12345678901234567890"}', "k-12345678901234567890"),
        ("password: hunter2hunter2", "hunter2hunter2"),
        ("OPENAI key sk-proj-abcdefghijklmnopqrstuvwxyz", "sk-proj-abcdefghijklmnopqrstuvwxyz"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
        ("AWS AKIAABCDEFGHIJKLMNOP used", "AKIAABCDEFGHIJKLMNOP"),
        ("jwt eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4f", "eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4f"),
    ],
)
def test_credentials_are_redacted(text, secret):
    out = redact(text)
    assert secret not in out and MASK in out


@pytest.mark.parametrize(
    "text",
    [
        "AssertionError: num_decodes: 1, num_spec_decodes: 4",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.",
        "max_num_batched_tokens (2048) is smaller than max_model_len (8192)",
    ],
)
def test_ordinary_crash_lines_are_untouched(text):
    assert redact(text) == text


def test_condition_messages_are_redacted():
    status: dict = {}
    st.set_condition(status, st.DEGRADED, True, "EngineCrashed", "died: 401 token hf_AbCdEfGhIjKlMnOpQrStUv", 1)
    assert "hf_AbCd" not in status["conditions"][0]["message"]


def test_findings_never_echo_env_values():
    spec = parse_spec(
        {
            "model": {"uri": "hf://Qwen/Qwen3.5-27B"},
            "image": {"tag": "v0.19.1", "vllmVersion": "0.19.1"},
            "tensorParallelSize": 2,
            "env": [{"name": "NCCL_P2P_DISABLE", "value": "1"}, {"name": "MY_SECRET", "value": "s3cr3t-value"}],
        }
    )
    ev = evaluate(spec, default_policy="warn")
    text = " ".join(f.message for f in ev.findings)
    assert "s3cr3t-value" not in text
    env_findings = [f for f in ev.findings if any(p.startswith("spec.env") for p in f.fields)]
    assert env_findings, [f.rule for f in ev.findings]
    assert all("env MY_SECRET, NCCL_P2P_DISABLE set" in f.message for f in env_findings)  # names, no values


def test_guard_findings_are_redacted_in_status_policy_reports_and_problems():
    """Issue 48: a GDNGuard's crash findings copied engine log text into its status and PolicyReports unredacted
    (`token=hf_...` passed through). Findings are redacted where they are made (guardstatus.Finding), so status,
    the PolicyReport, Events and log lines, which all take the finding's message, carry no credential."""
    from gdn_operator.handlers.guard.status import Finding, WorkloadView, compose, policy_report

    leak = "hf_AbCdEfGhIjKlMnOpQrStUv"
    f = Finding("CrashDiagnosed", f"engine died: OSError: 401 for url ?token={leak}", "2026-01-01T00:00:00Z", "x", "p-0", 1)
    assert leak not in f.message and MASK in f.message
    view = WorkloadView(
        "Deployment", "d", "0.33.0", "imageTag", 1, [f], None, [f"launch line of p-0 not read: --hf-token={leak}"]
    )
    status = compose({}, [view], 1, [])
    report = policy_report("ns", [("g", {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}, f)], 0)
    for text in (repr(status), repr(report)):
        assert leak not in text and MASK in text
