"""gdn-guard logic that does not need vLLM: versions, the start-up line, patch ids (kept in sync with
the operator's rules.yaml), register() without vLLM, the build-time CLI, and the step rewrite's
refusal paths.  The rewrite itself is exercised on the real vLLM 0.17.1 scheduler in
test_gdn_guard_engine.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from images_env import GUARD_SRC, REPO

import gdn_guard
from gdn_guard import plugin
from gdn_guard.guards import GuardUnavailable, all_guards, vllm_36917
from gdn_guard.versions import Version, VersionError, VersionRange

RULES = REPO / "operator" / "gdn_operator" / "rules" / "data" / "rules.yaml"
FA3 = "gdn-guard/fa3-group-metadata"
CATALOGUE = [
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
]


# ----------------------------------------------------------------------------------- versions --


@pytest.mark.parametrize(
    "lo,hi",
    [
        ("0.17.1", "0.18.0"),
        ("0.18.0rc1", "0.18.0"),
        ("0.18.0.dev5", "0.18.0rc1"),
        ("0.18.0", "0.18.0.post1"),
        ("0.19.2rc1.dev226+g53b9640fb", "0.19.2rc1"),
        ("0.9.9", "0.10.0"),
        ("0.17.1", "0.17.10"),
    ],
)
def test_version_order(lo, hi):
    assert Version.parse(lo) < Version.parse(hi)
    assert not Version.parse(hi) <= Version.parse(lo)


def test_version_local_part_and_trailing_zeros():
    assert Version.parse("0.32.0+cpu") == Version.parse("0.32.0") == Version.parse("0.32")
    assert Version.parse("0.32.0+cpu").public == "0.32.0"
    with pytest.raises(VersionError, match="not a PEP 440 version: 'latest'"):
        Version.parse("latest")


def test_range_is_half_open():
    r = VersionRange(since="0.25.0", fixed_in="0.29.0")
    assert [v for v in CATALOGUE if r.contains(v)] == ["0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0"]
    assert str(r) == ">=0.25.0,<0.29.0" and str(VersionRange(None, "0.18.0")) == "<0.18.0"


@pytest.mark.parametrize("pre", ["0.18.0rc1", "0.18.0.dev5", "0.18.0rc1.dev226+g53b9640fb"])
def test_range_keeps_prereleases_of_the_fix_inside(pre):
    """vllm#36917 was fixed in 0.18.0: its guard stays on for 0.18.0 pre-releases (PEP 440 specifiers would
    leave them out of `<0.18.0`, hence our own range)."""
    assert VersionRange(None, "0.18.0").contains(pre)
    assert not VersionRange(None, "0.18.0").contains("0.18.0")


# ------------------------------------------------------------------------------ patch ids --


def test_declared_patch_ids_per_catalogue_release():
    got = {v: plugin.declared_patch_ids(v) for v in CATALOGUE}
    # fa3-group-metadata (G1): the reuse it turns off is in every wheel read, 0.17.0-0.33.0 (V1 runner)
    assert got["0.17.0"] == got["0.17.1"] == ["gdn-guard/vllm-36917", FA3]
    assert all(got[v] == [FA3] for v in CATALOGUE[2:]), got
    assert plugin.declared_patch_ids("0.18.0rc1") == ["gdn-guard/vllm-36917", FA3]  # conservative for pre-releases
    assert plugin.declared_patch_ids("0.32.0+cpu") == [FA3]
    assert gdn_guard.declared_patch_ids("0.17.1") == ["gdn-guard/vllm-36917", FA3]
    with pytest.raises(ValueError, match="gdn-guard: not a PEP 440 version: 'v-next'"):
        plugin.declared_patch_ids("v-next")


def test_patch_ids_and_ranges_match_operator_rules():
    """Every guard's patch id is a known id in rules.yaml, and the rules that list it cover exactly
    the guard's version range (the operator treats the rule as neutralised by the image)."""
    data = yaml.safe_load(RULES.read_text())
    known = set(data["patches"])
    for guard in all_guards():
        assert guard.patch_id in known, f"{guard.patch_id} missing from {RULES} `patches`"
        rules = [r for r in data["rules"] if guard.patch_id in (r.get("patches") or [])]
        assert rules, f"no rule in {RULES} lists {guard.patch_id}"
        for r in rules:
            assert r["versions"].replace(" ", "") == str(guard.versions), (r["id"], r["versions"], str(guard.versions))
            assert guard.upstream.startswith(r["id"]), (guard.upstream, r["id"])


