"""The 2026-12-07 H100 lease at vLLM 0.34.0 (tests/fixtures/vllm-0.34.0-h100-lease-startup): what it shows about the
offline bundle (staged and installed in one lease; the H100 and H200 host images are the same package list) and that
it claims no engine result, because none finished starting (its README says why)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "tests" / "fixtures" / "vllm-0.34.0-h100-lease-startup"
sys.path.insert(0, str(REPO / "hack" / "gpu"))
import bundle  # noqa: E402


def _installs() -> dict[str, tuple[int, int]]:
    """release -> (exit code, milliseconds) from staging.log's install lines."""
    out = {}
    for m in re.finditer(r"lease: \S+ (\d+\.\d+\.\d+) install exited (\d+) in (\d+) ms", (CAPTURE / "staging.log").read_text()):
        out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def test_both_bundles_installed_on_the_h100_and_the_figures_are_the_readmes():
    installs = _installs()
    assert installs["0.34.0"][0] == 0 and installs["0.26.0"][0] == 0
    readme = (CAPTURE / "README.md").read_text()
    text = " ".join(readme.split())  # the README wraps its lines
    assert f"took {installs['0.34.0'][1] / 1000:.1f} s" in text
    assert f"installed in {installs['0.26.0'][1] / 1000:.1f} s" in text
    assert "no conflicts left" in (CAPTURE / "staging.log").read_text()  # the conflict gate passed on this host
    assert "NVIDIA H100 80GB HBM3" in (CAPTURE / "gpus.txt").read_text()


def test_the_h100_host_is_the_base_the_bundles_were_built_against():
    """The bundles were built against the H200 host's package list; the H100 host's is the same, so one bundle serves
    both kinds (and the 0.34.0 plan against it bundles the hub stack, transformers with it)."""
    h100 = bundle.parse_base(CAPTURE / "host-packages.txt")
    h200 = bundle.parse_base(REPO / "tests/fixtures/vllm-0.26.0-h200x2-release/host-packages.txt")
    assert h100 == h200
    assert h100["transformers"] == "5.17.0" and h100["huggingface-hub"] == "1.33.0"


@pytest.mark.parametrize("name", ["short-prompts-0.26.0.json", "short-prompts-0.34.0.json"])
def test_the_short_prompt_captures_hold_results_only_for_engines_that_became_ready(name):
    d = json.loads((CAPTURE / name).read_text())
    ready = {n for n, e in d["engines"].items() if e.get("ready_s") is not None}
    for n, e in d["engines"].items():
        assert (n in ready) != bool(e.get("failed")), n  # an engine is ready or says why not
    assert all(set(cells) <= ready for cells in d["cells"].values())
    mtp = {n for n, e in d["engines"].items() if e["k"] > 0}
    assert not (mtp & ready), "an MTP engine started: this capture would then hold a result the README does not state"
    if ready:  # 0.26.0: the MTP-off reference alone, exact on every prompt of 2..8 tokens and every final chunk
        (n,) = ready
        assert d["engines"][n]["ready_s"] == pytest.approx(152.2)
        for w, cells in d["cells"].items():
            rows = cells[n]["by_length"]
            assert all(r["exact"] == r["sent"] for L, r in rows.items() if w == "chunk" or L != "1"), (w, rows)


def test_no_engine_of_the_g1_matrix_or_the_release_bench_started():
    g = json.loads((CAPTURE / "graphs-tiny-0.34.0.json").read_text())
    assert {r["config"] for r in g["results"]} == {
        "base-cudagraph",
        "base-breakable",
        "base-breakable-piecewise",
        "base-cg-piecewise",
        "nomtp-cudagraph",
    }
    assert not any(r.get("started") for r in g["results"])
    rel = json.loads((CAPTURE / "release-0.34.0.json").read_text())
    assert all(e.get("ready_s") is None for e in rel["engines"].values()) and not rel["cells"]
    # the engines got as far as planning the KV cache on the V2 runner before the deadline stopped them
    log = (CAPTURE / "serve-k2-0.34.0.log").read_text()
    assert "torch.compile took" in log and "Setting attention block size to 192 tokens" in log
    assert "trigger received signal=SIGTERM" in log
