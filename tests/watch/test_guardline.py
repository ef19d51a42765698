"""The operator's reading of the gdn-guard start-up line, and the patch-set check built on it."""

import sys
from pathlib import Path

import pytest

from gdn_operator.watch.guardline import check_patch_set, parse_guard_line

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "images" / "gdn-guard" / "src"


@pytest.fixture(scope="module")
def gdn_guard():
    sys.path.insert(0, str(PLUGIN_SRC))
    try:
        import gdn_guard

        yield gdn_guard
    finally:
        sys.path.remove(str(PLUGIN_SRC))


@pytest.mark.parametrize(
    "version, guards, ids",
    [
        ("0.17.1", ["spec-decode-uniform-batch"], ["gdn-guard/vllm-36917"]),
        ("0.32.0", [], []),
        ("unknown", [], []),
        ("0.19.2rc1.dev226+g53b9640fb", ["a-guard", "b-guard"], ["gdn-guard/vllm-1", "gdn-guard/vllm-2"]),
    ],
)
def test_operator_parses_what_the_plugin_prints(gdn_guard, version, guards, ids):
    line = gdn_guard.format_log_line(version, guards, ids)
    prefixed = f"(EngineCore_DP0 pid=812) INFO 11-22 10:00:01 [plugin.py:88] {line}"
    got = parse_guard_line(prefixed)
    assert got is not None
    assert got.vllm_version == version and list(got.guards) == guards and list(got.patch_ids) == ids
    assert gdn_guard.parse_log_line(prefixed)["patch_ids"] == ids  # both sides agree


def test_no_line():
    assert parse_guard_line("INFO 11-22 [api_server.py:1] vLLM API server version 0.32.0") is None


def line(ids, version="0.17.1"):
    return parse_guard_line(f"gdn-guard 0.1.0: vLLM {version}, active guards: [x], patch ids: [{', '.join(ids)}]")


def test_declared_patch_applied_is_verified():
    c = check_patch_set(["gdn-guard/vllm-36917"], line(["gdn-guard/vllm-36917"]), "0.17.1")
    assert c.ok and c.reason == "PatchSetVerified"


def test_declared_patch_not_applied_is_a_mismatch():
    c = check_patch_set(["gdn-guard/vllm-36917", "gdn-guard/vllm-45100"], line(["gdn-guard/vllm-36917"]), "0.17.1")
    assert not c.ok and c.reason == "PatchSetMismatch" and "gdn-guard/vllm-45100" in c.message


def test_declared_patches_without_plugin_line():
    c = check_patch_set(["gdn-guard/vllm-36917"], None, "0.17.1")
    assert not c.ok and c.reason == "GuardLineMissing"
    assert check_patch_set([], None, "0.33.0").ok


def test_engine_version_differs_from_declared():
    c = check_patch_set([], line([], version="0.28.0"), "0.33.0")
    assert not c.ok and c.reason == "VersionMismatch"


def test_extra_reported_patches_are_not_relied_on():
    c = check_patch_set([], line(["gdn-guard/vllm-36917"]), "0.17.1")
    assert c.ok and "not declared" in c.message