# ---------------------------------------------------------------------------- start-up line --


def test_log_line_format_and_regex_roundtrip():
    line = gdn_guard.format_log_line("0.17.1", ["spec-decode-uniform-batch"], ["gdn-guard/vllm-36917"])
    assert line == ("gdn-guard 0.1.0: vLLM 0.17.1, active guards: [spec-decode-uniform-batch], patch ids: [gdn-guard/vllm-36917]")
    two = gdn_guard.format_log_line("0.17.1", ["a-b", "c"], ["gdn-guard/x-1", "gdn-guard/y"])
    assert gdn_guard.parse_log_line(two)["patch_ids"] == ["gdn-guard/x-1", "gdn-guard/y"]
    empty = gdn_guard.format_log_line("unknown", [], [])
    assert gdn_guard.parse_log_line(empty) == {"guard_version": "0.1.0", "vllm_version": "unknown", "guards": [], "patch_ids": []}


def test_log_line_found_behind_vllm_prefixes():
    # prefixes as printed by vLLM 0.32.0 (captured from the engine test) and 0.17.1
    for prefix in (
        "(EngineCore pid=11869) INFO 11-22 16:55:14 [plugin.py:115] ",
        "(VllmWorker-0 pid=12446) INFO 11-22 16:55:27 [plugin.py:115] ",
        "INFO 11-22 16:48:03 [plugin.py:104] ",
    ):
        got = gdn_guard.parse_log_line(prefix + "gdn-guard 0.1.0: vLLM 0.32.0, active guards: [], patch ids: []\n")
        assert got["vllm_version"] == "0.32.0"
    assert gdn_guard.parse_log_line("INFO [core.py:1] gdn-guard spec-decode-uniform-batch (vllm#36917): armed") is None
    assert gdn_guard.parse_log_line("gdn-guard 0.1.0: vLLM 0.17.1, active guards: [X], patch ids: []") is None


# ------------------------------------------------------------------------------- register() --


@pytest.fixture
def fresh_plugin(monkeypatch):
    monkeypatch.setattr(plugin, "_RESULT", None)
    monkeypatch.delenv("GDN_GUARD_DISABLE", raising=False)
    monkeypatch.delenv("GDN_GUARD_PATCHES", raising=False)
    return plugin


def test_register_without_vllm_logs_unknown_once(fresh_plugin, caplog):
    with pytest.raises(ImportError):
        __import__("vllm")
    caplog.set_level(logging.INFO, logger="vllm.gdn_guard")
    fresh_plugin.register()
    fresh_plugin.register()
    lines = [r.getMessage() for r in caplog.records if gdn_guard.LOG_LINE_RE.search(r.getMessage())]
    assert lines == ["gdn-guard 0.1.0: vLLM unknown, active guards: [], patch ids: []"]
    assert any("could not determine the vLLM version" in r.getMessage() for r in caplog.records)
    assert fresh_plugin.result().vllm.source == "none"


