"""Raw vLLM launch lines → the same effective configuration the rules evaluate.

    gdnctl validate --vllm-version 0.19.1 [--architecture ARCH] -- vllm serve MODEL --flags ...

Accepted forms: ``vllm serve MODEL ...``, ``python -m vllm.entrypoints.openai.api_server --model MODEL ...``,
leading ``VAR=value`` environment assignments (and an optional ``env``), ``--flag value`` and
``--flag=value``, JSON ``--speculative-config`` / ``-sc`` (and ``--speculative-config.KEY VALUE``),
``--compilation-config`` / ``-cc`` JSON, ``--additional-config`` JSON (``gdn_prefill_backend``: vLLM stores
``--gdn-prefill-backend`` there, so both spellings mean the same), ``--hf-overrides`` JSON
(``architectures`` names the model family), the dotted forms ``--<json-flag>.KEY VALUE``, and one quoted
string holding the whole line (shlex-split).
Every option is first resolved the way the target release's own parser reads it, with the option table
generated from vLLM's parser (api/vllm_args.py): argparse abbreviations (`--as`), aliases
(`--device-memory-utilization`), `--spec-method`/`--spec-tokens`, dotted keys merged and placed last as
FlexibleArgumentParser does; a JSON option given twice keeps the last value whole (argparse). With the
release's own table an unknown option or an ambiguous abbreviation is an error (vLLM exits at start);
with the nearest older release's table it is a note. tests/rules/test_rules_launchline_oracle.py checks
this against vLLM's real parser. Flags the rules do not need are ignored with a note. Bad input is a
ManifestError naming the flag.

The spec <-> flag mapping is api/flags.py's table (shared with the renderer); the model family is decided by
rules/family.py from every source the line has. The reader is in parts: the command (`_command`), the flag
loop (`_read_flags` with `_table_flag` / `_json_flag` / `_other_flag`), then one step per JSON-carried setting.
The same loop reads where the engine serves (`Endpoint`: `--port`, `--served-model-name`), on a parsed line and,
for a guarded engine whose release is unknown, without one (`read_endpoint`).

Size (~650 lines): one reader, from a launch line to a spec, whose steps and error messages belong together;
the option resolution itself lives in api/vllm_args.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gdn_operator.api import flags, vllm_args
from gdn_operator.api.enums import Architecture, CudagraphMode, GDNPrefillBackend, SpecMethod
from gdn_operator.api.load import ManifestError
from gdn_operator.api.parts import OPERATOR_OWNED_ENV
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules import family
from gdn_operator.rules.effective import LaunchOverrides
from gdn_operator.rules.evaluator import Evaluation, evaluate

_DOTTED = flags.DOTTED_JSON_PREFIXES
#: the JSON keys the reader reads, from their one home (api/flags.py JSON_FLAGS, which the renderer writes with)
_SD_KEYS = flags.JSON_FLAGS[flags.SPECULATIVE_CONFIG]  # spec key -> --speculative-config key
_METHOD = _SD_KEYS["speculativeDecoding.method"]
_K = _SD_KEYS["speculativeDecoding.numSpeculativeTokens"]
_CUDAGRAPH_MODE = flags.JSON_FLAGS[flags.COMPILATION_CONFIG]["cudagraphMode"]
_GDN_PREFILL = flags.JSON_FLAGS[flags.ADDITIONAL_CONFIG]["gdnPrefillBackend"]
_ARCHITECTURES = flags.JSON_FLAGS[flags.HF_OVERRIDES]["model.architecture"]
_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_MTP_METHODS = frozenset(m.value for m in SpecMethod)

#: flags that take a value but do not matter to the rules (consumed quietly)
_QUIET_VALUE = frozenset(
    {
        flags.HOST,
        "--dtype",
        "--quantization",
        "-q",
        "--download-dir",
        "--tokenizer",
        "--api-key",
        "--uvicorn-log-level",
        "--tool-call-parser",
        "--reasoning-parser",
        "--kv-cache-dtype",
        "--seed",
        "--swap-space",
        "--max-logprobs",
        "--chat-template",
        "--limit-mm-per-prompt",
        "--generation-config",
        "--load-format",
        "--revision",
        "--tokenizer-mode",
        "--root-path",
        "--ssl-keyfile",
        "--ssl-certfile",
        "--allowed-origins",
        "--middleware",
        "--optimization-level",
        *flags.PIPELINE_PARALLEL.spellings,
        "-dp",
        "--data-parallel-size",
    }
)
#: boolean flags that do not matter to the rules
_QUIET_BOOL = frozenset(
    {
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-log-requests",
        "--no-enable-log-requests",
        "--language-model-only",
        "--disable-fastapi-docs",
        "--enable-prompt-tokens-details",
        "--disable-frontend-multiprocessing",
        "--enable-expert-parallel",
    }
)
#: spelling -> (table entry, the value a bool spelling sets)
_TABLE: dict[str, tuple[flags.Flag, bool | None]] = {
    **{sp: (f, None) for f in flags.READ_FLAGS if f.kind != "bool" for sp in (f.flag, *f.aliases)},
    **{f.flag: (f, True) for f in flags.READ_FLAGS if f.kind == "bool"},
    **{f.off: (f, False) for f in flags.READ_FLAGS if f.kind == "bool" and f.off},
}
_SPEC_JSON = (flags.SPECULATIVE_CONFIG, *flags.SPECULATIVE_SHORT)
_CC_JSON = (flags.COMPILATION_CONFIG, *flags.COMPILATION_SHORT)
#: options the flag loop reads, besides the tables above
_READ_FLAGS = frozenset(
    {
        "--model",
        *_SPEC_JSON,
        "--spec-method",
        "--spec-tokens",
        *_CC_JSON,
        flags.ADDITIONAL_CONFIG,
        flags.HF_OVERRIDES,
        flags.HF_CONFIG_PATH,
        flags.SERVED_NAME.flag,
        flags.PORT,
        "--mamba-cache-mode",
    }
)
#: the port vLLM's API listens on when the line sets none (`vllm serve --port`'s default)
DEFAULT_PORT = 8000


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _spellings_read() -> frozenset[str]:
    return _READ_FLAGS | frozenset(_TABLE) | _QUIET_VALUE | _QUIET_BOOL


def _canonical_flags(rest: Sequence[str], vllm_version: str, notes: list[str]) -> list[str]:
    """Rewrite every option token to the spelling the flag loop reads, the way the target release's own
    parser resolves it (api/vllm_args.py's generated option table): argparse abbreviations (`--as`), aliases
    (`--device-memory-utilization`), new names for a setting. Without this a line spelled differently
    from our table would be evaluated with the rule-relevant setting missing. An option the release does
    not have, or an ambiguous abbreviation, is an error when the table is the release's own (vLLM would
    exit at start) and a note when it is the nearest older table's."""
    table, exact = vllm_args.select_table(vllm_version)
    if table is None:
        return list(rest)
    rest, problems = vllm_args.preprocess(rest, table)
    if problems and exact:
        raise ManifestError(problems)
    notes.extend(problems)
    read = _spellings_read()
    by_dest: dict[tuple[str, Any], str] = {}
    for spelling in sorted(read):
        option, dest, const = vllm_args.read_option(table, spelling)
        if option == spelling and dest is not None:
            by_dest.setdefault((dest, const), spelling)
    out: list[str] = []
    for tok in rest:
        flag, eq, inline = tok.partition("=")
        if (
            not tok.startswith("-")
            or tok == "-"
            or re.fullmatch(r"-\d.*|-O.*", tok)
            or flag.startswith(_DOTTED)
            or flag.startswith("-cc.")
        ):
            out.append(tok)
            continue
        lookup = flag.replace("_", "-") if flag.startswith("--") else flag
        try:
            option, dest, const = vllm_args.read_option(table, lookup)
        except ValueError as e:
            if exact:
                raise ManifestError(
                    f"{flag}: vLLM {table.version} would exit at start: {_short(str(e))}; spell the option out"
                ) from None
            notes.append(f"{flag}: ambiguous in the option table of vLLM {table.version} ({_short(str(e))})")
            out.append(tok)
            continue
        if option is None or dest is None:
            if exact:
                raise ManifestError(
                    f"{flag} is not an option of vLLM {table.version}'s `vllm serve` (vLLM would exit at start); "
                    "check the spelling against `vllm serve --help`"
                )
            out.append(tok)
            continue
        target = option if option in read else by_dest.get((dest, const), option)
        if target != lookup:
            how = "abbreviates" if option != lookup else "is another name for"
            notes.append(f"{flag} {how} {target} in vLLM {table.version}'s parser; read as {target}")
            if not exact and option != lookup:
                notes.append(
                    f"{flag}: abbreviation checked with the option table of vLLM {table.version}; "
                    f"write options in full for vLLM {vllm_version}"
                )
        out.append(target + eq + inline)
    return out


