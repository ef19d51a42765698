"""Test objects built by chaining, in the style of LeaderWorkerSet's ``test/wrappers``: a wrapper starts
from a sensible default, each setter changes one thing and returns the wrapper, and ``obj()`` hands out the
body. A test names only what it is about; the rest is the one default here, not a per-file copy of it.

    GMS().obj()                                    # the shortest valid manifest (model + image), ns/s
    GMS().version("0.32.0").update(tensorParallelSize=2).spec()          # just the spec
    GMS("srv").generation(3).uid("u").status({}).set("probes.enabled", False).obj()
    GMS("qwen", namespace=None).small().obj()      # for a real API server: no namespace, CPU-sized
    Guard("g").select({"app": "chat"}).policy("deny").features(probes=False).obj()   # a GDNGuard, ns/g
    Workload("chat", "StatefulSet").labelled({"app": "chat"}).tag("v0.17.1").obj()   # a workload it guards
    Workload("chat").uid("d-uid").labelled({"app": "chat"}).pod("chat-7d9f5b-x2x4q").obj()  # and its engine pod
    EnginePod("s-0").server("s").worker(0, group=0).ip("127.0.0.2").ready().obj()
    EnginePod().uid("u1").container(restartCount=3, lastState=EnginePod.terminated(1, "Error", "boom")).obj()

Spec setters of GMS and Guard: ``update(**fields)`` replaces top-level fields (``{**spec, **fields}``),
``merge(**fields)`` merges mappings into the ones already there, ``set("a.b.c", value)`` sets one nested field.
``obj()`` and ``spec()`` return deep copies, and a setter returns a new wrapper (the one it was called on is unchanged):
a module keeps a base (``V32 = GMS().version("0.32.0")``) and each test derives from it; no two share a dict.
Only what a setter put there is in the body (no status unless ``status()``, no labels unless set), so a
body reads like the manifest or the API server's object it stands for.

Stdlib only (plus the operator's constants), importable from every test directory as ``from builders
import GMS, EnginePod``: the root conftest puts ``tests/`` on ``sys.path``.

Size (~520 lines): one wrapper per kind of body the tests build (GMS, Guard, Workload, EnginePod) beside the
defaults they share (the image, the launch line); one module is the one place a test looks for a default.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Self

from gdn_operator import API_VERSION, GROUP, GUARD_KIND, KIND, PLURAL, VERSION
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


class _Object:
    """A custom resource body of the operator's (metadata, spec, status): the setters GMS and Guard share."""

    API_VERSION = API_VERSION
    KIND = KIND

    def __init__(self, name: str, namespace: str | None, spec: dict[str, Any]) -> None:
        self._meta: dict[str, Any] = {"name": name}
        if namespace is not None:
            self._meta["namespace"] = namespace
        self._spec: dict[str, Any] = copy.deepcopy(spec)
        self._status: dict[str, Any] | None = None

    # metadata
    def name(self, name: str) -> Self:
        return self.meta(name=name)

    def namespace(self, namespace: str | None) -> Self:
        new = copy.deepcopy(self)
        new._meta.pop("namespace", None)
        if namespace is not None:
            new._meta["namespace"] = namespace
        return new

    def uid(self, uid: str) -> Self:
        return self.meta(uid=uid)

    def generation(self, generation: int) -> Self:
        return self.meta(generation=generation)

    def annotations(self, annotations: dict[str, str]) -> Self:
        return self.meta(annotations=annotations)

    def labels(self, labels: dict[str, str]) -> Self:
        return self.meta(labels=labels)

    def meta(self, **fields: Any) -> Self:
        """Any other metadata field, by its Kubernetes name (``resourceVersion="10"``)."""
        new = copy.deepcopy(self)
        new._meta.update(copy.deepcopy(fields))
        return new

    # spec
    def update(self, **fields: Any) -> Self:
        """Replace top-level spec fields (the others stay)."""
        new = copy.deepcopy(self)
        new._spec.update(copy.deepcopy(fields))
        return new

    def merge(self, **fields: Any) -> Self:
        """Merge mappings into the spec's (``image={"tag": ...}`` keeps the repository); others replace."""
        new = copy.deepcopy(self)
        _merge(new._spec, fields)
        return new

    def set(self, path: str, value: Any) -> Self:
        """One spec field by its dotted path (``"speculativeDecoding.numSpeculativeTokens"``)."""
        new = copy.deepcopy(self)
        *parents, leaf = path.split(".")
        node = new._spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)
        return new

    def status(self, status: dict[str, Any]) -> Self:
        new = copy.deepcopy(self)
        new._status = copy.deepcopy(status)
        return new

    # out
    def spec(self) -> dict[str, Any]:
        return copy.deepcopy(self._spec)

    def obj(self) -> dict[str, Any]:
        body: dict[str, Any] = {"apiVersion": self.API_VERSION, "kind": self.KIND, "metadata": self._meta, "spec": self._spec}
        if self._status is not None:
            body["status"] = self._status
        return copy.deepcopy(body)