def test_register_reports_guards_that_cannot_apply(fresh_plugin, monkeypatch, caplog):
    """vLLM 0.17.1 metadata but no importable scheduler: the guard is needed, not applied, and the
    line does not claim its patch id; GDN_GUARD_PATCHES mismatch is warned about."""
    from gdn_guard import versions

    monkeypatch.setattr(
        plugin, "detect_vllm_version", lambda: versions.DetectedVersion(Version.parse("0.17.1"), "dist:vllm", "0.17.1")
    )
    monkeypatch.setenv("GDN_GUARD_PATCHES", "gdn-guard/vllm-36917")
    caplog.set_level(logging.INFO, logger="vllm.gdn_guard")
    fresh_plugin.register()
    msgs = [r.getMessage() for r in caplog.records]
    assert "gdn-guard 0.1.0: vLLM 0.17.1, active guards: [], patch ids: []" in msgs
    assert any(
        m.startswith(
            "gdn-guard: guard spec-decode-uniform-batch is needed by vLLM 0.17.1 but not active: "
            "cannot import vllm.v1.core.sched.scheduler"
        )
        for m in msgs
    ), msgs
    assert any("declares GDN_GUARD_PATCHES=gdn-guard/vllm-36917 but this process applied []" in m for m in msgs)


def test_register_disable_env(fresh_plugin, monkeypatch, caplog):
    from gdn_guard import versions

    monkeypatch.setattr(
        plugin, "detect_vllm_version", lambda: versions.DetectedVersion(Version.parse("0.17.1"), "dist:vllm", "0.17.1")
    )
    monkeypatch.setenv("GDN_GUARD_DISABLE", "gdn-guard/vllm-36917, fa3-group-metadata")
    caplog.set_level(logging.INFO, logger="vllm.gdn_guard")
    fresh_plugin.register()
    assert fresh_plugin.result().skipped == (
        ("spec-decode-uniform-batch", "disabled by GDN_GUARD_DISABLE"),
        ("fa3-group-metadata", "disabled by GDN_GUARD_DISABLE"),
    )


def test_register_never_raises(fresh_plugin, monkeypatch, caplog):
    def boom():
        raise RuntimeError("metadata exploded")

    monkeypatch.setattr(plugin, "detect_vllm_version", boom)
    fresh_plugin.register()  # must not raise: vLLM calls plugins without try/except
    assert any("register() failed" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------- the CLI --


def _cli(*args):
    env = {"PYTHONPATH": str(GUARD_SRC), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "gdn_guard", *args], capture_output=True, text=True, env=env)


def test_cli_declared_and_verify():
    p = _cli("declared-patch-ids", "0.17.1")
    assert p.returncode == 0 and p.stdout.strip() == f"gdn-guard/vllm-36917,{FA3}"
    assert _cli("declared-patch-ids", "0.32.0").stdout == f"{FA3}\n"
    assert _cli("verify-patches", f"gdn-guard/vllm-36917,{FA3}", "--vllm-version", "0.17.1").returncode == 0
    assert _cli("verify-patches", FA3, "--vllm-version", "0.32.0").returncode == 0
    assert _cli("verify-patches", "", "--vllm-version", "0.32.0").returncode == 1
    bad = _cli("verify-patches", "", "--vllm-version", "0.17.1")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        f"gdn-guard: GDN_GUARD_PATCHES=(empty) but vLLM 0.17.1 needs {FA3},gdn-guard/vllm-36917; "
        f"set --build-arg GDN_GUARD_PATCHES={FA3},gdn-guard/vllm-36917"
    )
    nov = _cli("declared-patch-ids")  # no vLLM installed in this interpreter
    assert nov.returncode == 1 and "no vLLM installation found" in nov.stderr
    assert _cli("verify-patches", "").returncode == 1
    assert _cli("verify-patches").returncode == 2
    assert "not a PEP 440 version" in _cli("declared-patch-ids", "latest").stderr


# ------------------------------------------------------------------ step rewrite refusal paths --


def _step(spec, sched, total=None):
    return SimpleNamespace(
        scheduled_spec_decode_tokens=spec,
        num_scheduled_tokens=sched,
        total_num_scheduled_tokens=total if total is not None else sum(sched.values()),
    )


