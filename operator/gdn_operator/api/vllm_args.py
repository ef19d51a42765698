"""`spec.extraArgs` and `spec.env` resolved the way the target vLLM release reads them.

A deny-list of spellings cannot hold: vLLM's parser accepts argparse abbreviations (`--as`), single-dash
aliases and their abbreviations (`-s` for `-sc`), `--no-*` negations, `--x_y` for `--x-y`, dotted JSON
keys (`-cc.mode=0`, `--speculative-config.method=mtp`) merged into one JSON option, `-O3`, `--config
FILE`, and new option names in each release (`--spec-method`, `--device-memory-utilization`). So every
entry is resolved to an argparse *destination* with a mirror of the real parser:

* the option table of the release (`data/vllm-options/<version>.yaml`) is GENERATED from vLLM's own
  `vllm serve` parser by `hack/gen_vllm_options.py` (option strings, destinations, nargs, types,
  choices, `allow_abbrev`, and which FlexibleArgumentParser preprocessing the release has);
* the preprocessing of vLLM's FlexibleArgumentParser (underscores, `-O`, dotted keys, `--config`) is
  replayed here, then Python's own argparse (the engine images run CPython 3.11/3.12, whose
  abbreviation rules are the ones below) classifies each token with a parser built from the table;
* a destination listed in `data/extra-args-policy.yaml` (owned by the operator, or read by the
  known-issue rules) is refused, so are options the release does not have and arguments that make vLLM
  exit at start (bad choice, bad number, stray positional).

Versions without a table: the table of the nearest release at or below is used (or the oldest table
for an older release) in STRICT mode: options must be spelled in full as that table has them (no
abbreviations, whose meaning can change when a release adds an option); unknown options are refused. An
unparseable `vllmVersion` admits no extraArgs. Regenerate a table per release you run (see the
generator's docstring).

Size (~545 lines): the mirror of one parser (type converters, preprocessing, classification, refusal text)
that must change together when vLLM's FlexibleArgumentParser changes.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gdn_operator.datafiles import load_yaml, once
from gdn_operator.redact import redact
from gdn_operator.versions import parse_version, require_version

_DATA = Path(__file__).resolve().parent / "data"
_TABLES = _DATA / "vllm-options"
_KNOWN_PREPROCESSING = frozenset({"underscore_to_dash", "dotted_json_keys", "o_level_shorthand", "config_file"})
_SHOW = 40  # characters of a user token quoted in a message


class _ParseError(Exception):
    pass


@dataclass(frozen=True)
class Resolved:
    """One option occurrence in extraArgs, as vLLM's parser reads it."""

    index: int  # the extraArgs entry it came from
    spelling: str  # what the user wrote (the option part, never the value)
    option: str  # the full option string argparse matched, e.g. --async-scheduling
    dest: str


@dataclass
class Resolution:
    table_version: str | None
    exact: bool
    resolved: list[Resolved]
    problems: list[str]

    @property
    def flags(self) -> frozenset[str]:
        """Full option strings set by extraArgs (what `has_arg` rule predicates match)."""
        return frozenset(r.option for r in self.resolved)


# ------------------------------------------------------------------------------------ the data ---


@once
def policy() -> dict[str, Any]:
    with open(_DATA / "extra-args-policy.yaml", encoding="utf-8") as f:
        data: dict[str, Any] = load_yaml(f)
    return data


@once
def table_versions() -> tuple[str, ...]:
    return tuple(sorted(p.name[: -len(".yaml")] for p in _TABLES.glob("*.yaml")))


class _MirrorParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ParseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ParseError(message or "exit")


def _human_int(value: str, allow_auto: bool = False) -> int:
    """vLLM's human_readable_int(_or_auto): 1k = 1000, 1K = 1024, 25.6k; no decimals with K/M/G/T."""
    value = value.strip()
    if allow_auto and (value == "-1" or value.lower() == "auto"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        binary: int = 2 ** (10 * "KMGT".index(suffix) + 10)
        return int(number) * binary
    return int(value)


_HUMAN_IN_JSON = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg})") from None


