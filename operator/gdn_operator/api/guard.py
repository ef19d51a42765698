"""GDNGuard (serving.gdn-operator.io/v1alpha1): guards vLLM workloads that other tools create (issue 35).

A guard selects pods and workloads (Deployment, StatefulSet, LeaderWorkerSet, bare Pod, whatever created
them) in its namespace by label, and runs the operator's safety features on them: known-crash rules at
admission, crash watch, stall detection, acceptance tracking and output probes. It never writes what it
guards (the one exception is the opt-in `remediation: deletePod`); what it finds goes to its own status.

These models are the single source of the GDNGuard CRD (api/crd.py `guard_crd_yaml`, `gdnctl crd --kind
GDNGuard`), like api/spec.py and api/status.py are for GDNModelServer. Unset means safe: every run-time
feature that needs nothing from the user is on, admission warns (never refuses), remediation is off.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from gdn_operator.api.base import _Model, _Status, cel
from gdn_operator.api.k8s import dns1123_label, label_key, label_selector_problems
from gdn_operator.api.probes import ProbesSpec
from gdn_operator.api.resource import ObjectMeta
from gdn_operator.api.status import AcceptanceStatus, Condition
from gdn_operator.api.tagpattern import compile_tag_pattern

#: The annotation read for the vLLM release when the image tag does not carry one (and the default key of
#: spec.vllmVersion.annotation).
VERSION_ANNOTATION = "gdn-operator.io/vllm-version"


class GuardPolicy(str, enum.Enum):
    WARN = "warn"
    DENY = "deny"


class GuardRemediation(str, enum.Enum):
    NONE = "none"
    DELETE_POD = "deletePod"


class SelectorOperator(str, enum.Enum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


#: the most values one selector requirement may list, and label pairs or requirements one selector may hold: each
#: guard becomes a webhook of the one shared guard webhook configuration (handlers/guard/admission.py), which
#: must stay far below the API server's object size limit however many guards there are
MAX_SELECTOR_VALUES = 16
MAX_SELECTOR_TERMS = 8
#: operators that select something: a selector needs at least one (matchLabels, In, Exists); NotIn and
#: DoesNotExist alone select nearly every workload of the namespace
_POSITIVE = ("In", "Exists")


class SelectorRequirement(_Model):
    key: str = Field(min_length=1, max_length=317, description="The label key the requirement applies to.")
    operator: SelectorOperator
    values: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list,
        max_length=MAX_SELECTOR_VALUES,
        description="Label values (In, NotIn); empty for Exists, DoesNotExist.",
    )


class GuardSelector(_Model):
    """A metav1.LabelSelector over the pods and workloads of the guard's namespace. It must select by something:
    a matchLabels pair or an In / Exists requirement (a selector of only NotIn / DoesNotExist, like an empty one,
    would guard nearly every workload in the namespace, and send every one through admission)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && "
                "self.matchExpressions.exists(e, e.operator == 'In' || e.operator == 'Exists'))",
                "spec.selector selects by nothing (empty, or only NotIn / DoesNotExist), which would guard nearly every "
                "workload in the namespace: set spec.selector.matchLabels (e.g. {app: my-vllm})",
            )
        ),
    )

    match_labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_SELECTOR_TERMS, description="Labels every guarded object carries."
    )
    match_expressions: list[SelectorRequirement] = Field(default_factory=list, max_length=MAX_SELECTOR_TERMS)

    @model_validator(mode="after")
    def _valid(self) -> GuardSelector:
        if not self.match_labels and not any(e.operator in _POSITIVE for e in self.match_expressions):
            raise ValueError(
                "spec.selector selects by nothing (empty, or only NotIn / DoesNotExist), which would guard nearly every "
                "workload in the namespace: set spec.selector.matchLabels (e.g. {app: my-vllm}) to the labels of the "
                "vLLM pods and workloads to guard"
            )
        problems = label_selector_problems(self.dump(), "spec.selector")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ImageTagSource(_Model):
    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                # the API server compiles the pattern with its RE2 (CEL matches): a pattern RE2 refuses (a
                # backreference, lookaround) is refused at admission of the guard; `a || !a` so the error is not absorbed
                "!has(self.pattern) || ''.matches(self.pattern) || !''.matches(self.pattern)",
                "spec.vllmVersion.imageTag.pattern is not an RE2 regular expression (no backreferences or lookaround): "
                "write one group that captures the release, e.g. '^v?([0-9.]+)-cu12'",
            )
        ),
    )

    pattern: str | None = Field(
        default=None,
        max_length=256,
        description="An RE2 regular expression (the syntax of Go's regexp and CEL: no backreferences or lookaround) "
        "with one group that captures the release from the image tag (default: vX.Y.Z or X.Y.Z, with an optional "
        "suffix). Matched in time linear in the tag.",
    )

    @field_validator("pattern")
    @classmethod
    def _one_group(cls, v: str | None) -> str | None:
        if v is not None:
            compile_tag_pattern(v)  # ValueError naming the field and the fix
        return v


