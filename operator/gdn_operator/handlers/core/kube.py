"""Thin synchronous Kubernetes helpers (run from async handlers via asyncio.to_thread).

Server-side apply with one field manager, reads of the objects the operator owns, Events. A GDNModelServer
itself is read and its status written only through handlers/core/servers.py (on handlers/core/statusguard.py).

Size (~480 lines): every other call the handlers make to the API server is here, so the other handler modules
stay thin and the tests stand in for the API server at this one module; the few modules beside it that own an API
surface of their own are named in pyproject.toml's contract "Only the cluster-access modules import the Kubernetes
client". The client's ApiException and parse_quantity are re-exported here for the modules that only catch or read.
"""

from __future__ import annotations

import base64
import datetime as dt
import email.utils
import functools
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException as ApiException  # re-exported: the handlers catch it from here
from kubernetes.utils import Backoff, on_error
from kubernetes.utils import parse_quantity as parse_quantity  # re-exported: the handlers read quantities from here

from gdn_operator import API_VERSION, KIND, __version__
from gdn_operator.redact import redact

log = logging.getLogger(__name__)

#: The client (kubernetes >= 35) imports each API and model class on first attribute access, under the
#: import lock: the first burst of reconciles had every worker thread waiting ~3 s on it (importlib
#: _ModuleLock.acquire under emit_event / get_object in bench/bench_reconcile.py --py-spy). Resolve the
#: classes the handlers use once, here, before kopf starts any.
WARM_CLASSES = tuple(
    getattr(kubernetes.client, n)
    for n in (
        "AppsV1Api",
        "CoreV1Api",
        "CustomObjectsApi",
        "AutoscalingV2Api",
        "ApiextensionsV1Api",
        "CoreV1Event",
        "V1DeleteOptions",
        "V1Secret",
    )
)

#: Pooled connections of the process's API client (`api_client`, built on first use): one per worker thread
#: (fewer: urllib3 opens and discards extra connections, a TLS handshake and a "pool is full" warning each).
#: startup.configure sizes it from GDN_MAX_WORKERS before kopf runs any handler. Module state on purpose:
#: the client is per process (see handlers/runtime.py), so is its pool.
_POOL = {"size": 32}


def size_connection_pool(workers: int) -> None:
    """One pooled connection per worker thread (at least 32); a client built with another size is rebuilt."""
    size = max(32, workers)
    if size != _POOL["size"]:
        _POOL["size"] = size
        api_client.cache_clear()


FIELD_MANAGER = "gdn-operator"
APPLY = "application/apply-patch+yaml"


@functools.lru_cache(maxsize=1)
def api_client() -> kubernetes.client.ApiClient:
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(client_configuration=cfg)
    # handlers run in kopf's thread pool: one pooled connection per worker thread (size_connection_pool)
    cfg.connection_pool_maxsize = _POOL["size"]
    client = kubernetes.client.ApiClient(cfg)
    # kube-apiserver names the field manager of a write without ?fieldManager= after the User-Agent (up to its
    # first "/"): the client's default made every such write "OpenAPI-Generator" in managedFields (issue 38)
    client.user_agent = f"{FIELD_MANAGER}/{__version__}"
    with_default_timeout(client.rest_client)
    return client


#: (connect, read) seconds for every request that does not set its own `_request_timeout`: a half-open
#: connection (API server frozen, a dropped NAT entry) fails the call instead of stalling a worker forever.
REQUEST_TIMEOUT = (10.0, 60.0)