@dataclass(frozen=True)
class Endpoint:
    """Where a launch line's engine serves its API: the port (`--port`, the last one as argparse reads it; DEFAULT_PORT
    when unset or not a number) and the name it answers to (the first `--served-model-name`; None: unset, the model
    is the name)."""

    port: int = DEFAULT_PORT
    served_name: str | None = None


@dataclass
class LaunchLine:
    """A parsed launch line: the spec it corresponds to plus what a spec cannot say."""

    argv: list[str]
    model: str
    spec: GDNModelServerSpec
    overrides: LaunchOverrides
    notes: list[str] = field(default_factory=list)
    endpoint: Endpoint = field(default_factory=Endpoint)


def _split(argv: Sequence[str]) -> list[str]:
    args = list(argv)
    if args and args[0] == "--":
        args = args[1:]
    if len(args) == 1 and any(c.isspace() for c in args[0]):
        try:
            args = shlex.split(args[0])
        except ValueError as e:
            raise ManifestError(f"launch line: cannot split the quoted line: {e}") from None
    return [a for a in args if a not in ("\\", "")]


def _parse_int(flag: str, text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise ManifestError(f"{flag}: expected an integer, got {text!r}")
    num, suffix = float(m.group(1)), m.group(2)
    mult = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2, "g": 1000**3, "G": 1024**3}[suffix]
    value = num * mult
    if value != int(value):
        raise ManifestError(f"{flag}: expected an integer, got {text!r}")
    return int(value)


