"""Pure functions: GDNModelServer spec → vLLM argv and Kubernetes objects, on render/meta.py's labels and
object metadata (the engine container, its pod template, Deployment, Service and PodMonitor); the
multi-node and scale-out builders use these, and render/objects.py's `render_all` puts a server together.

Nothing here talks to the API server; the reconciler applies what these functions return with
server-side apply, and `gdnctl render` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gdn_operator.api import flags
from gdn_operator.api.cache import RetainPolicy
from gdn_operator.api.enums import CudagraphImplementation
from gdn_operator.api.pod import CACHE_MOUNT, MODEL_MOUNT, SHM_MOUNT
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render import podparts, shutdown
from gdn_operator.render.meta import api_selector, check_names, common_labels, object_meta, owner_reference, selector_labels

ENGINE_PORT = 8000
#: The engine Service's `metrics` port (to the engine's own http port, where vLLM serves /metrics). Was 9400, the
#: port NVIDIA's DCGM exporter listens on on every GPU node: a scrape config or NetworkPolicy written for one
#: matched the other (issue 38). Scrape by the port name `metrics`, never by number.
METRICS_SERVICE_PORT = 8001
CONTAINER = "vllm"

GPU_RESOURCE = "nvidia.com/gpu"
#: --gpu-memory-utilization for an unset spec.gpuMemoryUtilization on releases before vLLM sizes the KV cache
#: itself (render/data/vllm_features.yaml kv_cache_sizing): the value always rendered there
GPU_MEMORY_BEFORE_KV_SIZING = 0.9
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def model_argument(spec: GDNModelServerSpec) -> str:
    uri = spec.model.uri
    scheme, rest = uri.split("://", 1)
    if scheme == "hf":
        return rest
    if scheme == "pvc":
        sub = spec.model.pvc_subpath
        return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT
    if scheme == "file":
        return "/" + rest.lstrip("/")
    return uri  # s3:// gs:// oci:// are passed through to vLLM's loaders


def speculative_config(spec: GDNModelServerSpec) -> dict[str, Any] | None:
    """The spec values --speculative-config carries (spec keys; api/flags.py maps them to vLLM's JSON keys)."""
    sd = spec.speculative_decoding
    if not sd.enabled:
        return None
    # vLLM rewrites the deprecated aliases (qwen3_next_mtp, qwen3_5_mtp) to "mtp" with a warning in every
    # release 0.17.0–0.33.0 (vllm/config/speculative.py), so render the canonical name.
    return {"speculativeDecoding.method": "mtp", "speculativeDecoding.numSpeculativeTokens": sd.num_speculative_tokens}


def gpu_memory_utilization(spec: GDNModelServerSpec) -> float | None:
    """The --gpu-memory-utilization to render: the spec's value when set; unset, nothing from the release where
    vLLM sizes the KV cache from measured memory (0.34.0), else the value always rendered before."""
    if spec.gpu_memory_utilization is not None:
        return spec.gpu_memory_utilization
    return None if shutdown.supports(spec, "kv_cache_sizing") else GPU_MEMORY_BEFORE_KV_SIZING


def vllm_args(name: str, spec: GDNModelServerSpec) -> list[str]:
    """The arguments after `vllm serve` (the model is the first positional argument); every flag and how its
    value is spelled comes from api/flags.py, the table the launch-line reader reads back with."""
    args = [
        model_argument(spec),
        *flags.SERVED_NAME.args(spec.model.served_name or name),
        *flags.REVISION.args(spec.model.revision),
        flags.HOST,
        "0.0.0.0",
        flags.PORT,
        str(ENGINE_PORT),
        *flags.TENSOR_PARALLEL.args(spec.tensor_parallel_size),
        *flags.GPU_MEMORY.args(gpu_memory_utilization(spec)),
    ]
    if spec.pipeline_parallel_size > 1:
        args += flags.PIPELINE_PARALLEL.args(spec.pipeline_parallel_size)
    args += shutdown.shutdown_args(spec)
    sc = speculative_config(spec)
    if sc is not None:
        args += flags.json_args(flags.SPECULATIVE_CONFIG, sc)
    args += flags.MAX_MODEL_LEN.args(spec.max_model_len)
    args += flags.MAX_NUM_SEQS.args(spec.max_num_seqs)
    args += flags.MAX_BATCHED_TOKENS.args(spec.max_num_batched_tokens)
    args += flags.ASYNC_SCHEDULING.args(spec.async_scheduling)
    args += flags.PREFIX_CACHING.args(spec.prefix_caching)
    args += flags.CHUNKED_PREFILL.args(spec.chunked_prefill)
    args += flags.ATTENTION_BACKEND.args(spec.attention_backend)
    args += flags.GDN_PREFILL_BACKEND.args(spec.gdn_prefill_backend)
    if spec.cudagraph_mode is not None:
        args += flags.json_args(flags.COMPILATION_CONFIG, {"cudagraphMode": str(spec.cudagraph_mode)})
    args += flags.ENFORCE_EAGER.args(spec.enforce_eager)  # only the on form exists (no --no-enforce-eager)
    args += list(spec.extra_args)
    return args


def engine_env(spec: GDNModelServerSpec) -> list[dict[str, Any]]:
    if podparts.downloads(spec):
        # the download step filled the cache: the engine loads from it and never reaches the Hub
        env: list[dict[str, Any]] = [{"name": "HF_HOME", "value": podparts.HF_HOME}, {"name": "HF_HUB_OFFLINE", "value": "1"}]
    else:
        env = podparts.hub_env(spec)
    if spec.model_runner == "v2":
        env.append({"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "1"})
    elif spec.model_runner == "v1":
        env.append({"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"})
    if spec.cudagraph_implementation is not None:  # vLLM reads it as == "1" (envs.py); admission bounds the release
        breakable = spec.cudagraph_implementation == CudagraphImplementation.BREAKABLE
        env.append({"name": "VLLM_USE_BREAKABLE_CUDAGRAPH", "value": "1" if breakable else "0"})
    if spec.api_key_secret is not None:  # vLLM reads VLLM_API_KEY when --api-key is absent (refused in extraArgs)
        ref = spec.api_key_secret
        env.append({"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    for e in spec.env:
        if e.secret_key_ref is not None:
            env.append(
                {"name": e.name, "valueFrom": {"secretKeyRef": {"name": e.secret_key_ref.name, "key": e.secret_key_ref.key}}}
            )
        elif e.config_map_key_ref is not None:
            env.append(
                {
                    "name": e.name,
                    "valueFrom": {"configMapKeyRef": {"name": e.config_map_key_ref.name, "key": e.config_map_key_ref.key}},
                }
            )
        else:
            env.append({"name": e.name, "value": e.value or ""})
    return env


def pod_template(name: str, spec: GDNModelServerSpec, args: list[str] | None = None) -> dict[str, Any]:
    """The engine pod template (Deployment, or a LeaderWorkerSet's leader/worker template via render/lws.py)."""
    labels = common_labels(name, spec)
    gpus = spec.gpus_per_pod
    period = 10
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size}},
        podparts.cache_volume(name, spec),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": SHM_MOUNT},
        {"name": "cache", "mountPath": CACHE_MOUNT},
    ]
    claim = spec.model.pvc_claim
    if claim:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})

    node_selector = dict(spec.node_selector)
    if spec.resources.gpu_type:
        node_selector.setdefault(GPU_PRODUCT_LABEL, spec.resources.gpu_type)

    tolerations = list(spec.tolerations)
    if not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 5}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.image.reference,
        "imagePullPolicy": spec.image.pull_policy,
        "command": ["vllm", "serve"],
        "args": vllm_args(name, spec) if args is None else args,
        "env": engine_env(spec),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": spec.resources.cpu, "memory": spec.resources.memory, GPU_RESOURCE: str(gpus)},
            "limits": {"cpu": spec.resources.cpu, "memory": spec.resources.memory, GPU_RESOURCE: str(gpus)},
        },
        "volumeMounts": mounts,
        # Loading a large model can take many minutes: the startup probe owns that budget, and
        # liveness/readiness only start once it has succeeded, so liveness cannot kill a loading engine.
        "startupProbe": {**probe, "periodSeconds": period, "failureThreshold": math.ceil(spec.startup_budget_seconds / period)},
        "readinessProbe": {**probe, "periodSeconds": period, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 30, "failureThreshold": 4},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "tolerations": tolerations,
        "terminationGracePeriodSeconds": 60,
        "enableServiceLinks": False,
    }
    shutdown.apply_graceful_shutdown(pod_spec, container, spec)
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if spec.affinity:
        pod_spec["affinity"] = spec.affinity
    if podparts.downloads(spec):
        pod_spec["initContainers"] = [podparts.download_container(spec)]
    template = {
        "metadata": {"labels": labels, "annotations": {"kubectl.kubernetes.io/default-container": CONTAINER}},
        "spec": pod_spec,
    }
    podparts.apply_pod_settings(template, spec)
    return template


