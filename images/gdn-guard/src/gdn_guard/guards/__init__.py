"""Guard catalogue: one :class:`Guard` per upstream vLLM defect the plugin can neutralise at run time.

A guard names the vLLM versions that need it (half-open range, catalogue "fixed in" = exclusive end),
the patch id it declares (the id the operator's rules list under ``patches``), and an ``apply``
function that installs it in the current process.  ``apply`` must be idempotent and must raise
:class:`GuardUnavailable` (never patch half-way) when the vLLM code it hooks is not what it expects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gdn_guard.versions import Version, VersionRange


class GuardUnavailable(RuntimeError):
    """The vLLM code a guard hooks is missing or has an unexpected shape; the guard was not applied."""


@dataclass(frozen=True)
class Guard:
    name: str  # short name shown in the start-up line, e.g. "spec-decode-uniform-batch"
    patch_id: str  # e.g. "gdn-guard/vllm-36917" (must match the operator's rules.yaml `patches`)
    upstream: str  # upstream references, e.g. "vllm#36917"
    versions: VersionRange
    summary: str
    apply: Callable[[], None]

    def needed_for(self, version: Version) -> bool:
        return self.versions.contains(version)


def all_guards() -> list[Guard]:
    """Every guard, in the order they are applied."""
    from gdn_guard.guards import fa3_group_metadata, vllm_36917

    return [vllm_36917.GUARD, fa3_group_metadata.GUARD]