def _req(rid, computed, placeholders=0):
    return SimpleNamespace(request_id=rid, num_computed_tokens=computed, num_output_placeholders=placeholders)


def test_find_lone_rows():
    assert vllm_36917.find_lone_rows(_step({}, {"a": 1, "b": 1})) == ()  # no spec rows: uniform
    assert vllm_36917.find_lone_rows(_step({"a": [5, 6]}, {"a": 3, "b": 7})) == ()  # b is a prefill chunk
    assert vllm_36917.find_lone_rows(_step({"a": [5, 6]}, {"a": 3, "b": 1, "c": 1})) == ("b", "c")
    assert vllm_36917.find_lone_rows(_step({"a": []}, {"a": 1, "b": 1})) == ()  # no draft at all


def test_rewrite_sync_and_async_bookkeeping():
    sched = SimpleNamespace(requests={"a": _req("a", 13), "b": _req("b", 40)})
    out = _step({"a": [5, 6]}, {"a": 3, "b": 1})
    rw = vllm_36917.make_step_uniform(sched, out, {"a": 0, "b": 0})
    assert rw.withdrawn == {"a": 2} and rw.lone_rows == ("b",)
    assert out.num_scheduled_tokens == {"a": 1, "b": 1} and out.total_num_scheduled_tokens == 2
    assert out.scheduled_spec_decode_tokens == {} and sched.requests["a"].num_computed_tokens == 11
    # async: schedule() added 1 + 2 placeholders; 2 of them are undone
    sched = SimpleNamespace(requests={"a": _req("a", 13, placeholders=4), "b": _req("b", 40, placeholders=1)})
    out = _step({"a": [-1, -1]}, {"a": 3, "b": 1})
    vllm_36917.make_step_uniform(sched, out, {"a": 1, "b": 0})
    assert sched.requests["a"].num_output_placeholders == 2 and sched.requests["a"].num_computed_tokens == 11


@pytest.mark.parametrize(
    "before,why",
    [
        ({"a": 2}, "output placeholders grew by 2 for 2 drafts"),
    ],
)
def test_rewrite_refuses_unexpected_bookkeeping_without_changes(before, why):
    sched = SimpleNamespace(requests={"a": _req("a", 13, placeholders=4), "b": _req("b", 40)})
    out = _step({"a": [5, 6]}, {"a": 3, "b": 1})
    with pytest.raises(GuardUnavailable, match=why):
        vllm_36917.make_step_uniform(sched, out, before)
    assert out.num_scheduled_tokens == {"a": 3, "b": 1} and out.scheduled_spec_decode_tokens == {"a": [5, 6]}
    assert sched.requests["a"].num_computed_tokens == 13


def test_decide_arming_rules():
    gdn = SimpleNamespace(kv_cache_spec=SimpleNamespace(mamba_type="gdn_attention"))
    mamba2 = SimpleNamespace(kv_cache_spec=SimpleNamespace(mamba_type="mamba2"))
    base = dict(requests={}, running=[], connector=None, ec_connector=None)
    s = SimpleNamespace(num_spec_tokens=2, kv_cache_config=SimpleNamespace(kv_cache_groups=[mamba2, gdn]), **base)
    assert vllm_36917.decide(s).armed
    s = SimpleNamespace(num_spec_tokens=2, kv_cache_config=SimpleNamespace(kv_cache_groups=[mamba2]), **base)
    assert vllm_36917.decide(s).reason == "no KV-cache group of mamba_type 'gdn_attention'"
    s = SimpleNamespace(num_spec_tokens=0, kv_cache_config=SimpleNamespace(kv_cache_groups=[gdn]), **base)
    assert vllm_36917.decide(s).reason == "speculative decoding is off"
    s = SimpleNamespace(
        num_spec_tokens=2, kv_cache_config=SimpleNamespace(kv_cache_groups=[gdn]), **{**base, "connector": object()}
    )
    assert not vllm_36917.decide(s).armed and "connector" in vllm_36917.decide(s).reason
