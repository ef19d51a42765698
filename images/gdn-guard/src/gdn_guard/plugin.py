"""The ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` (zero arguments) once per process -- API server, EngineCore, each
worker -- and does not catch its exceptions (0.32.0 ``load_general_plugins`` calls every plugin
function bare), so this module never raises out of :func:`register`.

Environment:
  GDN_GUARD_DISABLE   comma list of guard names or patch ids to skip, or ``all``.
  GDN_GUARD_PATCHES   the patch set the image declares (set by images/vllm-gdn/Dockerfile); when it
                      differs from the patch ids applied in this process a WARNING says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass

from gdn_guard import format_log_line
from gdn_guard.guards import Guard, GuardUnavailable, all_guards
from gdn_guard.versions import DetectedVersion, Version, VersionError, detect_vllm_version

logger = logging.getLogger("vllm.gdn_guard")

_LOCK = threading.Lock()
_RESULT: RegisterResult | None = None


@dataclass(frozen=True)
class RegisterResult:
    vllm: DetectedVersion
    active: tuple[Guard, ...]
    skipped: tuple[tuple[str, str], ...]  # (guard name, reason) for needed guards not applied
    line: str

    @property
    def guard_names(self) -> list[str]:
        return [g.name for g in self.active]

    @property
    def patch_ids(self) -> list[str]:
        return [g.patch_id for g in self.active]


def guards_for(vllm_version: str | Version) -> list[Guard]:
    """The guards a vLLM version needs (catalogue order)."""
    v = vllm_version if isinstance(vllm_version, Version) else Version.parse(vllm_version)
    return [g for g in all_guards() if g.needed_for(v)]


def declared_patch_ids(vllm_version: str) -> list[str]:
    """Patch ids the plugin declares for ``vllm_version`` (e.g. ``["gdn-guard/vllm-36917"]`` for
    0.17.1, ``[]`` for 0.32.0).  Raises ValueError for a string that is not a version."""
    try:
        return [g.patch_id for g in guards_for(vllm_version)]
    except VersionError as e:
        raise ValueError(f"gdn-guard: {e}") from None


def _disabled() -> set[str]:
    raw = os.environ.get("GDN_GUARD_DISABLE", "")
    return {p.strip() for p in raw.split(",") if p.strip()}


def _activate() -> RegisterResult:
    detected = detect_vllm_version()
    active: list[Guard] = []
    skipped: list[tuple[str, str]] = []
    if detected.version is not None:
        disabled = _disabled()
        for guard in guards_for(detected.version):
            if "all" in disabled or guard.name in disabled or guard.patch_id in disabled:
                skipped.append((guard.name, "disabled by GDN_GUARD_DISABLE"))
                continue
            try:
                guard.apply()
            except GuardUnavailable as e:
                skipped.append((guard.name, str(e)))
                continue
            except Exception as e:  # a bug in a guard must not take vLLM down
                logger.exception("gdn-guard: applying guard %s failed", guard.name)
                skipped.append((guard.name, f"{type(e).__name__}: {e}"))
                continue
            active.append(guard)
    line = format_log_line(str(detected), [g.name for g in active], [g.patch_id for g in active])
    return RegisterResult(detected, tuple(active), tuple(skipped), line)


def _ensure_vllm_logging() -> None:
    """Importing vllm.logger applies vLLM's logging configuration (handler, format, level from
    VLLM_LOGGING_LEVEL), so the start-up line is printed like vLLM's own lines even when this
    process has not imported it yet (0.32.0's plugin loader uses plain ``logging``)."""
    with contextlib.suppress(Exception):  # no vLLM (tests, the CLI) or a broken one: plain logging
        import vllm.logger  # noqa: F401


def register() -> None:
    """Entry point for ``vllm.general_plugins``: apply the guards this vLLM version needs and log
    the start-up line.  Idempotent within a process; never raises."""
    global _RESULT
    try:
        _ensure_vllm_logging()
        with _LOCK:
            if _RESULT is not None:
                return
            _RESULT = _activate()
            result = _RESULT
        for name, reason in result.skipped:
            logger.warning("gdn-guard: guard %s is needed by vLLM %s but not active: %s", name, result.vllm, reason)
        if result.vllm.version is None:
            logger.warning("gdn-guard: could not determine the vLLM version; no guard applied")
        logger.info("%s", result.line)
        declared = os.environ.get("GDN_GUARD_PATCHES")
        if declared is not None:
            want = sorted(p.strip() for p in declared.split(",") if p.strip())
            if want != sorted(result.patch_ids):
                logger.warning(
                    "gdn-guard: image declares GDN_GUARD_PATCHES=%s but this process applied [%s]",
                    declared,
                    ", ".join(result.patch_ids),
                )
    except Exception:  # pragma: no cover - last line of defence
        with contextlib.suppress(Exception):
            logger.exception("gdn-guard: register() failed; vLLM continues unguarded")


def result() -> RegisterResult | None:
    """What :func:`register` did in this process (None before it ran)."""
    return _RESULT
