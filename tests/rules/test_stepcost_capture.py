"""Every figure of a step-cost capture recomputed from its repetitions (issue 50 items 2-4).

A capture is `stepcost.json` (+ `stepcost-engines.log`) from `hack/gpu/session.sh stepcost`
(bench/bench_gpu_stepcost.py). Parametrised on the capture folder: the committed dry run
(tests/fixtures/vllm-0.33.0-stepcost-dryrun: stand-in engines, figures meaningless, the format and the arithmetic
real) and the GPU capture the lead commits after the lease (tests/fixtures/vllm-0.34.0-h100-stepcost: skipped while
absent; the checks marked "GPU capture only" then apply too).

Recomputed: each repetition's tokens/s; each cell's step cost (ms per token x tokens per step from the cell's own
spec-decode counters), tokens/s and TTFT medians with min-max; acceptance from its counters; every speed-up curve,
break-even acceptance and mark at the oracle's (tests/fixtures/vllm-0.26.0-h200x2-release) and the published
acceptance; the A/A noise floor and the claims judged against it. Checked: the engines ran what their names say
(gdnctl's render at the capture's release plus exactly the bench's recorded adaptations), the geometry files are the
committed ones, the method held (repetitions, cells per kind, what the deadline cut is listed), and every example was
started or refused with its reason.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from paths import REPO

from gdn_operator.rules import stepcost

sys.path.insert(0, str(REPO / "bench"))
import bench_gpu_stepcost as bench  # noqa: E402

DRY = REPO / "tests" / "fixtures" / "vllm-0.33.0-stepcost-dryrun"
REAL = REPO / "tests" / "fixtures" / "vllm-0.34.0-h100-stepcost"
#: every GPU capture committed beside the first (e.g. a second lease call's `-- --plan examples`, in its own folder)
GPU_CAPTURES = sorted(p.parent for p in (REPO / "tests" / "fixtures").glob("vllm-*-stepcost*/stepcost.json") if p.parent != DRY)
CAPTURES = [
    pytest.param(DRY, id="dry-run"),
    *[pytest.param(p, id=p.name) for p in GPU_CAPTURES],
    pytest.param(REAL, id="h100", marks=pytest.mark.skip(reason="not captured yet")) if REAL not in GPU_CAPTURES else None,
]
CAPTURES = [c for c in CAPTURES if c is not None]


def _load(fix: Path) -> dict:
    return json.loads((fix / "stepcost.json").read_text())


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _k(argv: list[str]) -> int:
    spec = _flag(argv, "--speculative-config")
    return json.loads(spec)["num_speculative_tokens"] if spec else 0


def _spread(xs: list[float], nd: int) -> dict:
    s = sorted(xs)
    m = len(s) // 2
    med = s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2
    return {"median": round(med, nd), "min": round(s[0], nd), "max": round(s[-1], nd)}


@pytest.mark.parametrize("fix", CAPTURES)
def test_each_repetition_and_cell_is_recomputed(fix: Path):
    doc = _load(fix)
    n = 0
    for name, cells in doc["cells"].items():
        k = doc["engines"][name]["k"]
        for work, cell in cells.items():
            reps = cell["reps"]
            assert reps and len(reps) <= doc["method"]["reps"], (name, work)
            assert cell["concurrency"] == bench.CONCURRENCY[work]
            for r in reps:
                assert r["errors"] == 0, (name, work, r["error_sample"])
                assert round(r["tokens"] / r["wall_s"], 1) == r["tokens_per_s"], (name, work)
                want = bench.CONCURRENCY[work] if work not in ("long", "prefix") else (8 if work == "long" else 16)
                assert r["requests"] == want, (name, work)
            acc = cell["acceptance"]
            if k:
                assert len(acc["per_position"]) == k
                assert acc["tokens_per_step"] == round(1 + acc["accepted"] / acc["drafts"], 4)
                assert all(round(v, 4) == v for v in acc["per_position"])
            else:
                assert acc is None
            L = acc["tokens_per_step"] if acc else 1.0
            assert cell["tokens_per_step"] == L
            assert cell["step_ms"] == _spread([r["ms_per_token"] * L for r in reps], 3), (name, work)
            assert cell["tokens_per_s"] == _spread([r["tokens_per_s"] for r in reps], 1), (name, work)
            assert cell["ttft_ms"] == _spread([r["ttft_ms"] for r in reps], 1), (name, work)
            n += 1
    assert n >= 10  # at least 27B off, k2 (as rendered) and k2 with vLLM's defaults measured


@pytest.mark.parametrize("fix", CAPTURES)
def test_curves_marks_and_noise_are_recomputed(fix: Path):
    doc = _load(fix)
    assert bench.curves(doc) == doc["curves"]
    assert bench.noise(doc) == doc["noise"]
    assert doc["oracle_acceptance"] == bench.oracle_acceptance()
    for key, e in doc["curves"].items():
        geom, work, pair = key.split(" ")
        num, den = pair.split("/")
        x = doc["cells"][f"{geom}:{num}"][work]["step_ms"]
        y = doc["cells"][f"{geom}:{den}"][work]["step_ms"]
        assert e["step_ratio"] == round(x["median"] / y["median"], 3)
        if "curve" not in e:
            continue
        k = bench.KINDS[num][0]
        # the curve's ends worked by hand: no acceptance -> the step-cost ratio inverted; full -> (k+1) times that
        assert e["curve"][0][1] == round(y["median"] / x["median"], 3)
        assert e["curve"][-1][1] == round((k + 1) * y["median"] / x["median"], 3)
        for label, mark in e["at"].items():
            assert mark["speedup"] == round(stepcost.tokens_per_step(mark["per_position"]) * y["median"] / x["median"], 3)
            assert mark["range"][0] <= mark["speedup"] <= mark["range"][1], (key, label)
        be = e["break_even_alpha"]
        if be not in (None, 0.0):
            assert stepcost.speedup(y["median"], x["median"], stepcost.constant(be, k)) == pytest.approx(1.0, abs=2e-3)
        if "noise_floor" in e:
            assert e["beyond_noise"] == (e["claimed"] and abs(e["step_ratio"] - 1) > e["noise_floor"])


@pytest.mark.parametrize("fix", CAPTURES)
def test_engines_ran_the_rendered_line_plus_the_recorded_adaptations(fix: Path):
    doc = _load(fix)
    flags = set(bench.RULE_FLAGS)
    model = doc["models"]["qwen3.5-27b"]
    r = bench.render_engine(
        "k2",
        model,
        type("A", (), {"vllm_version": doc["vllm_version"], "gpu_util": doc["method"]["gpu_util"],
                       "max_model_len": doc["method"]["max_model_len"], "capture_max": doc["method"]["capture_max"]})(),
    )  # fmt: skip
    # the defaults the rules force at the capture's release, as flags (0.33.0: both; from 0.34.0 prefix caching only)
    forced = {f for f in flags if f in r.argv}
    async_flags = {"--no-async-scheduling", "--async-scheduling"}
    for name, e in doc["engines"].items():
        a = e["argv"]
        k, settings = bench.KINDS[e["kind"]]
        assert _k(a) == k == e["k"], name
        assert Path(a[0]).name == e["geometry"] and _flag(a, "--load-format") == "dummy" and "--skip-tokenizer-init" in a
        assert _flag(a, "--tensor-parallel-size") == "1" and "--enforce-eager" not in a
        present = {f for f in flags if f in a}
        want = {
            "rendered": forced if k else set(),  # MTP off: vLLM's own
            "vllm": set(),
            "async-default": forced - async_flags,
            "no-prefix-caching": {"--no-enable-prefix-caching"},
        }[settings]
        assert present == want, name
        added = [n for n in e["notes"] if n.startswith("# bench:")]
        assert any("--load-format dummy" in n for n in added) and any("--skip-tokenizer-init" in n for n in added)
        # the flags the settings took out of the rendered line (MTP's two `--no-` flags) and put in
        n_removed = {"rendered": 0, "vllm": len(forced), "async-default": len(forced & async_flags), "no-prefix-caching": 0}
        n_removed = n_removed[settings]
        assert sum("removed" in n for n in added) == n_removed, name
        assert sum("added --" in n and "after rendering" in n for n in added) == len(bench.SETTINGS[settings][1]), name
        cap = doc["method"]["capture_max"]
        assert ("--compilation-config" in a) == bool(cap), name  # vLLM's own capture sizes unless asked
    # what the operator renders today at the capture's release is what k2 ran (model path, host and port aside)
    k2 = doc["engines"].get("qwen3.5-27b:k2")
    assert k2 is not None

    def strip(argv: list[str]) -> list[str]:
        out, skip = [], False
        for x in argv[1:]:
            if skip:
                skip = False
            elif x in ("--host", "--port"):
                skip = True
            else:
                out.append(x)
        return out

    assert strip(r.argv) == strip(k2["argv"])


@pytest.mark.parametrize("fix", CAPTURES)
def test_geometry_files_are_the_committed_ones(fix: Path):
    doc = _load(fix)
    for name, m in doc["models"].items():
        raw = (bench.GEOMETRY_DIR / name / "config.json").read_bytes()
        assert m["config_sha256"] == hashlib.sha256(raw).hexdigest(), name
        text = bench.text_only_config(json.loads(raw))
        assert m["served_architecture"] == text["architectures"][0] and m["text_params"] == bench.text_params(text)


@pytest.mark.parametrize("fix", CAPTURES)
def test_the_method_held_and_the_deadline_cut_is_listed(fix: Path):
    doc = _load(fix)
    assert doc["vllm_version"] == fix.name.split("-")[1]  # the release the folder names
    plan = doc["plan"]
    engines = [n for n in plan if not n.startswith("ex:")]
    assert list(doc["engines"]) == [n for n in engines if n in doc["engines"]]  # started in the plan's order
    started = [n for n in engines if n in doc["engines"]]
    if doc["plan"][:3] == bench.DEFAULT_PLAN.split(",")[:3]:
        assert started[:3] == ["qwen3.5-27b:off", "qwen3.5-27b:k2", "qwen3.5-27b:k2v"]  # the most valuable first
    for name in plan:
        if name.startswith("ex:"):
            continue
        if name not in doc["engines"]:
            assert any(s.startswith(f"{name}: not started") for s in doc["skipped"]), name
            continue
        eng = doc["engines"][name]
        if "ready_s" not in eng:  # it did not start: the reason is kept, and its cells are absent, not empty
            assert eng["start_error"] and name not in doc["cells"], name
            continue
        cells = doc["cells"].get(name, {})
        want = [c for c in doc["method"]["cells"] if c in bench.KIND_CELLS.get(doc["engines"][name]["kind"], bench.CELLS)]
        for work in [*want, "c8-again"]:
            got = len(cells.get(work, {}).get("reps", []))
            if got < doc["method"]["reps"]:
                assert any(s.startswith(f"{name} {work}") for s in doc["skipped"]), (name, work)
    stopped = {s["engine"] for s in doc["stops"]}
    assert stopped == {n.replace(":", "-") for n in doc["engines"]} | {
        "ex-" + Path(f).stem for f, e in doc["examples"].items() if "ready_s" in e or "start_error" in e
    }  # an example with the launch line of one started before is not started again
    assert not doc["errors"]


@pytest.mark.parametrize("fix", CAPTURES)
def test_every_example_was_started_or_refused_with_its_reason(fix: Path):
    doc = _load(fix)
    assert sorted(doc["examples"]) == sorted(x[3:] for x in bench.examples_plan())
    for name, e in doc["examples"].items():
        assert e["reason"], name
        if e["starts"] is None and "render_refused" in e:  # the operator refused it: nothing to start
            assert (
                "rejected by admission" in e["render_refused"][doc["vllm_version"]]
                or "error:" in e["render_refused"][doc["vllm_version"]]
            )
            continue
        assert e["how"] and e["started_release"] == doc["vllm_version"], name
        assert Path(e["argv"][0]).name == e["geometry"] and _flag(e["argv"], "--tensor-parallel-size") == "1"
        twin = [
            n
            for n, x in doc["examples"].items()
            if n != name and "ready_s" in x and bench.start_key(x["argv"]) == bench.start_key(e["argv"])
        ]
        if e["starts"] and twin and "ready_s" not in e:  # the same launch line as one already started
            assert e["reason"].startswith(f"the launch line of {twin[0]}: ")
        elif e["starts"]:
            assert "ready_s" in e and e["reason"] == "Ready"
    # the refused one is the example written to be refused (prefix caching + MTP set by the user, policy reject)
    assert doc["examples"]["denied-qwen3.6-prefix-caching-mtp.yaml"]["starts"] is None


@pytest.mark.parametrize("fix", GPU_CAPTURES or [pytest.param(REAL, marks=pytest.mark.skip(reason="not captured yet"))])
def test_gpu_capture_only_names_the_gpu_the_release_and_the_capacity(fix: Path):
    doc = _load(fix)
    assert not doc["dry_run"] and "H100" in doc["gpu"]
    for name, e in doc["engines"].items():
        if "ready_s" not in e:
            continue
        assert any("v0.34.0" in f for f in e["log_facts"]), name
        assert e["capacity"]["kv_cache_tokens"] and e["capacity"]["max_concurrency"], name
    for s in doc["stops"]:
        assert s["gpu_mib_used_after"] is not None and s["gpu_mib_used_after"] < 2048, s
    for name, e in doc["examples"].items():
        if e["starts"]:
            assert e["capacity"]["kv_cache_tokens"], name


def test_dry_run_keeps_the_plan_order_and_stops_at_the_deadline(tmp_path):
    """bench_gpu_stepcost.py --dry-run on stand-in engines: the first engine of the plan runs its cells, the
    deadline stops the rest (listed, not silently dropped), the examples are still rendered (a refused one needs no
    GPU), the files are written, and the driver is back before its --until."""
    import subprocess
    import time

    until = time.time() + bench.TEARDOWN_S + 14
    p = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_gpu_stepcost.py"), "--out", str(tmp_path), "--dry-run"]
        + ["--until", f"{until:.0f}", "--engine-min", "9", "--cell-min", "1", "--reps", "1", "--cells", "c1,c8"]
        + ["--plan", "qwen3.5-27b:off,qwen3.5-27b:k2,ex:denied-qwen3.6-prefix-caching-mtp.yaml"]
        + ["--vllm-version", "0.34.0", "--standin-ready", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert time.time() < until + 1
    doc = json.loads((tmp_path / "stepcost.json").read_text())
    assert list(doc["engines"]) == ["qwen3.5-27b:off"] and doc["dry_run"]
    assert sorted(doc["cells"]["qwen3.5-27b:off"]) == ["c1", "c8", "c8-again"]
    assert any(s.startswith("qwen3.5-27b:k2: not started") for s in doc["skipped"])
    assert doc["examples"]["denied-qwen3.6-prefix-caching-mtp.yaml"]["starts"] is None
    assert (tmp_path / "stepcost-engines.log").read_text().startswith("===== serve-qwen3.5-27b-off.log")


@pytest.mark.parametrize("fix", CAPTURES)
def test_the_closing_note_tables_carry_the_capture_figures(fix: Path):
    doc = _load(fix)
    text = bench.tables(doc)
    for name, cells in doc["cells"].items():
        for work, c in cells.items():
            s = c["step_ms"]
            assert f"| {work} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) |" in text, (name, work)
    for key, c in doc["curves"].items():
        assert f"| {c['step_ratio']:.3f} |" in text, key
    assert all(f"| {name} |" in text for name in doc["examples"])
    assert ("DRY RUN" in text) == doc["dry_run"]