def deployment(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    check_names(name)
    out: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(name)},
            # GPUs are scarce: Surge (default) brings a new engine up before the old one goes (zero downtime
            # when a spare GPU set exists; the rollout waits otherwise); InPlace takes an old one down first.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": spec.rollout.max_surge, "maxUnavailable": spec.rollout.max_unavailable},
            },
            "progressDeadlineSeconds": spec.startup_budget_seconds + 600,
            "revisionHistoryLimit": 3,
            "template": pod_template(name, spec),
        },
    }
    if spec.autoscaling is not None:
        del out["spec"]["replicas"]  # owned by the autoscaler through the scale subresource
    return out


def service(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    check_names(name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "type": "ClusterIP",
            "selector": api_selector(name, spec),
            "ports": [
                {"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_SERVICE_PORT, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }


def pod_disruption_budget(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    """The engine PodDisruptionBudget over every engine pod (LeaderWorkerSet workers included)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "selector": {"matchLabels": selector_labels(name)},
            "maxUnavailable": podparts.disruption_budget_max_unavailable(spec),
            # a crash-looping (never Ready) engine must not block a drain: evict pods that are not Ready
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def cache_claim(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any] | None:
    """The model cache claim the operator creates (spec.model.cache.persistentVolumeClaim.size): owned by the
    server only with retainPolicy Delete; with Retain (the default) it outlives the server, and a server
    re-created with the same name applies (adopts) it again."""
    claim = spec.model.cache.persistent_volume_claim
    if claim is None or claim.size is None:
        return None
    pvc_spec: dict[str, Any] = {"accessModes": [claim.access_mode], "resources": {"requests": {"storage": claim.size}}}
    if claim.storage_class_name:
        pvc_spec["storageClassName"] = claim.storage_class_name
    meta = object_meta(podparts.cache_claim_name(name), namespace, None, spec)
    if uid and claim.retain_policy == RetainPolicy.DELETE:  # Retain: no owner, the garbage collector keeps it
        meta["ownerReferences"] = [owner_reference(name, uid)]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": pvc_spec}


#: the label that names the GDNModelServer in every series: the operator's own (telemetry.py) and,
#: through the PodMonitor relabeling below, the engines' vLLM series
SERVER_METRIC_LABEL = "server"


def pod_monitor(
    name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The engines' PodMonitor. ``labels`` (GDN_POD_MONITOR_LABELS) are added to its metadata so that a
    Prometheus selecting PodMonitors by label (kube-prometheus-stack: ``release: <name>``) picks it up;
    the operator's own labels win on a clash. No ``honorLabels``: vLLM's series carry no namespace/pod
    labels of their own, and a scraped workload must not overwrite the target's labels. The server's
    name is added as ``server``, the label the operator's gdn_* series use, so one dashboard variable
    selects both."""
    meta = object_meta(name, namespace, uid, spec)
    meta["labels"] = {**dict(labels or {}), **meta["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": api_selector(name, spec)},
            "podMetricsEndpoints": [
                {
                    "port": "http",
                    "path": "/metrics",
                    "interval": f"{spec.metrics.scrape_interval_seconds}s",
                    "relabelings": [{"action": "replace", "targetLabel": SERVER_METRIC_LABEL, "replacement": name}],
                }
            ],
        },
    }
