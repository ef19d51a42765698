"""gdnctl validate through the installed console script: exit codes 0/1/2, JSON shape, no tracebacks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from paths import gdnctl
from rules_helpers import UNKNOWN_LAYOUT_MODEL

ROOT = Path(__file__).resolve().parents[2]
GDNCTL = gdnctl()
GOOD = ROOT / "examples" / "qwen3.5-27b-mtp.yaml"
DENIED = ROOT / "examples" / "denied-qwen3.6-prefix-caching-mtp.yaml"

MANIFEST = """apiVersion: serving.gdn-operator.io/v1alpha1
kind: GDNModelServer
metadata: {{name: {name}, namespace: default}}
spec:
  model: {{uri: "hf://Qwen/Qwen3.5-27B"}}
  image: {{tag: v{version}, vllmVersion: "{version}"}}
{extra}"""


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run([GDNCTL, "validate", *args], capture_output=True, text=True, input=stdin, timeout=60)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_known_good_example_exits_0():
    p = run("-f", str(GOOD))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "ADMITTED" in p.stdout


def test_denied_example_exits_1_and_names_the_fix_vllm_43559():
    p = run("-f", str(DENIED))
    assert p.returncode == 1
    assert "REJECTED" in p.stdout and "vllm#43559" in p.stdout and "prefixCaching: false" in p.stdout


def test_json_shape():
    p = run("-f", str(DENIED), "--output", "json")
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["exitCode"] == 1 and len(doc["results"]) == 1
    res = doc["results"][0]
    assert res["allowed"] is False and res["name"] == "default/qwen36-35b-a3b"
    f = next(f for f in res["findings"] if f["rule"] == "vllm#43559")
    for key in ("rule", "kind", "severity", "message", "workaround", "mitigation", "action", "fields"):
        assert key in f
    assert f["kind"] == "silent-corruption" and f["mitigation"] == {"prefixCaching": False}
    eff = res["effective"]
    assert eff["prefixCaching"] is True and eff["mambaCacheMode"] == "align" and eff["modelRunner"] == "v1"
    assert res["effectiveDetail"]["sources"]["prefix_caching"] == "spec.prefixCaching"  # the user's own value
    # the unset asyncScheduling resolves to the value vllm#51571 accepts, and says so
    assert {"field": "asyncScheduling", "value": False, "rule": "vllm#51571"} in res["defaults"]
    assert [{k: v for k, v in d.items() if k != "cost"} for d in eff["defaults"]] == res["defaults"]
    # each default in status says what it measurably costs at this release, or that nobody measured it
    assert all(d["cost"].startswith(("MTP with it ", "unmeasured at vLLM ")) for d in eff["defaults"])


def test_mitigated_manifest_exits_1_with_patch(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST.format(name="m", version="0.28.0", extra="  prefixCaching: true\n  admissionPolicy: mitigate\n"))
    p = run("-f", str(f), "--output", "json")
    assert p.returncode == 1
    res = json.loads(p.stdout)["results"][0]
    assert res["allowed"] is True and res["changed"] is True
    assert {"op": "replace", "path": "/spec/prefixCaching", "value": False} in res["patch"]
    assert res["mitigatedSpec"]["prefixCaching"] is False


def test_vllm_version_override_and_patch_flag(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST.format(name="m", version="0.33.0", extra="  prefixCaching: false\n"))
    assert run("-f", str(f)).returncode == 0
    p = run("-f", str(f), "--vllm-version", "0.17.1")  # vllm#36917
    assert p.returncode == 1 and "vllm#36917" in p.stdout
    # the shipped guard neutralises #36917; the planned #45100 backport is not relied on
    p = run("-f", str(f), "--vllm-version", "0.17.1", "--patch", "gdn-guard/vllm-36917", "--patch", "gdn-guard/vllm-45100")
    assert "vllm#36917" not in p.stdout and p.returncode == 0, p.stdout
    assert "default: asyncScheduling=false (unset; rule vllm#45100)" in p.stdout  # the unset field avoids it
    assert "not shipped" in p.stdout
    f.write_text(MANIFEST.format(name="m", version="0.33.0", extra="  prefixCaching: false\n  asyncScheduling: true\n"))
    p = run("-f", str(f), "--vllm-version", "0.17.1", "--patch", "gdn-guard/vllm-36917", "--patch", "gdn-guard/vllm-45100")
    assert "[rejected]" in p.stdout and "vllm#45100" in p.stdout and p.returncode == 1, p.stdout
    f.write_text(MANIFEST.format(name="m", version="0.33.0", extra="  prefixCaching: false\n  asyncScheduling: false\n"))
    p = run("-f", str(f), "--vllm-version", "0.17.1", "--patch", "gdn-guard/vllm-36917")
    assert "vllm#36917" not in p.stdout and p.returncode == 0, p.stdout


def test_multi_document_file_evaluates_each(tmp_path):
    f = tmp_path / "multi.yaml"
    good = MANIFEST.format(name="a", version="0.33.0", extra="  prefixCaching: false\n")
    bad = MANIFEST.format(name="b", version="0.28.0", extra="  prefixCaching: true\n")
    f.write_text(good + "---\n" + bad)
    p = run("-f", str(f), "--output", "json")
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and [r["allowed"] for r in doc["results"]] == [True, False]
    assert doc["results"][0]["source"].endswith("[doc 0]")


def test_stdin(tmp_path):
    p = run("-f", "-", stdin=MANIFEST.format(name="s", version="0.33.0", extra="  prefixCaching: false\n"))
    assert p.returncode == 0


@pytest.mark.parametrize(
    "content, needle",
    [
        ("spec: [", "malformed YAML"),
        (MANIFEST.format(name="x", version="0.33.0", extra="  prefixCachin: false\n"), "spec.prefixCachin"),
        (MANIFEST.format(name="x", version="0.33.0", extra="  tensorParallelSize: 0\n"), "spec.tensorParallelSize"),
    ],
)
def test_malformed_manifest_exits_2(tmp_path, content, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    p = run("-f", str(f))
    assert p.returncode == 2
    assert needle in p.stderr and p.stderr.startswith("error: ")


def test_unparseable_version_is_a_finding_exit_1_not_2(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text(MANIFEST.format(name="m", version="latest", extra=""))
    p = run("-f", str(f))
    assert p.returncode == 1 and "gdn-operator/unparseable-version" in p.stdout


def test_launch_line_rejected_exits_1_vllm_45100():
    p = run(
        "--vllm-version",
        "0.19.1",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3.6-27B",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
    )
    assert p.returncode == 1 and "vllm#45100" in p.stdout


def test_launch_line_good_exits_0():
    p = run(
        "--vllm-version",
        "0.33.0",
        "--output",
        "json",
        "--",
        "vllm serve Qwen/Qwen3.5-27B "
        '--speculative-config \'{"method":"mtp","num_speculative_tokens":1}\' --no-enable-prefix-caching',
    )
    assert p.returncode == 0, p.stdout
    res = json.loads(p.stdout)["results"][0]
    assert res["source"] == "launch line" and res["model"] == "Qwen/Qwen3.5-27B" and res["policy"] == "reject"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--", "vllm", "serve", "Qwen/Qwen3.5-27B"], "--vllm-version is required"),
        (["--vllm-version", "0.33.0", "--", "vllm", "serve", "Q/Qwen3.5-9B", "-sc", "{bad"], "not valid JSON"),
        ([], "nothing to validate"),
        (["-f", str(GOOD), "--vllm-version", "0.33.0", "--", "vllm", "serve", "x"], "not both"),
        (["-f", "/nonexistent.yaml"], "no such file"),
    ],
)
def test_usage_errors_exit_2(args, needle):
    p = run(*args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_launch_line_unrecognised_family_exits_2_cannot_tell():
    # issue 16: not a known-crash rejection (exit 1) but "cannot tell", with the fix
    p = run(
        "--vllm-version",
        "0.21.0",
        "--",
        "vllm",
        "serve",
        "/models/my-finetune",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
    )
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr.startswith("error: cannot tell:") and "pass --architecture" in p.stderr
    assert "Qwen3_5ForConditionalGeneration" in p.stderr and "REJECTED" not in p.stderr
    # the same line with the family given is evaluated (vllm#36917 applies on 0.17.1)
    p = run(
        "--vllm-version",
        "0.17.1",
        "--architecture",
        "Qwen3_5ForConditionalGeneration",
        "--",
        "vllm",
        "serve",
        "/models/my-finetune",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
    )
    assert p.returncode == 1 and "vllm#36917" in p.stdout


def test_launch_line_additional_config_triton_silences_flashinfer_3329():
    base = [
        "--vllm-version",
        "0.21.0",
        "--output",
        "json",
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3.5-35B-A3B",
        "-tp",
        "2",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":2}',
    ]
    warned = {f["rule"] for f in json.loads(run(*base).stdout)["results"][0]["findings"]}
    assert "flashinfer#3329" in warned
    for extra in (
        ["--additional-config", '{"gdn_prefill_backend": "triton"}'],
        ['--additional-config={"gdn_prefill_backend":"triton"}'],
        ["--additional-config.gdn_prefill_backend", "triton"],
        ["--gdn-prefill-backend", "triton"],
    ):
        doc = json.loads(run(*base, *extra).stdout)
        rules = {f["rule"] for f in doc["results"][0]["findings"]}
        assert "flashinfer#3329" not in rules, extra


def test_measured_cost_advisory_is_printed_apart_from_warnings(tmp_path):
    """G1's PIECEWISE default at 0.22.0: MTP with it measured 0.84x MTP off at concurrency 32 (rules.yaml `cost`,
    tests/fixtures/vllm-0.22.0-h100x2-prodmodel) — an advisory with its numbers, exit 0, never a warning."""
    f = tmp_path / "s.yaml"
    # a checkpoint whose layer layout the operator cannot read: G1 as measured at 0.22.0 (rules/layout.py)
    f.write_text(MANIFEST.format(name="m", version="0.22.0", extra="").replace("hf://Qwen/Qwen3.5-27B", UNKNOWN_LAYOUT_MODEL))
    p = run("-f", str(f))
    assert p.returncode == 0, p.stdout + p.stderr
    advisories = p.stdout.split("  advisories (", 1)[1]
    line = next(x for x in advisories.splitlines() if "MTPSlowerThanOff" in x)
    assert line.startswith("    (performance, info) MTPSlowerThanOff: gdn-operator/mtp-full-decode-cudagraph")
    assert "0.84x MTP off at concurrency 32" in line and "What to do:" in line
    assert "[warned]" not in p.stdout
    out = json.loads(run("-f", str(f), "--output", "json").stdout)["results"][0]
    (cost,) = [x for x in out["findings"] if x["code"] == "MTPSlowerThanOff"]
    assert cost["action"] == "advisory" and [(m["concurrency"], m["mtpVsOff"]) for m in cost["measurements"]] == [(32, 0.843)]
    for extra in ("  speculativeDecoding: {enabled: false}\n", ""):
        version = "0.22.0" if extra else "0.22.1"  # MTP off / a release no capture measured: nothing to say
        f.write_text(
            MANIFEST.format(name="m", version=version, extra=extra).replace("hf://Qwen/Qwen3.5-27B", UNKNOWN_LAYOUT_MODEL)
        )
        p = run("-f", str(f))
        assert p.returncode == 0 and "ADMITTED" in p.stdout and "MTPSlowerThanOff" not in p.stdout, p.stdout


G1 = "gdn-operator/mtp-full-decode-cudagraph"
TINY_DIR = ROOT / "tests" / "models" / "tiny-qwen3-next-recall"


@pytest.mark.parametrize(
    "model, patch, fires",
    [
        ("Qwen/Qwen3.5-27B", None, False),  # 16 attention + 1 MTP vs 48 GDN layers: one attention group
        (str(TINY_DIR), None, True),  # its config.json: 2 attention + 1 MTP vs 2 GDN layers: two groups
        (str(TINY_DIR), "gdn-guard/fa3-group-metadata", False),  # an image carrying the guard
        (UNKNOWN_LAYOUT_MODEL.removeprefix("hf://"), None, True),  # layout unknown: as measured at 0.22.0
    ],
)
def test_g1_on_a_launch_line_follows_the_attention_kv_groups(model, patch, fires):
    """Issue 33: G1 does not judge a real Qwen3.5 MTP launch line at 0.22.0 (one attention group); the tiny
    model's it does. Issue 47: either line is refused at 0.22.0 all the same, by vllm#53051 (V1 runner + vLLM's
    FULL graphs: a prompt of 1 + k tokens replays the spec-decode graph)."""
    args = ["--vllm-version", "0.22.0", "--output", "json", *(["--patch", patch] if patch else [])]
    argv = ["vllm", "serve", model, "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']
    p = run(*args, "--", *argv, "--no-async-scheduling", "--gdn-prefill-backend", "triton")
    out = json.loads(p.stdout)["results"][0]
    actions = {f["rule"]: f["action"] for f in out["findings"]}
    assert (actions.get(G1) == "rejected") is fires, actions
    assert actions.get("vllm#53051") == "rejected", actions
    assert p.returncode == 1 and out["allowed"] is False, (p.returncode, actions)
