"""Issue 29 in render: spec.pod on Deployment pods and LeaderWorkerSet leaders and workers, the model cache
and its download step, rollout strategies, the engine PodDisruptionBudget, the API key from a Secret."""

import json

import pytest

from gdn_operator.api.load import parse_spec
from gdn_operator.render import podparts
from gdn_operator.render.engine import deployment
from gdn_operator.render.objects import render_all
from gdn_operator.render.lws import leader_worker_set

from builders import GMS, MODEL, POD_SETTINGS

V32 = GMS().version("0.32.0")
POD = POD_SETTINGS


def templates(spec_):
    if spec_.nodes > 1:
        t = leader_worker_set("srv", "ns", spec_)["spec"]["leaderWorkerTemplate"]
        return [t["leaderTemplate"], t["workerTemplate"]]
    return [deployment("srv", "ns", spec_)["spec"]["template"]]


@pytest.mark.parametrize("extra", [{}, {"nodes": 2, "tensorParallelSize": 2}])
def test_pod_settings_on_every_engine_pod_template(extra):
    s = parse_spec(V32.update(pod=POD, **extra).spec())
    for tpl in templates(s):
        ps, c = tpl["spec"], tpl["spec"]["containers"][0]
        assert ps["imagePullSecrets"] == [{"name": "regcred"}]
        assert (ps["serviceAccountName"], ps["runtimeClassName"], ps["priorityClassName"], ps["schedulerName"]) == (
            "vllm-reader",
            "nvidia",
            "inference-high",
            "kai-scheduler",
        )
        assert ps["securityContext"] == {"runAsNonRoot": True, "fsGroup": 1000}
        assert tpl["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
        assert tpl["metadata"]["labels"]["serving.gdn-operator.io/server"] == "srv"  # the operator's stay
        assert tpl["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert tpl["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "vllm"
        assert {"name": "media", "persistentVolumeClaim": {"claimName": "media"}} in ps["volumes"]
        assert {v["name"] for v in ps["volumes"]} >= {"dshm", "cache", "media"}
        assert {"name": "media", "mountPath": "/media", "readOnly": True} in c["volumeMounts"]
        assert c["securityContext"] == {"allowPrivilegeEscalation": False}
        assert ps["initContainers"][0]["securityContext"] == {"allowPrivilegeEscalation": False}


def test_unset_pod_settings_render_nothing_new():
    ps = templates(parse_spec(V32.spec()))[0]["spec"]
    assert not {"imagePullSecrets", "serviceAccountName", "runtimeClassName", "securityContext"} & set(ps)
    assert "envFrom" not in ps["containers"][0] and "securityContext" not in ps["containers"][0]


def test_env_from_configmap_key_and_api_key_from_secret():
    s = parse_spec(
        V32.update(
            env=[{"name": "S3_ENDPOINT", "configMapKeyRef": {"name": "storage", "key": "endpoint"}}],
            apiKeySecret={"name": "vllm-key", "key": "api-key"},
        ).spec()
    )
    for tpl in templates(s):
        c = tpl["spec"]["containers"][0]
        env = {e["name"]: e for e in c["env"]}
        assert env["S3_ENDPOINT"]["valueFrom"] == {"configMapKeyRef": {"name": "storage", "key": "endpoint"}}
        assert env["VLLM_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "vllm-key", "key": "api-key"}}
        assert not any("api-key" in a for a in c["args"])  # no key, nor the flag, in the arguments
        # kubelet probes stay on /health, which vLLM leaves open (GUARDED_PREFIX is /v1, /v2, /inference, /cohere)
        assert c["readinessProbe"]["httpGet"]["path"] == "/health"


def test_default_cache_is_per_pod_with_a_download_step_and_an_offline_engine():
    s = parse_spec(
        V32.update(
            model={
                "uri": MODEL,
                "hubEndpoint": "https://hf-mirror.example.com",
                "hfTokenSecret": {"name": "hf"},
                "cache": {"emptyDir": {"sizeLimit": "80Gi"}},
            }
        ).spec()
    )
    ps = templates(s)[0]["spec"]
    assert {"name": "cache", "emptyDir": {"sizeLimit": "80Gi"}} in ps["volumes"]
    [init] = ps["initContainers"]
    assert init["name"] == podparts.DOWNLOAD_CONTAINER and init["image"] == "vllm/vllm-openai:v0.32.0"
    assert init["command"][:3] == ["sh", "-c", podparts.DOWNLOAD_SCRIPT]
    assert init["command"][5:7] == ["Qwen/Qwen3.5-27B", "--include"]  # after $0 and the ready marker
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_HOME"]["value"] == "/cache/huggingface" and env["HF_ENDPOINT"]["value"] == "https://hf-mirror.example.com"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert "nvidia.com/gpu" not in json.dumps(init["resources"])  # downloading holds no GPU
    engine = {e["name"]: e.get("value") for e in ps["containers"][0]["env"]}
    assert engine["HF_HUB_OFFLINE"] == "1" and engine["HF_HOME"] == "/cache/huggingface"
    assert "HF_TOKEN" not in engine and "HF_ENDPOINT" not in engine


def test_download_off_and_pvc_models_leave_the_engine_online_without_init():
    ps = templates(
        parse_spec(V32.update(model={"uri": MODEL, "hubEndpoint": "https://m.example", "cache": {"download": False}}).spec())
    )[0]["spec"]
    assert "initContainers" not in ps
    env = {e["name"]: e.get("value") for e in ps["containers"][0]["env"]}
    assert env["HF_ENDPOINT"] == "https://m.example" and "HF_HUB_OFFLINE" not in env
    assert "initContainers" not in templates(parse_spec(V32.update(model={"uri": "pvc://weights/qwen"}).spec()))[0]["spec"]


def test_cache_claims_existing_and_owned():
    s = parse_spec(
        V32.update(model={"uri": MODEL, "cache": {"persistentVolumeClaim": {"claimName": "shared-hf"}}}, replicas=2).spec()
    )
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "shared-hf"}} in templates(s)[0]["spec"]["volumes"]
    assert "PersistentVolumeClaim" not in [o["kind"] for o in render_all("srv", "ns", s, uid="u")]

    s = parse_spec(
        V32.update(
            model={"uri": MODEL, "cache": {"persistentVolumeClaim": {"size": "200Gi", "storageClassName": "fast"}}},
            nodes=2,
            tensorParallelSize=2,
        ).spec()
    )
    objs = {o["kind"]: o for o in render_all("srv", "ns", s, uid="u")}
    pvc = objs["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "srv-model-cache"
    assert "ownerReferences" not in pvc["metadata"]  # retainPolicy Retain (default): kept when the server goes
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast",
    }
    for tpl in templates(s):  # leader and workers share the claim
        assert {"name": "cache", "persistentVolumeClaim": {"claimName": "srv-model-cache"}} in tpl["spec"]["volumes"]


@pytest.mark.parametrize("strategy, surge, unavailable", [("Surge", 1, 0), ("InPlace", 0, 1)])
def test_rollout_strategy_on_deployment_and_leader_worker_set(strategy, surge, unavailable):
    d = deployment("srv", "ns", parse_spec(V32.update(rollout={"strategy": strategy}).spec()))
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": surge, "maxUnavailable": unavailable}
    lws = leader_worker_set(
        "srv", "ns", parse_spec(V32.update(rollout={"strategy": strategy}, nodes=2, tensorParallelSize=2).spec())
    )
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": surge, "maxUnavailable": unavailable}


@pytest.mark.parametrize(
    "fields, max_unavailable",
    [
        # issue 38: the default never blocks a drain forever, one replica or many (0 was the old one-replica default)
        ({}, 1),
        ({"replicas": 3}, 1),
        ({"autoscaling": {"minReplicas": 2, "maxReplicas": 4, "target": 5}}, 1),
        ({"autoscaling": {"maxReplicas": 4, "target": 5}}, 1),
        ({"replicas": 4, "disruptionBudget": {"maxUnavailable": 2}}, 2),
        ({"disruptionBudget": {"maxUnavailable": 0}}, 0),  # the opt-in: a drain waits for the only engine
    ],
)
def test_disruption_budget_default_and_override(fields, max_unavailable):
    objs = {o["kind"]: o for o in render_all("srv", "ns", parse_spec(V32.update(**fields).spec()), uid="u")}
    pdb = objs["PodDisruptionBudget"]
    assert pdb["spec"]["maxUnavailable"] == max_unavailable
    assert pdb["spec"]["selector"]["matchLabels"] == objs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_disruption_budget_off_and_lws_selector_covers_workers():
    assert "PodDisruptionBudget" not in [
        o["kind"] for o in render_all("srv", "ns", parse_spec(V32.update(disruptionBudget={"enabled": False}).spec()))
    ]
    objs = {o["kind"]: o for o in render_all("srv", "ns", parse_spec(V32.update(nodes=2, tensorParallelSize=2).spec()))}
    sel = objs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]
    assert "leaderworkerset.sigs.k8s.io/worker-index" not in sel  # leaders and workers alike
    worker_labels = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    assert all(worker_labels[k] == v for k, v in sel.items())


def test_url():
    assert podparts.url("srv", "ml", 8000) == "http://srv.ml.svc:8000/v1"
