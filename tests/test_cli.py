"""gdnctl end to end, as a user runs it (subprocess of the installed console script)."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gdn_operator.api.crd import crd_yaml
from paths import gdnctl

ROOT = Path(__file__).resolve().parents[1]
GDNCTL = gdnctl()


def run(*args, stdin=None):
    return subprocess.run([GDNCTL, *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_version():
    r = run("version")
    assert r.returncode == 0 and r.stdout.startswith("gdnctl ")


def test_crd_output_equals_generator():
    r = run("crd")
    assert r.returncode == 0
    assert r.stdout == crd_yaml()


def test_render_example():
    r = run("render", "-f", "examples/qwen3.5-27b-mtp.yaml")
    assert r.returncode == 0, r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout)]
    assert kinds[:2] == ["Deployment", "Service"]


def test_render_prints_no_yaml_anchors_and_the_same_objects_as_json():
    """Shared sub-dicts (the engine probes' httpGet) print in full: no `&id001` / `*id001` for a reader or kubectl."""
    r = run("render", "-f", "examples/qwen3.5-27b-mtp.yaml")
    assert r.returncode == 0, r.stderr
    assert "&id" not in r.stdout and "*id" not in r.stdout
    as_json = run("render", "-f", "examples/qwen3.5-27b-mtp.yaml", "--output", "json")
    assert list(yaml.safe_load_all(r.stdout)) == json.loads(as_json.stdout)["items"]


def test_render_and_validate_name_each_rule_once_per_line():
    for cmd in (("render",), ("validate",)):
        r = run(*cmd, "-f", "examples/denied-qwen3.6-prefix-caching-mtp.yaml")
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "vllm#43559" in ln]
        assert lines, r.stdout + r.stderr
        for ln in lines:
            assert "vllm#43559: vllm#43559" not in ln and ln.count("vllm#43559:") <= 1, ln


def test_render_json_from_stdin():
    r = run("render", "-f", "-", "--output", "json", stdin=(ROOT / "examples/qwen3.5-27b-mtp.yaml").read_text())
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "List"


BROKEN = """\
apiVersion: serving.gdn-operator.io/v1alpha1
kind: GDNModelServer
metadata: {name: broken}
spec:
  model: {uri: "hf://Qwen/Qwen3.5-27B"}
  image: {tag: v0.33.0, vllmVersion: "0.33.0"}
  tensorParallelSize: 0
  speculativeDecoding: {numSpeculativeTokens: "lots"}
  gpuMemoryUtilisation: 0.8
"""


