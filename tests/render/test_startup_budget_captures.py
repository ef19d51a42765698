"""The startup budget the operator renders, against every engine start-to-Ready time the GPU captures hold
(issue 25 item 3: "the compiled cold and warm start-to-Ready times, checked against the startup budget the
operator renders").

The captures (vLLM 0.22.0 from the offline bundle on H100s; every device session starts on a fresh machine,
so a session's first start of a configuration compiles from an empty torch.compile cache) give
start-to-/health-200 for eager and compiled engines at TP=1 and TP=2 and for the multi-node leader. The rendered Deployment gives the engine `startupProbe.periodSeconds x failureThreshold`
before the kubelet restarts it, and `progressDeadlineSeconds` before the rollout is reported stuck.

Warm starts: the TP=1 matrix's runs 1-4 ran in order on one machine, so a configuration whose launch line (port
aside) had started in an earlier run found vLLM's torch.compile cache and Triton's kernel cache filled: 44 and
42 s eager (cold 156-157 s), 63 s compiled (cold 210 s). "Warm" is inferred from that order and those times;
the logs of those starts were not kept.
"""

from __future__ import annotations

import json

import pytest

from gdn_operator.api.load import parse_spec
from gdn_operator.render.engine import deployment
from paths import REPO

FIX = REPO / "tests" / "fixtures"


def _starts() -> list[tuple[str, int, bool, float]]:
    """(capture/config, TP, compiled, ready seconds) for every engine start in the committed GPU captures."""
    out: list[tuple[str, int, bool, float]] = []
    for f in sorted(FIX.glob("vllm-0.22.0-h100*/*.json")):
        data = json.loads(f.read_text())
        if "leader_ready_s" in data:  # the multi-node run: its leader, compiled, TP=2 across the two nodes
            assert data["parallel"].startswith("TP=2"), data["parallel"]
            out.append((f"{f.parent.name}/leader", 2, True, float(data["leader_ready_s"])))
        engines = data.get("engines") or {}
        results = data.get("results") or []
        for name, e in [*engines.items(), *((r["config"], r) for r in results)]:
            if not isinstance(e, dict) or "ready_s" not in e or not e.get("argv"):
                continue
            argv = [str(a) for a in e["argv"]]
            tp = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
            out.append((f"{f.parent.name}/{f.stem}/{name}", tp, "--enforce-eager" not in argv, float(e["ready_s"])))
    return out


STARTS = _starts()


def _warm_pairs() -> list[tuple[str, str, float, float, bool]]:
    """(start name, config, cold s, warm s, compiled) for each launch line the TP=1 matrix started again in a
    later run."""
    first: dict[tuple[str, ...], tuple[str, float]] = {}  # launch line, port aside -> (run, cold seconds)
    out = []
    series = FIX / "vllm-0.22.0-h100-tp1-matrix"
    for f in sorted(series.glob("bench-gpu-tp-run*.json")):
        for r in json.loads(f.read_text())["results"]:
            argv = list(r["argv"])
            i = argv.index("--port")
            key = tuple(argv[:i] + argv[i + 2 :])
            if key not in first:
                first[key] = (f.stem, float(r["ready_s"]))
            elif first[key][0] != f.stem:
                name = f"{series.name}/{f.stem}/{r['config']}"
                out.append((name, r["config"], first[key][1], float(r["ready_s"]), "--enforce-eager" not in argv))
    return out


WARM = _warm_pairs()
WARM_STARTS = {name for name, *_ in WARM}


def _budget(tp: int) -> tuple[int, int]:
    spec = parse_spec(
        {
            "model": {"uri": "hf://Qwen/Qwen3-Next-80B-A3B-Instruct"},
            "image": {"tag": "v0.22.0", "vllmVersion": "0.22.0"},
            "tensorParallelSize": tp,
        }
    )
    d = deployment("srv", "ns", spec)
    probe = d["spec"]["template"]["spec"]["containers"][0]["startupProbe"]
    return probe["periodSeconds"] * probe["failureThreshold"], d["spec"]["progressDeadlineSeconds"]


def test_the_captures_hold_cold_compiled_and_eager_starts_at_both_tp_sizes():
    kinds = {(tp, compiled) for _, tp, compiled, _ in STARTS}
    assert {(1, True), (1, False), (2, True), (2, False)} <= kinds, kinds
    cold_compiled = [s for name, _, compiled, s in STARTS if compiled and name not in WARM_STARTS]
    assert len(cold_compiled) >= 8
    assert min(cold_compiled) >= 150 and max(cold_compiled) <= 300, sorted(cold_compiled)


@pytest.mark.parametrize(("name", "tp", "compiled", "ready"), STARTS, ids=[s[0] for s in STARTS])
def test_every_captured_start_fits_the_rendered_budget(name, tp, compiled, ready):
    budget, deadline = _budget(tp)
    assert ready < budget, f"{name}: ready after {ready:.0f} s, the startup probe gives {budget} s"
    assert deadline > budget, "the rollout deadline outlasts the startup probe"


def test_the_default_budget_holds_the_slowest_captured_cold_start_many_times_over():
    # the captures are small models: weights loaded in under a second, so their start is compile, autotune and
    # CUDA-graph capture; a real checkpoint adds its download and load (minutes), which the budget must still hold
    budget, _ = _budget(2)
    slowest = max(s for *_, s in STARTS)
    assert budget >= 6 * slowest, (budget, slowest)


def test_a_start_with_the_caches_kept_is_several_times_faster():
    """Cold vs warm for the same launch line, eager and compiled: what a restarted pod on the same node (or a
    persisted cache) saves."""
    assert {(cfg, compiled) for _, cfg, _, _, compiled in WARM} == {
        ("async-on", False),
        ("base", False),
        ("async-on-cudagraph", True),
    }
    for _, cfg, cold, warm, _ in WARM:
        assert warm * 3 < cold, (cfg, cold, warm)
