"""`gdnctl validate -- vllm serve ...` reads a launch line the way vLLM's REAL parser does (engine tier).

Issue 11 part 1 closed the `extraArgs` bypass with the generated option table; the launch-line reader had
its own flag table, so `--as`, `--spec-method=mtp --spec-tokens=2` or `--device-memory-utilization` were
"ignored unknown flags" and the rules evaluated a line without the setting that crashes it (e.g. MTP with
prefix caching, vllm#43559). Hypothesis generates launch lines that set the rule-relevant settings in
every spelling vLLM 0.32.0 accepts (full names, aliases, argparse abbreviations, `--x_y`, `--no-*`,
`=value`, dotted JSON keys, `--spec-method`/`--spec-tokens`); vLLM 0.32.0's own parser
(tests/api/vllm_parser_oracle.py) parses the same line, and:

* the launch-line reader accepts the line exactly when vLLM does (an unknown option or an ambiguous
  abbreviation makes vLLM exit at start, and is refused with the option named);
* every rule-relevant fact it reads equals vLLM's parsed value.
GDN_ORACLE_EXAMPLES sets the number of generated lines (default 300).
"""

from __future__ import annotations

import ast
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_fixtures import parser_oracle  # noqa: F401 (fixture)
from gdn_operator.api.load import ManifestError
from gdn_operator.rules.launchline import parse_launch_line

pytestmark = pytest.mark.engine

VERSION = "0.32.0"
MODEL = "Qwen/Qwen3.6-27B"


def _spell(draw: Any, option: str) -> str:
    how = draw(st.sampled_from(["full", "full", "underscore", "abbrev"]))
    if how == "underscore" and option.startswith("--"):
        return "--" + option[2:].replace("-", "_")
    if how == "abbrev" and option.startswith("--") and len(option) > 5:
        return option[: draw(st.integers(min_value=4, max_value=len(option) - 1))]
    return option


@st.composite
def setting(draw: Any) -> list[str]:
    kind = draw(st.sampled_from(["bool", "int", "gmu", "spec_json", "spec_split", "spec_dotted", "junk"]))
    if kind == "bool":
        opt = draw(
            st.sampled_from(
                [
                    "--async-scheduling",
                    "--no-async-scheduling",
                    "--enable-prefix-caching",
                    "--no-enable-prefix-caching",
                    "--enforce-eager",
                    "--enable-chunked-prefill",
                    "--no-enable-chunked-prefill",
                ]
            )
        )
        return [_spell(draw, opt)]
    if kind == "int":
        opt = draw(st.sampled_from(["--tensor-parallel-size", "-tp", "--max-model-len", "--max-num-seqs"]))
        value = draw(st.sampled_from(["4096", "8k", "32k"] if "len" in opt else ["1", "2", "4"]))
        sp = _spell(draw, opt)
        return [f"{sp}={value}"] if draw(st.booleans()) else [sp, value]
    if kind == "gmu":
        sp = _spell(draw, draw(st.sampled_from(["--gpu-memory-utilization", "--device-memory-utilization"])))
        return [sp, draw(st.sampled_from(["0.5", "0.85"]))]
    k = draw(st.integers(min_value=1, max_value=4))
    if kind == "spec_json":
        sp = draw(st.sampled_from(["--speculative-config", "-sc", "--speculative_config"]))
        return [sp, f'{{"method": "mtp", "num_speculative_tokens": {k}}}']
    if kind == "spec_split":
        return [f"{_spell(draw, '--spec-method')}=mtp", _spell(draw, "--spec-tokens"), str(k)]
    if kind == "spec_dotted":
        return ["--speculative-config.method", "mtp", f"--speculative-config.num_speculative_tokens={k}"]
    return [draw(st.sampled_from(["--frobnicate", "--en", "--no-such-switch"]))]


def _value(ns: dict[str, str], dest: str) -> Any:
    raw = ns.get(dest, "None")
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw


class EngineExits(Exception):
    """What vLLM's EngineArgs would refuse after parsing (the engine exits at start)."""


