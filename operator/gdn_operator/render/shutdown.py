"""Graceful engine shutdown: scale-down and rollouts must not cut requests off mid-stream.

Kubernetes removes a terminating pod from the Service endpoints while it sends SIGTERM, and the two race.
The recipe vLLM documents (vllm PR #43208, the KServe/llm-d pattern): a preStop sleep so endpoint removal
propagates first, then vLLM's `--shutdown-timeout N` (stop taking requests, let in-flight ones finish for
up to N seconds), inside `terminationGracePeriodSeconds > preStop + N`.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, TypeAdapter, field_validator

from gdn_operator.api import flags
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.datafiles import load_yaml, once
from gdn_operator.versions import parse_version, require_version

#: Seconds the preStop hook waits for endpoint removal before vLLM sees SIGTERM.
PRESTOP_SECONDS = 5
#: Drain used when autoscaling is on and spec.shutdownTimeoutSeconds is unset.
AUTOSCALING_DEFAULT_DRAIN = 30
#: Headroom after the drain for vLLM to stop its engine processes before SIGKILL.
EXIT_HEADROOM_SECONDS = 15
#: The grace period pods had before graceful draining existed (kept when no drain is configured).
DEFAULT_GRACE_SECONDS = 60


class Feature(BaseModel):
    """One entry of render/data/vllm_features.yaml, validated when the file is read (the same pydantic style as
    rules/rulefile.py): a `since` that is not a vLLM version fails the load instead of turning the feature off."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    since: str
    evidence: str
    flag: str | None = None
    flags: tuple[str, ...] = ()

    @field_validator("since")
    @classmethod
    def _since_is_a_version(cls, value: str) -> str:
        require_version(value)
        return value


_FEATURES = TypeAdapter(dict[str, Feature])


@once
def features() -> dict[str, Feature]:
    """render/data/vllm_features.yaml: the first vLLM release with each feature the renderer uses."""
    text = resources.files("gdn_operator.render").joinpath("data/vllm_features.yaml").read_text(encoding="utf-8")
    data: Any = load_yaml(text)
    return _FEATURES.validate_python(data)


def supports(spec: GDNModelServerSpec, feature: str) -> bool:
    """True when spec.image.vllmVersion is at least the feature's first release (unparseable: False)."""
    ver = parse_version(spec.image.vllm_version)
    return ver is not None and ver >= require_version(features()[feature].since)


def drain_seconds(spec: GDNModelServerSpec) -> int:
    """The --shutdown-timeout to render (0: none). An explicit value older vLLMs lack is refused by the rule
    vllm-config/shutdown-timeout-unsupported; the autoscaling default is only used where vLLM has the flag."""
    if spec.shutdown_timeout_seconds is not None:
        return spec.shutdown_timeout_seconds
    if spec.autoscaling is not None and supports(spec, "shutdown_timeout"):
        return AUTOSCALING_DEFAULT_DRAIN
    return 0


def shutdown_args(spec: GDNModelServerSpec) -> list[str]:
    n = drain_seconds(spec)
    return flags.SHUTDOWN_TIMEOUT.args(n) if n > 0 else []


def apply_graceful_shutdown(pod_spec: dict[str, Any], container: dict[str, Any], spec: GDNModelServerSpec) -> None:
    """Wire preStop and the grace period to the drain (only when a drain is configured)."""
    n = drain_seconds(spec)
    if n <= 0:
        return
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}}
    pod_spec["terminationGracePeriodSeconds"] = max(DEFAULT_GRACE_SECONDS, PRESTOP_SECONDS + n + EXIT_HEADROOM_SECONDS)
