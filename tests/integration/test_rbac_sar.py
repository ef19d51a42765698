"""The chart's RBAC, effective on the real API server (issue 11 part 6).

The chart's RBAC objects (real `helm template`) are applied to the test control plane, once with the
default values (all namespaces) and once with `operator.watchNamespaces`; SubjectAccessReviews for the
operator's ServiceAccount (user system:serviceaccount:<ns>:<sa> with its groups) then assert what it may
and may not do. Finally the operator's webhook publishing (handlers/webhookconfigs.point_webhooks) runs
with the ServiceAccount's own token against the chart's shipped webhook configurations: get + patch on
those two names is all it needs, and any other name is refused.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import kopf
import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from operator_harness import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "charts"))
from _chart_helpers import ToolError, docs, render_text, tools  # noqa: E402

from gdn_operator.handlers.webhook import certs  # noqa: E402

from gdn_operator.handlers.guard import admission as guardadmission

from gdn_operator.handlers import main

from gdn_operator.handlers.webhook import configs as webhookconfigs

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
WEBHOOK_KINDS = (webhookconfigs.VALIDATING, webhookconfigs.MUTATING)
ADM = "admissionregistration.k8s.io"
VWC, MWC = "validatingwebhookconfigurations", "mutatingwebhookconfigurations"


class Install:
    """The chart's RBAC (and optionally its webhook configurations) applied as one release."""

    def __init__(
        self, cp, api: kubernetes.client.ApiClient, *, watched: list[str], webhooks: bool, extra: dict[str, Any] | None = None
    ):
        s = uuid.uuid4().hex[:6]
        self.cp, self.api = cp, api
        self.release, self.namespace = f"rbac{s}", f"rbac-rel-{s}"
        self.watched = [f"{w}-{s}" for w in watched]
        self.config_name = f"rbac-{s}.serving.gdn-operator.io"
        sets: dict[str, Any] = {"webhook.configName": self.config_name, **(extra or {})}
        if self.watched:
            sets["operator.watchNamespaces"] = self.watched
        self.objs = docs(render_text(sets=sets, namespace=self.namespace, release=self.release))
        kinds = RBAC_KINDS + (WEBHOOK_KINDS if webhooks else ())
        self.applied = [o for o in self.objs if o["kind"] in kinds]
        dep = next(o for o in self.objs if o["kind"] == "Deployment")
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        self.env = {e["name"]: e.get("value") for e in c["env"]}
        self.sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
        self.user = f"system:serviceaccount:{self.namespace}:{self.sa}"
        self.groups = ["system:serviceaccounts", f"system:serviceaccounts:{self.namespace}", "system:authenticated"]

    def kubectl(self, *args: str, input: str) -> None:
        res = subprocess.run(
            [tools()["kubectl"], "--kubeconfig", str(self.cp.kubeconfig), *args], input=input, capture_output=True, text=True
        )
        assert res.returncode == 0, f"kubectl {' '.join(args)}:\n{res.stdout}\n{res.stderr}"

    def __enter__(self) -> Install:
        core = kubernetes.client.CoreV1Api(self.api)
        for ns in [self.namespace, *self.watched]:
            core.create_namespace({"metadata": {"name": ns}})
        self.kubectl("apply", "--server-side", "--field-manager", "helm", "-f", "-", input=yaml.safe_dump_all(self.applied))
        return self

    def __exit__(self, *exc: Any) -> None:
        cluster_scoped = [o for o in self.applied if "namespace" not in o["metadata"]]
        self.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(cluster_scoped))
        core = kubernetes.client.CoreV1Api(self.api)
        for ns in [self.namespace, *self.watched]:
            try:
                core.delete_namespace(ns)
            except ApiException:
                pass

    def can(
        self, verb: str, resource: str, group: str = "", ns: str | None = None, name: str | None = None, sub: str | None = None
    ) -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group, "namespace": ns, "name": name, "subresource": sub}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": self.user,
                "groups": self.groups,
                "resourceAttributes": {k: v for k, v in attrs.items() if v is not None},
            },
        }
        return bool(kubernetes.client.AuthorizationV1Api(self.api).create_subject_access_review(review).status.allowed)

    def check(self, allowed: list[tuple], denied: list[tuple]) -> None:
        """Wait until every allowed request is allowed (bindings reach the authorizer's cache), then
        require every denied one to be denied."""
        for a in allowed:
            wait_for(lambda a=a: self.can(*a), 30, what=f"{self.user} allowed to {a}")
        wrongly = [d for d in denied if self.can(*d)]
        assert not wrongly, f"{self.user} may: {wrongly}"


