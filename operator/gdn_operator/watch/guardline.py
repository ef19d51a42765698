"""The gdn-guard plugin's start-up line, as the operator reads it from engine logs.

The plugin (images/gdn-guard) logs exactly one line per process naming the guards it applied and the
patch ids they stand for; the format is a contract between the plugin and this parser (a test checks
both sides agree). The operator compares the ids with spec.image.patches: an image that declares a patch
its plugin does not apply would let admission wave through a configuration that is not actually guarded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GUARD_LINE_RE = re.compile(
    r"gdn-guard (?P<guard_version>\d[0-9A-Za-z.+!-]*): "
    r"vLLM (?P<vllm_version>unknown|\d[0-9A-Za-z.+!-]*), "
    r"active guards: \[(?P<guards>[a-z0-9-]+(?:, [a-z0-9-]+)*)?\], "
    r"patch ids: \[(?P<patch_ids>[a-z0-9-]+/[a-z0-9-]+(?:, [a-z0-9-]+/[a-z0-9-]+)*)?\]"
)

#: how much of a container's log to search for the start-up line before calling it missing
SEARCH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class GuardLine:
    guard_version: str
    vllm_version: str
    guards: tuple[str, ...]
    patch_ids: tuple[str, ...]


def parse_guard_line(text: str) -> GuardLine | None:
    m = GUARD_LINE_RE.search(text)
    if m is None:
        return None

    def split(s: str | None) -> tuple[str, ...]:
        return tuple(p for p in (s or "").split(", ") if p)

    return GuardLine(m.group("guard_version"), m.group("vllm_version"), split(m.group("guards")), split(m.group("patch_ids")))


@dataclass(frozen=True)
class PatchCheck:
    ok: bool
    reason: str
    message: str


def check_patch_set(declared: list[str] | tuple[str, ...], line: GuardLine | None, declared_version: str) -> PatchCheck:
    """Compare the image's declared patch set with what the plugin reported (None: no line found)."""
    declared_set = set(declared)
    if line is None:
        if declared_set:
            return PatchCheck(
                False,
                "GuardLineMissing",
                f"spec.image.patches declares {sorted(declared_set)} but the engine log has no gdn-guard "
                "start-up line: the image does not run the gdn-guard plugin (or VLLM_PLUGINS excludes it)",
            )
        return PatchCheck(True, "NoPatchesDeclared", "no patches declared, none expected")
    reported = set(line.patch_ids)
    missing = sorted(declared_set - reported)
    if missing:
        return PatchCheck(
            False,
            "PatchSetMismatch",
            f"spec.image.patches declares {missing} but gdn-guard {line.guard_version} on vLLM "
            f"{line.vllm_version} applied only {sorted(reported) or 'none'}; admission relied on patches "
            "the engine does not have: fix spec.image.patches or the image",
        )
    if line.vllm_version not in ("unknown", declared_version) and not line.vllm_version.startswith(declared_version + "+"):
        return PatchCheck(
            False,
            "VersionMismatch",
            f"spec.image.vllmVersion is {declared_version} but the engine runs vLLM {line.vllm_version}: "
            "the known-crash rules were evaluated against the wrong version",
        )
    extra = sorted(reported - declared_set)
    msg = f"gdn-guard {line.guard_version} applied {sorted(reported) or 'no guards'} on vLLM {line.vllm_version}"
    if extra:
        msg += f" (not declared, so not relied on: {extra})"
    return PatchCheck(True, "PatchSetVerified", msg)
