"""Pure builders for the parts of an engine pod a platform team configures (issue 29): spec.pod applied to a
pod template, the model cache volume and its download step, the engine PodDisruptionBudget, the owned cache
claim, and the in-cluster URL. render/engine.py and render/lws.py call them, so Deployment pods and
LeaderWorkerSet leaders and workers get the same settings.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gdn_operator.api.cache import SHARED_MODES
from gdn_operator.api.pod import CACHE_MOUNT
from gdn_operator.api.spec import GDNModelServerSpec

HF_HOME = f"{CACHE_MOUNT}/huggingface"
DOWNLOAD_CONTAINER = "model-download"
CACHE_CLAIM_SUFFIX = "-model-cache"

#: Where a completed download is marked in the cache, one file per (repository, revision, patterns): the
#: workers of a multi-node engine with a shared (ReadWriteMany) cache wait for it instead of downloading.
READY_DIR = f"{HF_HOME}/gdn-operator-ready"
WAIT_CONTAINER = "model-wait"

#: The download step: the `hf` CLI of the vLLM image (huggingface_hub, a vLLM dependency) fetches the files
#: of the repository that match the include patterns, at the pinned revision, into HF_HOME; then it marks
#: the download complete. Idempotent (files already in the cache are checked, not fetched again; with the
#: Hub unreachable a complete cache is used as is) and resumable (partial files are continued). A failure
#: exits non-zero with hf's own reason last in the log (terminationMessagePolicy FallbackToLogsOnError makes
#: it the termination message, which status reports as ModelDownloadFailed); the kubelet retries the init
#: container with its back-off. Arguments: the marker file, then hf download's.
DOWNLOAD_SCRIPT = """\
marker="$1"; shift
echo "gdn-operator: hf download $* into $HF_HOME from ${HF_ENDPOINT:-https://huggingface.co}"
if ! hf download "$@"; then
  echo "gdn-operator: download of $1 failed (see the lines above)" >&2
  exit 1
