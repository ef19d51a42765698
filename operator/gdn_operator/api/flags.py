"""The one table of spec fields <-> vLLM `serve` flags (issue 22 part 4).

The renderer (render/engine.py, render/shutdown.py, render/lws.py: spec -> argv) and the launch-line reader
(rules/launchline.py: argv -> spec) both read their flag spellings from here, so a setting cannot be written
under one name and read under another; `Flag.args` is the one place a value is spelled for argv. Each entry names the spec key (the CRD's camelCase alias), the vLLM option, how its value is
spelled, and the other spellings the reader accepts without vLLM's option table (`-tp`).

JSON-carried settings (speculative decoding in ``--speculative-config``, the CUDA-graph mode in
``--compilation-config``, the GDN prefill backend in ``--additional-config``, the architecture in ``--hf-overrides``)
are listed in JSON_FLAGS with the JSON key each spec field maps to; the renderer writes them with `json_args` and the
reader (rules/launchline.py) reads them under the same keys; tests/render/test_engine.py holds the two to the table.
Whether vLLM accepts a spelling at all is api/vllm_args.py's business (the option table generated from vLLM's
parser); tests/rules/test_rules_launchline_oracle.py checks the reader against vLLM's real parser.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass

from gdn_operator.api.enums import AttentionBackend, GDNPrefillBackend


@dataclass(frozen=True)
class Flag:
    """One spec field carried by one vLLM option.

    kind: ``int`` (``8k`` suffixes accepted when read), ``float``, ``bool`` (``flag`` turns it on, ``off`` turns
    it off; no ``off``: only the on form exists), ``choice`` (a member of ``choices``, spelled in ``case``).
    """

    key: str
    flag: str
    kind: str
    aliases: tuple[str, ...] = ()
    off: str | None = None
    choices: type[enum.Enum] | None = None
    case: str = "upper"
    #: an unknown choice is an error (vLLM refuses it) rather than a note (a value the rules do not model)
    strict: bool = False

    @property
    def spellings(self) -> tuple[str, ...]:
        return (self.flag, *self.aliases, *((self.off,) if self.off else ()))

    def spell(self, value: str) -> str:
        return value.upper() if self.case == "upper" else value.lower()

    def args(self, value: object) -> list[str]:
        """The argv form the renderer writes (None: the flag is left out, vLLM's default applies).

        ``int``/``str``/``choice``: ``[flag, str(value)]``; ``float``: ``%g`` (``0.9``, not ``0.90000001``);
        ``bool``: `bool_args` (the on form, the ``off`` form or nothing).
        """
        if value is None:
            return []
        if self.kind == "bool":
            return bool_args(self, bool(value))
        if self.kind == "float":
            return [self.flag, f"{value:g}"]
        return [self.flag, str(value)]

    def choice(self, value: str) -> str | None:
        """The spec value for a flag value, or None when it is not one of `choices`."""
        if self.choices is None:
            return None
        v = self.spell(value)
        return v if v in {c.value for c in self.choices} else None


TENSOR_PARALLEL = Flag("tensorParallelSize", "--tensor-parallel-size", "int", aliases=("-tp",))
PIPELINE_PARALLEL = Flag("pipelineParallelSize", "--pipeline-parallel-size", "int", aliases=("-pp",))
GPU_MEMORY = Flag("gpuMemoryUtilization", "--gpu-memory-utilization", "float")
MAX_MODEL_LEN = Flag("maxModelLen", "--max-model-len", "int")
MAX_NUM_SEQS = Flag("maxNumSeqs", "--max-num-seqs", "int")
MAX_BATCHED_TOKENS = Flag("maxNumBatchedTokens", "--max-num-batched-tokens", "int")
ASYNC_SCHEDULING = Flag("asyncScheduling", "--async-scheduling", "bool", off="--no-async-scheduling")
PREFIX_CACHING = Flag("prefixCaching", "--enable-prefix-caching", "bool", off="--no-enable-prefix-caching")
CHUNKED_PREFILL = Flag("chunkedPrefill", "--enable-chunked-prefill", "bool", off="--no-enable-chunked-prefill")
ATTENTION_BACKEND = Flag("attentionBackend", "--attention-backend", "choice", choices=AttentionBackend)
GDN_PREFILL_BACKEND = Flag(
    "gdnPrefillBackend", "--gdn-prefill-backend", "choice", choices=GDNPrefillBackend, case="lower", strict=True
)
ENFORCE_EAGER = Flag("enforceEager", "--enforce-eager", "bool")
SERVED_NAME = Flag("model.servedName", "--served-model-name", "str")
REVISION = Flag("model.revision", "--revision", "str")
SHUTDOWN_TIMEOUT = Flag("shutdownTimeoutSeconds", "--shutdown-timeout", "int")

#: Options the renderer writes that no spec field sets (the engine's listen address; the multi-node
#: rendezvous of render/lws.py). The reader consumes HOST and PORT quietly and knows none of the others.
HOST = "--host"
PORT = "--port"
NNODES = "--nnodes"
NODE_RANK = "--node-rank"
MASTER_ADDR = "--master-addr"
MASTER_PORT = "--master-port"
HEADLESS = "--headless"

#: Flags the launch-line reader maps back onto the spec (the served name is family evidence,
#: rules/family.py). Pipeline parallelism is read since issue 36: MTP under PP is a hazard (vllm#44697, vllm#52069).
READ_FLAGS: tuple[Flag, ...] = (
    TENSOR_PARALLEL,
    PIPELINE_PARALLEL,
    MAX_NUM_SEQS,
    MAX_BATCHED_TOKENS,
    MAX_MODEL_LEN,
    GPU_MEMORY,
    ASYNC_SCHEDULING,
    PREFIX_CACHING,
    CHUNKED_PREFILL,
    ENFORCE_EAGER,
    ATTENTION_BACKEND,
    GDN_PREFILL_BACKEND,
)

#: JSON options and the keys the spec maps to them
SPECULATIVE_CONFIG = "--speculative-config"
SPECULATIVE_SHORT = ("-sc",)
COMPILATION_CONFIG = "--compilation-config"
COMPILATION_SHORT = ("-cc",)
ADDITIONAL_CONFIG = "--additional-config"
HF_OVERRIDES = "--hf-overrides"
HF_CONFIG_PATH = "--hf-config-path"
JSON_FLAGS = {
    SPECULATIVE_CONFIG: {
        "speculativeDecoding.method": "method",
        "speculativeDecoding.numSpeculativeTokens": "num_speculative_tokens",
    },
    COMPILATION_CONFIG: {"cudagraphMode": "cudagraph_mode"},
    ADDITIONAL_CONFIG: {"gdnPrefillBackend": "gdn_prefill_backend"},
    HF_OVERRIDES: {"model.architecture": "architectures"},
}
#: JSON-valued flags whose keys may be given one by one (`--speculative-config.method mtp`)
DOTTED_JSON_PREFIXES = tuple(f + "." for f in JSON_FLAGS)


def json_args(flag: str, values: dict[str, object]) -> list[str]:
    """`flag` and a compact JSON object of spec values under the JSON keys JSON_FLAGS maps them to
    (``json_args(COMPILATION_CONFIG, {"cudagraphMode": "PIECEWISE"})`` ->
    ``["--compilation-config", '{"cudagraph_mode":"PIECEWISE"}']``)."""
    keys = JSON_FLAGS[flag]
    return [flag, json.dumps({keys[k]: v for k, v in values.items()}, separators=(",", ":"), sort_keys=True)]


def bool_args(flag: Flag, value: bool | None) -> list[str]:
    """The argv form of a tri-state bool (None: the flag is left out, vLLM's default applies)."""
    if value is None:
        return []
    if value:
        return [flag.flag]
    if flag.off is None:
        return []
    return [flag.off]