def with_default_timeout(rest_client: Any, timeout: tuple[float, float] = REQUEST_TIMEOUT) -> None:
    """Give `rest_client.request` a default timeout (the generated client has none: it passes
    timeout=None to urllib3, which means wait forever, whatever the pool's default)."""
    request = rest_client.request

    def bounded(
        method: str,
        url: str,
        headers: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return request(
            method, url, headers=headers, body=body, post_params=post_params, _request_timeout=_request_timeout or timeout
        )

    rest_client.request = bounded


def _json(resp: Any) -> dict[str, Any]:
    """Body of a `_preload_content=False` response (skips the client's slow model deserialisation): the API
    server answers every call this module makes with a JSON object."""
    try:
        body: dict[str, Any] = json.loads(resp.data)
        return body
    finally:
        resp.release_conn()


def require_namespace(namespace: str | None) -> str:
    """The namespace kopf passes a handler of a namespaced resource (kopf types it Optional for
    cluster-scoped ones): never None for the pods, workloads and servers this operator watches."""
    if namespace is None:
        raise ValueError("kopf passed no namespace for an event of a namespaced resource")
    return namespace


#: JSON's scalars: plain() keeps them as they are
_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain(obj: Any) -> Any:
    """A deep plain-dict copy of a kopf Body/Patch view or of a JSON-like dict (safe to hand to a worker thread).
    Plain dicts, lists and scalars are told by their exact type first: that is what the operator copies most,
    about 3x faster than copy.deepcopy (copies were a large share of the operator's own CPU in a burst of new
    servers, bench/bench_reconcile.py)."""
    t = type(obj)
    if t is dict:
        return {k: v if type(v) in _SCALARS else plain(v) for k, v in obj.items()}
    if t is list:
        return [v if type(v) in _SCALARS else plain(v) for v in obj]
    if t in _SCALARS:
        return obj
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        return {k: plain(obj[k]) for k in obj.keys()}  # noqa: SIM118 - all it is known to have is keys() (the test above)
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    return obj


def plain_object(obj: Any) -> dict[str, Any]:
    """plain(obj) of a whole Kubernetes object without metadata.managedFields: no handler reads them (an apply's
    own response is read for them, changed_by_apply), and they are the largest part of most bodies (a
    Deployment's pod template once per field manager)."""
    out = {k: plain(obj[k]) for k in obj.keys() if k != "metadata"}  # noqa: SIM118 - a kopf Body has keys()
    meta = obj.get("metadata")
    if meta is not None:
        out["metadata"] = {k: plain(meta[k]) for k in meta.keys() if k != "managedFields"}  # noqa: SIM118
    return out


def owner_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference of the GDNModelServer that controls an object (its engine workload, InferencePool), from its
    metadata (a dict or kopf's Meta view: nothing is copied); None when no server controls it."""
    return next((r for r in meta.get("ownerReferences") or [] if r.get("kind") == KIND and r.get("controller")), None)


def owner_name(meta: Mapping[str, Any]) -> str | None:
    """The name of the GDNModelServer that controls an object (owner_ref)."""
    ref = owner_ref(meta)
    name: str | None = ref.get("name") if ref is not None else None
    return name


def now() -> str:
    return iso(None)


def iso(epoch: float | None) -> str:
    """RFC 3339 UTC, whole seconds (None: now)."""
    t = dt.datetime.now(dt.UTC) if epoch is None else dt.datetime.fromtimestamp(epoch, dt.UTC)
    return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")


def apply(obj: dict[str, Any]) -> dict[str, Any]:
    """Server-side apply of a Deployment, Service or PodMonitor (force: the operator owns these fields)."""
    return apply_changed(obj)[0]


def apply_changed(obj: dict[str, Any], *, same_rendering: bool = False) -> tuple[dict[str, Any], bool]:
    """Server-side apply; also whether it changed anything (`changed_by_apply`), from the response alone:
    no read of the object before. `same_rendering`: the operator applied exactly this object before (so only
    someone else's change makes this apply write)."""
    c = api_client()
    kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
    kw: dict[str, Any] = dict(field_manager=FIELD_MANAGER, force=True, _content_type=APPLY, _preload_content=False)
    # the raw HTTP response (_preload_content=False), not the model the client's annotations promise
    r: Any
    if kind == "Deployment":
        r = kubernetes.client.AppsV1Api(c).patch_namespaced_deployment(name, ns, obj, **kw)
    elif kind == "Service":
        r = kubernetes.client.CoreV1Api(c).patch_namespaced_service(name, ns, obj, **kw)
    elif kind == "PodMonitor":
        r = kubernetes.client.CustomObjectsApi(c).patch_namespaced_custom_object(
            "monitoring.coreos.com", "v1", ns, "podmonitors", name, obj, **kw
        )
    elif kind in CUSTOM_KINDS:
        group, version, plural = CUSTOM_KINDS[kind]
        r = kubernetes.client.CustomObjectsApi(c).patch_namespaced_custom_object(group, version, ns, plural, name, obj, **kw)
    elif kind == "HorizontalPodAutoscaler":
        r = kubernetes.client.AutoscalingV2Api(c).patch_namespaced_horizontal_pod_autoscaler(name, ns, obj, **kw)
    elif kind == "PodDisruptionBudget":
        r = kubernetes.client.PolicyV1Api(c).patch_namespaced_pod_disruption_budget(name, ns, obj, **kw)
    elif kind == "PersistentVolumeClaim":
        r = kubernetes.client.CoreV1Api(c).patch_namespaced_persistent_volume_claim(name, ns, obj, **kw)
    else:  # pragma: no cover - render only produces the kinds above
        raise ValueError(f"cannot apply kind {kind}")
    date = r.headers.get("Date") if hasattr(r, "headers") else None
    created = getattr(r, "status", None) == 201
    out = _json(r)
    return out, created or changed_by_apply(out, date, same_rendering=same_rendering)


def changed_by_apply(obj: dict[str, Any], date: str | None, *, same_rendering: bool = False) -> bool:
    """Whether the apply that answered `obj` (at `date`, the response's HTTP Date: the API server's clock)
    changed the object. The API server moves our field manager's managedFields `time` only when an apply
    adds, changes or removes one of its fields (a no-op apply writes nothing), so the apply changed the object
    iff that time is not older than the response. Both are whole seconds: a write at x.999 answered at x+1.001
    reads one second old, so a new rendering gets one second of slack; the same rendering (re-applied: after an
    operator restart, a retry) gets none, since with slack the previous apply, if it was less than two seconds
    ago, would read as a change. Unknown (no Date, no entry): True, which at worst repeats an "Applied" Event."""
    entry = next(
        (
            m
            for m in (obj.get("metadata") or {}).get("managedFields") or []
            if m.get("manager") == FIELD_MANAGER and m.get("operation") == "Apply"
        ),
        None,
    )
    if not date or entry is None or not entry.get("time"):
        return True
    try:
        at = email.utils.parsedate_to_datetime(date)
        written = dt.datetime.fromisoformat(str(entry["time"]).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return True
    return (at - written).total_seconds() <= (0.0 if same_rendering else 1.0)


#: Built-in kinds the operator may own beside the engine Service (get_object / delete_owned read them directly).
BUILTIN_KINDS = frozenset({"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PersistentVolumeClaim"})

#: Custom resources the scale-out renderers produce: kind → (group, version, plural).
CUSTOM_KINDS: dict[str, tuple[str, str, str]] = {
    "LeaderWorkerSet": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
    "InferencePool": ("inference.networking.k8s.io", "v1", "inferencepools"),
}


def get_object(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """Read a Deployment, HPA or one of CUSTOM_KINDS (None: absent, its API not served, or not readable
    with the operator's RBAC: the chart grants each scale-out kind only when enabled)."""
    c = api_client()
    r: Any  # the raw HTTP response (_preload_content=False)
    try:
        if kind == "Deployment":
            r = kubernetes.client.AppsV1Api(c).read_namespaced_deployment(name, namespace, _preload_content=False)
        elif kind == "HorizontalPodAutoscaler":
            r = kubernetes.client.AutoscalingV2Api(c).read_namespaced_horizontal_pod_autoscaler(
                name, namespace, _preload_content=False
            )
        elif kind == "PodDisruptionBudget":
            r = kubernetes.client.PolicyV1Api(c).read_namespaced_pod_disruption_budget(name, namespace, _preload_content=False)
        elif kind == "PersistentVolumeClaim":
            r = kubernetes.client.CoreV1Api(c).read_namespaced_persistent_volume_claim(name, namespace, _preload_content=False)
        else:
            group, version, plural = CUSTOM_KINDS[kind]
            r = kubernetes.client.CustomObjectsApi(c).get_namespaced_custom_object(
                group, version, namespace, plural, name, _preload_content=False
            )
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    return _json(r)


def delete_owned(kind: str, namespace: str, name: str, owner_uid: str | None, crds: CrdCache) -> bool:
    """Delete an object of `kind` named `name` if the GDNModelServer (owner_uid) controls it; True if deleted.
    Never touches an object someone else owns, nor fails when the kind's API is not installed."""
    obj = get_object(kind, namespace, name) if kind in BUILTIN_KINDS or crds.exists(_crd_name(kind)) else None
    if obj is None:
        return False
    ref = owner_ref(obj.get("metadata") or {})
    if ref is None or (owner_uid is not None and ref.get("uid") != owner_uid):
        return False
    c = api_client()
    body = kubernetes.client.V1DeleteOptions.model_validate({"propagationPolicy": "Background"})
    try:
        if kind == "Deployment":
            kubernetes.client.AppsV1Api(c).delete_namespaced_deployment(name, namespace, body=body)
        elif kind == "HorizontalPodAutoscaler":
            kubernetes.client.AutoscalingV2Api(c).delete_namespaced_horizontal_pod_autoscaler(name, namespace, body=body)
        elif kind == "PodDisruptionBudget":
            kubernetes.client.PolicyV1Api(c).delete_namespaced_pod_disruption_budget(name, namespace, body=body)
        elif kind == "PersistentVolumeClaim":
            kubernetes.client.CoreV1Api(c).delete_namespaced_persistent_volume_claim(name, namespace, body=body)
        else:
            group, version, plural = CUSTOM_KINDS[kind]
            kubernetes.client.CustomObjectsApi(c).delete_namespaced_custom_object(
                group, version, namespace, plural, name, body=body
            )
    except ApiException as e:
        if e.status != 404:
            raise
        return False
    return True


def _crd_name(kind: str) -> str:
    group, _, plural = CUSTOM_KINDS[kind]
    return f"{plural}.{group}"


def delete_pod_monitor(namespace: str, name: str) -> None:
    try:
        kubernetes.client.CustomObjectsApi(api_client()).delete_namespaced_custom_object(
            "monitoring.coreos.com", "v1", namespace, "podmonitors", name
        )
    except ApiException as e:
        if e.status != 404:
            raise


class CrdCache:
    """Which CRDs the cluster serves, remembered for `ttl` seconds (one per operator run, held by the runtime)."""

    def __init__(self, ttl: float = 60.0) -> None:
        self.ttl = ttl
        self._seen: dict[str, tuple[float, bool]] = {}

    def exists(self, name: str) -> bool:
        hit = self._seen.get(name)
        if hit and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        try:
            kubernetes.client.ApiextensionsV1Api(api_client()).read_custom_resource_definition(name)
            found = True
        except ApiException as e:
            if e.status not in (403, 404):
                raise
            found = False
        self._seen[name] = (time.monotonic(), found)
        return found


def get_deployment(namespace: str, name: str) -> dict[str, Any] | None:
    try:
        r = kubernetes.client.AppsV1Api(api_client()).read_namespaced_deployment(name, namespace, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return _json(r)


def read_secret_key(namespace: str, name: str, key: str) -> tuple[str | None, str]:
    """One key of a Secret, decoded, and "" — or None and why not (absent, no such key, or the operator may
    not read Secrets: chart value operator.readApiKeySecrets)."""
    try:
        secret = kubernetes.client.CoreV1Api(api_client()).read_namespaced_secret(name, namespace)
    except ApiException as e:
        if e.status == 403:
            return None, "the operator may not read Secrets here; set the chart value operator.readApiKeySecrets=true"
        if e.status == 404:
            return None, "no such Secret"
        raise
    raw = (secret.data or {}).get(key)
    if raw is None:
        return None, f"the Secret has no key {key!r}"
    return base64.b64decode(raw).decode("utf-8", "replace"), ""  # as the engine reads VLLM_API_KEY: not stripped


def delete_pod(namespace: str, name: str, uid: str | None) -> bool:
    """Delete one pod instance (uid precondition: never a replacement that took the same name, as LWS pods
    do). False when it is already gone or was replaced."""
    body = kubernetes.client.V1DeleteOptions.model_validate({"preconditions": {"uid": uid}} if uid else {})
    try:
        kubernetes.client.CoreV1Api(api_client()).delete_namespaced_pod(name, namespace, body=body, _preload_content=False)
    except ApiException as e:
        if e.status in (404, 409):
            return False
        raise
    return True


def read_pod(namespace: str, name: str) -> dict[str, Any]:
    """One pod (ApiException when it cannot be read: 404 when it is gone)."""
    r: Any = kubernetes.client.CoreV1Api(api_client()).read_namespaced_pod(name, namespace, _preload_content=False)
    return _json(r)


def pod_log_stream(namespace: str, pod: str, container: str, since_seconds: int | None = None) -> Any:
    """A followed read of one container's log (`since_seconds`: only what it wrote since): the raw urllib3 response,
    read with `.stream()` and closed with `.release_conn()` by the caller, who may shut it down from another thread.
    Its read timeout is 600 s (a quiet engine writes nothing for minutes)."""
    kw: dict[str, Any] = {} if since_seconds is None else {"since_seconds": since_seconds}
    return kubernetes.client.CoreV1Api(api_client()).read_namespaced_pod_log(
        pod, namespace, container=container, follow=True, _preload_content=False, _request_timeout=(10, 600), **kw
    )


T = TypeVar("T")

#: Conflict retries (a read-modify-write lost a race): client-go's retry.DefaultRetry shape (constant delay with
#: jitter), 50 ms apart; `steps` is set per call.
CONFLICT_BACKOFF = Backoff(steps=5, duration=0.05, factor=1.0, jitter=1.0)


class Retry(Exception):
    """Raised by an attempt passed to `retrying` to ask for another; `error` is raised when none is left."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def retrying(attempt: Callable[[int], T], attempts: int, backoff: Backoff = CONFLICT_BACKOFF) -> T:
    """The one bounded retry loop (the Kubernetes client's kubernetes.utils.retry.on_error, client-go's
    retry.OnError): call `attempt(n)` for n = 0, 1, ... until it returns; an attempt that raises `Retry(error)`
    is called again after the backoff, and `error` itself is raised once `attempts` attempts have asked for
    another. Any other exception ends it at once."""
    numbers = itertools.count()
    steps = Backoff(attempts, backoff.duration, backoff.factor, backoff.jitter, backoff.cap)
    try:
        return on_error(steps, lambda e: isinstance(e, Retry), lambda: attempt(next(numbers)))
    except Retry as r:
        raise r.error from None


def emit_event(obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
    """A core/v1 Event on the GDNModelServer, or on the object `obj` names with its own apiVersion and kind (a
    workload a GDNGuard guards: the Event is a new object of ours, the workload is not written). Never raises:
    events are best effort."""
    meta = obj["metadata"]
    ts = dt.datetime.now(dt.UTC)
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion") or API_VERSION,
            "kind": obj.get("kind") or KIND,
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": redact(message)[:1024],
        "type": type_,
        "source": {"component": "gdn-operator"},
        "firstTimestamp": ts.isoformat(),
        "lastTimestamp": ts.isoformat(),
        "count": 1,
        "reportingComponent": "gdn-operator",
        "reportingInstance": "gdn-operator",
    }
    try:
        event = kubernetes.client.CoreV1Event.model_validate(body)  # what the client's validate_call does with a dict
        _json(
            kubernetes.client.CoreV1Api(api_client()).create_namespaced_event(
                meta["namespace"], event, field_manager=FIELD_MANAGER, _preload_content=False
            )
        )
    except Exception as e:  # noqa: BLE001 - events must never break reconciliation
        log.warning("could not emit event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], e)