fi
mkdir -p "$(dirname "$marker")" && touch "$marker"
echo "gdn-operator: $1 is in the cache"
"""

#: A worker's wait for the leader's download into the shared cache (multi-node engine, ReadWriteMany claim).
WAIT_SCRIPT = """\
until [ -f "$1" ]; do echo "gdn-operator: waiting for the leader's download ($1)"; sleep 10; done
"""


def cache_claim_name(name: str) -> str:
    return f"{name}{CACHE_CLAIM_SUFFIX}"


def cache_volume(name: str, spec: GDNModelServerSpec) -> dict[str, Any]:
    cache = spec.model.cache
    claim = cache.persistent_volume_claim
    if claim is not None:
        return {"name": "cache", "persistentVolumeClaim": {"claimName": claim.claim_name or cache_claim_name(name)}}
    empty: dict[str, Any] = {}
    if cache.empty_dir is not None and cache.empty_dir.size_limit:
        empty["sizeLimit"] = cache.empty_dir.size_limit
    return {"name": "cache", "emptyDir": empty}


def downloads(spec: GDNModelServerSpec) -> bool:
    """Whether a download step fills the cache before the engine (then the engine runs offline)."""
    return spec.model.is_hub and spec.model.cache.download


def hub_env(spec: GDNModelServerSpec) -> list[dict[str, Any]]:
    """What the Hub client needs (download step and engine): the cache, the mirror, the token."""
    env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": HF_HOME}]
    if spec.model.hub_endpoint:
        env.append({"name": "HF_ENDPOINT", "value": spec.model.hub_endpoint})
    ref = spec.model.hf_token_secret
    if ref is not None:
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def hub_repo(spec: GDNModelServerSpec) -> str:
    return spec.model.uri.split("://", 1)[1]


def download_args(spec: GDNModelServerSpec) -> list[str]:
    """`hf download` arguments: the repository, the revision (when pinned), one --include per pattern."""
    args = [hub_repo(spec)]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    for pattern in spec.model.cache.include_patterns:
        args += ["--include", pattern]
    return args


def ready_marker(spec: GDNModelServerSpec) -> str:
    """The marker of a completed download: named by repository and revision, and by a digest of the include
    patterns (a download with other patterns is another download)."""
    digest = hashlib.sha256("\0".join(spec.model.cache.include_patterns).encode()).hexdigest()[:12]
    repo = hub_repo(spec).replace("/", "--")
    return f"{READY_DIR}/{repo}@{(spec.model.revision or 'default').replace('/', '--')}-{digest}"


def shared_download(spec: GDNModelServerSpec) -> bool:
    """A multi-node engine whose cache is one ReadWriteMany claim: the leader downloads, the workers wait."""
    claim = spec.model.cache.persistent_volume_claim
    return downloads(spec) and spec.nodes > 1 and claim is not None and claim.access_mode in SHARED_MODES


def _init_container(spec: GDNModelServerSpec, name: str, script: str, args: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": spec.image.reference,
        "imagePullPolicy": spec.image.pull_policy,
        "command": ["sh", "-c", script, name, *args],
        "env": hub_env(spec),
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": "cache", "mountPath": CACHE_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.pod.container_security_context:
        c["securityContext"] = dict(spec.pod.container_security_context)
    return c


def download_container(spec: GDNModelServerSpec) -> dict[str, Any]:
    return _init_container(spec, DOWNLOAD_CONTAINER, DOWNLOAD_SCRIPT, [ready_marker(spec), *download_args(spec)])


def wait_container(spec: GDNModelServerSpec) -> dict[str, Any]:
    c = _init_container(spec, WAIT_CONTAINER, WAIT_SCRIPT, [ready_marker(spec)])
    c["resources"] = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}
    return c


def apply_pod_settings(template: dict[str, Any], spec: GDNModelServerSpec) -> None:
    """spec.pod onto a rendered pod template (the engine container is the first): the operator's own labels,
    annotations, volumes and mounts stay as rendered (admission refuses user values that collide)."""
    pod = spec.pod
    meta, ps = template["metadata"], template["spec"]
    container = ps["containers"][0]
    if pod.labels:
        meta["labels"] = {**pod.labels, **meta["labels"]}
    if pod.annotations:
        meta["annotations"] = {**pod.annotations, **meta.get("annotations", {})}
    if pod.image_pull_secrets:
        ps["imagePullSecrets"] = [{"name": r.name} for r in pod.image_pull_secrets]
    for key, value in (
        ("serviceAccountName", pod.service_account_name),
        ("runtimeClassName", pod.runtime_class_name),
        ("priorityClassName", pod.priority_class_name),
        ("schedulerName", pod.scheduler_name),
    ):
        if value:
            ps[key] = value
    if pod.security_context:
        ps["securityContext"] = dict(pod.security_context)
    if pod.volumes:
        ps["volumes"] = [*ps["volumes"], *pod.volumes]
    if pod.volume_mounts:
        container["volumeMounts"] = [*container["volumeMounts"], *pod.volume_mounts]
    if pod.env_from:
        container["envFrom"] = list(pod.env_from)
    if pod.container_security_context:
        container["securityContext"] = dict(pod.container_security_context)


def apply_workload_meta(obj: dict[str, Any], spec: GDNModelServerSpec) -> dict[str, Any]:
    """spec.pod.workloadLabels / workloadAnnotations onto the workload object's own metadata (Deployment or
    LeaderWorkerSet); the operator's labels stay as rendered (admission refuses user keys that collide)."""
    pod, meta = spec.pod, obj["metadata"]
    if pod.workload_labels:
        meta["labels"] = {**pod.workload_labels, **meta["labels"]}
    if pod.workload_annotations:
        meta["annotations"] = {**pod.workload_annotations, **meta.get("annotations", {})}
    return obj


def disruption_budget_max_unavailable(spec: GDNModelServerSpec) -> int:
    """spec.disruptionBudget.maxUnavailable, or the default that never blocks a drain forever (api/rollout.py)."""
    value = spec.disruption_budget.effective_max_unavailable
    if value is None:
        raise ValueError("no engine PodDisruptionBudget with spec.disruptionBudget.enabled: false")
    return value


def url(name: str, namespace: str, port: int) -> str:
    """The in-cluster OpenAI endpoint of a server (its engine Service)."""
    return f"http://{name}.{namespace}.svc:{port}/v1"