@pytest.fixture(scope="module")
def helm_tools():
    try:
        return tools()
    except ToolError as e:
        pytest.fail(str(e), pytrace=False)


#: the drain marks DisruptionBlocked reads (operator.watchNodes, default on; issue 38)
NODE_READS = [("get", "nodes"), ("list", "nodes"), ("watch", "nodes")]


def common_denials(i: Install, ns: str) -> list[tuple]:
    secret = i.env["GDN_WEBHOOK_SECRET"]
    return [
        # webhook configurations: nothing but get/patch of the chart's two by name
        ("create", VWC, ADM),
        ("create", MWC, ADM),
        ("list", VWC, ADM),
        ("watch", VWC, ADM),
        ("get", VWC, ADM, None, "some-other-webhook"),
        ("patch", VWC, ADM, None, "some-other-webhook"),
        ("patch", MWC, ADM, None, "some-other-webhook"),
        ("update", VWC, ADM, None, i.config_name),
        ("delete", VWC, ADM, None, i.config_name),
        ("delete", MWC, ADM, None, i.config_name),
        # Secrets: only its own webhook Secret, in its own namespace
        ("get", "secrets", "", ns),
        ("list", "secrets", "", i.namespace),
        ("get", "secrets", "", i.namespace, "someone-elses"),
        ("update", "secrets", "", i.namespace, "someone-elses"),
        ("get", "secrets", "", "kube-system", secret),
        # no deletes but a stalled engine pod's (issue 24: the stall ladder's restart, allowed below), no pods of
        # its own, no spec writes beyond patch
        ("delete", "deployments", "apps", ns),
        ("create", "pods", "", ns),
        ("deletecollection", "pods", "", ns),
        ("update", "gdnmodelservers", "serving.gdn-operator.io", ns),
        ("delete", "gdnmodelservers", "serving.gdn-operator.io", ns),
        ("create", "pods", "", ns, None, "exec"),
        # nodes: read only (operator.watchNodes: drain marks, issue 38); never evicts; nothing on RBAC itself
        ("patch", "nodes"),
        ("update", "nodes"),
        ("delete", "nodes"),
        ("create", "pods", "", ns, None, "eviction"),
        ("create", "clusterroles", "rbac.authorization.k8s.io"),
        ("bind", "clusterroles", "rbac.authorization.k8s.io"),
        ("escalate", "clusterroles", "rbac.authorization.k8s.io"),
        ("create", "rolebindings", "rbac.authorization.k8s.io", ns),
        ("create", "namespaces"),
        ("delete", "namespaces", "", None, ns),
    ]