def _parse_json_obj(flag: str, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ManifestError(
            f"{flag}: not valid JSON ({e.msg} at column {e.colno}); quote it, e.g. "
            f"{flag} '{json.dumps({_METHOD: 'mtp', _K: 2}, separators=(',', ':'))}'"
        ) from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{flag}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _coerce_scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


@dataclass
class _Read:
    """What the flag loop read from a launch line, before it becomes a spec."""

    rest: list[str]
    notes: list[str]
    model: str | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # spec key -> flag, for error messages
    sd: dict[str, Any] = field(default_factory=dict)  # --speculative-config
    sd_short: dict[str, Any] = field(default_factory=dict)  # --spec-method / --spec-tokens
    cc: dict[str, Any] = field(default_factory=dict)  # --compilation-config
    extra: dict[str, Any] = field(default_factory=dict)  # --additional-config
    hf: dict[str, Any] = field(default_factory=dict)  # --hf-overrides
    served: list[str] = field(default_factory=list)  # --served-model-name
    port: int = DEFAULT_PORT  # --port
    hf_config_path: str | None = None
    ov: LaunchOverrides = field(default_factory=LaunchOverrides)
    j: int = 0

    def value(self, flag: str, inline: str | None) -> str:
        """The flag's value: `--flag=value`, or the next token."""
        if inline is not None:
            return inline
        if self.j + 1 >= len(self.rest):
            raise ManifestError(f"{flag}: missing value")
        self.j += 1
        return self.rest[self.j]


def _command(args: list[str], notes: list[str]) -> tuple[int, dict[str, str]]:
    """(index of the first argument after the command, leading environment assignments)."""
    env: dict[str, str] = {}
    i = 1 if args[0] == "env" else 0
    while i < len(args) and (m := _ENV_ASSIGN.match(args[i])):
        env[m.group(1)] = m.group(2)
        i += 1
    if i >= len(args):
        raise ManifestError("launch line has only environment assignments; expected `vllm serve MODEL ...`")
    cmd = args[i]
    if cmd.rsplit("/", 1)[-1] == "vllm":
        if i + 1 >= len(args) or args[i + 1] != "serve":
            raise ManifestError(f"launch line: expected `vllm serve MODEL ...`, got `{' '.join(args[i : i + 2])}`")
        return i + 2, env
    if re.fullmatch(r"(?:.*/)?python(?:3(?:\.\d+)?)?", cmd):
        if len(args) > i + 2 and args[i + 1] == "-m" and args[i + 2] in _API_SERVER_MODULES:
            return i + 3, env
        raise ManifestError("launch line: expected `python -m vllm.entrypoints.openai.api_server --model MODEL ...`")
    if cmd == "serve":
        return i + 1, env
    if cmd.startswith("-"):
        notes.append("launch line starts with flags; treated as the arguments of `vllm serve`")
        return i, env
    raise ManifestError(
        f"launch line: unknown command {cmd!r}; expected `vllm serve MODEL ...` or "
        "`python -m vllm.entrypoints.openai.api_server --model MODEL ...`"
    )


def _table_flag(r: _Read, flag: str, inline: str | None) -> None:
    """A flag of api/flags.py's table: its value onto the spec key."""
    f, on = _TABLE[flag]
    if f.kind == "bool":
        if inline is not None:
            raise ManifestError(f"{flag}: takes no value (got {flag}={inline})")
        r.spec[f.key], r.origin[f.key] = on, flag
        return
    value = r.value(flag, inline)
    if f.kind == "int":
        r.spec[f.key] = _parse_int(flag, value)
    elif f.kind == "float":
        try:
            r.spec[f.key] = float(value)
        except ValueError:
            raise ManifestError(f"{flag}: expected a number, got {value!r}") from None
    else:
        choice = f.choice(value)
        if choice is None and f.strict:
            raise ManifestError(f"{flag}: unknown backend {value!r} (vLLM has {', '.join(c.value for c in f.choices or ())})")
        if choice is None:
            r.notes.append(f"{flag} {value}: backend not modelled by the rules; ignored")
            return
        r.spec[f.key] = choice
    r.origin[f.key] = flag


def _json_flag(r: _Read, flag: str, inline: str | None) -> bool:
    """A JSON option, whole or one dotted key at a time (argparse: the last whole value wins)."""
    if flag in _SPEC_JSON:
        r.sd = _parse_json_obj(flag, r.value(flag, inline))
    elif flag in _CC_JSON:
        value = r.value(flag, inline)
        if value.strip().lstrip("-").isdigit():
            r.notes.append(f"{flag} {value}: optimization level form; cudagraph mode left to vLLM")
        else:
            r.cc = _parse_json_obj(flag, value)
    elif flag == flags.ADDITIONAL_CONFIG:
        r.extra = _parse_json_obj(flag, r.value(flag, inline))
    elif flag == flags.HF_OVERRIDES:
        r.hf = _parse_json_obj(flag, r.value(flag, inline))
    elif flag.startswith(_DOTTED) or flag.startswith("-cc."):
        target = {
            "--speculative-config": r.sd,
            "--compilation-config": r.cc,
            "-cc": r.cc,
            "--additional-config": r.extra,
            "--hf-overrides": r.hf,
        }[flag.split(".", 1)[0]]
        target[flag.split(".", 1)[1]] = _coerce_scalar(r.value(flag, inline))
    else:
        return False
    return True


def _other_flag(r: _Read, tok: str, flag: str, inline: str | None) -> None:
    """Flags outside the table and the JSON options: read, consumed quietly, or ignored with a note."""
    if flag == "--model":
        r.model = r.value(flag, inline)
    elif flag == "--spec-method":
        r.sd_short[_METHOD] = r.value(flag, inline)
    elif flag == "--spec-tokens":
        r.sd_short[_K] = _parse_int(flag, r.value(flag, inline))
    elif flag == flags.SERVED_NAME.flag:
        r.served.append(r.value(flag, inline))
    elif flag == flags.PORT:
        value = r.value(flag, inline).strip()
        r.port = int(value) if value.isdigit() else DEFAULT_PORT
    elif flag == flags.HF_CONFIG_PATH:
        r.hf_config_path = r.value(flag, inline)
    elif flag == "--mamba-cache-mode":
        value = r.value(flag, inline)
        if value not in ("align", "none", "all"):
            raise ManifestError(f"--mamba-cache-mode: expected align, none or all, got {value!r}")
        r.ov.mamba_cache_mode = value
    elif flag in _QUIET_VALUE:
        r.value(flag, inline)
    elif flag in _QUIET_BOOL:
        pass
    elif flag == "-O" or re.fullmatch(r"-O\d", flag):
        if flag == "-O" and inline is None and r.j + 1 < len(r.rest) and not r.rest[r.j + 1].startswith("-"):
            r.j += 1
    elif inline is None and r.j + 1 < len(r.rest) and not r.rest[r.j + 1].startswith("-"):
        # unknown flag: `--flag=value`, `--flag value` or a boolean switch
        r.notes.append(f"ignored unknown flag {flag} {r.rest[r.j + 1]}")
        r.ov.extra_flags.add(flag)  # `has_arg` rules still see it (e.g. --kv-transfer-config, vllm#41830)
        r.j += 1
    else:
        r.notes.append(f"ignored unknown flag {tok}")
        r.ov.extra_flags.add(flag)


def _read_flags(rest: list[str], notes: list[str]) -> _Read:
    r = _Read(rest, notes)
    while r.j < len(rest):
        tok = rest[r.j]
        if not tok.startswith("-") or tok == "-":
            if r.model is None:
                r.model = tok
            else:
                notes.append(f"ignored extra positional argument {tok!r}")
            r.j += 1
            continue
        flag, eq, value = tok.partition("=")
        inline = value if eq else None
        if flag.startswith("--") and "_" in flag and not flag.startswith(_DOTTED):
            flag = flag.replace("_", "-")  # vLLM accepts --max_num_seqs as --max-num-seqs
        if flag in _TABLE:
            _table_flag(r, flag, inline)
        elif not _json_flag(r, flag, inline):
            _other_flag(r, tok, flag, inline)
        r.j += 1
    return r


def _additional_config(r: _Read) -> None:
    """--additional-config: vLLM stores --gdn-prefill-backend there, so both spellings mean the same."""
    key = flags.GDN_PREFILL_BACKEND.key
    if _GDN_PREFILL in r.extra:
        value = r.extra[_GDN_PREFILL]
        known = {b.value for b in GDNPrefillBackend}
        if not isinstance(value, str) or value.lower() not in known:
            raise ManifestError(
                f"--additional-config: {_GDN_PREFILL} {value!r} is not a GDN prefill backend "
                f"(vLLM has {', '.join(sorted(known))})"
            )
        if key in r.spec and r.spec[key] != value.lower():
            r.notes.append(
                f"--gdn-prefill-backend {r.spec[key]} and --additional-config {_GDN_PREFILL} {value} disagree; the flag is used"
            )
        else:
            r.spec[key] = value.lower()
            r.origin[key] = "--additional-config"
    for k in sorted(set(r.extra) - {_GDN_PREFILL, _ARCHITECTURES}):
        r.notes.append(f"--additional-config key {k!r} not used by the rules")


def _speculative(r: _Read) -> None:
    sd = r.sd
    for key, value in r.sd_short.items():
        # vLLM's EngineArgs.create_speculative_config refuses a key given both ways (the engine exits)
        if key in sd:
            flag = "--spec-method" if key == _METHOD else "--spec-tokens"
            raise ManifestError(
                f"{flag} and --speculative-config['{key}'] are mutually exclusive (vLLM exits at start); give one"
            )
        sd[key] = value
    if not sd:
        r.spec["speculativeDecoding"] = {"enabled": False}
        r.notes.append("no --speculative-config: speculative decoding (MTP) is off")
        return
    method = sd.get(_METHOD)
    k = sd.get(_K)
    if method is None:
        raise ManifestError(f"--speculative-config: '{_METHOD}' is missing (use \"mtp\" for the Qwen3.5 / Qwen3-Next MTP head)")
    if not isinstance(method, str):
        raise ManifestError(f"--speculative-config: '{_METHOD}' must be a string, got {method!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ManifestError(f"--speculative-config: {_K} must be a positive integer, got {k!r}")
    for key in sorted(set(sd) - {_METHOD, _K, "parallel_drafting", "model"}):
        r.notes.append(f"--speculative-config key {key!r} not used by the rules")
    if sd.get("parallel_drafting") is True:
        r.ov.parallel_drafting = True
    if method in _MTP_METHODS and (k is None or k <= 16):
        r.spec["speculativeDecoding"] = {"enabled": True, **_spec_values({_METHOD: method, _K: k})}
        return
    r.spec["speculativeDecoding"] = {"enabled": False}
    r.ov.spec_method = method
    r.ov.num_speculative_tokens = k if k is not None else 1
    if method not in _MTP_METHODS and not method.endswith("_mtp"):
        r.notes.append(f"speculative method {method!r} is not MTP; only rules for any spec decode apply")


def _spec_values(values: dict[str, Any]) -> dict[str, Any]:
    """--speculative-config values (JSON keys) -> speculativeDecoding's own keys, by the table; unset ones left out."""
    return {spec_key.split(".", 1)[1]: values[key] for spec_key, key in _SD_KEYS.items() if values.get(key) is not None}


def _compilation(r: _Read) -> None:
    mode = r.cc.get(_CUDAGRAPH_MODE)
    if mode is None:
        return
    if str(mode).upper() not in {m.value for m in CudagraphMode}:
        r.notes.append(f"--compilation-config {_CUDAGRAPH_MODE} {mode!r} not recognised; ignored")
    elif r.spec.get(flags.ENFORCE_EAGER.key):
        r.notes.append(f"--enforce-eager overrides {_CUDAGRAPH_MODE} (no CUDA graphs)")
    else:
        r.spec["cudagraphMode"] = str(mode).upper()
        r.origin["cudagraphMode"] = "--compilation-config"


def _environment(r: _Read, env: dict[str, str]) -> None:
    env_list = []
    for name, value in env.items():
        r.ov.env[name] = value
        if name == "VLLM_USE_V2_MODEL_RUNNER":
            with contextlib.suppress(ValueError):  # the rule vllm-config/v2-runner-env-not-integer reports it
                r.spec["modelRunner"] = "v2" if int(value.strip()) else "v1"
        elif name not in OPERATOR_OWNED_ENV:
            env_list.append({"name": name, "value": value})
    if env_list:
        r.spec["env"] = env_list


def _model_and_family(r: _Read, model: str, architecture: str | None) -> None:
    """spec.model: the URI, and the family decided from every source (rules/family.py)."""
    if architecture and architecture.lower() not in family.GDN_CLASSES:
        raise ManifestError(
            f"--architecture: unknown architecture {architecture!r}; use one of {', '.join(a.value for a in Architecture)}"
        )
    if "://" in model:
        uri = model
    elif model.startswith(("/", "./", "../", "~")):
        uri = "file://" + model
    else:
        uri = "hf://" + model
    r.spec["model"] = {"uri": uri}
    d = family.decide_family(
        explicit=architecture,
        overrides=r.hf,
        additional=r.extra,
        model=model,
        hf_config_path=r.hf_config_path,
        served_names=tuple(r.served),
    )
    r.notes.extend(d.conflicts)
    if d.not_gdn is not None:
        r.notes.append(f"{d.source} names {d.not_gdn!r}: not a GDN hybrid class the rules know")
        r.ov.architecture_source = d.source
        r.ov.not_gdn = d.not_gdn
    elif d.architecture is not None:
        r.spec["model"]["architecture"] = d.architecture
        r.ov.architecture_source = d.source


def _validate(r: _Read) -> GDNModelServerSpec:
    try:
        return GDNModelServerSpec.model_validate(r.spec)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            loc = [str(p) for p in err.get("loc", ())]
            key = loc[0] if loc else ""
            where = r.origin.get(key) or {
                "model": "model",
                "image": "--vllm-version/--patch",
                "speculativeDecoding": "--speculative-config",
                "env": "environment",
            }.get(key, ".".join(loc))
            msg = err.get("msg", "invalid").removeprefix("Value error, ")
            problems.append(f"{where}: {msg} (got {err.get('input')!r})")
        raise ManifestError(problems) from None


def parse_launch_line(
    argv: Sequence[str],
    *,
    vllm_version: str | None,
    architecture: str | None = None,
    patches: Sequence[str] = (),
) -> LaunchLine:
    """Map a vLLM launch line onto a GDNModelServerSpec (+ LaunchOverrides). Raises ManifestError."""
    if not vllm_version:
        raise ManifestError(
            "--vllm-version is required with a launch line (the vLLM release that would run it, e.g. --vllm-version 0.33.0)"
        )
    args = _split(argv)
    if not args:
        raise ManifestError("launch line is empty; give e.g. -- vllm serve Qwen/Qwen3.5-27B --speculative-config '{...}'")
    notes: list[str] = []
    i, env = _command(args, notes)
    r = _read_flags(_canonical_flags(args[i:], vllm_version, notes), notes)
    if r.model is None:
        raise ManifestError("launch line has no model (vllm serve MODEL ... or --model MODEL)")
    _additional_config(r)
    _speculative(r)
    _compilation(r)
    _environment(r, env)
    _model_and_family(r, r.model, architecture)
    r.spec["image"] = {"tag": f"v{vllm_version}"[:128], "vllmVersion": vllm_version, "patches": list(patches)}
    return LaunchLine(argv=args, model=r.model, spec=_validate(r), overrides=r.ov, notes=notes, endpoint=_endpoint(r))


def _endpoint(r: _Read) -> Endpoint:
    return Endpoint(r.port, (r.served[0] if r.served else None) or None)


def read_endpoint(argv: Sequence[str]) -> Endpoint:
    """The Endpoint of a launch line read without a release (the flag loop of parse_launch_line over the whole line,
    without the release's option table, so an abbreviated `--port` is not resolved here): a guarded engine whose
    release is unknown is still scraped on its port. A line the flag loop cannot read (vLLM would exit on it at start)
    has the default Endpoint."""
    try:
        return _endpoint(_read_flags(_split(argv), []))
    except ManifestError:
        return Endpoint()


def evaluate_launch(
    argv: Sequence[str],
    *,
    vllm_version: str | None,
    architecture: str | None = None,
    patches: Sequence[str] = (),
    policy: str = "reject",
) -> tuple[LaunchLine, Evaluation]:
    """Parse and evaluate a launch line (default policy reject: report what would be refused)."""
    line = parse_launch_line(argv, vllm_version=vllm_version, architecture=architecture, patches=patches)
    ev = evaluate(line.spec, overrides=line.overrides, policy=policy, defaults=False)  # runs as written
    ev.notes = list(dict.fromkeys(line.notes + ev.notes))
    return line, ev