#: The release in an image tag by default: v0.33.0, 0.33.0, v0.33.0-cu129 (the suffix is not part of it).
DEFAULT_TAG_PATTERN = r"^v?([0-9]+\.[0-9]+\.[0-9]+)(?:$|[-+._])"
_VERSION = r"[0-9]+\.[0-9]+(\.[0-9]+)?([.+-][0-9A-Za-z.+-]*)?"


class VersionSource(_Model):
    """How the guarded engine's vLLM release is known: exactly one of imageTag, annotation, pinned
    (default: imageTag, falling back to the gdn-operator.io/vllm-version annotation)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "[has(self.imageTag), has(self.annotation), has(self.pinned)].filter(x, x).size() <= 1",
                "spec.vllmVersion: set exactly one of imageTag, annotation, pinned",
            )
        ),
    )

    image_tag: ImageTagSource | None = Field(
        default=None, description="Read the release from the engine container's image tag (the default)."
    )
    annotation: str | None = Field(
        default=None,
        max_length=317,
        description="The pod or workload annotation holding the release, e.g. gdn-operator.io/vllm-version.",
    )
    pinned: str | None = Field(default=None, max_length=64, description="The release, stated here (e.g. 0.33.0).")

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionSource:
        set_ = [
            n
            for n, v in (("imageTag", self.image_tag), ("annotation", self.annotation), ("pinned", self.pinned))
            if v is not None
        ]
        if len(set_) > 1:
            raise ValueError(f"spec.vllmVersion sets {', '.join(set_)}: set exactly one of imageTag, annotation, pinned")
        if not set_:
            self.image_tag = ImageTagSource()
        if self.annotation is not None and not label_key(self.annotation):
            raise ValueError(f"spec.vllmVersion.annotation {self.annotation!r} is not an annotation key (prefix/name)")
        if self.pinned is not None and not re.fullmatch(_VERSION, self.pinned.removeprefix("v")):
            raise ValueError(f"spec.vllmVersion.pinned {self.pinned!r} is not a vLLM release: write it as X.Y.Z (e.g. 0.33.0)")
        return self

    def resolve(self, image_tag: str, annotations: dict[str, str]) -> tuple[str | None, str]:
        """(the release, where it came from: imageTag, annotation or pinned) for an engine whose image tag and
        annotations (the pod's or workload's) are given; None when the chosen source does not tell."""
        if self.pinned is not None:
            return self.pinned.removeprefix("v"), "pinned"
        if self.annotation is not None:
            value = annotations.get(self.annotation, "").strip().removeprefix("v")
            return (value, "annotation") if re.fullmatch(_VERSION, value) else (None, "annotation")
        pattern = self.image_tag.pattern if self.image_tag is not None and self.image_tag.pattern else DEFAULT_TAG_PATTERN
        release = compile_tag_pattern(pattern).release(image_tag)  # RE2: linear in the tag, whatever the pattern
        if release:
            return release, "imageTag"
        value = annotations.get(VERSION_ANNOTATION, "").strip().removeprefix("v")
        return (value, "annotation") if re.fullmatch(_VERSION, value) else (None, "imageTag")

    @property
    def source(self) -> Literal["imageTag", "annotation", "pinned"]:
        if self.pinned is not None:
            return "pinned"
        return "annotation" if self.annotation is not None else "imageTag"


class GuardFeatures(_Model):
    admission: bool = Field(default=True, description="Judge the launch line of guarded workloads at admission.")
    crash_watch: bool = Field(default=True, description="Classify engine crashes from the pods' logs.")
    stall: bool = Field(default=True, description="Flag engines with requests running and no tokens generated.")
    acceptance: bool = Field(default=True, description="Track the speculative-decoding acceptance rate.")
    probes: bool = Field(default=False, description="Send the output probes of spec.probes (needs prompts).")


class GuardAdmission(_Model):
    policy: GuardPolicy = Field(
        default=GuardPolicy.WARN,
        description="warn: admit with admission warnings naming the rules; deny: refuse a launch line a "
        "known-crash rule matches (the same messages as GDNModelServer admission and gdnctl validate).",
    )


class GDNGuardSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.features) || !has(self.features.probes) || !self.features.probes || has(self.probes)",
                "spec.features.probes is true but spec.probes is unset: add spec.probes.prompts",
            )
        ),
    )

    selector: GuardSelector = Field(
        description="Label selector over the pods and workloads to guard, in the guard's namespace (required, non-empty)."
    )
    container: str | None = Field(
        default=None,
        max_length=63,
        description="The engine container's name (default: the first container whose command and args launch vLLM).",
    )
    vllm_version: VersionSource = Field(
        default_factory=VersionSource,
        description="How the engine's vLLM release is known: exactly one of imageTag, annotation, pinned "
        "(default: imageTag, falling back to the gdn-operator.io/vllm-version annotation).",
    )
    features: GuardFeatures = Field(default_factory=GuardFeatures, description="What the guard runs (probes is off by default).")
    admission: GuardAdmission = Field(default_factory=GuardAdmission)
    remediation: GuardRemediation = Field(
        default=GuardRemediation.NONE,
        description="none (default): report only. deletePod: delete a stalled or deterministically crashing pod "
        "(needs the chart's guard.remediation.enabled, which grants pod delete).",
    )
    probes: ProbesSpec | None = Field(default=None, description="Output probes (with features.probes: true).")

    @field_validator("container")
    @classmethod
    def _container(cls, v: str | None) -> str | None:
        if v is not None and not dns1123_label(v):
            raise ValueError(f"spec.container {v!r} is not a container name (a DNS-1123 label)")
        return v

    @model_validator(mode="after")
    def _probes_need_prompts(self) -> GDNGuardSpec:
        if self.features.probes and self.probes is None:
            raise ValueError(
                "spec.features.probes is true but spec.probes is unset: add spec.probes.prompts, or set features.probes: false"
            )
        return self


# ------------------------------------------------------------------------------------------------ status ---

FindingType = Literal["KnownCrash", "CrashDiagnosed", "Stalled", "AcceptanceCollapsed", "OutputInconsistent"]


def _conditions_map() -> dict[str, Any]:
    """One condition per type: server-side apply merges by type instead of replacing the list."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}


