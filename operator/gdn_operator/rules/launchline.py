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

Size (~520 lines): one reader, from a launch line to a spec, whose flag table and error messages belong
together; the option resolution itself lives in api/vllm_args.py.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Sequence

from pydantic import ValidationError

from gdn_operator.api import vllm_args
from gdn_operator.api.load import ManifestError
from gdn_operator.api.enums import Architecture, AttentionBackend, CudagraphMode, GDNPrefillBackend, SpecMethod
from gdn_operator.api.parts import OPERATOR_OWNED_ENV
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules.effective import LaunchOverrides
from gdn_operator.rules.evaluator import Evaluation, evaluate

_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_MTP_METHODS = frozenset(m.value for m in SpecMethod)
#: JSON-valued flags whose keys may be given one by one (`--speculative-config.method mtp`)
_DOTTED_JSON_FLAGS = ("--speculative-config.", "--compilation-config.", "--additional-config.", "--hf-overrides.")

#: flags that take a value but do not matter to the rules (consumed quietly)
_QUIET_VALUE = frozenset({
    "--host", "--port", "--dtype", "--quantization", "-q", "--download-dir", "--tokenizer", "--api-key",
    "--uvicorn-log-level", "--tool-call-parser", "--reasoning-parser", "--kv-cache-dtype", "--seed",
    "--swap-space", "--max-logprobs", "--chat-template", "--limit-mm-per-prompt", "--generation-config",
    "--load-format", "--revision", "--tokenizer-mode", "--root-path", "--ssl-keyfile",
    "--ssl-certfile", "--allowed-origins", "--middleware", "--served-model-name", "--optimization-level",
})
#: boolean flags that do not matter to the rules
_QUIET_BOOL = frozenset({
    "--trust-remote-code", "--enable-auto-tool-choice", "--disable-log-requests", "--disable-log-stats",
    "--enable-log-requests", "--no-enable-log-requests", "--language-model-only", "--disable-fastapi-docs",
    "--enable-prompt-tokens-details", "--disable-frontend-multiprocessing", "--enable-expert-parallel",
})

_INT_FLAGS = {
    "--tensor-parallel-size": "tensorParallelSize",
    "-tp": "tensorParallelSize",
    "--max-num-seqs": "maxNumSeqs",
    "--max-num-batched-tokens": "maxNumBatchedTokens",
    "--max-model-len": "maxModelLen",
}
#: options the flag loop below reads, besides the tables above
_READ_FLAGS = frozenset({
    "--model", "--speculative-config", "-sc", "--spec-method", "--spec-tokens", "--compilation-config", "-cc",
    "--additional-config", "--hf-overrides", "--mamba-cache-mode", "--attention-backend", "--gdn-prefill-backend",
    "--gpu-memory-utilization", "-pp", "--pipeline-parallel-size", "-dp", "--data-parallel-size",
})
_BOOL_FLAGS = {
    "--async-scheduling": ("asyncScheduling", True),
    "--no-async-scheduling": ("asyncScheduling", False),
    "--enable-prefix-caching": ("prefixCaching", True),
    "--no-enable-prefix-caching": ("prefixCaching", False),
    "--enable-chunked-prefill": ("chunkedPrefill", True),
    "--no-enable-chunked-prefill": ("chunkedPrefill", False),
    "--enforce-eager": ("enforceEager", True),
}


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _spellings_read() -> frozenset[str]:
    return _READ_FLAGS | frozenset(_INT_FLAGS) | frozenset(_BOOL_FLAGS) | _QUIET_VALUE | _QUIET_BOOL


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
        if (not tok.startswith("-") or tok == "-" or re.fullmatch(r"-\d.*|-O.*", tok)
                or flag.startswith(_DOTTED_JSON_FLAGS) or flag.startswith("-cc.")):
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