class GMS(_Object):
    """A GDNModelServer body: ``GMS(name, namespace)`` (``namespace=None`` leaves it out, as a manifest for
    ``kubectl apply -n`` or a namespaced create does)."""

    def __init__(self, name: str = "s", namespace: str | None = "ns") -> None:
        super().__init__(name, namespace, DEFAULT_SPEC)

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


class Guard(_Object):
    """A GDNGuard body: ``Guard(name, namespace)`` selects what is labelled ``app=<name>``; every other field is
    the API's default (all run-time features but the probes on, admission policy warn). ``namespace=None`` leaves
    the namespace out (a namespaced create)."""

    KIND = GUARD_KIND

    def __init__(self, name: str = "g", namespace: str | None = "ns") -> None:
        super().__init__(name, namespace, {"selector": {"matchLabels": {"app": name}}})

    def select(self, labels: dict[str, str]) -> Guard:
        """Select by these labels (``spec.selector.matchLabels``, replacing the default)."""
        return self.update(selector={"matchLabels": labels})

    def selector(self, selector: dict[str, Any]) -> Guard:
        """A whole ``spec.selector`` (``matchLabels`` and ``matchExpressions``)."""
        return self.update(selector=selector)

    def policy(self, policy: str) -> Guard:
        """``spec.admission.policy``: warn or deny."""
        return self.merge(admission={"policy": policy})

    def features(self, **features: bool) -> Guard:
        """Turn ``spec.features`` on or off by their field names (``crashWatch=False``); the others keep theirs."""
        return self.merge(features=features)


class EnginePod:
    """An engine Pod body as the operator's pod handlers and the crash watch read it: metadata (name, uid,
    labels, deletionTimestamp) and status (phase, podIP, conditions, containerStatuses)."""

    def __init__(self, name: str = "p") -> None:
        self._meta: dict[str, Any] = {"name": name}
        self._spec: dict[str, Any] | None = None
        self._status: dict[str, Any] = {}

    def uid(self, uid: str) -> EnginePod:
        return self.meta(uid=uid)

    def namespace(self, namespace: str) -> EnginePod:
        return self.meta(namespace=namespace)

    def meta(self, **fields: Any) -> EnginePod:
        """Any other metadata field, by its Kubernetes name (``ownerReferences=[...]``)."""
        new = copy.deepcopy(self)
        new._meta.update(copy.deepcopy(fields))
        return new

    def pod_spec(self, spec: dict[str, Any]) -> EnginePod:
        """The pod's ``spec`` (its containers: what the guard reads the launch line from)."""
        new = copy.deepcopy(self)
        new._spec = copy.deepcopy(spec)
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
        body: dict[str, Any] = {"metadata": self._meta, "status": self._status}
        if self._spec is not None:
            body["spec"] = self._spec
        return copy.deepcopy(body)

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


#: MTP speculative decoding as a vLLM launch line writes it
SPECULATIVE_CONFIG = '{"method":"mtp","num_speculative_tokens":2}'
#: the arguments of a plain vLLM workload's engine container (the upstream image's entrypoint is `vllm serve`):
#: a Qwen3.5 model with MTP; with an image before 0.18.0 this is vllm#36917's known-crash line
ENGINE_ARGS = ["Qwen/Qwen3.5-9B", "--speculative-config", SPECULATIVE_CONFIG]
#: the flags that turn off the known risks of ENGINE_ARGS at 0.33.0: with them no rule warns
CLEAN_ARGS = ["--no-enable-prefix-caching", "--no-async-scheduling", "--gdn-prefill-backend", "triton"]
#: apiVersion of each kind of workload a guard reads
WORKLOAD_API_VERSIONS = {
    "Deployment": "apps/v1",
    "StatefulSet": "apps/v1",
    "ReplicaSet": "apps/v1",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    "Pod": "v1",
}
#: the pod-template-hash of the ReplicaSet a Deployment makes (the suffix of its name and its pods' label)
TEMPLATE_HASH = "7d9f5b"


