"""GDNModelServerStatus: what the operator reports (conditions, rule findings, the effective vLLM
configuration, crashes and remediations, speculative-decoding acceptance, output probes).

Status models tolerate unknown fields (api/base.py `_Status`): a newer operator may have written them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gdn_operator.api.base import _Status
from gdn_operator.api.enums import Phase
from gdn_operator.api.overrides import Override
from gdn_operator.api.probes import ProbesStatus


class Condition(_Status):
    type: str = Field(description="Validated, Ready, Progressing, Degraded, CrashLooping, Unschedulable, ...")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")
    observed_generation: int | None = None


class MeasuredCost(_Status):
    """One measured concurrency at which MTP with a rule's mitigation ran slower than MTP off (rules.yaml `cost`)."""

    vllm_version: str = Field(description="vLLM release measured.")
    hardware: str = Field(description="GPUs measured, e.g. 1x NVIDIA H100 80GB HBM3.")
    model: str = Field(description="Model measured (geometry name and size).")
    tensor_parallel_size: int | None = None
    concurrency: int = Field(description="Requests in flight to one engine.")
    mtp_vs_off: float = Field(description="tokens/s of MTP with the mitigation / MTP off (below 1: MTP loses).")
    mtp_vs_unmitigated: float | None = Field(default=None, description="tokens/s with the mitigation / without it.")
    above_max_num_seqs: bool = Field(
        default=False, description="The concurrency is above this server's maxNumSeqs: outside the range it serves."
    )
    fixture: str = Field(description="The GPU capture the numbers come from (tests/... in the project's checkout).")


class RuleFinding(_Status):
    """One known-issue rule that matched the effective configuration."""

    rule: str = Field(description="Rule id = upstream reference, e.g. vllm#36917.")
    title: str = ""
    kind: str = Field(default="", description="startup-crash, runtime-crash, silent-corruption, deadlock, config, performance.")
    severity: str = Field(default="", description="critical, high, medium, low, info.")
    action: str = Field(default="", description="What admission did: rejected, mitigated, warned, advisory.")
    message: str = ""
    fields: list[str] = Field(default_factory=list, description="Spec fields that trigger the rule.")
    workaround: str = ""
    mitigation: dict[str, Any] | None = Field(default=None, description="Spec change the rule applies when mitigating.")
    code: str | None = Field(
        default=None,
        description="Stable reason of a measured advisory: MTPSlowerThanOff (MTP with the rule's mitigation "
        "measured slower than MTP off within this server's maxNumSeqs), MTPSlowerOnlyAboveMaxNumSeqs.",
    )
    measurements: list[MeasuredCost] | None = Field(
        default=None, max_length=16, description="The measurements behind a measured advisory (rules.yaml `cost`)."
    )

    def line(self) -> str:
        """The message led by the rule id exactly once (rule messages already begin with it)."""
        return self.message if self.message.startswith(f"{self.rule}:") else f"{self.rule}: {self.message}"


class CrashInfo(_Status):
    """The most recent engine crash the crash watch classified."""

    time: str | None = None
    pod: str | None = None
    container: str | None = None
    group: str | None = Field(default=None, description="Multi-node engines: the LeaderWorkerSet group (<name>/<index>).")
    incident_pods: list[str] = Field(
        default_factory=list, max_length=16, description="Multi-node engines: the group's pods that died in this one crash."
    )
    signature: str = Field(description="Signature id from the catalogue, or engine-dead for an unknown crash.")
    upstream: str | None = Field(default=None, description="Upstream issue, e.g. vllm#36917.")
    kind: str | None = None
    root_cause: str | None = Field(default=None, description="The root-cause line extracted from the log.")
    exit_code: int | None = None
    restart_count: int | None = None
    count: int | None = Field(default=None, description="Crashes with this signature on this generation.")
    generation: int | None = Field(default=None, description="Spec generation the crashes were counted on.")
    revision: str | None = Field(
        default=None, description="Generation + remediation overrides in force the crashes were counted on."
    )
    remediation_hint: str | None = Field(default=None, description="What the catalogue says to do about it.")


class Remediation(_Status):
    """A change the operator made to stop a deterministic crash loop."""

    time: str | None = None
    signature: str
    upstream: str | None = None
    generation: int | None = Field(default=None, description="Spec generation the remediation was applied on.")
    revision: str | None = Field(
        default=None, description="Generation + remediation overrides in force (api/overrides.revision)."
    )
    action: str = Field(description="What was changed, e.g. asyncScheduling=false.")
    changes: dict[str, Any] = Field(default_factory=dict, description="Spec fields changed (camelCase path → value).")
    reason: str = ""


class PodAcceptance(_Status):
    pod: str
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    drafts_per_second: float | None = None
    error: str | None = Field(default=None, description="Last scrape error: timeout, connect, http, parse.")


class AcceptanceFinding(_Status):
    reason: str = Field(description="SpecAcceptanceNearZero, SpecAcceptanceDrop, EarlyStopShift, ...")
    severity: str = "Warning"
    message: str = ""
    upstream: list[str] = Field(default_factory=list)
    pods: list[str] = Field(default_factory=list)


