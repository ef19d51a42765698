"""Test objects built by chaining, in the style of LeaderWorkerSet's ``test/wrappers``: a wrapper starts
from a sensible default, each setter changes one thing and returns the wrapper, and ``obj()`` hands out the
body. A test names only what it is about; the rest is the one default here, not a per-file copy of it.

    GMS().obj()                                    # the shortest valid manifest (model + image), ns/s
    GMS().version("0.32.0").update(tensorParallelSize=2).spec()          # just the spec
    GMS("srv").generation(3).uid("u").status({}).set("probes.enabled", False).obj()
    GMS("qwen", namespace=None).small().obj()      # for a real API server: no namespace, CPU-sized
    EnginePod("s-0").server("s").worker(0, group=0).ip("127.0.0.2").ready().obj()
    EnginePod().uid("u1").container(restartCount=3, lastState=EnginePod.terminated(1, "Error", "boom")).obj()

Spec setters: ``update(**fields)`` replaces top-level fields (``{**spec, **fields}``), ``merge(**fields)``
merges mappings into the ones already there, ``set("a.b.c", value)`` sets one nested field. ``obj()`` and
``spec()`` return deep copies, and a setter returns a new wrapper (the one it was called on is unchanged):
a module keeps a base (``V32 = GMS().version("0.32.0")``) and each test derives from it; no two share a dict.
Only what a setter put there is in the body (no status unless ``status()``, no labels unless set), so a
body reads like the manifest or the API server's object it stands for.

Stdlib only (plus the operator's constants), importable from every test directory as ``from builders
import GMS, EnginePod``: the root conftest puts ``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from gdn_operator import API_VERSION, GROUP, KIND, PLURAL, VERSION
from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SERVER, LABEL_SET_NAME, LABEL_WORKER_INDEX, MANAGED

#: the shortest manifest README.md shows working: a model and an image with its vLLM version
MODEL = "hf://Qwen/Qwen3.5-27B"
DEFAULT_SPEC: dict[str, Any] = {"model": {"uri": MODEL}, "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}
#: README.md's example server: the model's architecture and its image (stock vLLM: no gdn-guard patch applies to
#: 0.33.0, hack/release/images.py; tests/images/test_image_tags.py holds README.md to that scheme)
ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
GDN_IMAGE = {"repository": "vllm/vllm-openai", "tag": "v0.33.0", "vllmVersion": "0.33.0"}
#: what fits a CPU-only test cluster (kwok nodes, the vLLM CPU engine)
SMALL_RESOURCES = {"cpu": "1", "memory": "1Gi", "shmSize": "1Gi"}
#: spec.pod with every day-one setting a platform team sets (issue 29 item 1), as README.md shows them
POD_SETTINGS: dict[str, Any] = {
    "imagePullSecrets": [{"name": "regcred"}],
    "serviceAccountName": "vllm-reader",
    "runtimeClassName": "nvidia",
    "priorityClassName": "inference-high",
    "schedulerName": "kai-scheduler",
    "labels": {"kueue.x-k8s.io/queue-name": "gpu"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "volumes": [{"name": "media", "persistentVolumeClaim": {"claimName": "media"}}],
    "volumeMounts": [{"name": "media", "mountPath": "/media", "readOnly": True}],
    "securityContext": {"runAsNonRoot": True, "fsGroup": 1000},
    "containerSecurityContext": {"allowPrivilegeEscalation": False},
}


def _merge(into: dict[str, Any], fields: dict[str, Any]) -> None:
    for k, v in fields.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


class GMS:
    """A GDNModelServer body: ``GMS(name, namespace)`` (``namespace=None`` leaves it out, as a manifest for
    ``kubectl apply -n`` or a namespaced create does)."""

    def __init__(self, name: str = "s", namespace: str | None = "ns") -> None:
        self._meta: dict[str, Any] = {"name": name}
        if namespace is not None:
            self._meta["namespace"] = namespace
        self._spec: dict[str, Any] = copy.deepcopy(DEFAULT_SPEC)
        self._status: dict[str, Any] | None = None

    # metadata
    def name(self, name: str) -> GMS:
        return self.meta(name=name)

    def namespace(self, namespace: str | None) -> GMS:
        new = copy.deepcopy(self)
        new._meta.pop("namespace", None)
        if namespace is not None:
            new._meta["namespace"] = namespace
        return new

    def uid(self, uid: str) -> GMS:
        return self.meta(uid=uid)

    def generation(self, generation: int) -> GMS:
        return self.meta(generation=generation)

    def annotations(self, annotations: dict[str, str]) -> GMS:
        return self.meta(annotations=annotations)

    def labels(self, labels: dict[str, str]) -> GMS:
        return self.meta(labels=labels)

    def meta(self, **fields: Any) -> GMS:
        """Any other metadata field, by its Kubernetes name (``resourceVersion="10"``)."""
        new = copy.deepcopy(self)
        new._meta.update(copy.deepcopy(fields))
        return new

    # spec
    def version(self, vllm: str) -> GMS:
        """vLLM ``vllm`` in the upstream image: tag ``v<vllm>``."""
        return self.merge(image={"tag": f"v{vllm}", "vllmVersion": vllm})

    def flagship(self) -> GMS:
        """README.md's example: the model with its architecture, on the project's image (vLLM 0.33.0)."""
        return self.update(model={"uri": MODEL, "architecture": ARCHITECTURE}, image=GDN_IMAGE)

    def small(self) -> GMS:
        """The flagship sized for the CPU test cluster: 1 GPU, 2 MTP tokens, prefix caching off (no rule
        rejects it at 0.33.0), 1 CPU / 1Gi."""
        return self.flagship().update(
            tensorParallelSize=1,
            speculativeDecoding={"numSpeculativeTokens": 2},
            prefixCaching=False,
            resources=SMALL_RESOURCES,
        )

    def update(self, **fields: Any) -> GMS:
        """Replace top-level spec fields (the others stay)."""
        new = copy.deepcopy(self)
        new._spec.update(copy.deepcopy(fields))
        return new

    def merge(self, **fields: Any) -> GMS:
        """Merge mappings into the spec's (``image={"tag": ...}`` keeps the repository); others replace."""
        new = copy.deepcopy(self)
        _merge(new._spec, fields)
        return new

    def set(self, path: str, value: Any) -> GMS:
        """One spec field by its dotted path (``"speculativeDecoding.numSpeculativeTokens"``)."""
        new = copy.deepcopy(self)
        *parents, leaf = path.split(".")
        node = new._spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)
        return new

    def status(self, status: dict[str, Any]) -> GMS:
        new = copy.deepcopy(self)
        new._status = copy.deepcopy(status)
        return new

    # out
    def spec(self) -> dict[str, Any]:
        return copy.deepcopy(self._spec)

    def obj(self) -> dict[str, Any]:
        body: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": self._meta, "spec": self._spec}
        if self._status is not None:
            body["status"] = self._status
        return copy.deepcopy(body)