class GuardFinding(_Status):
    type: FindingType = Field(description="KnownCrash, CrashDiagnosed, Stalled, AcceptanceCollapsed, OutputInconsistent.")
    rule: str | None = Field(default=None, description="Rule or crash-signature id, e.g. vllm#36917.")
    pod: str | None = None
    message: str = ""
    since: str | None = Field(default=None, description="RFC 3339 time the finding was first seen.")
    count: int | None = Field(default=None, description="CrashDiagnosed: crashes of this signature in this pod so far.")


class GuardedWorkload(_Status):
    kind: str = Field(description="Deployment, StatefulSet, LeaderWorkerSet, Pod, or the owning resource's kind.")
    name: str
    vllm_version: str | None = None
    version_source: str | None = Field(default=None, description="imageTag, annotation or pinned.")
    pods: int = 0
    findings: list[GuardFinding] = Field(default_factory=list, max_length=64)
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_conditions_map())
    acceptance: AcceptanceStatus | None = Field(
        default=None, description="Speculative-decoding acceptance of the workload's engines (features.acceptance)."
    )
    problems: list[str] = Field(
        default_factory=list, max_length=8, description="Why part of the guard cannot act on this workload, and the fix."
    )


class GDNGuardStatus(_Status):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=_conditions_map())
    workloads: list[GuardedWorkload] = Field(default_factory=list, max_length=512, description="One entry per guarded workload.")


class GDNGuard(_Model):
    """Guards vLLM workloads other tools create: known-crash rules at admission, crash watch, stall detection,
    acceptance and output probes, reported in status without writing the guarded objects."""

    api_version: Literal["serving.gdn-operator.io/v1alpha1"] = Field(default="serving.gdn-operator.io/v1alpha1")
    kind: Literal["GDNGuard"] = Field(default="GDNGuard")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GDNGuardSpec
    status: GDNGuardStatus | None = None