def test_broken_manifest_exits_2_with_one_line_per_field(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text(BROKEN)
    for cmd in ("render", "validate"):
        r = run(cmd, "-f", str(f))
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert any("spec.tensorParallelSize" in l for l in lines)
        assert any("spec.speculativeDecoding.numSpeculativeTokens" in l for l in lines)
        assert any("spec.gpuMemoryUtilisation: unknown field" in l for l in lines)
        assert len(lines) == 3


def test_malformed_yaml_and_missing_file_exit_2(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("spec: [unclosed\n")
    r = run("validate", "-f", str(f))
    assert r.returncode == 2 and "malformed YAML" in r.stderr and "Traceback" not in r.stderr
    r = run("render", "-f", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no such file" in r.stderr


def test_render_of_a_rejected_manifest_creates_nothing_and_exits_1():
    r = run("render", "-f", "examples/denied-qwen3.6-prefix-caching-mtp.yaml")
    assert r.returncode == 1
    assert r.stdout.strip() == ""
    assert "rejected vllm#43559" in r.stderr and "the operator creates nothing" in r.stderr


def test_render_runs_without_the_kubernetes_client():
    """GPU hosts run `gdnctl render` (tests/gpu/harness.py, bench/bench_gpu_*.py) with only the offline vLLM
    bundle on the path, which has pydantic and PyYAML but no Kubernetes client: rendering a manifest
    without affinity/tolerations must not import it (the typed affinity checks import it lazily)."""
    import sys

    code = (
        "import sys, runpy; sys.modules['kubernetes'] = None; "  # any `import kubernetes` now raises ImportError
        "sys.argv = ['gdnctl', 'render', '-f', 'examples/qwen3.5-27b-mtp.yaml', '--output', 'json']; "
        "runpy.run_module('gdn_operator.cli', run_name='__main__')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={"PYTHONPATH": str(ROOT / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    kinds = [o["kind"] for o in json.loads(p.stdout)["items"]]
    assert "Deployment" in kinds


def test_render_prints_the_measured_cost_advisory_and_keeps_the_mitigation():
    # a Qwen3.5 name with no known layer layout: G1 keeps its 0.22.0 PIECEWISE default (rules/layout.py)
    manifest = (
        "apiVersion: serving.gdn-operator.io/v1alpha1\nkind: GDNModelServer\nmetadata: {name: q, namespace: default}\n"
        'spec:\n  model: {uri: "hf://Qwen/Qwen3.5-9B"}\n  image: {tag: v0.22.0, vllmVersion: "0.22.0"}\n'
    )
    r = run("render", "-f", "-", "--output", "json", stdin=manifest)
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if "MTPSlowerThanOff" in x)
    assert line.startswith("# q: advisory gdn-operator/mtp-full-decode-cudagraph: MTPSlowerThanOff:")
    assert "0.84x MTP off at concurrency 32" in line
    deploy = next(o for o in json.loads(r.stdout)["items"] if o["kind"] == "Deployment")
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--compilation-config") + 1] == '{"cudagraph_mode":"PIECEWISE"}'  # the default stays
    r = run("render", "-f", "-", stdin=manifest.replace("0.22.0", "0.33.0"))
    assert r.returncode == 0 and "MTPSlowerThanOff" not in r.stderr


def test_validate_policy_is_the_operators_default_and_the_spec_still_wins(tmp_path):
    """`--policy` answers as an operator whose chart sets operator.defaultPolicy: it decides where the manifest
    sets no spec.admissionPolicy; a manifest's own admissionPolicy still wins, as in the cluster."""
    example = (ROOT / "examples/denied-qwen3.6-prefix-caching-mtp.yaml").read_text()
    unset = tmp_path / "unset.yaml"
    unset.write_text(example.replace("  admissionPolicy: reject\n", ""))
    assert "\n  admissionPolicy" not in unset.read_text()

    plain = run("validate", "-f", str(unset), "--output", "json")
    assert plain.returncode == 1 and json.loads(plain.stdout)["results"][0]["policy"] == "reject"
    assert json.loads(plain.stdout)["results"][0]["allowed"] is False

    mitigated = run("validate", "-f", str(unset), "--policy", "mitigate", "--output", "json")
    res = json.loads(mitigated.stdout)["results"][0]
    assert mitigated.returncode == 1 and res["policy"] == "mitigate" and res["allowed"] is True
    assert {"op": "replace", "path": "/spec/prefixCaching", "value": False} in res["patch"]

    pinned = run("validate", "-f", "examples/denied-qwen3.6-prefix-caching-mtp.yaml", "--policy", "mitigate", "--output", "json")
    assert json.loads(pinned.stdout)["results"][0]["policy"] == "reject"

    bad = run("validate", "-f", str(unset), "--policy", "lenient")
    assert bad.returncode == 2 and "--policy" in bad.stderr and "mitigate" in bad.stderr


def test_validate_policy_applies_to_a_launch_line():
    line = [
        "--",
        "vllm",
        "serve",
        "Qwen/Qwen3.5-27B",
        "--enable-prefix-caching",
        "--speculative-config",
        '{"method":"qwen3_next_mtp","num_speculative_tokens":2}',
    ]
    default = json.loads(run("validate", "--vllm-version", "0.28.0", "--output", "json", *line).stdout)["results"][0]
    assert default["policy"] == "reject" and default["allowed"] is False
    r = run("validate", "--vllm-version", "0.28.0", "--policy", "mitigate", "--output", "json", *line)
    res = json.loads(r.stdout)["results"][0]
    assert res["policy"] == "mitigate" and res["allowed"] is True, r.stdout + r.stderr


def test_render_keeps_full_graphs_for_a_checkpoint_with_one_attention_group():
    """Issue 33: Qwen/Qwen3.5-27B (16 attention + 1 MTP vs 48 GDN layers, data/checkpoints.yaml) forms one
    full-attention KV-cache group, so G1 sets no CUDA-graph mode: on the V2 runner (0.29.0) vLLM's
    FULL_AND_PIECEWISE default runs. Issue 47: on the V1 runner (0.22.0) vllm#53051 sets PIECEWISE all the same,
    and says so; G1 is not the reason."""

    def render(version: str) -> tuple[list[str], str]:
        manifest = (
            "apiVersion: serving.gdn-operator.io/v1alpha1\nkind: GDNModelServer\nmetadata: {name: q, namespace: default}\n"
            f'spec:\n  model: {{uri: "hf://Qwen/Qwen3.5-27B"}}\n  image: {{tag: v{version}, vllmVersion: "{version}"}}\n'
        )
        r = run("render", "-f", "-", "--output", "json", stdin=manifest)
        assert r.returncode == 0, r.stderr
        deploy = next(o for o in json.loads(r.stdout)["items"] if o["kind"] == "Deployment")
        return deploy["spec"]["template"]["spec"]["containers"][0]["args"], r.stderr

    args, err = render("0.29.0")
    assert "--compilation-config" not in args and "--enforce-eager" not in args
    assert '"method":"mtp"' in " ".join(args) and "mtp-full-decode-cudagraph" not in err
    args, err = render("0.22.0")
    i = args.index("--compilation-config")
    assert args[i + 1] == '{"cudagraph_mode":"PIECEWISE"}' and "--enforce-eager" not in args
    assert 'default cudagraphMode="PIECEWISE" (vllm#53051)' in err, err


# ------------------------------------------------------------------------ vLLM 0.34.0 (issue 46) --

MANIFEST_34 = (
    "apiVersion: serving.gdn-operator.io/v1alpha1\nkind: GDNModelServer\nmetadata: {name: q, namespace: default}\n"
    'spec:\n  model: {uri: "hf://Qwen/Qwen3.5-27B"}\n  image: {tag: v0.34.0, vllmVersion: "0.34.0"}\n'
)


def _engine_args(stdout: str) -> list[str]:
    deploy = next(o for o in json.loads(stdout)["items"] if o["kind"] == "Deployment")
    return deploy["spec"]["template"]["spec"]["containers"][0]["args"]


def test_validate_at_0_34_refuses_modelrunner_v1_naming_why_and_the_fix(tmp_path):
    f = tmp_path / "v1.yaml"
    f.write_text(MANIFEST_34.replace("0.34.0", "0.33.0") + "  modelRunner: v1\n")
    r = run("validate", "-f", str(f), "--vllm-version", "0.34.0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "REJECTED" in r.stdout and "vllm-config/v1-runner-removed" in r.stdout
    assert "V1 model runner was removed in vLLM 0.34.0" in r.stdout and "pin spec.image.vllmVersion to a 0.33.x" in r.stdout
    assert run("validate", "-f", str(f)).returncode == 0  # the same manifest at 0.33.0 still runs V1


def test_render_at_0_34_writes_no_gpu_memory_fraction_or_async_flag_unless_set():
    r = run("render", "-f", "-", "--output", "json", stdin=MANIFEST_34)
    assert r.returncode == 0, r.stderr
    args = _engine_args(r.stdout)
    assert "--gpu-memory-utilization" not in args and "--no-async-scheduling" not in args
    assert "--no-enable-prefix-caching" in args and "--gdn-prefill-backend" in args  # the defaults that stay
    set_ = run("render", "-f", "-", "--output", "json", stdin=MANIFEST_34 + "  gpuMemoryUtilization: 0.8\n")
    args = _engine_args(set_.stdout)
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.8"
    v = json.loads(run("validate", "-f", "-", "--output", "json", stdin=MANIFEST_34).stdout)["results"][0]
    assert {d["field"] for d in v["defaults"]} == {"prefixCaching", "gdnPrefillBackend"}, v["defaults"]


def test_validate_strict_exits_4_for_an_uncatalogued_release_and_names_it(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(MANIFEST_34)
    assert run("validate", "-f", str(f), "--strict").returncode == 0  # 0.34.0 is catalogued
    for version in ("0.35.0", "0.34.1rc1", "0.34.1.dev12+gabc"):
        r = run("validate", "-f", str(f), "--vllm-version", version, "--strict")
        assert r.returncode == 4, (version, r.stdout + r.stderr)
        assert "strict: not a catalogued release" in r.stdout, r.stdout
        assert run("validate", "-f", str(f), "--vllm-version", version).returncode == 0  # without --strict: admitted
    newer = run("validate", "-f", str(f), "--vllm-version", "0.35.0", "--strict", "--output", "json")
    doc = json.loads(newer.stdout)
    assert doc["exitCode"] == 4 and "newer than the releases the catalogue read" in doc["results"][0]["uncatalogued"]
    # the admission warning names what was not checked
    assert any("not checked against vLLM 0.35.0" in w["message"] for w in doc["results"][0]["findings"])
    # a refusal stays a refusal (1), strict or not; a launch line is judged the same way
    f.write_text(MANIFEST_34 + "  modelRunner: v1\n")
    assert run("validate", "-f", str(f), "--vllm-version", "0.35.0", "--strict").returncode == 1
    line = ["--", "vllm", "serve", "Qwen/Qwen3.5-27B", "--no-enable-prefix-caching", "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']  # fmt: skip
    assert run("validate", "--vllm-version", "0.36.0", "--strict", *line).returncode == 4
    assert run("validate", "--vllm-version", "0.34.0", "--strict", *line).returncode == 0


@pytest.mark.readme("gdnctl validate --strict --vllm-version 0.35.0 -f examples/qwen3.5-27b-mtp.yaml")
def test_readme_strict_line_exits_4_for_a_release_newer_than_the_catalogue():
    r = run("validate", "--strict", "--vllm-version", "0.35.0", "-f", "examples/qwen3.5-27b-mtp.yaml")
    assert r.returncode == 4, r.stdout + r.stderr
    assert "ADMITTED WITH WARNINGS" in r.stdout and "gdn-operator/version-not-in-catalogue" in r.stdout
    assert r.stdout.rstrip().endswith("vLLM 0.35.0 is newer than the releases the catalogue read (0.17.0 - 0.34.0)")


def test_validate_help_documents_strict():
    r = run("validate", "--help")
    assert "--strict" in r.stdout and "catalogue" in r.stdout
