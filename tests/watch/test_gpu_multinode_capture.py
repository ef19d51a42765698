"""Multi-node on real vLLM (issue 25 item 5): the capture of ``hack/gpu/session.sh multinode``
(hack/gpu/multinode.py) in tests/fixtures/vllm-0.22.0-h100x2-multinode.

Committed after the GPU run; a missing folder fails the tests. Checks that the group ran
the launch lines render/lws.py produces today (multi-node and parallel flags, leader vs headless worker),
that it answered exactly with MTP accepting, that the stall detector stayed quiet on the healthy group,
that the logs show a real two-node group (leader rank 0, headless rank 1), and that the crash watch's group
counting over the recorded deaths is what watch/groups.py says today.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "fixtures" / "vllm-0.22.0-h100x2-multinode"
REPO = ROOT.parent

MULTINODE_FLAGS = (
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--speculative-config",
)


@pytest.fixture(scope="module")
def result() -> dict:
    return json.loads((CAPTURE / "multinode.json").read_text())


def _flags(argv: list[str]) -> dict[str, str | bool]:
    out: dict[str, str | bool] = {f: argv[argv.index(f) + 1] for f in MULTINODE_FLAGS if f in argv}
    out["--headless"] = "--headless" in argv
    return out


def test_the_group_ran_what_the_renderer_renders_today(result):
    sys.path.insert(0, str(REPO / "hack" / "gpu"))
    sys.path.insert(0, str(ROOT / "gpu"))
    import multinode  # renders with gdnctl, as on the GPU host

    today = multinode.launch_lines()
    for role in ("leader", "worker"):
        ran = result["launch"][role]
        assert _flags(ran["rendered_args"]) == _flags(today[role]["rendered_args"]), role
        assert ran["args"][ran["args"].index("--master-addr") + 1] == "127.0.0.1"
        assert ran["args"][ran["args"].index("--node-rank") + 1] == ("0" if role == "leader" else "1")
    assert result["launch"]["worker"]["args"][-1] == "--headless" and "--headless" not in result["launch"]["leader"]["args"]


def test_recall_is_exact_and_mtp_accepts_across_two_nodes(result):
    rc = result["recall"]
    assert rc["requests"] >= 32 and rc["exact"] == rc["requests"]
    acc = result["acceptance"]
    assert acc["draft_tokens"] > 0 and acc["acceptance_rate"] >= 0.6


def test_stall_detector_stays_quiet_on_the_healthy_group(result):
    assert result["healthy_phase"]["flagged"] is False
    assert result["healthy_phase"]["flagged_samples"] == 0


def test_logs_show_a_two_node_group():
    leader = (CAPTURE / "multinode-leader.log").read_text()
    worker = (CAPTURE / "multinode-worker.log").read_text()
    assert "DP group leader: node_rank=0" in leader
    assert "headless multiproc executor" in worker


def test_group_counting_over_the_recorded_deaths_matches_the_crash_watch(result):
    from gdn_operator.watch.groups import GROUP_INCIDENT_SECONDS, same_incident

    cw = result["crash_watch"]
    deaths = cw["deaths"]
    assert result["worker_exit"] == -9 and deaths[0]["pod"].endswith("-1")  # the worker died first, killed
    assert cw["classifications"][deaths[0]["pod"]]["signature"]
    counted, prev = 0, None
    for d in deaths:
        incident = prev is not None and same_incident(prev, cw["group"], d["pod"], 1, d["finished"])
        assert incident == d["same_incident"]
        counted += not incident
        prev = {
            "time": d["finished"],
            "pod": d["pod"],
            "group": cw["group"],
            "generation": 1,
            "signature": d["effective_signature"],
            "incidentPods": [d["pod"]],
        }
    assert counted == cw["crashes_counted"] and cw["window_s"] == GROUP_INCIDENT_SECONDS
