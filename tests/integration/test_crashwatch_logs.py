"""The crash watch's log path on the real API server: kwok serves `kubectl logs` of the fake engine pods
from files (ClusterLogs), the operator follows them through pods/log, reads the gdn-guard start-up line
(patch-set check against spec.image.patches), and classifies the streamed log, which wins over an
uninformative termination message."""

from __future__ import annotations

from pathlib import Path

import pytest

from paths import SHARED
from operator_harness import gms, running_operator, wait_for

ROOT = Path(__file__).resolve().parents[2]
STARTUP = SHARED / "fixtures" / "vllm-0.32.0-cpu" / "serve-startup-mtp2.log"  # GDN_SHARED_DIR honoured
B1_TAIL = ROOT / "tests" / "fixtures" / "logs" / "b1-gdn-assert-tp2-interleaved.tail.log"


def cri(lines: list[str]) -> str:
    """Container runtime log format, as the kubelet (here kwok) reads it."""
    return "".join(f"2026-11-22T10:00:{i % 60:02d}.000000000Z stdout F {ln}\n" for i, ln in enumerate(lines))


def guard_line(version: str, ids: list[str]) -> str:
    guards = ["spec-decode-uniform-batch"] if ids else []
    return (
        f"(EngineCore_DP0 pid=812) INFO 11-22 10:00:01 [plugin.py:115] gdn-guard 0.1.0: vLLM {version}, "
        f"active guards: [{', '.join(guards)}], patch ids: [{', '.join(ids)}]"
    )


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-logs")) as proc:
        yield proc


def startup_lines() -> list[str]:
    return STARTUP.read_text(errors="replace").splitlines()[:60]


def test_declared_patch_missing_from_the_engine_is_flagged(op, k, ns, full_cluster, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(cri(startup_lines()[:20] + [guard_line("0.33.0", [])] + startup_lines()[20:]))
    full_cluster.serve_pod_logs(ns, log, containers=["vllm"])
    k.create(ns, gms("claims", image={"patches": ["gdn-guard/vllm-36917"]}))
    cond = k.wait_condition(ns, "claims", "PatchSetVerified", "False", timeout=60)
    assert cond["reason"] == "PatchSetMismatch" and "gdn-guard/vllm-36917" in cond["message"]
    assert k.condition(ns, "claims", "Degraded")["reason"] == "PatchSetMismatch"
    assert wait_for(lambda: k.events(ns, "claims", "PatchSetMismatch"), 15)


def test_matching_patch_set_is_verified(op, k, ns, full_cluster, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(cri(startup_lines()[:20] + [guard_line("0.33.0", [])] + startup_lines()[20:]))
    full_cluster.serve_pod_logs(ns, log, containers=["vllm"])
    k.create(ns, gms("honest"))
    cond = k.wait_condition(ns, "honest", "PatchSetVerified", "True", timeout=60)
    assert "vLLM 0.33.0" in cond["message"]


def test_streamed_log_gives_the_diagnosis_when_the_termination_message_does_not(op, k, ns, full_cluster, tmp_path):
    log = tmp_path / "engine.log"
    log.write_text(cri(startup_lines() + B1_TAIL.read_text().splitlines()))
    full_cluster.serve_pod_logs(ns, log, containers=["vllm"])
    k.create(ns, gms("streamed", remediation={"mode": "none"}))
    pod = wait_for(lambda: next((p for p in k.engine_pods(ns, "streamed") if p.status.phase == "Running"), None), 90)
    # the follower reads the log while the container runs; wait until it has fetched it
    wait_for(lambda: f"pods/{pod.metadata.name}/log" in op.log_tail(400), 30, what="operator followed the log")
    k.core.patch_namespaced_pod(
        pod.metadata.name,
        ns,
        {
            "metadata": {
                "annotations": {
                    "gdn-operator.io/test-crash-message": "container exited",
                    "gdn-operator.io/test-crash-exit-code": "1",
                }
            }
        },
    )
    lc = wait_for(lambda: k.status(ns, "streamed").get("lastCrash"), 30, what="lastCrash")
    assert lc["signature"] == "gdn-mixed-spec-decode-assert" and lc["upstream"] == "vllm#36917"
