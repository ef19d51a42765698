"""The live monitoring test (issue 28; the body is monitoring_live_body.py), run inside a private network
namespace that this test makes for it.

The chart's ServiceMonitor reaches the operator through its metrics Service's EndpointSlice, and the API server
refuses loopback addresses there, so the operator's kwok pod needs a non-loopback address. Rather than use an
address of the machine, the body runs in `unshare -n` — a network namespace with nothing but `lo` — with
10.254.0.2/32 added to that `lo`: the whole run (control plane, operator, vLLM engines, Prometheus Operator,
Prometheus) lives and talks inside it, and nothing can leave it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.monitoring, pytest.mark.timeout(1800)]

HERE = Path(__file__).resolve().parent
SERVICE_HOST_IP = "10.254.0.2"  # on the namespace's own lo; nothing routes anywhere from there
SERVICE_HOST_ENV = "GDN_TEST_SERVICE_HOST_IP"  # read by monitoring_live_body.py


def test_monitoring_stack_live_in_its_own_network_namespace(tmp_path):
    assert shutil.which("unshare") and shutil.which("ip"), "the live monitoring test needs util-linux unshare and iproute2 ip"
    setup = f'ip link set lo up && ip addr add {SERVICE_HOST_IP}/32 dev lo && exec "$0" "$@"'
    cmd = [
        "unshare",
        "-n",
        "--",
        "sh",
        "-c",
        setup,
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rA",
        f"--basetemp={tmp_path / 'body'}",
        str(HERE / "monitoring_live_body.py"),
    ]
    env = {**os.environ, SERVICE_HOST_ENV: SERVICE_HOST_IP}
    res = subprocess.run(cmd, env=env, cwd=HERE.parents[1], capture_output=True, text=True, timeout=1700)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-20000:]
    # pytest's closing line ("5 passed in 100.69s"), the last of its stdout that names a count
    summary = next((ln for ln in reversed(res.stdout.splitlines()) if re.search(r"\d+ (passed|failed|error)", ln)), "")
    # every test of the body ran and passed: no skip, no deselection hiding one
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, out[-5000:]