class Workload:
    """A workload that runs vLLM as a user or another tool writes it, the thing a GDNGuard guards: ``Workload(name,
    kind)`` for a Deployment (the default), StatefulSet, ReplicaSet, LeaderWorkerSet (its worker template) or a
    bare Pod. Its pod template holds one engine container, ``vllm``: the upstream image at ``v0.33.0`` with
    ENGINE_ARGS. Only what a setter put there is in the body (no labels, selector or replicas unless set; no
    namespace unless given, as a manifest for a namespaced create).

        Workload("my-vllm").labelled({"app": "my-vllm"}).tag("v0.17.1").obj()      # vllm#36917's launch line
        Workload("d").template_labels({"app": "g"}).owner("MyInferenceThing").obj()
        Workload("chat", "StatefulSet").uid("u").labelled({"app": "chat"}).pod("chat-0").obj()   # one of its pods
    """

    def __init__(self, name: str = "my-vllm", kind: str = "Deployment", namespace: str | None = None) -> None:
        self.kind = kind
        self._meta: dict[str, Any] = {"name": name}
        if namespace is not None:
            self._meta["namespace"] = namespace
        self._spec: dict[str, Any] = {}
        self._template_meta: dict[str, Any] = {}
        self._containers: list[dict[str, Any]] = [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "args": list(ENGINE_ARGS)}
        ]

    # metadata
    def name(self, name: str) -> Workload:
        return self.meta(name=name)

    def meta(self, **fields: Any) -> Workload:
        """Any metadata field, by its Kubernetes name (``annotations={...}``)."""
        new = copy.deepcopy(self)
        new._meta.update(copy.deepcopy(fields))
        return new

    def uid(self, uid: str) -> Workload:
        return self.meta(uid=uid)

    def labels(self, labels: dict[str, str]) -> Workload:
        """The object's own labels (``metadata.labels``)."""
        return self.meta(labels=labels)

    def owner(self, kind: str, name: str = "o", uid: str = "1", api_version: str = "x/v1") -> Workload:
        """Made by a controller: its controller ownerReference."""
        ref = {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}
        return self.meta(ownerReferences=[ref])

    # spec
    def template_labels(self, labels: dict[str, str]) -> Workload:
        """The pod template's labels (a Pod's are its own)."""
        if self.kind == "Pod":
            return self.labels(labels)
        new = copy.deepcopy(self)
        new._template_meta["labels"] = copy.deepcopy(labels)
        return new

    def template_annotations(self, annotations: dict[str, str]) -> Workload:
        new = copy.deepcopy(self)
        new._template_meta["annotations"] = copy.deepcopy(annotations)
        return new

    def selector(self, labels: dict[str, str]) -> Workload:
        """``spec.selector.matchLabels`` (a Deployment's, StatefulSet's or ReplicaSet's)."""
        new = copy.deepcopy(self)
        new._spec["selector"] = {"matchLabels": copy.deepcopy(labels)}
        return new

    def labelled(self, labels: dict[str, str]) -> Workload:
        """The labels where a user writes them for a guard to find: on the object and its pod template, and as its
        selector where the kind has one."""
        w = self.labels(labels).template_labels(labels)
        return w.selector(labels) if self.kind in ("Deployment", "StatefulSet", "ReplicaSet") else w

    def replicas(self, replicas: int) -> Workload:
        new = copy.deepcopy(self)
        new._spec["replicas"] = replicas
        return new

    # the engine container
    def tag(self, tag: str) -> Workload:
        """The upstream vLLM image at ``tag`` (its release is what the guard reads by default)."""
        return self.engine(image=f"vllm/vllm-openai:{tag}")

    def args(self, *extra: str) -> Workload:
        """Flags after ENGINE_ARGS (``args(*CLEAN_ARGS)``)."""
        return self.engine(args=[*ENGINE_ARGS, *extra])

    def argv(self, argv: list[str]) -> Workload:
        """A whole launch line (``vllm serve MODEL ...``): its first two words the command, the rest the args."""
        return self.engine(command=argv[:2], args=argv[2:])

    def engine(self, **fields: Any) -> Workload:
        """Set fields of the engine container, by their Kubernetes names (``name="engine"``,
        ``terminationMessagePolicy=...``); a field set to None is removed (``args=None``)."""
        new = copy.deepcopy(self)
        c = new._containers[-1]
        for k, v in fields.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = copy.deepcopy(v)
        return new

    def sidecar(self, name: str = "proxy", image: str = "envoy:v1.30.0", command: list[str] | None = None) -> Workload:
        """A container before the engine (as KServe and llm-d add one): the guard finds the engine past it."""
        new = copy.deepcopy(self)
        new._containers.insert(len(new._containers) - 1, {"name": name, "image": image, "command": command or [name]})
        return new

    # out
    def container(self) -> dict[str, Any]:
        """The engine container."""
        return copy.deepcopy(self._containers[-1])

    def pod_spec(self) -> dict[str, Any]:
        return {"containers": copy.deepcopy(self._containers)}

    def obj(self) -> dict[str, Any]:
        meta = copy.deepcopy(self._meta)
        body: dict[str, Any] = {"apiVersion": WORKLOAD_API_VERSIONS.get(self.kind, "v1"), "kind": self.kind, "metadata": meta}
        if self.kind == "Pod":
            body["spec"] = self.pod_spec()
            return body
        template = {"metadata": copy.deepcopy(self._template_meta), "spec": self.pod_spec()}
        if self.kind == "LeaderWorkerSet":
            body["spec"] = {**copy.deepcopy(self._spec), "leaderWorkerTemplate": {"workerTemplate": template}}
        else:
            body["spec"] = {**copy.deepcopy(self._spec), "template": template}
        return body

    @property
    def _name(self) -> str:
        return str(self._meta["name"])

    def _ref(self, kind: str, name: str, uid: str | None) -> dict[str, Any]:
        ref = {"apiVersion": WORKLOAD_API_VERSIONS[kind], "kind": kind, "name": name, "controller": True}
        return {**ref, "uid": uid} if uid else ref

    def replica_set(self) -> dict[str, Any]:
        """The ReplicaSet a Deployment's controller makes for its template (``<name>-<TEMPLATE_HASH>``), as the API
        server holds it: what a guard reads going up a pod's owner chain."""
        uid = self._meta.get("uid")
        meta = {
            "name": f"{self._name}-{TEMPLATE_HASH}",
            "labels": {**self._template_meta.get("labels", {}), "pod-template-hash": TEMPLATE_HASH},
            "ownerReferences": [self._ref("Deployment", self._name, uid)],
        }
        if uid:
            meta["uid"] = f"{uid}-rs"
        if "namespace" in self._meta:
            meta["namespace"] = self._meta["namespace"]
        return {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta}

    def pod(self, name: str | None = None) -> EnginePod:
        """One of the workload's pods as its controller makes it: the template's labels and containers, its
        controller's ownerReference (a Deployment's ReplicaSet, the StatefulSet, the LeaderWorkerSet's
        StatefulSet and its name label); a Pod workload is its own pod (``name`` left out)."""
        name = name or f"{self._name}-0"
        labels = copy.deepcopy(self._template_meta.get("labels", {}))
        uid = self._meta.get("uid")
        refs: list[dict[str, Any]] = []
        if self.kind == "Pod":
            name, labels, refs = self._name, copy.deepcopy(self._meta.get("labels", {})), self._meta.get("ownerReferences", [])
        elif self.kind == "Deployment":
            rs = self.replica_set()["metadata"]
            labels["pod-template-hash"] = TEMPLATE_HASH
            refs = [self._ref("ReplicaSet", rs["name"], rs.get("uid"))]
        elif self.kind == "LeaderWorkerSet":
            labels[LABEL_SET_NAME] = self._name
            refs = [self._ref("StatefulSet", self._name, f"{uid}-sts" if uid else None)]
        else:
            refs = [self._ref(self.kind, self._name, uid)]
        pod = EnginePod(name).labels(labels).pod_spec(self.pod_spec())
        if "namespace" in self._meta:
            pod = pod.namespace(self._meta["namespace"])
        return pod.meta(ownerReferences=refs) if refs else pod


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