def test_namespaced_install_grants_only_the_watched_namespaces(kube_api, control_plane, helm_tools):
    with Install(control_plane, kube_api, watched=["rbac-a", "rbac-b"], webhooks=False) as i:
        a, b = i.watched
        secret = i.env["GDN_WEBHOOK_SECRET"]
        peering = i.env["GDN_PEERING"]
        allowed = [
            *NODE_READS,
            *[(v, "deployments", "apps", ns) for ns in (a, b) for v in ("get", "list", "watch", "create", "patch")],
            ("create", "services", "", a),
            ("patch", "services", "", b),
            ("get", "pods", "", a),
            ("list", "pods", "", b),
            ("get", "pods", "", a, None, "log"),
            ("delete", "pods", "", a),  # the stall ladder restarts a stalled engine pod (issue 24)
            ("create", "events", "", b),
            ("patch", "gdnmodelservers", "serving.gdn-operator.io", a),
            ("patch", "gdnmodelservers", "serving.gdn-operator.io", a, None, "status"),
            ("list", "kopfpeerings", "kopf.dev", a),
            ("patch", "kopfpeerings", "kopf.dev", b, peering),
            ("get", VWC, ADM, None, i.config_name),
            ("patch", VWC, ADM, None, i.config_name),
            ("get", MWC, ADM, None, i.config_name),
            ("patch", MWC, ADM, None, i.config_name),
            ("list", "customresourcedefinitions", "apiextensions.k8s.io"),
            ("list", "namespaces"),
            ("watch", "namespaces"),
            ("get", "secrets", "", i.namespace, secret),
            ("update", "secrets", "", i.namespace, secret),
            ("create", "secrets", "", i.namespace),
        ]
        denied = [
            # outside the watched namespaces: kube-system (coredns), default, its own release namespace
            ("patch", "deployments", "apps", "kube-system", "coredns"),
            ("create", "deployments", "apps", "kube-system"),
            ("patch", "services", "", "kube-system", "kube-dns"),
            ("create", "deployments", "apps", "default"),
            ("get", "pods", "", "kube-system", None, "log"),
            ("get", "pods", "", "default", None, "log"),
            ("get", "pods", "", i.namespace, None, "log"),
            ("create", "events", "", "kube-system"),
            ("delete", "pods", "", "kube-system"),
            ("delete", "pods", "", i.namespace),
            ("patch", "gdnmodelservers", "serving.gdn-operator.io", "default"),
            # status is written as a guarded JSON patch only: no whole-object replace
            ("update", "gdnmodelservers", "serving.gdn-operator.io", a, None, "status"),
            # nothing across all namespaces at once
            ("list", "deployments", "apps"),
            ("list", "pods"),
            ("get", "pods", "", None, None, "log"),
            ("patch", "kopfpeerings", "kopf.dev", a, "someone-elses-peering"),
            ("list", "clusterkopfpeerings", "kopf.dev"),
            ("create", "secrets", "", a),
            *common_denials(i, a),
        ]
        i.check(allowed, denied)


def test_cluster_wide_install_keeps_webhooks_and_secrets_narrow(kube_api, control_plane, helm_tools):
    """Default values: engines in every namespace (what all-namespaces means, and why the chart README
    recommends watchNamespaces), but still no webhook configuration or Secret beyond its own."""
    with Install(control_plane, kube_api, watched=[], webhooks=False) as i:
        ns = f"anywhere-{uuid.uuid4().hex[:4]}"  # need not exist for a review
        allowed = [
            *NODE_READS,
            ("patch", "deployments", "apps", ns),
            ("list", "deployments", "apps"),
            ("get", "pods", "", ns, None, "log"),
            ("patch", "clusterkopfpeerings", "kopf.dev", None, i.env["GDN_PEERING"]),
            ("delete", "pods", "", ns),  # the stall ladder restarts a stalled engine pod (issue 24)
            ("get", VWC, ADM, None, i.config_name),
            ("patch", MWC, ADM, None, i.config_name),
            ("get", "secrets", "", i.namespace, i.env["GDN_WEBHOOK_SECRET"]),
        ]
        denied = [
            ("list", "namespaces"),
            ("patch", "clusterkopfpeerings", "kopf.dev", None, "someone-elses-peering"),
            *common_denials(i, ns),
        ]
        i.check(allowed, denied)


