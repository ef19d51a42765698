"""bench/bench_heap.py's operator-side instruments (issue 49 item 6), in a child process like the bench's operators:
its sitecustomize wraps the tree's settle_heap and records what it did, runs another tree that has none as it ships,
and on SIGUSR1 writes the census: the heaps, what a full collection would free, the Kubernetes objects held."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import bench_heap  # noqa: E402

#: the child: settle as __main__ would, leave a cycle holding a server body (what kopf's event views leave to the
#: full collection), then ask for the census
CHILD = """
import os, signal, sys, time
try:
    from gdn_operator.handlers.core.heap import settle_heap
    settle_heap()
except ModuleNotFoundError:
    pass
body = {"apiVersion": "serving.gdn-operator.io/v1alpha1", "kind": "GDNModelServer",
        "metadata": {"name": "s0", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}
cycle = {"body": body}
cycle["self"] = cycle
del body, cycle
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.monotonic() + 60
while not os.path.exists(os.environ["GDN_BENCH_CENSUS"]) and time.monotonic() < deadline:
    time.sleep(0.05)
"""


def run_child(tmp_path: Path, variant: str, operator_dir: Path) -> tuple[str, str]:
    env, log = bench_heap.variant_env(tmp_path, variant, operator_dir)
    census = tmp_path / "census.txt"
    env = {**os.environ, **env, "GDN_BENCH_CENSUS": str(census)}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return bench_heap.settled(log), census.read_text()


def test_shipped_variant_settles_and_the_census_names_the_garbage_and_the_objects(tmp_path):
    settled, census = run_child(tmp_path, "shipped", REPO / "operator")
    assert settled.startswith("frozen=") and "thresholds=(700, 10, 100)" in settled
    assert "Traceback" not in census
    freed = next(ln for ln in census.splitlines() if ln.startswith("a full collection now:"))
    assert int(freed.split()[4]) >= 3  # the body, its metadata and the cycle's dict at least
    assert "API objects held" in census and "('GDNModelServer', True) 1" not in census  # collected before the count
    assert "malloc arena" in census and "pymalloc # bytes in allocated blocks" in census
    assert "gc-tracked objects" in census


def test_a_tree_without_settle_heap_runs_as_it_ships(tmp_path):
    tree = tmp_path / "tree"
    (tree / "gdn_operator").mkdir(parents=True)
    (tree / "gdn_operator" / "__init__.py").write_text("")
    settled, census = run_child(tmp_path, "base", tree)
    assert settled.startswith("as its tree ships it (no settle_heap)") and "(700, 10, 10)" in settled
    assert "frozen 0" in census