def _json_object(keys: Sequence[str] | None) -> Callable[[str], dict[str, Any]]:
    """vLLM's parse_dataclass: a JSON object (bare 8k-style numbers allowed) with the config's fields."""

    def convert(value: str) -> dict[str, Any]:
        parts = re.split(r'("(?:[^"\\]|\\.)*")', value)
        for i in range(0, len(parts), 2):
            parts[i] = _HUMAN_IN_JSON.sub(lambda m: str(_human_int(m.group())), parts[i])
        obj = _json_value("".join(parts))
        if not isinstance(obj, dict):
            raise ValueError("not a JSON object")
        unknown = sorted(set(obj) - set(keys)) if keys is not None else []
        if unknown:
            raise ValueError(f"unknown keys {unknown}")
        return obj

    return convert


def _json_or_str(value: str) -> Any:
    return _json_value(value) if re.match(r"(?s)^\s*{.*}\s*$", value) else value


def _lora_module(value: str) -> Any:
    """vLLM's LoRAParserAction: `name=path` (no comma), or a JSON object with name, path[, base_model_name]."""
    if value == "" or ("=" in value and "," not in value):
        return value
    obj = _json_value(value)
    if not isinstance(obj, dict) or not {"name", "path"} <= set(obj) or set(obj) - {"name", "path", "base_model_name"}:
        raise ValueError("not name=path or a JSON object with name and path")
    return value


#: on/off options: argparse's BooleanOptionalAction and vLLM's EnableDisableAction (0.33.0+: `--enable-x` with
#: `--disable-x`, the hidden `--no-enable-x` still accepted); the table's `negative` lists the strings that store False
_ON_OFF_ACTIONS = frozenset({"BooleanOptionalAction", "EnableDisableAction"})

#: vLLM's own argparse Action classes (their checks are code, not table data): the value check per class
_CUSTOM_ACTION_VALUES = {"LoRAParserAction": _lora_module}


def _converter(type_name: str, optional: bool, keys: Sequence[str] | None = None) -> Callable[[str], Any]:
    converters: dict[str, Callable[[str], Any]] = {
        "int": int,
        "float": float,
        "human_int": _human_int,
        "human_int_or_auto": lambda v: _human_int(v, allow_auto=True),
        "json": _json_value,
        "json_object": _json_object(keys),
        "json_or_str": _json_or_str,
    }
    base = converters.get(type_name, str)

    def convert(value: str) -> Any:
        if optional and value in ("", "None"):
            return None
        return base(value)

    convert.__name__ = type_name  # argparse names the type in "invalid <type> value" errors
    return convert


class OptionTable:
    """One release's `vllm serve` options and a mirror argparse parser built from them."""

    def __init__(self, raw: dict[str, Any]):
        self.version: str = str(raw["vllm_version"])
        parser_facts = raw.get("parser", {})
        self.allow_abbrev = bool(parser_facts.get("allow_abbrev", True))
        self.preprocessing = dict(parser_facts.get("preprocessing", {}))
        unknown = set(self.preprocessing) - _KNOWN_PREPROCESSING
        if unknown:
            raise ValueError(f"option table {self.version}: unknown preprocessing {sorted(unknown)}; update api/vllm_args.py")
        self.parser = _MirrorParser(
            prog="vllm serve",
            add_help=False,
            allow_abbrev=self.allow_abbrev,
            prefix_chars=parser_facts.get("prefix_chars", "-"),
        )
        self.canonical: dict[str, str] = {}
        for opt in raw["options"]:
            self._add(opt)

    def _add(self, opt: dict[str, Any]) -> None:
        strings, dest, kind = list(opt["options"]), opt["dest"], opt["action"]
        nargs = opt.get("nargs")
        longs = [s for s in strings if s.startswith("--")]
        self.canonical[dest] = (longs or strings or [dest])[0]
        common = {"dest": dest, "default": argparse.SUPPRESS}
        if not strings:
            self.parser.add_argument(dest, nargs=nargs, default=argparse.SUPPRESS)
            return
        if kind in _ON_OFF_ACTIONS:
            negative = opt.get("negative")  # tables before it was recorded: argparse's own `--no-` forms
            neg = [s for s in strings if s.startswith("--no-")] if negative is None else list(negative)
            pos = [s for s in strings if s not in neg]
            self.parser.add_argument(*pos, action="store_const", const=True, **common)
            if neg:
                self.parser.add_argument(*neg, action="store_const", const=False, **common)
            return
        if nargs == 0:
            self.parser.add_argument(*strings, action="store_const", const=opt.get("const", True), **common)
            return
        type_name = opt.get("type", "str")
        kwargs: dict[str, Any] = {"type": _converter(type_name, bool(opt.get("optional")), opt.get("keys"))}
        if opt.get("normalise") == "lower_dash_to_underscore":
            kwargs["type"] = lambda v: v.lower().replace("-", "_")
            type_name = "str"
        if nargs is not None:
            kwargs["nargs"] = nargs
        if opt.get("const") is not None and nargs == "?":
            kwargs["const"] = opt["const"]
        if "choices" in opt and type_name in ("str", "int", "float"):
            kwargs["choices"] = opt["choices"]
        if kind in _CUSTOM_ACTION_VALUES:
            kwargs["type"] = _CUSTOM_ACTION_VALUES[kind]
        action = "append" if kind == "AppendAction" else "store"
        self.parser.add_argument(*strings, action=action, **kwargs, **common)