def test_operator_points_the_shipped_webhooks_with_only_its_rbac(kube_api, control_plane, helm_tools, tmp_path):
    """point_webhooks as the ServiceAccount (its own token): the chart's two configurations get the CA
    and keep every other field; a configuration of another name is out of reach."""
    # operator.mutateSpec: the chart ships the MutatingWebhookConfiguration too (without it, only the validating one)
    with Install(control_plane, kube_api, watched=["rbac-w"], webhooks=True, extra={"operator.mutateSpec": True}) as i:
        token = control_plane.create_token(i.namespace, i.sa)
        sa_api = control_plane.api_client(token=token)
        adm = kubernetes.client.AdmissionregistrationV1Api(kube_api)
        read = {
            webhookconfigs.VALIDATING: adm.read_validating_webhook_configuration,
            webhookconfigs.MUTATING: adm.read_mutating_webhook_configuration,
        }
        shipped = {o["kind"]: o for o in i.applied if o["kind"] in WEBHOOK_KINDS and o["metadata"]["name"] == i.config_name}
        ca = certs.new_bundle(["x"]).ca_pem
        bundle = base64.b64encode(ca).decode()
        served = webhookconfigs.service_client_config(i.env["GDN_WEBHOOK_SERVICE"], i.namespace, 443, None, bundle)
        desired = webhookconfigs.desired_webhooks(
            webhookconfigs.registered_handlers(_registry()), i.config_name, served, i.watched
        )
        wait_for(lambda: i.can("patch", MWC, ADM, None, i.config_name), 30, what="the SA's webhook RBAC")
        try:
            drift = webhookconfigs.point_webhooks(sa_api, i.config_name, desired)
            assert drift == []
            for kind in WEBHOOK_KINDS:
                live = kube_api.sanitize_for_serialization(read[kind](i.config_name))
                assert [h["clientConfig"].get("caBundle") for h in live["webhooks"]] == [bundle]
                for have, chart in zip(live["webhooks"], shipped[kind]["webhooks"], strict=True):
                    for f in ("name", "rules", "failurePolicy", "sideEffects", "namespaceSelector", "matchPolicy"):
                        assert have[f] == chart[f], f"{kind} {f} changed by the operator"
                    assert have["clientConfig"]["service"] == chart["clientConfig"]["service"]
            # a second pass finds nothing to do (no write on every replica restart)
            rv = {k: read[k](i.config_name).metadata.resource_version for k in WEBHOOK_KINDS}
            webhookconfigs.point_webhooks(sa_api, i.config_name, desired)
            assert {k: read[k](i.config_name).metadata.resource_version for k in WEBHOOK_KINDS} == rv

            # GDNGuard admission (issue 35): the SA sets the webhooks of the shipped guard configuration, as
            # handlers/guard/admission.write_configuration does (through guard/client.set_webhooks: a JSON patch), with its own token
            guards_cfg = f"guards.{i.config_name}"
            hook = guardadmission.guard_webhooks(
                [{"metadata": {"name": "g", "namespace": i.watched[0]}, "spec": {"selector": {"matchLabels": {"app": "x"}}}}],
                i.config_name,
                served,
            )
            sa_adm = kubernetes.client.AdmissionregistrationV1Api(sa_api)
            sa_adm.patch_validating_webhook_configuration(guards_cfg, [{"op": "add", "path": "/webhooks", "value": hook}])
            live_guards = adm.read_validating_webhook_configuration(guards_cfg).webhooks
            assert [h.match_conditions[0].expression for h in live_guards] == [hook[0]["matchConditions"][0]["expression"]]

            # another configuration (admin-made, same content): the SA can neither read nor patch it
            other = {**shipped[webhookconfigs.VALIDATING], "metadata": {"name": f"other-{i.config_name}"}}
            other["webhooks"] = [
                {**h, "name": h["name"].replace(i.config_name, other["metadata"]["name"])} for h in other["webhooks"]
            ]
            adm.create_validating_webhook_configuration(other)
            try:
                theirs = {
                    webhookconfigs.VALIDATING: webhookconfigs.desired_webhooks(
                        webhookconfigs.registered_handlers(_registry()), other["metadata"]["name"], served, i.watched
                    )[webhookconfigs.VALIDATING]
                }
                with pytest.raises(webhookconfigs.ConfigurationProblem, match="not allowed to read"):
                    webhookconfigs.point_webhooks(sa_api, other["metadata"]["name"], theirs)
                assert (
                    not adm.read_validating_webhook_configuration(other["metadata"]["name"]).webhooks[0].client_config.ca_bundle
                )
            finally:
                adm.delete_validating_webhook_configuration(other["metadata"]["name"])
        finally:
            sa_api.close()


