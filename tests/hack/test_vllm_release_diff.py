"""hack/vllm-release-diff.py (issue 46 part 2): a vLLM release -> the facts this repo depends on (extract), two
extracts -> every change, each naming the rules / render paths / tables here that read it (diff).

No wheel and no network here: extraction is tested on tiny synthetic releases written below (as a directory and
as a .whl), the diff on the committed extracts of the real 0.33.0 and 0.34.0 wheels
(tests/fixtures/vllm-release-extracts/), which are also held to the parser tables generated from vLLM's real
parser (api/data/vllm-options/).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "hack"))

from vllm_release import extract, report  # noqa: E402

SCRIPT = ROOT / "hack" / "vllm-release-diff.py"
EXTRACTS = ROOT / "tests" / "fixtures" / "vllm-release-extracts"
WATCH = yaml.safe_load((ROOT / "hack" / "vllm_release" / "watch.yaml").read_text())


def _committed(version: str) -> dict:
    return json.loads((EXTRACTS / f"{version}.json").read_text())


# ----------------------------------------------------------------------- a synthetic release ---


def write_release(root: Path, version: str, *, v1_runner: bool, gpu_mem: str, block: int, refuse_v1_env: bool) -> Path:
    """A wheel-like tree with the shapes extract.py reads (the real files are the same shapes, much longer)."""
    files = {
        f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Requires-Dist: torch==2.14.0\nRequires-Dist: huggingface_hub>="
        + ("2.0.0" if refuse_v1_env else "1.31.0")
        + "\nRequires-Dist: pytest; extra == 'test'\n",
        "vllm/__init__.py": "",
        "vllm/config/cache.py": f"""
            from typing import ClassVar
            from pydantic import Field

            class CacheConfig:
                DEFAULT_BLOCK_SIZE: ClassVar[int] = {block}
                block_size: int = Field(default=None, gt=0)
                gpu_memory_utilization: float = Field(default={gpu_mem}, gt=0, le=1)
                enable_prefix_caching: bool = True
            """,
        "vllm/config/scheduler.py": """
            class SchedulerConfig:
                async_scheduling: bool | None = None
                max_num_seqs: int = None
            """,
        "vllm/config/vllm.py": """
            _QWEN3_5_ARCHITECTURES = frozenset({"Qwen3_5ForCausalLM"})

            class VllmConfig:
                def __post_init__(self):
                    if self.scheduler_config.async_scheduling is None:
                        if self.speculative_config is not None and not self.use_v2_model_runner:
                            self.scheduler_config.async_scheduling = False
                        else:
                            self.scheduler_config.async_scheduling = True
            """,
        "vllm/engine/arg_utils.py": """
            from vllm.config.cache import CacheConfig
            from vllm.config.scheduler import SchedulerConfig

            class EngineArgs:
                gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization
                async_scheduling: bool | None = SchedulerConfig.async_scheduling

                @staticmethod
                def add_cli_args(parser):
                    cache_kwargs = get_kwargs(CacheConfig)
                    scheduler_kwargs = get_kwargs(SchedulerConfig)
                    group = parser.add_argument_group("cache")
                    group.add_argument(
                        "--gpu-memory-utilization", "--device-memory-utilization", dest="gpu_memory_utilization",
                        **cache_kwargs["gpu_memory_utilization"],
                    )
                    group.add_argument("--block-size", **cache_kwargs["block_size"])
                    group.add_argument("--async-scheduling", **scheduler_kwargs["async_scheduling"])
                    group.add_argument("--max-num-seqs", "-mns", **scheduler_kwargs["max_num_seqs"])
                    group.add_argument("--fail-on-environ-validation", default=False)
                    return parser
            """,
        "vllm/entrypoints/common/cli_args.py": """
            class BaseFrontendArgs:
                chat_template: str | None = None

            class FrontendArgs(BaseFrontendArgs):
                host: str | None = None
                port: int = 8000

            def make_arg_parser(parser):
                parser.add_argument("--api-server-count", "-asc", type=int, default=None)
                return parser
            """,
        "vllm/envs.py": textwrap.dedent(
            """
            import os
            removed_environment_variables: dict[str, str] = {"VLLM_OLD_KNOB": "Use --new-knob."}
            environment_variables = {
                "VLLM_USE_BREAKABLE_CUDAGRAPH": lambda: bool(int(os.getenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"))),
                "VLLM_LOGGING_LEVEL": lambda: os.getenv("VLLM_LOGGING_LEVEL", "INFO"),
            """
        )
        + ("" if refuse_v1_env else '    "VLLM_USE_V2_MODEL_RUNNER": lambda: os.getenv("VLLM_USE_V2_MODEL_RUNNER"),\n')
        + "}\n",
        "vllm/platforms/interface.py": textwrap.dedent(
            """
            import os

            class Platform:
                @classmethod
                def validate_environ(cls, hard_fail):
                    for env, value in os.environ.items():
            """
        )
        + (
            '            if env == "VLLM_USE_V2_MODEL_RUNNER" and value != "1":\n'
            '                raise ValueError(f"VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported")\n'
            if refuse_v1_env
            else ""
        )
        + '            if env.startswith("VLLM_") and hard_fail:\n'
        + '                raise ValueError(f"Unknown vLLM environment variable detected: {env}")\n',
        "vllm/v1/worker/gpu/model_runner.py": "class GPUModelRunner:\n    pass\n",
        "vllm/v1/attention/backends/flash_attn.py": """
            class AttentionMetadataBuilder:
                def update_block_table(self, metadata, block_table, slot_mapping):
                    return metadata

            class FlashAttentionMetadataBuilder(AttentionMetadataBuilder):
                supports_update_block_table: bool = True

                def __init__(self):
                    self.use_full_cuda_graph = False
            """,
        "vllm/v1/metrics/loggers.py": """
            NAMES = ["vllm:generation_tokens", "vllm:num_requests_running", "vllm:spec_decode_num_drafts"]
            """,
    }
    if v1_runner:
        files["vllm/v1/worker/gpu_model_runner.py"] = "class GPUModelRunner:\n    pass\n"
    else:  # the newer release has one more option
        new_option = '                    group.add_argument("--cache-aware-admission-window", type=int, default=0)\n'
        files["vllm/engine/arg_utils.py"] = files["vllm/engine/arg_utils.py"].replace(
            "                    return parser\n", new_option + "                    return parser\n"
        )
    if not refuse_v1_env:  # the older release: the spec-decode acceptance counter is spelled too
        files["vllm/v1/metrics/loggers.py"] += 'ACCEPTED = "vllm:spec_decode_num_accepted_tokens"\n'
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text) if text.startswith("\n") else text)
    return root


@pytest.fixture()
def two_releases(tmp_path):
    old = write_release(tmp_path / "old", "9.1.0", v1_runner=True, gpu_mem="0.92", block=16, refuse_v1_env=False)
    new = write_release(tmp_path / "new", "9.2.0", v1_runner=False, gpu_mem="None", block=64, refuse_v1_env=True)
    return old, new


def _wheel(tree: Path, out: Path) -> Path:
    with zipfile.ZipFile(out, "w") as z:
        for p in sorted(tree.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(tree).as_posix())
    return out


def test_extract_reads_a_synthetic_release(two_releases):
    old, _ = two_releases
    ex = extract.extract(old, WATCH)
    assert ex["vllm_version"] == "9.1.0" and ex["schema"] == extract.SCHEMA
    assert ex["requires"] == {"huggingface-hub": ">=1.31.0", "torch": "==2.14.0"}  # extras left out
    assert ex["flags"]["gpu_memory_utilization"] == {
        "options": ["--gpu-memory-utilization", "--device-memory-utilization"],
        "default": "0.92",  # followed from get_kwargs(CacheConfig) to CacheConfig's Field(default=...)
    }
    assert ex["flags"]["max_num_seqs"]["options"] == ["--max-num-seqs", "-mns"]
    assert ex["flags"]["api_server_count"] == {"options": ["--api-server-count", "-asc"], "default": "None"}
    assert ex["flags"]["port"] == {"options": ["--port"], "default": "8000"}  # a frontend dataclass field
    assert ex["flags"]["chat_template"]["options"] == ["--chat-template"]  # inherited from the base class
    assert set(ex["env"]) == {"VLLM_USE_BREAKABLE_CUDAGRAPH", "VLLM_LOGGING_LEVEL", "VLLM_USE_V2_MODEL_RUNNER"}
    assert ex["env_removed"] == {"VLLM_OLD_KNOB": "Use --new-knob."}
    assert ex["config"]["vllm/config/cache.py:CacheConfig"]["DEFAULT_BLOCK_SIZE"] == "16"
    assert ex["constants"]["vllm/config/vllm.py:_QWEN3_5_ARCHITECTURES"] == "frozenset({'Qwen3_5ForCausalLM'})"
    assert ex["model_runners"] == {
        "vllm/v1/worker/gpu/model_runner.py": ["GPUModelRunner"],
        "vllm/v1/worker/gpu_model_runner.py": ["GPUModelRunner"],
    }
    assert ex["branches"]["async_scheduling"]["vllm/config/vllm.py:VllmConfig.__post_init__"] == [
        "self.scheduler_config.async_scheduling is None / self.speculative_config is not None and (not self.use_v2_model_runner)"
        " => self.scheduler_config.async_scheduling = False",
        "self.scheduler_config.async_scheduling is None / not (self.speculative_config is not None and (not "
        "self.use_v2_model_runner)) => self.scheduler_config.async_scheduling = True",
    ]
    builder = ex["patch_targets"]["vllm/v1/attention/backends/flash_attn.py:FlashAttentionMetadataBuilder"]
    assert builder == {"exists": True, "members": ["__init__", "supports_update_block_table", "update_block_table"]}
    assert ex["metrics"] == [
        "vllm:generation_tokens",
        "vllm:num_requests_running",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_drafts",
    ]


def test_a_wheel_and_its_unpacked_tree_give_the_same_extract(two_releases, tmp_path):
    old, _ = two_releases
    from_dir = extract.extract(old, WATCH)
    from_pkg = extract.extract(old / "vllm", WATCH)  # the vllm/ directory itself
    from_whl = extract.extract(_wheel(old, tmp_path / "vllm-9.1.0-py3-none-any.whl"), WATCH)
    for ex in (from_pkg, from_whl):
        assert {k: v for k, v in ex.items() if k != "source"} == {k: v for k, v in from_dir.items() if k != "source"}
    assert from_whl["source"] == "vllm-9.1.0-py3-none-any.whl"


def test_extract_refuses_what_is_not_a_release(tmp_path):
    with pytest.raises(extract.ExtractError, match="no vllm/ package"):
        extract.extract(tmp_path, WATCH)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(extract.ExtractError, match="not a .whl file or a directory"):
        extract.extract(tmp_path / "x.txt", WATCH)


def _changes(old: dict, new: dict) -> list[report.Change]:
    return report.diff(old, new, report.Repo(WATCH))


def _find(changes, section, item_part, kind=None):
    found = [c for c in changes if c.section == section and item_part in c.item and (kind is None or c.kind == kind)]
    assert found, f"no {kind or ''} change in {section} naming {item_part}: {[(c.section, c.kind, c.item) for c in changes]}"
    return found[0]


def test_diff_of_two_synthetic_releases_names_each_change_and_who_reads_it(two_releases):
    old, new = (extract.extract(p, WATCH) for p in two_releases)
    changes = _changes(old, new)
    runner = _find(changes, "model_runners", "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner", "removed")
    assert "remedy:disable-v2-model-runner" in runner.consumers
    gpu = _find(changes, "flags", "--gpu-memory-utilization", "default changed")
    assert (gpu.old, gpu.new) == ("0.92", "None")
    assert "operator/gdn_operator/api/flags.py:GPU_MEMORY" in gpu.consumers and gpu.note == "owned by spec.gpuMemoryUtilization"
    block = _find(changes, "config", "CacheConfig.DEFAULT_BLOCK_SIZE", "changed")
    assert (block.old, block.new) == ("16", "64")
    raise_v1 = _find(changes, "env_checks", "VLLM_USE_V2_MODEL_RUNNER", "added")
    assert "is no longer supported" in raise_v1.new and "rule:vllm-config/v2-runner-env-not-integer" in raise_v1.consumers
    gone = _find(changes, "env", "VLLM_USE_V2_MODEL_RUNNER", "removed")
    assert "it still raises where named" in gone.note
    hub = _find(changes, "requires", "huggingface-hub", "changed")
    assert (hub.old, hub.new) == (">=1.31.0", ">=2.0.0") and hub.consumers == ["operator/gdn_operator/render/podparts.py"]
    window = _find(changes, "flags", "--cache-aware-admission-window", "added")
    assert window.new == {"options": ["--cache-aware-admission-window"], "default": "0"}
    assert window.note == (
        "reviewed, allowed in extraArgs; NO PARSER TABLE: refused in extraArgs until hack/gen_vllm_options.py makes it"
    )
    scraped = _find(changes, "metrics", "vllm:spec_decode_num_accepted_tokens", "removed")
    assert scraped.note.startswith("SCRAPED") and "operator/gdn_operator/watch/acceptance/parse.py:_KINDS" in scraped.consumers
    validate = _find(changes, "branches:env_validation", "Platform.validate_environ")
    assert any("is no longer supported" in line for line in validate.new)
    assert not [c for c in changes if c.section == "patch_targets"]  # unchanged: nothing reported
    same = _changes(old, old)  # no change; only the scraped names the synthetic release never spells are findings
    assert {(c.kind, c.note) for c in same} == {("absent", "SCRAPED but in neither release")}
    assert "vllm:spec_decode_num_draft_tokens" in {c.item for c in same}


def test_text_and_json_reports(two_releases):
    old, new = (extract.extract(p, WATCH) for p in two_releases)
    changes = _changes(old, new)
    text = report.render_text(old, new, changes)
    assert text.startswith("vLLM release diff 9.1.0 -> 9.2.0")
    assert "== model runners (vllm/v1/worker)\n  - vllm/v1/worker/gpu_model_runner.py:GPUModelRunner\n" in text
    assert "  ~ --gpu-memory-utilization default changed: 0.92 -> None\n      note: owned by spec.gpuMemoryUtilization" in text
    doc = json.loads(report.render_json(old, new, changes))
    assert (doc["old"]["vllm_version"], doc["new"]["vllm_version"]) == ("9.1.0", "9.2.0")
    assert len(doc["changes"]) == len(changes) and all(
        {"section", "kind", "item", "consumers", "read_here"} <= set(c) for c in doc["changes"]
    )


# --------------------------------------------------------------- the committed real extracts ---


def test_committed_extracts_hold_every_watched_topic():
    for version in ("0.33.0", "0.34.0"):
        ex = _committed(version)
        assert ex["schema"] == extract.SCHEMA and ex["vllm_version"] == version
        assert ex["source"] == f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
        assert (EXTRACTS / f"{version}.json").read_text() == json.dumps(ex, indent=1, sort_keys=True) + "\n"
        for topic in WATCH["branches"]:
            assert topic in ex["branches"], f"{version}: watch.yaml topic {topic!r} not extracted; re-extract"


def _cached_wheels() -> list[Path]:
    """Release wheels the GPU bundle cached (hack/gpu/bundle.sh) whose extract is committed: re-extracted below."""
    cache = Path(os.environ.get("GDN_CACHE_DIR", Path.home() / ".cache" / "gdn-operator"))
    wheels = {*cache.glob("gpu-wheels/vllm-*.whl"), *cache.glob("wheels/vllm-*/vllm-*.whl")}
    return sorted(w for w in wheels if (EXTRACTS / f"{w.name.split('-')[1]}.json").exists())


@pytest.mark.engine  # the tier with real vLLM artefacts (as tests/images/test_gdn_guard_fa3.py's wheel-source check)
@pytest.mark.parametrize("wheel", _cached_wheels(), ids=lambda w: w.name.split("-")[1])
def test_committed_extract_is_what_the_extractor_makes_of_the_cached_wheel(wheel):
    """Where the release's wheel is at hand (the GPU bundle caches it), the committed extract must be today's
    extractor's reading of it (a change to extract.py or watch.yaml without re-extracting fails here). The unit
    tier reads no wheel."""
    assert extract.extract(wheel, WATCH) == _committed(wheel.name.split("-")[1])


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_static_flags_agree_with_the_real_parser_table(version):
    """The extract reads options from source; the parser table was generated by vLLM's own parser. Same options."""
    table = {o["dest"]: o for o in yaml.safe_load((ROOT / report.TABLES / f"{version}.yaml").read_text())["options"]}
    flags = _committed(version)["flags"]
    assert set(flags) == set(table) - {"help", "model_tag"}
    for dest, entry in flags.items():
        assert set(entry["options"]) <= set(table[dest]["options"]), dest
        assert {s for s in table[dest]["options"] if not s.startswith("--")} <= set(entry["options"]), dest  # aliases
        assert entry["options"][0] == table[dest]["options"][0], dest  # the canonical spelling first


def test_diff_033_to_034_catches_what_issue_46_lists():
    changes = _changes(_committed("0.33.0"), _committed("0.34.0"))
    # the V1 model runner is gone and VLLM_USE_V2_MODEL_RUNNER != 1 is refused at start
    _find(changes, "model_runners", "vllm/v1/worker/gpu_model_runner.py:GPUModelRunner", "removed")
    refused = _find(changes, "env_checks", "VLLM_USE_V2_MODEL_RUNNER", "added")
    assert refused.new.startswith(
        "vllm/platforms/interface.py: raise ValueError(f'VLLM_USE_V2_MODEL_RUNNER={value} is no longer supported"
    )
    # async scheduling: 0.33.0's V1-only incompatibility block is deleted
    post_init = _find(changes, "branches:async_scheduling", "vllm/config/vllm.py:VllmConfig.__post_init__")
    assert any("v1_async_sched_incompat" in line for line in post_init.old)
    assert not any("v1_async_sched_incompat" in line for line in post_init.new)
    # Qwen3.5 defaults to breakable CUDA graphs on NVIDIA
    breakable = _find(changes, "branches:cuda_graphs", "vllm/config/vllm.py:default_breakable_cudagraph_architectures")
    assert breakable.new == [
        "current_platform.is_cuda() => return DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES | _QWEN3_5_ARCHITECTURES"
    ]
    assert (
        "Qwen3_5ForConditionalGeneration"
        in _find(changes, "constants", "vllm/config/vllm.py:_QWEN3_5_ARCHITECTURES", "added").new
    )
    # KV sizing: gpu_memory_utilization unset by default, block size 16 -> 64
    gpu = _find(changes, "flags", "--gpu-memory-utilization", "default changed")
    assert (gpu.old, gpu.new) == ("0.92", "None")
    block = _find(changes, "config", "vllm/config/cache.py:CacheConfig.DEFAULT_BLOCK_SIZE", "changed")
    assert (block.old, block.new) == ("16", "64")
    # new options, classified by the extraArgs policy
    for option in ("--enable-extensible-kv-cache", "--cache-aware-admission-threshold"):
        new = _find(changes, "flags", option, "added")
        assert new.note == "reviewed, allowed in extraArgs" and f"{report.TABLES}/0.34.0.yaml" in new.consumers
    # the image's huggingface_hub
    hub = _find(changes, "requires", "huggingface-hub", "changed")
    assert (hub.old, hub.new) == (">=1.31.0", ">=2.0.0")
    # and nothing the scraper reads went away
    assert not [c for c in changes if c.section == "metrics" and c.note.startswith("SCRAPED")]


def test_diff_033_to_034_catches_what_issue_46_did_not_list():
    changes = _changes(_committed("0.33.0"), _committed("0.34.0"))
    assert _find(changes, "requires", "flashinfer-python", "changed").new == "==0.7.3"
    _find(changes, "model_runners", "vllm/v1/worker/cpu_model_runner.py:CPUModelRunner", "removed")  # V1 CPU runner too
    removed_hint = _find(changes, "branches:env_validation", "Platform.validate_environ")  # removed variables now fail
    assert any("removed_environment_variables.get(env)" in line for line in removed_hint.new)
    drafting = _find(changes, "config", "SpeculativeConfig.parallel_drafting", "changed")
    assert (drafting.old, drafting.new) == ("False", "None")
    # the breakable-graph choice moved from the process environment into compilation_config, overwritten from the env
    enable = _find(changes, "branches:cuda_graphs", "VllmConfig._maybe_enable_breakable_cudagraph")
    assert "self.compilation_config.use_breakable_cudagraph = enabled" in enable.new
    assert any("os.environ['VLLM_USE_BREAKABLE_CUDAGRAPH'] = '1'" in line for line in enable.old)


def test_fa3_metadata_reuse_is_mamba_only_on_the_v2_runner():
    """G1's mechanism (a FlashAttention builder's metadata handed to another KV-cache group through
    update_block_table) is in the V1 runner; the V2 runner reuses metadata only for Mamba groups (static
    evidence for issue 46 item 4; the GPU run decides)."""
    for version in ("0.33.0", "0.34.0"):
        scopes = _committed(version)["branches"]["fa3_group_metadata"]
        v2 = scopes["vllm/v1/worker/gpu/attn_utils.py:build_attn_metadata"]
        assert any("supports_update_block_table and isinstance(attn_group.kv_cache_spec, MambaSpec)" in line for line in v2)
    assert not [s for s in _committed("0.34.0")["branches"]["fa3_group_metadata"] if "gpu_model_runner.py" in s]


# --------------------------------------------------------------------------------- the map ---


def _check_consumer(ref: str, rule_ids: set[str], remedies: set[str]) -> str | None:
    if ref.startswith("rule:"):
        return None if ref[5:] in rule_ids else f"no rule {ref[5:]}"
    if ref.startswith("remedy:"):
        return None if ref[7:] in remedies else f"no remedy {ref[7:]}"
    path, _, symbol = ref.partition(":")
    if not (ROOT / path).exists():
        return f"no file {path}"
    if symbol and not re.search(rf"\b{re.escape(symbol)}\b", (ROOT / path).read_text()):
        return f"{path} does not name {symbol}"
    return None


def _consumer_refs(node) -> list[str]:
    if isinstance(node, dict):
        return [r for k, v in node.items() for r in (v if k == "consumers" and isinstance(v, list) else _consumer_refs(v))]
    if isinstance(node, list):
        return [r for item in node for r in _consumer_refs(item)]
    return []


def test_every_consumer_in_the_map_exists():
    rules = yaml.safe_load((ROOT / report.RULES).read_text())
    rule_ids = {r["id"] for r in rules["rules"]}
    remedies = set(yaml.safe_load((ROOT / "operator/gdn_operator/watch/data/signatures.yaml").read_text())["actions"])
    refs = _consumer_refs(WATCH)
    refs += [r for refs_ in WATCH["flags"]["consumers"].values() for r in refs_]
    refs += [r for refs_ in WATCH["env"].values() for r in refs_ or []]
    refs += [r for refs_ in WATCH["requires"].values() for r in refs_]
    assert len(refs) > 60
    bad = {r: why for r in refs if (why := _check_consumer(r, rule_ids, remedies))}
    assert bad == {}


def test_every_vllm_variable_the_repo_names_is_watched():
    policy = yaml.safe_load((ROOT / report.POLICY).read_text())["env"]
    named = {n for section in ("owned", "rule_relevant") for n in policy[section] if n.startswith("VLLM_")}
    named |= set(re.findall(r'"(VLLM_[A-Z0-9_]+)"', (ROOT / "operator/gdn_operator/render/engine.py").read_text()))
    assert named - set(WATCH["env"]) == set()


def test_every_scraped_metric_exists_in_the_newest_release():
    names = set(_committed("0.34.0")["metrics"])
    assert sorted(f"vllm:{b}" for b in report.Repo(WATCH).scraped if f"vllm:{b}" not in names) == []


# --------------------------------------------------------------------------------- the CLI ---


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_cli_on_committed_versions():
    out = _run("0.33.0", "0.34.0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("vLLM release diff 0.33.0 -> 0.34.0")
    doc = json.loads(_run("0.33.0", "0.34.0", "--json").stdout)
    assert doc["new"]["vllm_version"] == "0.34.0" and any(c["section"] == "model_runners" for c in doc["changes"])


def test_cli_extract_then_diff_files(two_releases, tmp_path):
    old, new = two_releases
    assert _run("--extract", str(old), "-o", str(tmp_path / "old.json")).returncode == 0
    assert _run("--extract", str(_wheel(new, tmp_path / "new.whl")), "-o", str(tmp_path / "new.json")).returncode == 0
    out = _run(str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert out.returncode == 0 and "9.1.0 -> 9.2.0" in out.stdout
    mixed = _run(str(tmp_path / "old.json"), str(new))  # an extract against a tree
    assert mixed.stdout == out.stdout.replace("new.whl", "new")


def test_cli_errors_name_the_input(tmp_path):
    out = _run("0.1.0", "0.34.0")
    assert out.returncode == 2 and "0.1.0: no such file or directory, and no committed extract" in out.stderr
    stale = tmp_path / "old.json"
    stale.write_text(json.dumps({"schema": 0}))
    out = _run(str(stale), "0.34.0")
    assert out.returncode == 2 and "extract schema 0" in out.stderr and "re-extract" in out.stderr
