"""The real control plane (etcd + kube-apiserver) serves our CRD, its status subresource and RBAC.

Runs against ``control_plane`` (core tier, or the session's full cluster when one is up anyway).
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from gdn_operator import GROUP, KIND, PLURAL, VERSION
from gdn_operator.api.crd import crd_manifest
from waiting import poll, wait_for

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3.5-27b-mtp.yaml"


def _ns(api: client.ApiClient, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def _install_crd(api: client.ApiClient, manifest: dict, timeout: float = 30) -> None:
    ext = client.ApiextensionsV1Api(api)
    name = manifest["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(manifest)
    except ApiException as e:
        if e.status != 409:
            raise

    def established():
        crd = ext.read_custom_resource_definition(name)
        return {c.type: c.status for c in (crd.status.conditions or [])}.get("Established") == "True"

    wait_for(established, timeout, 0.2, what=f"CRD {name} Established")


@pytest.fixture(scope="module")
def crd(kube_api):
    manifest = crd_manifest()
    _install_crd(kube_api, manifest)
    return manifest


def test_server_reports_pinned_kubernetes_version(control_plane, kube_api):
    info = client.VersionApi(kube_api).get_code()
    # Stamped by build.sh (-X gitVersion); unstamped builds say v0.0.0-master and break helm's kubeVersion.
    assert info.git_version == control_plane.binaries.k8s_version
    assert (info.major, info.minor) == ("1", "35")


def test_custom_object_create_get_patch(kube_api, crd):
    ns = _ns(kube_api, "crd")
    co = client.CustomObjectsApi(kube_api)
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "qwen", "namespace": ns}
    co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    got = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "qwen")
    assert got["kind"] == KIND
    assert got["spec"]["speculativeDecoding"]["numSpeculativeTokens"] == 2
    assert got["metadata"]["generation"] == 1

    patched = co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "qwen", {"spec": {"replicas": 3}})
    assert patched["spec"]["replicas"] == 3
    assert patched["metadata"]["generation"] == 2

    # The CRD's structural schema is enforced by the real apiserver.
    bad = copy.deepcopy(body)
    bad["metadata"] = {"name": "bad", "namespace": ns}
    bad["spec"]["replicas"] = "three"
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, bad)
    assert err.value.status == 422
    assert "spec.replicas" in err.value.body


def test_status_subresource_is_separate_from_spec(kube_api, crd):
    ns = _ns(kube_api, "status")
    co = client.CustomObjectsApi(kube_api)
    body = yaml.safe_load(EXAMPLE.read_text())
    body["metadata"] = {"name": "qwen", "namespace": ns}
    co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    out = co.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        "qwen",
        {"status": {"phase": "Progressing", "observedGeneration": 1, "replicas": 1}, "spec": {"replicas": 7}},
    )
    assert out["status"]["phase"] == "Progressing"
    assert out["spec"]["replicas"] == body["spec"]["replicas"], "status endpoint must ignore spec"
    assert out["metadata"]["generation"] == 1, "a status write must not bump generation"

    # And the main endpoint ignores status.
    out = co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "qwen", {"status": {"phase": "Ready"}})
    assert out["status"]["phase"] == "Progressing"

    # Enum in the status schema is enforced too.
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "qwen", {"status": {"phase": "Exploded"}})
    assert err.value.status == 422


def _limited_sa(kube_api) -> tuple[str, str]:
    """A ServiceAccount allowed only to get/list pods in its own namespace."""
    ns = _ns(kube_api, "rbac")
    core = client.CoreV1Api(kube_api)
    rbac = client.RbacAuthorizationV1Api(kube_api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "limited"}})
    rbac.create_namespaced_role(
        ns,
        {"metadata": {"name": "pod-reader"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "limited", "namespace": ns}],
        },
    )
    return ns, "limited"


def _wait_allowed(fn, timeout: float = 10.0):
    # RBAC informers in the apiserver catch up with a fresh RoleBinding within a moment: 403 means "not yet".
    def forbidden(e: BaseException) -> bool:
        return isinstance(e, ApiException) and e.status == 403

    value, met = poll(fn, until=lambda _: True, timeout=timeout, interval=0.2, retry=forbidden)
    if not met:  # still forbidden at the deadline: the real error
        return fn()
    return value


def test_service_account_token_is_limited_by_rbac(control_plane, kube_api, crd):
    ns, sa = _limited_sa(kube_api)
    token = control_plane.create_token(ns, sa, expiration_seconds=600)
    assert token.count(".") == 2, "TokenRequest returns a JWT"

    with control_plane.api_client(token=token) as as_sa:
        pods = _wait_allowed(lambda: client.CoreV1Api(as_sa).list_namespaced_pod(ns))
        assert pods.items == []

        with pytest.raises(ApiException) as err:
            client.CoreV1Api(as_sa).list_namespaced_secret(ns)
        assert err.value.status == 403
        assert f"system:serviceaccount:{ns}:{sa}" in err.value.body

        with pytest.raises(ApiException) as err:
            client.CustomObjectsApi(as_sa).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        assert err.value.status == 403

        with pytest.raises(ApiException) as err:
            client.CoreV1Api(as_sa).list_namespaced_pod("default")
        assert err.value.status == 403

    # A kubeconfig carrying the token works the same way (how kopf would log in as the SA).
    kc = control_plane.write_token_kubeconfig(token, control_plane.workdir / f"{ns}.kubeconfig")
    from kubernetes import config as kconfig

    cfg = client.Configuration()
    kconfig.load_kube_config(config_file=str(kc), client_configuration=cfg)
    with client.ApiClient(cfg) as as_sa:
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(as_sa).list_namespaced_secret(ns)
        assert err.value.status == 403


def test_impersonation_of_limited_sa_is_denied(control_plane, kube_api):
    ns, sa = _limited_sa(kube_api)
    with control_plane.api_client() as admin_as_sa:
        admin_as_sa.set_default_header("Impersonate-User", f"system:serviceaccount:{ns}:{sa}")
        _wait_allowed(lambda: client.CoreV1Api(admin_as_sa).list_namespaced_pod(ns))
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(admin_as_sa).create_namespaced_config_map(ns, {"metadata": {"name": "nope"}})
        assert err.value.status == 403

    # SelfSubjectAccessReview as the SA agrees with what the requests above saw.
    token = control_plane.create_token(ns, sa, expiration_seconds=600)
    with control_plane.api_client(token=token) as as_sa:
        authz = client.AuthorizationV1Api(as_sa)

        def can(verb: str, resource: str) -> bool:
            r = authz.create_self_subject_access_review(
                {"spec": {"resourceAttributes": {"namespace": ns, "verb": verb, "resource": resource}}}
            )
            return r.status.allowed

        assert can("list", "pods") is True
        assert can("delete", "pods") is False
        assert can("get", "secrets") is False