@once
def load_table(version: str) -> OptionTable:
    with open(_TABLES / f"{version}.yaml", encoding="utf-8") as f:
        return OptionTable(load_yaml(f))


def select_table(vllm_version: str) -> tuple[OptionTable | None, bool]:
    """(table, exact) for a target release; (None, False) when the version is not a version."""
    target = parse_version(vllm_version)
    versions = table_versions()
    if target is None or not versions:
        return None, False
    parsed = sorted((require_version(v), v) for v in versions)  # table file names are versions
    for v, name in parsed:
        if v == target and not target.is_prerelease:
            return load_table(name), True
    below = [name for v, name in parsed if v <= target]
    return load_table(below[-1] if below else parsed[0][1]), False


# ------------------------------------------------------------------------------- preprocessing ---


def _show(token: str) -> str:
    shown = redact(token)
    return repr(shown if len(shown) <= _SHOW else shown[: _SHOW - 3] + "...")


def _option_part(token: str) -> str:
    return token.split("=", 1)[0]


def _json_or_human(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        try:
            return _human_int(text)
        except ValueError:
            return text


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] = into[k] + v
        else:
            into[k] = v


def _preprocess(args: Sequence[str], table: OptionTable, problems: list[str]) -> list[tuple[str, int]]:
    """Replay FlexibleArgumentParser.parse_args' rewriting; each token keeps its extraArgs index."""
    pre = table.preprocessing
    out: list[tuple[str, int]] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            out.append(("--help", i))
        elif arg.startswith("--"):
            if pre.get("underscore_to_dash", True):
                key, sep, arg_value = arg.partition("=")
                head, dot, tail = key[2:].partition(".")
                arg = "--" + head.replace("_", "-") + dot + tail + sep + arg_value
            out.append((arg, i))
        elif pre.get("o_level_shorthand", True) and arg.startswith("-O") and arg != "-O":
            level = arg[3:] if arg[2] == "=" else arg[2:]
            out += [("--optimization-level", i), (level, i)]
        elif pre.get("o_level_shorthand", True) and arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append(("--optimization-level", i))
        else:
            out.append((arg, i))
    if not pre.get("dotted_json_keys", True):
        return out

    dotted: dict[str, dict[str, Any]] = {}
    first_index: dict[str, int] = {}
    drop: set[int] = set()
    for j, (tok, i) in enumerate(out):
        if j in drop or not tok.startswith("-") or "." not in tok:
            continue
        if "=" in tok:
            key, value_str = tok.split("=", 1)
            if "." not in key:
                continue
        else:
            key = tok
            if j + 1 >= len(out):
                problems.append(f"extraArgs[{i}] {_show(key)} needs a value (vLLM fails at start without one)")
                drop.add(j)
                continue
            value_str = out[j + 1][0]
            drop.add(j + 1)
        value: Any = value_str
        if key.endswith("+"):
            key = key[:-1]
            value = json.dumps(value_str.split(","))
        head, *path = key.split(".")
        node: Any = _json_or_human(value)
        for part in reversed(path):
            node = {part: node}
        _merge(dotted.setdefault(head, {}), node)
        first_index.setdefault(head, i)
        drop.add(j)
    kept = [t for j, t in enumerate(out) if j not in drop]
    for head, value in dotted.items():
        kept += [(head, first_index[head]), (json.dumps(value), first_index[head])]
    return kept