class EnginePod:
    """An engine Pod body as the operator's pod handlers and the crash watch read it: metadata (name, uid,
    labels, deletionTimestamp) and status (phase, podIP, conditions, containerStatuses)."""

    def __init__(self, name: str = "p") -> None:
        self._meta: dict[str, Any] = {"name": name}
        self._status: dict[str, Any] = {}

    def uid(self, uid: str) -> EnginePod:
        new = copy.deepcopy(self)
        new._meta["uid"] = uid
        return new

    def labels(self, labels: dict[str, str]) -> EnginePod:
        """Add labels (an empty mapping gives the pod an empty ``labels``)."""
        new = copy.deepcopy(self)
        new._meta.setdefault("labels", {}).update(labels)
        return new

    def server(self, server: str) -> EnginePod:
        """The labels the operator selects its engine pods by."""
        return self.labels({**MANAGED, LABEL_SERVER: server})

    def worker(self, index: int | None = None, group: int | None = None, set_name: str | None = None) -> EnginePod:
        """A pod of a LeaderWorkerSet group: the labels the LWS controller sets (worker 0 leads)."""
        labels = {LABEL_WORKER_INDEX: str(index)} if index is not None else {}
        if group is not None:
            labels[LABEL_GROUP_INDEX] = str(group)
        if set_name is not None:
            labels[LABEL_SET_NAME] = set_name
        return self.labels(labels)

    def deleting(self, when: str = "2026-01-01T00:00:00Z") -> EnginePod:
        new = copy.deepcopy(self)
        new._meta["deletionTimestamp"] = when
        return new

    def ip(self, ip: str) -> EnginePod:
        return self._with_status(podIP=ip)

    def phase(self, phase: str) -> EnginePod:
        return self._with_status(phase=phase)

    def ready(self, ready: bool = True) -> EnginePod:
        return self.condition("Ready", "True" if ready else "False")

    def condition(self, type_: str, status: str, **fields: Any) -> EnginePod:
        """Set one pod condition (``condition("PodScheduled", "False", reason="Unschedulable")``)."""
        conds = [c for c in self._status.get("conditions", []) if c["type"] != type_]
        return self._with_status(conditions=[*conds, {"type": type_, "status": status, **fields}])

    def container(self, name: str = "vllm", **fields: Any) -> EnginePod:
        """Add a containerStatuses entry, in Kubernetes' field names (``restartCount``, ``state``, ``lastState``)."""
        return self._with_status(containerStatuses=[*self._status.get("containerStatuses", []), {"name": name, **fields}])

    def init_container(self, name: str = "model-download", **fields: Any) -> EnginePod:
        """Add an initContainerStatuses entry (``state``, ``lastState``, ``restartCount``)."""
        statuses = self._status.get("initContainerStatuses", [])
        return self._with_status(initContainerStatuses=[*statuses, {"name": name, **fields}])

    @staticmethod
    def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
        """A container ``state`` of a container that has not started: ``{"waiting": {...}}``."""
        return {"waiting": {"reason": reason, **({"message": message} if message is not None else {})}}

    @staticmethod
    def terminated(exit_code: int, reason: str | None = None, message: str | None = None, **fields: Any) -> dict[str, Any]:
        """A container ``state`` / ``lastState`` of a container that ended: ``{"terminated": {...}}``."""
        t: dict[str, Any] = {"exitCode": exit_code}
        if reason is not None:
            t["reason"] = reason
        if message is not None:
            t["message"] = message
        return {"terminated": {**t, **fields}}

    def _with_status(self, **fields: Any) -> EnginePod:
        new = copy.deepcopy(self)
        new._status.update(copy.deepcopy(fields))
        return new

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy({"metadata": self._meta, "status": self._status})

    def client(self) -> SimpleNamespace:
        """The pod as the Kubernetes client's ``V1Pod`` reads (attributes in snake_case, ``None`` where unset),
        for code that lists pods through ``CoreV1Api``."""
        m, s = self.obj()["metadata"], self._status
        return SimpleNamespace(
            metadata=SimpleNamespace(
                name=m["name"], uid=m.get("uid"), labels=m.get("labels"), deletion_timestamp=m.get("deletionTimestamp")
            ),
            status=SimpleNamespace(pod_ip=s.get("podIP"), phase=s.get("phase")),
        )


def server_review(spec: dict[str, Any], uid: str = "u-1", *, namespace: str = "ns", username: str = "alice") -> dict[str, Any]:
    """An AdmissionReview of a GDNModelServer CREATE as the API server sends it to the validating webhook (the fields
    the webhook front and kopf's server read), the object ``namespace/s`` with ``spec``."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
            "operation": "CREATE",
            "userInfo": {"username": username},
            "object": {"metadata": {"name": "s", "namespace": namespace}, "spec": copy.deepcopy(spec)},
        },
    }