class AcceptanceStatus(_Status):
    """Speculative-decoding acceptance over the scrape window (from the engines' /metrics)."""

    state: str | None = Field(
        default=None, description="NoData, WarmingUp, NotApplicable (spec decode off), NoTraffic, Ok, Degraded."
    )
    rate: float | None = Field(default=None, description="Accepted / draft tokens over the window.")
    rate_display: str | None = Field(default=None, description="Rate as a percentage string, for kubectl.")
    mean_accepted_length: float | None = Field(default=None, description="1 + accepted / drafts.")
    per_position: list[float | None] = Field(default_factory=list, description="Acceptance per draft position.")
    drafts_per_second: float | None = None
    window_seconds: float | None = None
    observed_seconds: float | None = None
    baseline_rate: float | None = Field(default=None, description="Healthy acceptance the drop check compares with.")
    stop_share: float | None = Field(default=None, description="Share of finished requests that stopped on EOS/stop.")
    mean_generation_length: float | None = None
    pods_reporting: int | None = None
    scrape_errors: int | None = None
    updated: str | None = None
    findings: list[AcceptanceFinding] = Field(default_factory=list, max_length=16)
    pods: list[PodAcceptance] = Field(default_factory=list, max_length=64, description="Per pod (first 64).")


class PodStall(_Status):
    """One engine pod (the leader, for a multi-node group) with requests in flight and no progress."""

    pod: str
    group: str | None = Field(default=None, description="LeaderWorkerSet group (multi-node): the whole group is stalled.")
    running: int = Field(default=0, description="Requests stuck running.")
    waiting: int = Field(default=0, description="Requests stuck waiting.")
    seconds_without_progress: float = 0.0
    tokens_per_request_second: float | None = Field(
        default=None, description="Output tokens per running request per second over that time (floor 0.5)."
    )
    engine_steps: float | None = Field(default=None, description="Engine steps over that time, when exposed.")
    hang_evidence: str | None = Field(default=None, description="Hang wording in the pod's log (supporting evidence).")
    probe_timeouts: int | None = Field(default=None, description="Output-probe timeouts (supporting evidence).")
    since: str | None = Field(default=None, description="RFC 3339 time the progress stopped.")


class StallStatus(_Status):
    """Engines that hold requests but stopped making progress, from their /metrics (spec.health.stallSeconds)."""

    stall_seconds: int | None = None
    stalled: list[PodStall] = Field(default_factory=list, max_length=64, description="Stalled pods (first 64).")
    updated: str | None = None


class DefaultedField(_Status):
    """An unset spec field the operator set to the value a known-issue rule accepts (unset means safe)."""

    field: str = Field(description="camelCase spec path, e.g. prefixCaching.")
    value: Any = Field(default=None, description="The value rendered for it.")
    rule: str = Field(default="", description="The rule whose mitigation the value is, e.g. vllm#43559.")
    cost: str = Field(
        default="",
        description="What the value measurably costs at this release (MTP with it against MTP off, from a GPU capture), "
        "or 'unmeasured'.",
    )


class EffectiveConfig(_Status):
    """vLLM's behaviour after resolving its version-dependent defaults (what the rules evaluated)."""

    vllm_version: str | None = None
    async_scheduling: bool | None = None
    prefix_caching: bool | None = None
    mamba_cache_mode: str | None = None
    model_runner: str | None = None
    spec_method: str | None = None
    architecture: str | None = None
    gdn_prefill_backend: str | None = None
    cudagraph_mode: str | None = None
    cudagraph_implementation: str | None = Field(
        default=None, description="breakable or compiled piecewise CUDA graphs (none without CUDA graphs)."
    )
    defaults: list[DefaultedField] = Field(
        default_factory=list,
        max_length=32,
        description="Unset fields set to the value the rules accept for this vLLM version, each with its rule.",
    )


class GDNModelServerStatus(_Status):
    phase: Phase | None = None
    observed_generation: int | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    ready: str | None = Field(default=None, description="ready/desired, for kubectl.")
    workload: str | None = Field(default=None, description="Engine workload kind: Deployment or LeaderWorkerSet (multi-node).")
    group_size: int | None = Field(
        default=None, description="Pods per engine group (multi-node); replicas and readyReplicas then count groups."
    )
    url: str | None = Field(
        default=None,
        description="The in-cluster OpenAI endpoint (http://<name>.<namespace>.svc:8000/v1); set once the engine Service is applied.",
    )
    owned_kinds: list[str] | None = Field(
        default=None,
        max_length=16,
        description="Optional kinds (Deployment, LeaderWorkerSet, HorizontalPodAutoscaler, ScaledObject, InferencePool) "
        "this server may own: the reconciler deletes those its spec stops rendering.",
    )
    selector: str | None = Field(
        default=None,
        max_length=1024,
        description="Label selector of the pods the replicas count (the scale subresource's labelSelectorPath, for "
        "an HPA or KEDA scaling the server itself): every engine pod, or the group leaders of a multi-node engine.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        # one condition per type: server-side apply merges by type instead of replacing the list
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    findings: list[RuleFinding] = Field(default_factory=list, description="Known-issue rules that matched.")
    effective: EffectiveConfig | None = None
    last_crash: CrashInfo | None = None
    remediations: list[Remediation] = Field(default_factory=list, max_length=32)
    overrides: list[Override] = Field(
        default_factory=list,
        max_length=32,
        description="Values the operator runs instead of the spec's (admission mitigations, crash remediations); "
        "the spec itself is never written. See api/overrides.py for when one ends.",
    )
    rendered_digest: str | None = Field(
        default=None,
        max_length=64,
        description="Digest of the engine workload as the operator last rendered it (its own record): an apply of "
        "the same rendering is a no-op unless someone changed the workload, which tells a repeated apply (after a "
        "restart) from a change without reading the workload first.",
    )
    overrides_cleared: str | None = Field(
        default=None, description="The last serving.gdn-operator.io/clear-overrides annotation value acted on."
    )
    advisories: list[RuleFinding] = Field(
        default_factory=list,
        description="Known risks no spec value avoids yet, and measured costs of the rules' mitigations "
        "(code MTPSlowerThanOff); reported here, not warned on every apply.",
    )
    acceptance: AcceptanceStatus | None = None
    stall: StallStatus | None = None
    probes: ProbesStatus | None = None