def _vllm_facts(ns: dict[str, str]) -> dict[str, Any]:
    sc = dict(_value(ns, "speculative_config") or {})
    for dest, key in (("spec_method", "method"), ("spec_tokens", "num_speculative_tokens")):
        # EngineArgs.create_speculative_config (vLLM 0.32.0): --spec-X merges into --speculative-config,
        # and a key given both ways is a ValueError
        if _value(ns, dest) is not None:
            if key in sc:
                raise EngineExits(f"--{dest.replace('_', '-')} and --speculative-config['{key}']")
            sc[key] = _value(ns, dest)
    method, k = sc.get("method"), sc.get("num_speculative_tokens")
    return {
        "asyncScheduling": _value(ns, "async_scheduling"),
        "prefixCaching": _value(ns, "enable_prefix_caching"),
        "chunkedPrefill": _value(ns, "enable_chunked_prefill"),
        "enforceEager": bool(_value(ns, "enforce_eager")),
        "tensorParallelSize": _value(ns, "tensor_parallel_size"),
        "maxModelLen": _value(ns, "max_model_len"),
        "maxNumSeqs": _value(ns, "max_num_seqs"),
        "gpuMemoryUtilization": _value(ns, "gpu_memory_utilization"),
        "spec": (method, k) if method else None,
    }


def _line_facts(spec: dict[str, Any], vllm: dict[str, Any]) -> dict[str, Any]:
    sd = spec.get("speculativeDecoding") or {}
    return {
        "asyncScheduling": spec.get("asyncScheduling"),
        "prefixCaching": spec.get("prefixCaching"),
        "chunkedPrefill": spec.get("chunkedPrefill"),
        "enforceEager": bool(spec.get("enforceEager")),
        "tensorParallelSize": spec.get("tensorParallelSize", 1),
        "maxModelLen": spec.get("maxModelLen"),
        "maxNumSeqs": spec.get("maxNumSeqs"),
        "gpuMemoryUtilization": spec.get("gpuMemoryUtilization"),
        "spec": (sd.get("method"), sd.get("numSpeculativeTokens")) if sd.get("enabled") else None,
    }


@settings(
    max_examples=int(os.environ.get("GDN_ORACLE_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(groups=st.lists(setting(), min_size=1, max_size=5))
def test_launch_line_reads_what_vllm_parses(parser_oracle, groups):  # noqa: F811
    flags = [tok for g in groups for tok in g]
    got = parser_oracle.parse([MODEL, *flags])
    try:
        vllm = _vllm_facts(got["ns"]) if got["ok"] else None
    except EngineExits as e:
        got, vllm = {"ok": False, "error": str(e)}, None
    try:
        line = parse_launch_line(["vllm", "serve", MODEL, *flags], vllm_version=VERSION)
    except ManifestError as e:
        assert not got["ok"], f"refused a line vLLM {VERSION} accepts: {flags}: {e}"
        return
    assert got["ok"] and vllm is not None, f"accepted a line vLLM {VERSION} exits on: {flags}: {got.get('error')}"
    facts = _line_facts(line.spec.model_dump(by_alias=True, exclude_none=True), vllm)
    if not any(g[0].startswith(("--gpu", "--dev")) for g in groups):
        # the spec's default (0.9) is not vLLM's (0.92): compare the utilisation only where the line sets it
        del facts["gpuMemoryUtilization"], vllm["gpuMemoryUtilization"]
    assert facts == vllm, flags


@pytest.mark.parametrize(
    "flags, fact, expected",
    [
        (["--as"], "asyncScheduling", True),  # argparse abbreviation of --async-scheduling
        (["--no-async"], "asyncScheduling", False),
        (["--spec-method=mtp", "--spec-tokens=2"], "spec", ("mtp", 2)),
        (["--device-memory-utilization", "0.5"], "gpuMemoryUtilization", 0.5),
        (["--enable-prefix"], "prefixCaching", True),
    ],
)
def test_spellings_the_old_reader_ignored(parser_oracle, flags, fact, expected):  # noqa: F811
    got = parser_oracle.parse([MODEL, *flags])
    assert got["ok"], got
    assert _vllm_facts(got["ns"])[fact] == expected
    line = parse_launch_line(["vllm", "serve", MODEL, *flags], vllm_version=VERSION)
    vllm = _vllm_facts(got["ns"])
    assert _line_facts(line.spec.model_dump(by_alias=True, exclude_none=True), vllm)[fact] == expected
