"""hack/dev.sh --real-engine [NAME]: which server the real engine attaches to, and the explanation when
none qualifies (issue 27: it used to take the first applied server, `autoscaled.yaml`, which never got a pod).
The choice is pure (hack/dev_engine.py); the real run is tests/hack/test_dev_cluster.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack"))
from dev_engine import Candidate, api_serving_pod, choose_target, order_candidates  # noqa: E402

from builders import EnginePod  # noqa: E402

OK = {"type": "Validated", "status": "True", "reason": "Admitted"}
MISSING_LWS = {
    "type": "Validated",
    "status": "False",
    "reason": "MissingAPI",
    "message": "spec.nodes 2 needs the LeaderWorkerSet API",
}


def cands() -> list[Candidate]:
    # file order, as dev mode applies examples/*.yaml
    return [
        Candidate("default", "qwen35-27b-autoscaled", "autoscaled.yaml", validated=OK),
        Candidate(
            "default",
            "qwen36-35b-a3b",
            "denied-qwen3.6-prefix-caching-mtp.yaml",
            refused="admission webhook denied the request: ... vllm#43559",
        ),
        Candidate("default", "qwen35-27b", "qwen3.5-27b-mtp.yaml", validated=OK, pod="qwen35-27b-abc", ip="127.0.0.9"),
        Candidate("default", "qwen35-397b", "qwen3.5-397b-a17b-2node.yaml", validated=MISSING_LWS),
    ]


def test_flagship_comes_first_whatever_the_file_order():
    ordered = order_candidates(cands(), None, "qwen35-27b")
    assert [c.name for c in ordered] == ["qwen35-27b", "qwen35-27b-autoscaled", "qwen36-35b-a3b", "qwen35-397b"]
    target, skipped = choose_target(ordered, 60)
    assert target is not None and target.name == "qwen35-27b" and skipped == []


def test_without_a_qualifying_flagship_the_next_admitted_server_with_a_pod_is_taken():
    cs = cands()
    cs[2].ip = cs[2].pod = ""  # the flagship has no pod
    cs[0].pod, cs[0].ip = "qwen35-27b-autoscaled-x", "127.0.0.4"
    target, skipped = choose_target(order_candidates(cs, None, "qwen35-27b"), 60)
    assert target is not None and target.name == "qwen35-27b-autoscaled"
    assert skipped == ["default/qwen35-27b (qwen3.5-27b-mtp.yaml): admitted, but no engine pod with an IP after 60s"]


def test_no_qualifying_server_names_each_one_and_why():
    cs = cands()
    cs[2].ip = ""
    target, skipped = choose_target(order_candidates(cs, None, "qwen35-27b"), 30)
    assert target is None
    text = "\n".join(skipped)
    assert len(skipped) == 4
    assert "default/qwen35-27b (qwen3.5-27b-mtp.yaml): admitted, but no engine pod with an IP after 30s" in text
    assert "default/qwen36-35b-a3b (denied-qwen3.6-prefix-caching-mtp.yaml): refused at admission: " in text
    assert "vllm#43559" in text
    assert (
        "default/qwen35-397b (qwen3.5-397b-a17b-2node.yaml): not admitted: Validated=False (MissingAPI): "
        "spec.nodes 2 needs the LeaderWorkerSet API"
    ) in text


def test_a_named_server_is_the_only_one_considered():
    ordered = order_candidates(cands(), "qwen35-397b", "qwen35-27b")
    assert [c.ref for c in ordered] == ["default/qwen35-397b"]
    target, skipped = choose_target(ordered, 60)
    assert target is None and len(skipped) == 1 and "MissingAPI" in skipped[0]
    assert [c.name for c in order_candidates(cands(), "default/qwen35-27b", "x")] == ["qwen35-27b"]


def test_an_unknown_name_lists_the_applied_servers():
    err = order_candidates(cands(), "nope", "qwen35-27b")
    assert isinstance(err, str) and "'nope'" in err and "default/qwen35-27b-autoscaled" in err


def test_observe_runs_lazily_in_order():
    seen = []

    def observe(c):
        seen.append(c.name)
        return c

    choose_target(order_candidates(cands(), None, "qwen35-27b"), 60, observe=observe)
    assert seen == ["qwen35-27b"]  # the flagship qualified: nobody else was waited for


def test_api_serving_pod_is_a_group_leader_with_an_ip():
    pods = [EnginePod("g-0-1").worker(1).ip("127.0.0.3"), EnginePod("g-0").worker(0).ip("127.0.0.2"), EnginePod("a")]
    assert api_serving_pod([p.client() for p in pods]) == ("g-0", "127.0.0.2")
    deleting = [EnginePod("d-1").ip("127.0.0.5").deleting(), EnginePod("d-2").ip("127.0.0.6")]
    assert api_serving_pod([p.client() for p in deleting]) == ("d-2", "127.0.0.6")
    assert api_serving_pod([EnginePod("w").worker(1).ip("127.0.0.3").client()]) == ("", "")


@pytest.mark.readme("hack/dev.sh --help")
def test_help_documents_sigterm_and_the_flags():
    """`hack/dev.sh --help` answers without building anything and says how to stop a background run."""
    res = subprocess.run(["bash", str(REPO / "hack" / "dev.sh"), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = " ".join(res.stdout.split())
    assert "usage: hack/dev.sh" in out
    assert "--real-engine [NAME]" in out and "--real-engine-broken-mtp [NAME]" in out and "--exit-after" in out
    assert "kill -TERM <pid>" in out and "background" in out and "SIGINT" in out
    assert "[build.sh]" not in res.stderr  # no control-plane build for --help
