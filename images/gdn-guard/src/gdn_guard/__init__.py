"""gdn-guard: a vLLM general plugin that neutralises known GDN + MTP bugs at run time.

Entry point: ``vllm.general_plugins`` -> ``gdn_guard = gdn_guard.plugin:register``.

Start-up line (logged once per process through the ``vllm.gdn_guard`` logger, so vLLM's handler
prints it with its usual ``INFO <date> [plugin.py:<n>]`` prefix, and under multiprocessing with a
``(EngineCore_DP0 pid=<n>)`` prefix)::

    gdn-guard 0.1.0: vLLM 0.17.1, active guards: [spec-decode-uniform-batch], patch ids: [gdn-guard/vllm-36917]
    gdn-guard 0.1.0: vLLM 0.32.0, active guards: [], patch ids: []

``vLLM unknown`` when the version cannot be determined (then no guard is applied).  The lists are
the guards actually applied in that process and their patch ids, comma+space separated, in catalogue
order.  :data:`LOG_LINE_RE` matches the line anywhere in a log line (use ``.search``).
"""

from __future__ import annotations

import re

__version__ = "0.1.0"

LOG_LINE_FORMAT = "gdn-guard {guard_version}: vLLM {vllm_version}, active guards: [{guards}], patch ids: [{patch_ids}]"

LOG_LINE_RE = re.compile(
    r"gdn-guard (?P<guard_version>\d[0-9A-Za-z.+!-]*): "
    r"vLLM (?P<vllm_version>unknown|\d[0-9A-Za-z.+!-]*), "
    r"active guards: \[(?P<guards>[a-z0-9-]+(?:, [a-z0-9-]+)*)?\], "
    r"patch ids: \[(?P<patch_ids>[a-z0-9-]+/[a-z0-9-]+(?:, [a-z0-9-]+/[a-z0-9-]+)*)?\]"
)


def format_log_line(vllm_version: str, guards: list[str], patch_ids: list[str]) -> str:
    return LOG_LINE_FORMAT.format(
        guard_version=__version__,
        vllm_version=vllm_version,
        guards=", ".join(guards),
        patch_ids=", ".join(patch_ids),
    )


def parse_log_line(text: str) -> dict | None:
    """Find the start-up line in ``text`` (one log line or a whole log); None if absent.

    Returns ``{"guard_version", "vllm_version", "guards": [...], "patch_ids": [...]}``."""
    m = LOG_LINE_RE.search(text)
    if m is None:
        return None

    def split(s: str | None) -> list[str]:
        return [p for p in (s or "").split(", ") if p]

    return {
        "guard_version": m.group("guard_version"),
        "vllm_version": m.group("vllm_version"),
        "guards": split(m.group("guards")),
        "patch_ids": split(m.group("patch_ids")),
    }


def declared_patch_ids(vllm_version: str) -> list[str]:
    """Patch ids this plugin declares for a vLLM version (see :mod:`gdn_guard.plugin`)."""
    from gdn_guard.plugin import declared_patch_ids as _declared

    return _declared(vllm_version)


__all__ = [
    "__version__",
    "LOG_LINE_FORMAT",
    "LOG_LINE_RE",
    "format_log_line",
    "parse_log_line",
    "declared_patch_ids",
]