def _registry() -> kopf.OperatorRegistry:
    """A kopf registry with the operator's admission handlers, registered as the operator does with
    GDN_MUTATE_SPEC (both webhooks)."""
    reg = kopf.OperatorRegistry()
    main.register_admission(reg, mutate_spec=True)
    return reg


def test_watch_nodes_off_grants_nothing_on_nodes(kube_api, control_plane, helm_tools):
    with Install(control_plane, kube_api, watched=["rbac-n"], webhooks=False, extra={"operator.watchNodes": False}) as i:
        assert i.env["GDN_WATCH_NODES"] == "false"
        (ns,) = i.watched
        i.check([("patch", "deployments", "apps", ns)], [*NODE_READS, *common_denials(i, ns)])


def test_guards_read_what_they_select_and_write_nothing_of_it(kube_api, control_plane, helm_tools):
    """GDNGuard (issue 35): in the watched namespaces the operator reads the guards and the workloads they
    select (StatefulSets, ReplicaSets, LeaderWorkerSets besides the pods, logs and Deployments it reads for its
    own servers), writes only a guard's status and the webhooks of its own guard configuration, and never
    creates, changes or deletes a StatefulSet, ReplicaSet, LeaderWorkerSet or a GDNGuard (the user's spec)."""
    with Install(control_plane, kube_api, watched=["guard-a"], webhooks=False) as i:
        (a,) = i.watched
        guards, lws = "serving.gdn-operator.io", "leaderworkerset.x-k8s.io"
        allowed = [
            *[(v, "gdnguards", guards, a) for v in ("get", "list", "watch")],
            ("patch", "gdnguards", guards, a, None, "status"),
            *[(v, r, "apps", a) for r in ("statefulsets", "replicasets", "deployments") for v in ("get", "list", "watch")],
            *[(v, "leaderworkersets", lws, a) for v in ("get", "list", "watch")],
            ("get", "pods", "", a, None, "log"),
            ("get", VWC, ADM, None, f"guards.{i.config_name}"),
            ("patch", VWC, ADM, None, f"guards.{i.config_name}"),
        ]
        denied = [
            *[(v, "gdnguards", guards, a) for v in ("create", "update", "patch", "delete")],
            ("update", "gdnguards", guards, a, None, "status"),
            *[(v, r, "apps", a) for r in ("statefulsets", "replicasets") for v in ("create", "update", "patch", "delete")],
            *[(v, "leaderworkersets", lws, a) for v in ("create", "update", "patch", "delete")],
            *[("get", r, "apps", "kube-system") for r in ("statefulsets", "replicasets")],
            ("list", "gdnguards", guards, "default"),
            ("list", "gdnguards", guards),  # not across all namespaces
            ("delete", VWC, ADM, None, f"guards.{i.config_name}"),
            ("patch", VWC, ADM, None, f"guards.{i.config_name}x"),
            *common_denials(i, a),
        ]
        i.check(allowed, denied)
    with Install(control_plane, kube_api, watched=["guard-off"], webhooks=False, extra={"guard.enabled": False}) as i:
        (a,) = i.watched
        i.check(
            [("list", "deployments", "apps", a)],
            [
                ("list", "gdnguards", "serving.gdn-operator.io", a),
                ("list", "statefulsets", "apps", a),
                ("get", VWC, ADM, None, f"guards.{i.config_name}"),
            ],
        )
        assert i.env["GDN_GUARDS"] == "false" and i.env["GDN_GUARD_DELETE_PODS"] == "false"
