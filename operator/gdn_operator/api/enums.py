"""Enumerations of the GDNModelServer API (spec values and status.phase).

Part of the API models (api/spec.py, api/status.py, api/resource.py); enum values are what the CRD's
schema lists.
"""

from __future__ import annotations

import enum


class Architecture(str, enum.Enum):
    """HF `architectures` classes of the Gated DeltaNet hybrid families vLLM serves (Qwen3.6 and
    Qwen3.8 checkpoints load as the Qwen3_5 classes)."""

    QWEN3_NEXT = "Qwen3NextForCausalLM"
    QWEN3_5 = "Qwen3_5ForConditionalGeneration"
    QWEN3_5_CAUSAL = "Qwen3_5ForCausalLM"
    QWEN3_5_MOE = "Qwen3_5MoeForConditionalGeneration"
    QWEN3_5_MOE_CAUSAL = "Qwen3_5MoeForCausalLM"


class PullPolicy(str, enum.Enum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class SpecMethod(str, enum.Enum):
    """`mtp`, plus the deprecated aliases vLLM still accepts and rewrites to `mtp`."""

    MTP = "mtp"
    QWEN3_NEXT_MTP = "qwen3_next_mtp"
    QWEN3_5_MTP = "qwen3_5_mtp"


class ModelRunner(str, enum.Enum):
    AUTO = "auto"
    V1 = "v1"
    V2 = "v2"


class AttentionBackend(str, enum.Enum):
    FLASH_ATTN = "FLASH_ATTN"
    FLASHINFER = "FLASHINFER"
    TRITON_ATTN = "TRITON_ATTN"
    FLEX_ATTENTION = "FLEX_ATTENTION"
    TREE_ATTN = "TREE_ATTN"
    ROCM_ATTN = "ROCM_ATTN"
    CPU_ATTN = "CPU_ATTN"


class GDNPrefillBackend(str, enum.Enum):
    FLASHINFER = "flashinfer"
    TRITON = "triton"
    CUTEDSL = "cutedsl"
    AITER_FLYDSL = "aiter_flydsl"
    SYCL = "sycl"


class CudagraphMode(str, enum.Enum):
    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"


# How vLLM captures the piecewise part of its CUDA graphs (VLLM_USE_BREAKABLE_CUDAGRAPH, issue 46): breakable =
# one stream capture broken at attention and the GDN core (no torch.compile), compiled = torch.compile's split
# graphs. No docstring: it would become a schema description and change the generated CRD.
class CudagraphImplementation(str, enum.Enum):
    BREAKABLE = "breakable"
    COMPILED = "compiled"


# What admission does with a known-crash finding (spec.admissionPolicy, GDN_DEFAULT_POLICY). No docstring:
# it would become a schema description and change the generated CRD.
class AdmissionPolicy(str, enum.Enum):
    REJECT = "reject"
    MITIGATE = "mitigate"
    WARN = "warn"


#: The policy names, in the order they are listed in messages.
ADMISSION_POLICIES: tuple[str, ...] = tuple(p.value for p in AdmissionPolicy)


class RemediationMode(str, enum.Enum):
    AUTO = "auto"
    NONE = "none"


class Phase(str, enum.Enum):
    PENDING = "Pending"
    REJECTED = "Rejected"
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"
    CRASH_LOOPING = "CrashLooping"
    UNSCHEDULABLE = "Unschedulable"