@dataclass
class LaunchLine:
    """A parsed launch line: the spec it corresponds to plus what a spec cannot say."""

    argv: list[str]
    model: str
    spec: GDNModelServerSpec
    overrides: LaunchOverrides
    notes: list[str] = field(default_factory=list)


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
        raise ManifestError(f"{flag}: not valid JSON ({e.msg} at column {e.colno}); quote it, e.g. "
                            f"{flag} '{{\"method\":\"mtp\",\"num_speculative_tokens\":2}}'") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{flag}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _coerce_scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


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
    env: dict[str, str] = {}

    # --- leading environment assignments and the command itself ------------------------------
    i = 0
    if args[i] == "env":
        i += 1
    while i < len(args) and _ENV_ASSIGN.match(args[i]):
        name, value = _ENV_ASSIGN.match(args[i]).groups()  # type: ignore[union-attr]
        env[name] = value
        i += 1
    if i >= len(args):
        raise ManifestError("launch line has only environment assignments; expected `vllm serve MODEL ...`")
    cmd = args[i]
    model: str | None = None
    if cmd.rsplit("/", 1)[-1] == "vllm":
        if i + 1 >= len(args) or args[i + 1] != "serve":
            raise ManifestError(f"launch line: expected `vllm serve MODEL ...`, got `{' '.join(args[i:i + 2])}`")
        i += 2
    elif re.fullmatch(r"(?:.*/)?python(?:3(?:\.\d+)?)?", cmd):
        if len(args) > i + 2 and args[i + 1] == "-m" and args[i + 2] in _API_SERVER_MODULES:
            i += 3
        else:
            raise ManifestError(
                "launch line: expected `python -m vllm.entrypoints.openai.api_server --model MODEL ...`"
            )
    elif cmd == "serve":
        i += 1
    elif cmd.startswith("-"):
        notes.append("launch line starts with flags; treated as the arguments of `vllm serve`")
    else:
        raise ManifestError(
            f"launch line: unknown command {cmd!r}; expected `vllm serve MODEL ...` or "
            "`python -m vllm.entrypoints.openai.api_server --model MODEL ...`"
        )

    # --- flags ---------------------------------------------------------------------------------
    spec: dict[str, Any] = {}
    origin: dict[str, str] = {}  # spec key -> flag, for error messages
    sd: dict[str, Any] = {}
    sd_short: dict[str, Any] = {}  # --spec-method / --spec-tokens
    ov = LaunchOverrides()
    cc: dict[str, Any] = {}
    extra: dict[str, Any] = {}  # --additional-config
    hf: dict[str, Any] = {}  # --hf-overrides
    rest = _canonical_flags(args[i:], vllm_version, notes)
    j = 0

    def take_value(flag: str, inline: str | None) -> str:
        nonlocal j
        if inline is not None:
            return inline
        if j + 1 >= len(rest):
            raise ManifestError(f"{flag}: missing value")
        j += 1
        return rest[j]

    while j < len(rest):
        tok = rest[j]
        if not tok.startswith("-") or tok == "-":
            if model is None:
                model = tok
            else:
                notes.append(f"ignored extra positional argument {tok!r}")
            j += 1
            continue
        inline: str | None = None
        flag = tok
        if "=" in tok:
            flag, inline = tok.split("=", 1)
        if flag.startswith("--") and "_" in flag and not flag.startswith(_DOTTED_JSON_FLAGS):
            flag = flag.replace("_", "-")  # vLLM accepts --max_num_seqs as --max-num-seqs

        if flag == "--model":
            model = take_value(flag, inline)
        elif flag in _INT_FLAGS:
            key = _INT_FLAGS[flag]
            spec[key] = _parse_int(flag, take_value(flag, inline))
            origin[key] = flag
        elif flag in _BOOL_FLAGS:
            if inline is not None:
                raise ManifestError(f"{flag}: takes no value (got {flag}={inline})")
            key, val = _BOOL_FLAGS[flag]
            spec[key] = val
            origin[key] = flag
        elif flag in ("--speculative-config", "-sc"):
            sd = _parse_json_obj(flag, take_value(flag, inline))  # argparse: the last value wins whole
        elif flag == "--spec-method":
            sd_short["method"] = take_value(flag, inline)
        elif flag == "--spec-tokens":
            sd_short["num_speculative_tokens"] = _parse_int(flag, take_value(flag, inline))
        elif flag.startswith("--speculative-config."):
            sd[flag[len("--speculative-config."):]] = _coerce_scalar(take_value(flag, inline))
        elif flag in ("--compilation-config", "-cc"):
            value = take_value(flag, inline)
            if value.strip().lstrip("-").isdigit():
                notes.append(f"{flag} {value}: optimization level form; cudagraph mode left to vLLM")
            else:
                cc = _parse_json_obj(flag, value)
        elif flag.startswith(("--compilation-config.", "-cc.")):
            cc[flag.split(".", 1)[1]] = _coerce_scalar(take_value(flag, inline))
        elif flag == "--additional-config":
            extra = _parse_json_obj(flag, take_value(flag, inline))
        elif flag.startswith("--additional-config."):
            extra[flag.split(".", 1)[1]] = _coerce_scalar(take_value(flag, inline))
        elif flag == "--hf-overrides":
            hf = _parse_json_obj(flag, take_value(flag, inline))
        elif flag.startswith("--hf-overrides."):
            hf[flag.split(".", 1)[1]] = _coerce_scalar(take_value(flag, inline))
        elif flag == "--mamba-cache-mode":
            value = take_value(flag, inline)
            if value not in ("align", "none", "all"):
                raise ManifestError(f"--mamba-cache-mode: expected align, none or all, got {value!r}")
            ov.mamba_cache_mode = value
        elif flag == "--attention-backend":
            value = take_value(flag, inline)
            if value.upper() in {b.value for b in AttentionBackend}:
                spec["attentionBackend"] = value.upper()
                origin["attentionBackend"] = flag
            else:
                notes.append(f"--attention-backend {value}: backend not modelled by the rules; ignored")
        elif flag == "--gdn-prefill-backend":
            value = take_value(flag, inline)
            if value.lower() in {b.value for b in GDNPrefillBackend}:
                spec["gdnPrefillBackend"] = value.lower()
                origin["gdnPrefillBackend"] = flag
            else:
                raise ManifestError(
                    f"--gdn-prefill-backend: unknown backend {value!r} "
                    f"(vLLM has {', '.join(b.value for b in GDNPrefillBackend)})"
                )
        elif flag == "--gpu-memory-utilization":
            value = take_value(flag, inline)
            try:
                spec["gpuMemoryUtilization"] = float(value)
            except ValueError:
                raise ManifestError(f"--gpu-memory-utilization: expected a number, got {value!r}") from None
            origin["gpuMemoryUtilization"] = flag
        elif flag in _QUIET_VALUE or flag in ("-pp", "--pipeline-parallel-size", "-dp", "--data-parallel-size"):
            take_value(flag, inline)
        elif flag in _QUIET_BOOL:
            pass
        elif flag in ("-O",) or re.fullmatch(r"-O\d", flag):
            if flag == "-O" and inline is None and j + 1 < len(rest) and not rest[j + 1].startswith("-"):
                j += 1
        else:
            # unknown flag: `--flag=value`, `--flag value` or a boolean switch
            if inline is None and j + 1 < len(rest) and not rest[j + 1].startswith("-"):
                notes.append(f"ignored unknown flag {flag} {rest[j + 1]}")
                j += 1
            else:
                notes.append(f"ignored unknown flag {tok}")
        j += 1

    if model is None:
        raise ManifestError("launch line has no model (vllm serve MODEL ... or --model MODEL)")

    # --- JSON-carried settings: --additional-config, --hf-overrides ----------------------------
    if "gdn_prefill_backend" in extra:
        value = extra["gdn_prefill_backend"]
        known = {b.value for b in GDNPrefillBackend}
        if not isinstance(value, str) or value.lower() not in known:
            raise ManifestError(
                f"--additional-config: gdn_prefill_backend {value!r} is not a GDN prefill backend "
                f"(vLLM has {', '.join(sorted(known))})"
            )
        if "gdnPrefillBackend" in spec and spec["gdnPrefillBackend"] != value.lower():
            notes.append(
                f"--gdn-prefill-backend {spec['gdnPrefillBackend']} and --additional-config gdn_prefill_backend "
                f"{value} disagree; the flag is used"
            )
        else:
            spec["gdnPrefillBackend"] = value.lower()
            origin["gdnPrefillBackend"] = "--additional-config"
    for key in sorted(set(extra) - {"gdn_prefill_backend"}):
        notes.append(f"--additional-config key {key!r} not used by the rules")
    hf_arch = None
    archs = hf.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        hf_arch = archs[0]

    # --- speculative config ------------------------------------------------------------------
    for key, value in sd_short.items():
        # vLLM's EngineArgs.create_speculative_config refuses a key given both ways (the engine exits)
        if key in sd:
            flag = "--spec-method" if key == "method" else "--spec-tokens"
            raise ManifestError(
                f"{flag} and --speculative-config['{key}'] are mutually exclusive (vLLM exits at start); give one"
            )
        sd[key] = value
    if sd:
        method = sd.get("method")
        k = sd.get("num_speculative_tokens")
        if method is None:
            raise ManifestError(
                "--speculative-config: 'method' is missing (use \"mtp\" for the Qwen3.5 / Qwen3-Next MTP head)"
            )
        if not isinstance(method, str):
            raise ManifestError(f"--speculative-config: 'method' must be a string, got {method!r}")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ManifestError(f"--speculative-config: num_speculative_tokens must be a positive integer, got {k!r}")
        for key in sorted(set(sd) - {"method", "num_speculative_tokens", "parallel_drafting", "model"}):
            notes.append(f"--speculative-config key {key!r} not used by the rules")
        if sd.get("parallel_drafting") is True:
            ov.parallel_drafting = True
        if method in _MTP_METHODS and (k is None or k <= 16):
            spec["speculativeDecoding"] = {"enabled": True, "method": method, **({"numSpeculativeTokens": k} if k else {})}
        else:
            spec["speculativeDecoding"] = {"enabled": False}
            ov.spec_method = method
            ov.num_speculative_tokens = k if k is not None else 1
            if method not in _MTP_METHODS and not method.endswith("_mtp"):
                notes.append(f"speculative method {method!r} is not MTP; only rules for any spec decode apply")
    else:
        spec["speculativeDecoding"] = {"enabled": False}
        notes.append("no --speculative-config: speculative decoding (MTP) is off")

    # --- compilation config ------------------------------------------------------------------
    mode = cc.get("cudagraph_mode")
    if mode is not None:
        if str(mode).upper() in {m.value for m in CudagraphMode}:
            if spec.get("enforceEager"):
                notes.append("--enforce-eager overrides cudagraph_mode (no CUDA graphs)")
            else:
                spec["cudagraphMode"] = str(mode).upper()
                origin["cudagraphMode"] = "--compilation-config"
        else:
            notes.append(f"--compilation-config cudagraph_mode {mode!r} not recognised; ignored")

    # --- environment ---------------------------------------------------------------------------
    env_list = []
    for name, value in env.items():
        ov.env[name] = value
        if name == "VLLM_USE_V2_MODEL_RUNNER":
            try:
                spec["modelRunner"] = "v2" if int(value.strip()) else "v1"
            except ValueError:
                pass  # the rule vllm-config/v2-runner-env-not-integer reports it
        elif name not in OPERATOR_OWNED_ENV:
            env_list.append({"name": name, "value": value})
    if env_list:
        spec["env"] = env_list

    # --- model, architecture, image ----------------------------------------------------------
    if "://" in model:
        uri = model
    elif model.startswith(("/", "./", "../", "~")):
        uri = "file://" + model
    else:
        uri = "hf://" + model
    spec["model"] = {"uri": uri}
    if not architecture and hf_arch:
        if hf_arch.lower() in {a.value.lower() for a in Architecture}:
            architecture = hf_arch
            ov.architecture_source = "--hf-overrides architectures"
        else:
            notes.append(f"--hf-overrides architectures {hf_arch!r} is not a GDN hybrid class the rules know")
    if architecture:
        valid = {a.value.lower(): a.value for a in Architecture}
        arch = valid.get(architecture.lower())
        if arch is None:
            raise ManifestError(
                f"--architecture: unknown architecture {architecture!r}; use one of {', '.join(a.value for a in Architecture)}"
            )
        spec["model"]["architecture"] = arch
        ov.architecture_source = ov.architecture_source or "--architecture"
    spec["image"] = {"tag": f"v{vllm_version}"[:128], "vllmVersion": vllm_version, "patches": list(patches)}

    try:
        parsed = GDNModelServerSpec.model_validate(spec)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            loc = [str(p) for p in err.get("loc", ())]
            key = loc[0] if loc else ""
            where = origin.get(key) or {
                "model": "model", "image": "--vllm-version/--patch", "speculativeDecoding": "--speculative-config",
                "env": "environment",
            }.get(key, ".".join(loc))
            msg = err.get("msg", "invalid").removeprefix("Value error, ")
            problems.append(f"{where}: {msg} (got {err.get('input')!r})")
        raise ManifestError(problems) from None
    return LaunchLine(argv=args, model=model, spec=parsed, overrides=ov, notes=notes)


def evaluate_launch(
    argv: Sequence[str],
    *,
    vllm_version: str | None,
    architecture: str | None = None,
    patches: Sequence[str] = (),
) -> tuple[LaunchLine, Evaluation]:
    """Parse and evaluate a launch line with policy reject (report what would be refused)."""
    line = parse_launch_line(argv, vllm_version=vllm_version, architecture=architecture, patches=patches)
    ev = evaluate(line.spec, overrides=line.overrides, policy="reject", defaults=False)  # runs as written
    ev.notes = list(dict.fromkeys(line.notes + ev.notes))
    return line, ev