# ---------------------------------------------------------------------------------- resolution ---


def _classify(parser: _MirrorParser, token: str) -> tuple[argparse.Action | None, str, str | None] | None:
    """argparse's own reading of one token: None (positional) or (action|None, option_string, explicit)."""
    found = parser._parse_optional(token)
    if isinstance(found, list):  # Python 3.13+: a list of candidate tuples
        found = found[0] if found else None
    if found is None:
        return None
    return found[0], found[1], found[-1]


def _consumes(action: argparse.Action, following: list[str], parser: _MirrorParser) -> int:
    kinds = []
    for tok in following:
        if tok == "--":
            break
        try:
            kinds.append("O" if _classify(parser, tok) is not None else "A")
        except _ParseError:
            kinds.append("O")
    n_args = 0
    for k in kinds:
        if k != "A":
            break
        n_args += 1
    nargs = action.nargs
    if nargs is None:
        return min(1, n_args)
    if nargs == "?":
        return min(1, n_args)
    if nargs in ("*", "+"):
        return n_args
    return min(int(nargs), n_args)


def preprocess(args: Sequence[str], table: OptionTable) -> tuple[list[str], list[str]]:
    """The arguments as vLLM's FlexibleArgumentParser hands them to argparse (underscores to dashes, `-O`
    forms, dotted JSON keys merged into one JSON option placed LAST, so they win over a full JSON value),
    and the problems found on the way."""
    problems: list[str] = []
    return [tok for tok, _ in _preprocess(args, table, problems)], problems


def read_option(table: OptionTable, token: str) -> tuple[str | None, str | None, Any]:
    """How vLLM's parser reads one option token: (full option string, dest, const) — (None, None, None) for an
    option the release does not have. Raises ValueError when argparse refuses the token (an ambiguous
    abbreviation), with argparse's message. `const` tells `--x` from `--no-x` (True / False)."""
    try:
        found = _classify(table.parser, token)
    except _ParseError as e:
        raise ValueError(str(e)) from None
    if found is None:
        return None, None, None
    action, option_string, _explicit = found
    if action is None:
        return None, None, None
    return option_string, action.dest, action.const


