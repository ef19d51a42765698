"""`helm template` output for every value set, parsed and checked: least-privilege RBAC that follows the
watch scope, the hardened operator pod, wiring between env, Services and ports, HA, the CRD."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from _chart_helpers import (
    CHART,
    GENERATED_CRD,
    GENERATED_GUARD_CRD,
    NAMESPACE,
    VALUE_SETS,
    by_kind,
    container,
    docs,
    env_of,
    one,
    render_set,
    render_text,
)

# Every (apiGroup, resource) -> verbs the operator may get, and who needs it. The chart may grant a
# SUBSET (features off); it must never grant anything outside this table. Derived from the code:
#   handlers/core/kube.py (SSA apply = patch + create-on-absent, get_deployment, get_server,
#   update_status, emit_event, crd_exists, delete_pod_monitor), handlers/webhook/certs.py (Secret get/create/
#   replace), handlers/server/workload.py (kopf index/event on pods and deployments), handlers/server/reconcile.py,
#   handlers/engines/crashwatch.py (pod daemon -> kopf finalizer on pods, pods/log), handlers/engines/acceptance.py,
#   handlers/webhook/configs.py (get + patch of the chart's webhook configurations), and kopf 1.45
#   itself (resource/namespace observers, peering keep-alives, event posting).
ALLOWED: dict[tuple[str, str], set[str]] = {
    ("serving.gdn-operator.io", "gdnmodelservers"): {"get", "list", "watch", "patch"},
    ("serving.gdn-operator.io", "gdnmodelservers/status"): {"patch"},
    ("serving.gdn-operator.io", "gdnmodelservers/finalizers"): {"update"},  # blockOwnerDeletion
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
    ("", "services"): {"create", "patch"},
    # kopf index + event handlers; get: crash-watch log re-follow; delete: the stall watch's restart (handlers/engines/stall.py)
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("", "pods/log"): {"get"},
    ("", "events"): {"create"},
    ("monitoring.coreos.com", "podmonitors"): {"create", "patch", "delete"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    # the chart ships both configurations; the operator reads them and patches its caBundle in
    # (handlers/webhook/configs.py): never create, list, watch, update or delete
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"get", "patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "patch"},
    ("", "namespaces"): {"list", "watch"},
    ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch"},
    ("kopf.dev", "kopfpeerings"): {"list", "watch", "patch"},
    ("", "secrets"): {"get", "create", "update"},
    # the engine PodDisruptionBudget and the owned model-cache claim (issue 29): apply, prune
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get", "create", "patch", "delete"},
    # drain marks for DisruptionBlocked (issue 38, handlers/server/disruption.py): read only, operator.watchNodes
    ("", "nodes"): {"get", "list", "watch"},
    # GDNGuard (issue 35, guard.enabled): the guards, and read only what they select (never a write)
    ("serving.gdn-operator.io", "gdnguards"): {"get", "list", "watch"},
    ("serving.gdn-operator.io", "gdnguards/status"): {"patch"},
    ("apps", "statefulsets"): {"get", "list", "watch"},
    ("apps", "replicasets"): {"get", "list", "watch"},
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): {"get", "list", "watch"},
    # guard.policyReports (issue 48): the operator's PolicyReport per namespace (handlers/guard/status.py)
    ("wgpolicyk8s.io", "policyreports"): {"get", "create", "patch"},
}
NAMESPACED_RESOURCES = {
    ("wgpolicyk8s.io", "policyreports"),
    ("serving.gdn-operator.io", "gdnguards"),
    ("serving.gdn-operator.io", "gdnguards/status"),
    ("apps", "statefulsets"),
    ("apps", "replicasets"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    ("serving.gdn-operator.io", "gdnmodelservers"),
    ("serving.gdn-operator.io", "gdnmodelservers/status"),
    ("serving.gdn-operator.io", "gdnmodelservers/finalizers"),
    ("apps", "deployments"),
    ("", "services"),
    ("", "pods"),
    ("", "pods/log"),
    ("", "events"),
    ("monitoring.coreos.com", "podmonitors"),
    ("policy", "poddisruptionbudgets"),
    ("", "persistentvolumeclaims"),
}
#: Verbs that must be limited to one object by resourceNames (the API allows it for them).
NAME_RESTRICTED = {
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations"): {"get", "patch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"get", "patch"},
    ("kopf.dev", "clusterkopfpeerings"): {"patch"},
    ("kopf.dev", "kopfpeerings"): {"patch"},
    ("", "secrets"): {"get", "update"},
}

SETS = sorted(VALUE_SETS)


def grants(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                out.setdefault((g, r), set()).update(rule.get("verbs", []))
    return out


def all_grants(objs: list[dict]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for role in by_kind(objs, "ClusterRole") + by_kind(objs, "Role"):
        for k, v in grants(role).items():
            out.setdefault(k, set()).update(v)
    return out


@pytest.mark.parametrize("name", SETS)
def test_rbac_has_no_wildcards_and_only_allowed_rules(chart_tools, name):
    objs = render_set(name)
    roles = by_kind(objs, "ClusterRole") + by_kind(objs, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in (rule.get(field) or []), f"{role['metadata']['name']}: wildcard in {field}: {rule}"
            assert not rule.get("nonResourceURLs"), rule
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    assert (g, r) in ALLOWED, (
                        f"{role['kind']} {role['metadata']['name']} grants {g}/{r}: not used by the operator"
                    )
                    extra = set(rule["verbs"]) - ALLOWED[(g, r)]
                    assert not extra, f"{g}/{r}: verbs {extra} are not used by the operator"
                    limited = NAME_RESTRICTED.get((g, r), set()) & set(rule["verbs"])
                    if limited:
                        assert rule.get("resourceNames"), f"{g}/{r} {limited} must be limited by resourceNames"


def test_default_rbac_is_exactly_what_the_code_needs(chart_tools):
    """All features on (webhook self-signed, peering, per-server PodMonitors, all namespaces)."""
    got = all_grants(render_set("default"))
    want = {k: v for k, v in ALLOWED.items() if k not in {("", "namespaces"), ("kopf.dev", "kopfpeerings")}}
    assert got == want


def test_cluster_wide_scope_uses_one_cluster_role(chart_tools):
    objs = render_set("default")
    cr = one(objs, "ClusterRole")
    assert set(grants(cr)) >= NAMESPACED_RESOURCES
    crb = one(objs, "ClusterRoleBinding")
    assert crb["roleRef"]["name"] == cr["metadata"]["name"]
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": one(objs, "ServiceAccount")["metadata"]["name"], "namespace": NAMESPACE}
    ]
    # the only Role is the webhook Secret's, in the release namespace
    (role,) = by_kind(objs, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE and set(grants(role)) == {("", "secrets")}
    assert env_of(objs)["GDN_WATCH_NAMESPACES"] == ""
    one(objs, "ClusterKopfPeering")
    assert not by_kind(objs, "KopfPeering")


def test_namespaced_scope_uses_roles_per_namespace(chart_tools):
    objs = render_set("namespaced")
    watched = yaml.safe_load((CHART / "ci" / "namespaced-values.yaml").read_text())["operator"]["watchNamespaces"]
    cr = one(objs, "ClusterRole")
    cluster = grants(cr)
    assert not (NAMESPACED_RESOURCES & set(cluster)), "namespaced resources must not be granted cluster-wide"
    assert cluster[("", "namespaces")] == {"list", "watch"}
    assert ("kopf.dev", "clusterkopfpeerings") not in cluster
    sa = one(objs, "ServiceAccount")["metadata"]["name"]
    for ns in watched:
        role = [r for r in by_kind(objs, "Role") if r["metadata"]["namespace"] == ns]
        assert len(role) == 1, ns
        g = grants(role[0])
        assert {k for k in g if k in NAMESPACED_RESOURCES} == NAMESPACED_RESOURCES - {("monitoring.coreos.com", "podmonitors")}
        assert g[("kopf.dev", "kopfpeerings")] == {"list", "watch", "patch"}
        rb = [b for b in by_kind(objs, "RoleBinding") if b["metadata"]["namespace"] == ns]
        assert len(rb) == 1 and rb[0]["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role[0]["metadata"]["name"],
        }
        assert rb[0]["subjects"][0]["name"] == sa and rb[0]["subjects"][0]["namespace"] == NAMESPACE
    assert env_of(objs)["GDN_WATCH_NAMESPACES"] == ",".join(watched)
    peerings = by_kind(objs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == sorted(watched)
    assert not by_kind(objs, "ClusterKopfPeering")


def test_engine_pod_monitor_mode_controls_operator_and_rbac(chart_tools):
    per_server = render_set("default")
    assert env_of(per_server)["GDN_POD_MONITORS"] == "true"
    assert ("monitoring.coreos.com", "podmonitors") in all_grants(per_server)
    assert not by_kind(per_server, "PodMonitor")

    glob = render_set("namespaced")  # mode: global
    assert env_of(glob)["GDN_POD_MONITORS"] == "false"
    assert ("monitoring.coreos.com", "podmonitors") not in all_grants(glob)
    pm = one(glob, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "gdn-operator",
        "app.kubernetes.io/component": "engine",
    }
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"

    none = docs(render_text(sets={"monitoring.enginePodMonitor.mode": "none"}))
    assert env_of(none)["GDN_POD_MONITORS"] == "false" and not by_kind(none, "PodMonitor")


def test_engine_pod_monitor_selects_what_the_renderer_labels():
    """The global PodMonitor's selector and port must match the engine pods the operator renders."""
    from gdn_operator.api.load import parse_spec
    from gdn_operator.render.objects import render_all

    spec = parse_spec(yaml.safe_load((Path(CHART).parents[1] / "examples" / "qwen3.5-27b-mtp.yaml").read_text())["spec"])
    dep = next(o for o in render_all("q", "team-a", spec) if o["kind"] == "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    pm = one(docs(render_text(sets={"monitoring.enginePodMonitor.mode": "global"})), "PodMonitor")
    for k, v in pm["spec"]["selector"]["matchLabels"].items():
        assert pod_labels.get(k) == v, k
    ports = {p["name"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] in ports


@pytest.mark.parametrize("name", SETS)
def test_operator_pod_is_hardened(chart_tools, name):
    objs = render_set(name)
    dep = one(objs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    c = container(objs)
    psc, sc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
    assert sc.get("privileged") in (None, False)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in vols[mounts["/tmp"]]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == one(objs, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("name", SETS)
def test_probes_ports_and_services_are_wired(chart_tools, name):
    objs = render_set(name)
    c = container(objs)
    env = env_of(objs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    liveness_url = env["GDN_LIVENESS"]
    assert liveness_url == f"http://0.0.0.0:{ports['liveness']}/healthz"
    for probe in ("startupProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "liveness"}, probe
    # ready once the webhook port listens (the webhook front opens it after kopf started), else kopf's /healthz
    ready = {"tcpSocket": {"port": "webhook"}} if "webhook" in ports else {"httpGet": {"path": "/healthz", "port": "liveness"}}
    assert {k: v for k, v in c["readinessProbe"].items() if k in ("tcpSocket", "httpGet")} == ready
    assert int(env["GDN_METRICS_PORT"]) == ports["metrics"]
    pod_labels = one(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    services = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")}
    for svc in services.values():
        assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items()), svc["metadata"]["name"]
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, p
    webhook = services[env["GDN_WEBHOOK_SERVICE"]]
    assert env["GDN_WEBHOOK_MODE"] == "service" and env["GDN_WEBHOOK_NAMESPACE"] == NAMESPACE
    # handlers/startup.ServiceWebhookServer advertises port 443
    assert [(p["port"], p["targetPort"]) for p in webhook["spec"]["ports"]] == [(443, "webhook")]
    assert int(env["GDN_WEBHOOK_PORT"]) == ports["webhook"]
    # the chart ships the webhook configurations complete (tests/charts/test_chart_webhooks.py holds them
    # to what the operator serves); the operator only patches their caBundle, by name
    assert env["GDN_WEBHOOK_CONFIGS"] == "shipped"
    # the mutating configuration only with operator.mutateSpec (without it the operator serves no mutating webhook)
    assert not by_kind(objs, "MutatingWebhookConfiguration")
    with_mutating = docs(render_text(sets={"operator.mutateSpec": True}))
    for kind, source in (("ValidatingWebhookConfiguration", objs), ("MutatingWebhookConfiguration", with_mutating)):
        cfg = one(source, kind, env["GDN_WEBHOOK_CONFIG_NAME"])
        for hook in cfg["webhooks"]:
            assert hook["clientConfig"]["service"]["name"] == env["GDN_WEBHOOK_SERVICE"]
            assert hook["clientConfig"]["service"]["namespace"] == NAMESPACE
            assert "caBundle" not in hook["clientConfig"], "the operator publishes the caBundle"
            # failurePolicy Fail: an operator that does not answer holds each write this long (issue 38: was 30)
            assert hook["failurePolicy"] == "Fail" and hook["timeoutSeconds"] <= 10
    rules = [r for r in one(objs, "ClusterRole")["rules"] if "admissionregistration.k8s.io" in r["apiGroups"]]
    assert [(r.get("resourceNames"), sorted(r["verbs"])) for r in rules] == [
        ([env["GDN_WEBHOOK_CONFIG_NAME"]], ["get", "patch"]),
        ([f"guards.{env['GDN_WEBHOOK_CONFIG_NAME']}"], ["get", "patch"]),  # GDNGuard admission (issue 35)
    ]
    assert env["POD_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_self_signed_webhook_tls_gets_exactly_its_secret(chart_tools):
    objs = render_set("default")
    env = env_of(objs)
    assert "GDN_WEBHOOK_CERT_DIR" not in env
    (role,) = by_kind(objs, "Role")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [env["GDN_WEBHOOK_SECRET"]], "verbs": ["get", "update"]}
    ]
    assert not by_kind(objs, "Certificate")


def test_cert_manager_mode_mounts_the_certificate_and_needs_no_secret_rbac(chart_tools):
    objs = render_set("certmanager")
    env = env_of(objs)
    assert "GDN_WEBHOOK_SECRET" not in env
    assert ("", "secrets") not in all_grants(objs)
    certs = {c["metadata"]["name"]: c for c in by_kind(objs, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in by_kind(objs, "Issuer")}
    serving = next(c for c in certs.values() if not c["spec"].get("isCA"))
    ca = next(c for c in certs.values() if c["spec"].get("isCA"))
    svc = env["GDN_WEBHOOK_SERVICE"]
    assert f"{svc}.{NAMESPACE}.svc" in serving["spec"]["dnsNames"]
    # chain: selfSigned Issuer -> CA Certificate -> CA Issuer -> serving Certificate
    assert "selfSigned" in issuers[ca["spec"]["issuerRef"]["name"]]["spec"]
    assert issuers[serving["spec"]["issuerRef"]["name"]]["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    # the operator reads the serving Secret's files from GDN_WEBHOOK_CERT_DIR
    c = container(objs)
    pod = one(objs, "Deployment")["spec"]["template"]["spec"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == env["GDN_WEBHOOK_CERT_DIR"])
    vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert vol["secret"]["secretName"] == serving["spec"]["secretName"] and mount["readOnly"] is True

    ext = docs(
        render_text(
            VALUE_SETS["certmanager"], sets={"webhook.certManager.issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}
        )
    )
    assert not by_kind(ext, "Issuer")
    (cert,) = by_kind(ext, "Certificate")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def test_ha_two_replicas_with_peering_pdb_and_anti_affinity(chart_tools):
    objs = render_set("default")
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pref = dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert pref[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    env = env_of(objs)
    assert env["GDN_PEERING"] == one(objs, "ClusterKopfPeering")["metadata"]["name"]
    # priority=auto: each pod draws its own priority (kopf pauses all replicas sharing one)
    assert env["GDN_PEERING_PRIORITY"] == "auto"
    assert container(objs)["command"] == ["gdn-operator"]
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_single_replica_has_no_pdb_and_a_fixed_priority(chart_tools):
    objs = render_set("single-replica")
    assert one(objs, "Deployment")["spec"]["replicas"] == 1
    assert not by_kind(objs, "PodDisruptionBudget")
    assert env_of(objs)["GDN_PEERING_PRIORITY"] == "10"
    assert container(objs)["command"] == ["gdn-operator"]


def test_peering_crds_in_crds_dir_match_kopf():
    crds = {d["metadata"]["name"]: d for d in docs((CHART / "crds" / "kopf.dev-peerings.yaml").read_text())}
    assert set(crds) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    from kopf._cogs.structs import references

    for sel, scope in ((references.CLUSTER_PEERINGS_K, "Cluster"), (references.NAMESPACED_PEERINGS_K, "Namespaced")):
        crd = crds[f"{sel.any_name}.{sel.group}"]
        assert crd["spec"]["group"] == sel.group and crd["spec"]["scope"] == scope
        (v,) = crd["spec"]["versions"]
        assert v["name"] == sel.version and "subresources" not in v  # kopf patches .status on the object


@pytest.mark.parametrize("name", SETS)
def test_crds_are_the_generated_files(chart_tools, name):
    from gdn_operator.api.crd import crd_manifest, guard_crd_manifest

    crds = {c["metadata"]["name"]: c for c in by_kind(render_set(name), "CustomResourceDefinition")}
    assert set(crds) == {"gdnmodelservers.serving.gdn-operator.io", "gdnguards.serving.gdn-operator.io"}
    for generated, manifest in ((GENERATED_CRD, crd_manifest()), (GENERATED_GUARD_CRD, guard_crd_manifest())):
        crd = crds[manifest["metadata"]["name"]]
        annotations = crd["metadata"].pop("annotations")
        assert annotations == {"helm.sh/resource-policy": "keep"}
        assert crd == yaml.safe_load(generated.read_text())
        assert crd == manifest


def test_crd_install_and_keep_switches(chart_tools):
    objs = docs(render_text(sets={"crds.install": False}))
    assert not by_kind(objs, "CustomResourceDefinition")
    crds = by_kind(docs(render_text(sets={"crds.keep": False})), "CustomResourceDefinition")
    assert len(crds) == 2 and all("annotations" not in c["metadata"] for c in crds)


@pytest.mark.parametrize("name", SETS)
def test_every_object_is_namespaced_correctly(chart_tools, name):
    cluster_kinds = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "ClusterKopfPeering",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    }
    for o in render_set(name):
        assert o.get("apiVersion") and o.get("kind") and o["metadata"].get("name"), o
        if o["kind"] in cluster_kinds:
            assert "namespace" not in o["metadata"], o["kind"]
        else:
            assert o["metadata"].get("namespace"), f"{o['kind']} {o['metadata']['name']} has no namespace"


@pytest.mark.parametrize("name", SETS)
def test_helm_test_hook_can_only_dry_run_a_server_in_one_watched_namespace(chart_tools, name):
    """`helm test`'s pod (templates/tests/) proves the webhook refuses a known-bad manifest; its account may
    create GDNModelServers (a dry run) in one namespace the webhook covers, nothing else."""
    objs = render_set(name, hooks=True)
    hooks = [o for o in objs if "helm.sh/hook" in (o["metadata"].get("annotations") or {})]
    if not by_kind(objs, "ValidatingWebhookConfiguration"):
        assert hooks == []
        return
    assert {o["kind"] for o in hooks} == {"ServiceAccount", "Role", "RoleBinding", "Pod"}
    assert all(o["metadata"]["annotations"]["helm.sh/hook"] == "test" for o in hooks)
    watched = [n for n in env_of(objs)["GDN_WATCH_NAMESPACES"].split(",") if n] or [NAMESPACE]
    assert {o["metadata"]["namespace"] for o in hooks} == {watched[0]}
    role = one(hooks, "Role")
    assert role["rules"] == [{"apiGroups": ["serving.gdn-operator.io"], "resources": ["gdnmodelservers"], "verbs": ["create"]}]
    pod = one(hooks, "Pod")
    script = pod["spec"]["containers"][0]["args"][0]
    assert 'dry_run="All"' in script and "NVIDIA_VISIBLE_DEVICES" in script
    assert pod["spec"]["serviceAccountName"] == one(hooks, "ServiceAccount")["metadata"]["name"]


def test_pod_delete_and_policy_reports_follow_the_values(chart_tools):
    """Issue 48: pods `delete` was granted whatever the values, though guard remediation is opt-in; it follows
    operator.stallRestart and guard.remediation.enabled now, and PolicyReports are granted when the chart writes
    them (guard.policyReports)."""
    assert "delete" in all_grants(render_set("default"))[("", "pods")]

    def render_with(sets):
        return [
            o for o in docs(render_text(sets=sets)) if "helm.sh/hook" not in ((o.get("metadata") or {}).get("annotations") or {})
        ]

    off = {"operator.stallRestart": False}
    assert all_grants(render_with(off))[("", "pods")] == {"get", "list", "watch"}
    on = all_grants(render_with({**off, "guard.remediation.enabled": True}))
    assert "delete" in on[("", "pods")]
    assert ("wgpolicyk8s.io", "policyreports") not in all_grants(render_with({"guard.policyReports": False}))
    assert env_of(render_with(off))["GDN_STALL_RESTART"] == "false"


def test_the_webhook_port_admits_only_the_api_server(chart_tools):
    """Issue 48: no NetworkPolicy shipped, so any pod could POST reviews to the webhook port. One is on by default:
    the webhook port from the API server's addresses (apiServerCIDRs) or every address but the pod networks
    (podCIDRs); the metrics and liveness ports stay reachable."""

    def policy(sets):
        return [o for o in docs(render_text(sets=sets)) if o["kind"] == "NetworkPolicy"]

    (np,) = policy({"webhook.networkPolicy.apiServerCIDRs": ["172.18.0.2/32"]})
    assert np["spec"]["policyTypes"] == ["Ingress"]
    assert np["spec"]["podSelector"]["matchLabels"] == one(render_set("default"), "Deployment")["spec"]["selector"]["matchLabels"]
    webhook, rest = np["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "webhook", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "172.18.0.2/32"}}]}
    assert {p["port"] for p in rest["ports"]} == {"metrics", "liveness"} and "from" not in rest
    (np,) = policy({"webhook.networkPolicy.podCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"]})
    assert np["spec"]["ingress"][0]["from"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.244.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:10:244::/56"]}},
    ]
    container_ports = {p["name"] for p in container(render_set("default"))["ports"]}
    assert {"webhook", "metrics", "liveness"} == container_ports  # every port the policy names, and no other
    assert len(by_kind(render_set("default"), "NetworkPolicy")) == 1  # on by default
    assert policy({"webhook.networkPolicy.enabled": False}) == []
