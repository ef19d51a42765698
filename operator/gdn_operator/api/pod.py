"""spec.pod: the ordinary pod settings of the engine pods (Deployment pods, LeaderWorkerSet leaders and
workers): pull secrets, service account, runtime/priority class, scheduler, labels, annotations, extra
volumes and mounts, whole-map envFrom (opt-in), pod and container securityContext.

What the operator owns (command, args, ports, probes, GPU resources, the model cache mount, the labels it
selects on) is refused here naming the field to use instead. Scheduling keeps its one home at the top of
the spec (spec.nodeSelector, spec.tolerations, spec.affinity).

Settings that loosen the pod's isolation (GPU-visibility env, envFrom, hostPath, privileged, added
capabilities, and the engine's own insecure settings) pass the schema but are refused by
`unsafe_refusals` unless the operator-wide opt-in (settings GDN_ALLOW_UNSAFE, chart value
operator.allowUnsafe) lists them: admission and the reconciler both call it.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from gdn_operator.api import k8s as _k8s
from gdn_operator.api import vllm_args as _vllm_args
from gdn_operator.api.base import _Model

if TYPE_CHECKING:  # pragma: no cover
    from gdn_operator.api.spec import GDNModelServerSpec

#: Where the operator mounts its own volumes in the engine container (render/engine.py renders them).
SHM_MOUNT = "/dev/shm"
CACHE_MOUNT = "/cache"
MODEL_MOUNT = "/models"
#: Volume names the operator renders itself.
OPERATOR_VOLUMES = frozenset({"dshm", "cache", "model"})

#: Label / annotation key prefixes the operator sets or selects on (render/meta.py common_labels,
#: the LeaderWorkerSet controller's own keys).
OWNED_KEY_PREFIXES = ("app.kubernetes.io/", "serving.gdn-operator.io/", "leaderworkerset.sigs.k8s.io/")
OWNED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/default-container"})

#: Pod/container fields a user may try in spec.pod that the operator owns -> what to use instead.
OWNED_POD_FIELDS = {
    "containers": "nothing: the operator renders the engine container (use spec.extraArgs, spec.env, spec.image)",
    "initContainers": "nothing: the operator renders the pod's init containers",
    "image": "spec.image",
    "command": "nothing: the operator runs `vllm serve` (use spec.extraArgs)",
    "args": "spec.extraArgs",
    "ports": "nothing: the engine serves HTTP on port 8000 (the Service and probes use it)",
    "resources": "spec.resources (GPUs are tensorParallelSize x pipelineParallelSize / nodes)",
    "livenessProbe": "spec.startupBudgetSeconds (the operator renders the probes)",
    "readinessProbe": "spec.startupBudgetSeconds (the operator renders the probes)",
    "startupProbe": "spec.startupBudgetSeconds",
    "env": "spec.env",
    "nodeSelector": "spec.nodeSelector",
    "nodeName": "spec.nodeSelector",
    "tolerations": "spec.tolerations",
    "affinity": "spec.affinity",
    "terminationGracePeriodSeconds": "spec.shutdownTimeoutSeconds",
    "hostNetwork": "nothing: engine pods never share the node's network namespace",
    "hostPID": "nothing: engine pods never share the node's process namespace",
    "hostIPC": "nothing: engine pods never share the node's IPC namespace (the operator mounts /dev/shm)",
    "restartPolicy": "nothing: the operator owns restarts (spec.remediation)",
}

# ------------------------------------------------------------------------------ unsafe opt-ins ---
#: opt-in name -> what it admits. Listed in GDN_ALLOW_UNSAFE (chart value operator.allowUnsafe).
UNSAFE_OPT_INS = {
    "gpu-visibility-env": "GPU-visibility and NVIDIA container-toolkit variables in spec.env",
    "env-from": "whole-map spec.pod.envFrom (the operator cannot check its variable names)",
    "host-path": "hostPath volumes in spec.pod.volumes",
    "privileged": "spec.pod.containerSecurityContext.privileged: true",
    "capabilities": "spec.pod.containerSecurityContext.capabilities.add",
    "insecure-serialization": "VLLM_ALLOW_INSECURE_SERIALIZATION in spec.env",
    "local-media-path": "--allowed-local-media-path at / or outside a spec.pod.volumeMounts path",
}
OPT_IN_SETTING = "chart value operator.allowUnsafe (GDN_ALLOW_UNSAFE)"


def _opt_in(what: str) -> str:
    return f"refused unless the operator's {OPT_IN_SETTING} lists {what}"


class LocalObjectReference(_Model):
    name: str = Field(min_length=1, max_length=253, description="Object name in the server's namespace.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _k8s.check_name(v)


def _check_list(model_name: str, items: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    if not items:
        return items
    try:
        import kubernetes.client as kc  # the client's strict models (see api/k8s.py); gdnctl may lack it
    except ImportError:
        raise ValueError(_k8s.client_missing(f"spec.pod.{what}")) from None

    model = getattr(kc, model_name)
    problems: list[str] = []
    for i, item in enumerate(items):
        problems += _k8s.check_k8s(model, item, f"{what}[{i}]")
    if problems:
        raise ValueError("; ".join(problems[:5]))
    return items


class PodSettings(_Model):
    """Ordinary pod settings for every engine pod (Deployment, LeaderWorkerSet leader and workers)."""

    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the image from a private registry."
    )
    service_account_name: str | None = Field(
        default=None, max_length=253, description="Service account of the engine pods (e.g. cloud workload identity)."
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, description="RuntimeClass (e.g. `nvidia` where it is not the default runtime)."
    )
    priority_class_name: str | None = Field(default=None, max_length=253, description="PriorityClass of the engine pods.")
    scheduler_name: str | None = Field(default=None, max_length=253, description="Scheduler of the engine pods.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra pod labels (the operator's app.kubernetes.io/*, serving.gdn-operator.io/* are refused).",
    )
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64, description="Extra pod annotations.")
    workload_labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "Labels on the engine workload object itself (the Deployment or LeaderWorkerSet), where Kueue "
            "(kueue.x-k8s.io/queue-name), cost and inventory tools read them; same keys refused as for labels."
        ),
    )
    workload_annotations: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations on the engine workload object (Deployment or LeaderWorkerSet).",
    )
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="Extra volumes (Kubernetes Volume); names dshm, cache and model are the operator's.",
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=32,
        description="Mounts of spec.pod.volumes in the engine container (Kubernetes VolumeMount).",
    )
    env_from: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=8,
        description=(
            "Whole Secrets/ConfigMaps as environment (Kubernetes EnvFromSource). Refused unless the operator "
            "opts in: prefer spec.env with secretKeyRef/configMapKeyRef per key, whose names are checked."
        ),
    )
    security_context: dict[str, Any] | None = Field(
        default=None, description="Pod securityContext (Kubernetes PodSecurityContext)."
    )
    container_security_context: dict[str, Any] | None = Field(
        default=None,
        description="securityContext of the engine container (privileged and added capabilities need an opt-in).",
    )

    @model_validator(mode="before")
    @classmethod
    def _owned(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key in OWNED_POD_FIELDS:
                    raise ValueError(f"spec.pod.{key} is owned by the operator; set {OWNED_POD_FIELDS[key]} instead")
        return data

    @field_validator("service_account_name", "runtime_class_name", "priority_class_name", "scheduler_name")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        return v if v is None else _k8s.check_name(v)

    @field_validator("labels", "workload_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        _k8s.check_labels(v)
        for key in v:
            if key.startswith(OWNED_KEY_PREFIXES):
                raise ValueError(
                    f"label {key!r} is set by the operator (it selects engine pods on its labels); "
                    "use a key outside app.kubernetes.io/, serving.gdn-operator.io/ and leaderworkerset.sigs.k8s.io/"
                )
        return v

    @field_validator("annotations", "workload_annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _k8s.label_key(key):
                raise ValueError(f"key {key!r} is not a valid annotation key")
            if key.startswith(OWNED_KEY_PREFIXES[1:]) or key in OWNED_ANNOTATIONS:
                raise ValueError(f"annotation {key!r} is set by the operator or the LeaderWorkerSet controller; use another key")
            if len(value) > 64 * 1024:
                raise ValueError(f"annotation {key!r} is longer than 64 KiB")
        return v

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _check_list("V1Volume", v, "volumes")
        seen: set[str] = set()
        for i, vol in enumerate(v):
            name = vol.get("name", "")
            if not _k8s.dns1123_label(name):
                raise ValueError(f"volumes[{i}].name {name!r} is not a DNS-1123 label")
            if name in OPERATOR_VOLUMES:
                what = "spec.model.cache" if name == "cache" else "spec.resources.shmSize" if name == "dshm" else "spec.model.uri"
                raise ValueError(
                    f"volumes[{i}].name {name!r} is the operator's volume; choose another name (configure it through {what})"
                )
            if name in seen:
                raise ValueError(f"volumes[{i}].name {name!r} is used twice")
            seen.add(name)
            sources = [k for k in vol if k != "name"]
            if len(sources) != 1:
                raise ValueError(f"volumes[{i}] must have exactly one volume source (got {sources or 'none'})")
        return v

    @field_validator("volume_mounts")
    @classmethod
    def _mounts(cls, v: list[dict[str, Any]], info: Any) -> list[dict[str, Any]]:
        _check_list("V1VolumeMount", v, "volumeMounts")
        names = {vol.get("name") for vol in info.data.get("volumes") or []}
        paths: set[str] = set()
        for i, m in enumerate(v):
            if m.get("name") not in names:
                raise ValueError(
                    f"volumeMounts[{i}].name {m.get('name')!r} is not a volume of spec.pod.volumes; "
                    "add it there (the operator's own volumes cannot be mounted again)"
                )
            path = m.get("mountPath", "")
            if not path.startswith("/"):
                raise ValueError(f"volumeMounts[{i}].mountPath {path!r} must be an absolute path")
            norm = posixpath.normpath(path)
            for own in (SHM_MOUNT, CACHE_MOUNT, MODEL_MOUNT):
                if norm == own or norm.startswith(own + "/") or own.startswith(norm + "/") or norm == "/":
                    raise ValueError(
                        f"volumeMounts[{i}].mountPath {path!r} overlaps the operator's mount {own}; choose another path"
                    )
            if norm in paths:
                raise ValueError(f"volumeMounts[{i}].mountPath {path!r} is mounted twice")
            paths.add(norm)
        return v

    @field_validator("env_from")
    @classmethod
    def _env_from(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _check_list("V1EnvFromSource", v, "envFrom")

    @field_validator("security_context")
    @classmethod
    def _pod_security(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            _check_list("V1PodSecurityContext", [v], "securityContext")
        return v

    @field_validator("container_security_context")
    @classmethod
    def _container_security(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            _check_list("V1SecurityContext", [v], "containerSecurityContext")
        return v

    @property
    def mount_paths(self) -> list[str]:
        return [posixpath.normpath(m["mountPath"]) for m in self.volume_mounts]


# ------------------------------------------------------------------------------ unsafe settings ---

#: Variables the NVIDIA container toolkit (or the CUDA/ROCm runtimes) read to choose which GPUs and driver
#: features a container sees: on nodes whose toolkit honours them, NVIDIA_VISIBLE_DEVICES=all exposes every
#: GPU of the node, beyond what the device plugin allocated.
GPU_VISIBILITY_ENV = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_DISABLE_REQUIRE",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
        "NVIDIA_GDRCOPY",
        "NVIDIA_GDS",
        "NVIDIA_MOFED",
        "NVIDIA_NVSWITCH",
        "NVIDIA_FABRICMANAGER",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "GPU_DEVICE_ORDINAL",
    }
)
GPU_VISIBILITY_PREFIXES = ("NVIDIA_REQUIRE_",)
INSECURE_SERIALIZATION_ENV = "VLLM_ALLOW_INSECURE_SERIALIZATION"


def _local_media_problem(spec: GDNModelServerSpec) -> str | None:
    values = _vllm_args.option_values(spec.extra_args, spec.image.vllm_version)
    path = values.get("allowed_local_media_path")
    if not path:
        return None
    norm = posixpath.normpath(path) if path.startswith("/") else ""
    mounts = spec.pod.mount_paths
    if norm == "/":
        why = "/ lets requests read every file of the engine container"
    elif not any(norm == m or norm.startswith(m + "/") for m in mounts):
        why = (
            f"{path!r} is not inside a spec.pod.volumeMounts path ({', '.join(mounts) or 'none'}), so requests "
            "could read the container's own files"
        )
    else:
        return None
    return (
        f"spec.extraArgs --allowed-local-media-path: {why}; mount a media volume and point it there, or it is "
        f"{_opt_in('local-media-path')}"
    )


def unsafe_refusals(spec: GDNModelServerSpec, allowed: frozenset[str] | tuple[str, ...] = ()) -> list[str]:
    """Settings of `spec` that loosen the engine pod's isolation and are not opted in (one line each, naming
    the field and the opt-in). Empty when the spec is safe or every finding is opted in."""
    allowed = frozenset(allowed)
    out: list[str] = []
    for i, e in enumerate(spec.env):
        if "gpu-visibility-env" not in allowed and (e.name in GPU_VISIBILITY_ENV or e.name.startswith(GPU_VISIBILITY_PREFIXES)):
            out.append(
                f"spec.env[{i}] {e.name!r} chooses which GPUs and driver features the container sees (the NVIDIA "
                "container toolkit can expose every GPU of the node); the operator requests GPUs from the device "
                f"plugin; {_opt_in('gpu-visibility-env')}"
            )
        if e.name == INSECURE_SERIALIZATION_ENV and "insecure-serialization" not in allowed:
            out.append(
                f"spec.env[{i}] {e.name!r} lets the engine's internal channels unpickle data (code execution for "
                f"whoever reaches them); {_opt_in('insecure-serialization')}"
            )
    pod = spec.pod
    if pod.env_from and "env-from" not in allowed:
        out.append(
            "spec.pod.envFrom sets every key of a Secret/ConfigMap as a variable, so the operator cannot check the "
            "names (GPU visibility, LD_PRELOAD, owned variables); list keys in spec.env with secretKeyRef or "
            f"configMapKeyRef instead; {_opt_in('env-from')}"
        )
    for i, vol in enumerate(pod.volumes):
        if "hostPath" in vol and "host-path" not in allowed:
            out.append(
                f"spec.pod.volumes[{i}].hostPath gives the engine pod the node's files; use a PersistentVolumeClaim, "
                f"or it is {_opt_in('host-path')}"
            )
    sc = pod.container_security_context or {}
    if sc.get("privileged") and "privileged" not in allowed:
        out.append(
            "spec.pod.containerSecurityContext.privileged: a privileged engine container sees every device of "
            f"the node (every GPU); {_opt_in('privileged')}"
        )
    if ((sc.get("capabilities") or {}).get("add")) and "capabilities" not in allowed:
        out.append(
            "spec.pod.containerSecurityContext.capabilities.add: added Linux capabilities widen what the engine "
            f"may do to the node; {_opt_in('capabilities')}"
        )
    if "local-media-path" not in allowed:
        problem = _local_media_problem(spec)
        if problem:
            out.append(problem)
    return out