def resolve_extra_args(args: Sequence[str], vllm_version: str) -> Resolution:
    """Resolve `args` (spec.extraArgs) for `vllm_version`. `problems` lists every refusal, one line each."""
    problems: list[str] = []
    table, exact = select_table(vllm_version)
    if table is None:
        if args:
            problems.append(
                f"extraArgs cannot be checked for vLLM {vllm_version!r}: it is not a release version; "
                "set spec.image.vllmVersion to the release inside the image (e.g. 0.33.0)"
            )
        return Resolution(None, False, [], problems)
    if "--config" in args:
        i = list(args).index("--config")
        problems.append(
            f"extraArgs[{i}] '--config' would set vLLM options the known-crash rules cannot see "
            "(it loads options from a file inside the container); use the spec fields and extraArgs instead"
        )
        return Resolution(table.version, exact, [], problems)
    tokens = _preprocess(args, table, problems)
    parser = table.parser
    resolved: list[Resolved] = []
    j = 0
    while j < len(tokens):
        tok, i = tokens[j]
        if tok == "--":
            problems.append(f"extraArgs[{i}] '--' would end vLLM's options; remove it")
            j += 1
            continue
        try:
            found = _classify(parser, tok)
        except _ParseError as e:
            problems.append(
                f"extraArgs[{i}] {_show(_option_part(tok))}: vLLM {table.version} would exit at start: "
                f"{str(e)[:160]}...; spell the option out"
            )
            j += 1
            continue
        if found is None:
            problems.append(
                f"extraArgs[{i}] {_show(tok)} is not an option and not the value of one; vLLM takes no further "
                "positional arguments and would exit at start"
            )
            j += 1
            continue
        action, option_string, explicit = found
        spelling = _option_part(tok) if tok.startswith("--") or explicit is None else tok[: len(tok) - len(explicit)].rstrip("=")
        if not args[i].startswith(spelling):  # rewritten by the preprocessing (-O3, --x_y, dotted keys)
            spelling = _option_part(args[i])
        if action is None:
            problems.append(
                f"extraArgs[{i}] {_show(spelling)} is not an option of vLLM {table.version}'s `vllm serve` "
                "(vLLM would exit at start); check the spelling against `vllm serve --help`"
            )
            j += 1
            continue
        abbreviated = spelling not in parser._option_string_actions
        if abbreviated and not exact:
            problems.append(
                f"extraArgs[{i}] {_show(spelling)} abbreviates {option_string}; write options in full for vLLM "
                f"{vllm_version} (checked with the option table of vLLM {table.version}, where abbreviations "
                "may mean another option)"
            )
        resolved.append(Resolved(i, spelling, option_string, action.dest))
        j += 1 + (0 if explicit is not None else _consumes(action, [t for t, _ in tokens[j + 1 :]], parser))

    for r in resolved:
        msg = refusal(r, table)
        if msg:
            problems.append(msg)
    if not problems:
        try:
            parser.parse_args(["MODEL", *(t for t, _ in tokens)])
        except _ParseError as e:
            problems.append(f"extraArgs: vLLM {table.version} would reject them and exit at start: {e}")
    return Resolution(table.version, exact, resolved, problems)


def option_values(args: Sequence[str], vllm_version: str) -> dict[str, Any]:
    """What vLLM's parser stores for `args` (spec.extraArgs), by destination: only options the args set. Empty
    when they cannot be resolved (resolve_extra_args reports why)."""
    table, _exact = select_table(vllm_version)
    if table is None or not args or "--config" in args:
        return {}
    problems: list[str] = []
    tokens = [t for t, _ in _preprocess(args, table, problems)]
    try:
        ns = table.parser.parse_args(["MODEL", *tokens])
    except _ParseError:
        return {}
    values = dict(vars(ns))
    values.pop("model_tag", None)
    return values


def refusal(r: Resolved, table: OptionTable) -> str | None:
    pol = policy()
    canonical = table.canonical.get(r.dest, r.option)
    if r.spelling == canonical:
        how = ""
    elif r.spelling == r.option:
        how = f" ({r.spelling} is an alias of {canonical} in vLLM {table.version})"
    else:
        how = f" (vLLM {table.version} reads {r.spelling} as {r.option})"
    if r.dest in pol["owned"]:
        return (
            f"extraArgs[{r.index}] {r.spelling!r} sets {canonical}, which the operator owns{how}; "
            f"set {pol['owned'][r.dest]} instead"
        )
    if r.dest in pol["rule_relevant"]:
        return (
            f"extraArgs[{r.index}] {r.spelling!r} would set vLLM options the known-crash rules cannot see: "
            f"{canonical} {pol['rule_relevant'][r.dest]}{how}; use the spec fields instead"
        )
    return None


def env_refusal(name: str, allowed_unsafe: Sequence[str] = ()) -> str | None:
    """Why `name` may not be set through spec.env (None when it may). Values are never looked at."""
    env = policy()["env"]
    if name in env["owned"]:
        return f"{name!r} is owned by the operator; set {env['owned'][name]} instead"
    if name in env.get("injected", {}):
        return f"{name!r} is injected by {env['injected'][name]}; remove it"
    if name in env["rule_relevant"]:
        return f"{name!r} is refused: it {env['rule_relevant'][name]}"
    if name in env["process"] and name not in allowed_unsafe:
        return (
            f"{name!r} changes which code the engine's interpreter or dynamic loader runs, outside what the "
            f"known-crash rules check; list it in spec.allowUnsafeEnv to opt in explicitly"
        )
    return None
