"""tests/builders.py: the default body is one the API admits, each setter does what it says, bodies are copies; a
workload's engine and its pods read as the guard reads them."""

from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.api.load import parse_object, parse_spec
from gdn_operator.handlers.engines.crashwatch import deaths_in
from gdn_operator.handlers.core.pods import pod_summary
from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SERVER, LABEL_WORKER_INDEX
from gdn_operator.rules.workload import engine_container, pod_specs
from gdn_operator.watch.guarded import selects_object

from builders import CLEAN_ARGS, ENGINE_ARGS, GMS, EnginePod, Guard, Workload


def test_the_default_body_is_the_readme_minimum_and_the_api_admits_it():
    body = GMS().obj()
    assert body["spec"] == {"model": {"uri": "hf://Qwen/Qwen3.5-27B"}, "image": {"tag": "v0.33.0", "vllmVersion": "0.33.0"}}
    assert body["metadata"] == {"name": "s", "namespace": "ns"} and "status" not in body
    parsed = parse_object(body)
    assert (parsed.metadata.name, parsed.metadata.namespace, parsed.spec.image.vllm_version) == ("s", "ns", "0.33.0")
    assert parse_spec(GMS().small().spec()).resources.cpu == "1"  # the cluster-test server is admitted too
    assert parse_spec(GMS().flagship().spec()).model.architecture == "Qwen3_5ForConditionalGeneration"


def test_setters_set_what_they_name():
    b = (
        GMS("srv", namespace="team")
        .generation(3)
        .uid("u")
        .annotations({"a": "1"})
        .labels({"l": "2"})
        .meta(resourceVersion="10")
        .status({"phase": "Ready"})
        .version("0.32.0")
        .set("speculativeDecoding.numSpeculativeTokens", 3)
        .update(tensorParallelSize=2)
        .obj()
    )
    assert b["metadata"] == {
        "name": "srv",
        "namespace": "team",
        "generation": 3,
        "uid": "u",
        "annotations": {"a": "1"},
        "labels": {"l": "2"},
        "resourceVersion": "10",
    }
    assert b["status"] == {"phase": "Ready"}
    assert b["spec"]["image"] == {"tag": "v0.32.0", "vllmVersion": "0.32.0"}
    assert b["spec"]["speculativeDecoding"] == {"numSpeculativeTokens": 3} and b["spec"]["tensorParallelSize"] == 2
    assert "namespace" not in GMS("x", namespace=None).obj()["metadata"]
    assert "namespace" not in GMS().namespace(None).obj()["metadata"]


def test_update_replaces_a_field_merge_merges_into_it():
    flagship = GMS().flagship()
    assert flagship.update(image={"tag": "v1"}).spec()["image"] == {"tag": "v1"}
    merged = flagship.merge(image={"tag": "v1"}, replicas=2).spec()
    assert merged["image"] == {"repository": "vllm/vllm-openai", "tag": "v1", "vllmVersion": "0.33.0"}
    assert merged["replicas"] == 2


def test_bodies_and_wrappers_are_independent():
    base = GMS()
    one, two = base.obj(), base.obj()
    one["spec"]["model"]["uri"] = "hf://changed/x"
    one["metadata"]["name"] = "changed"
    assert two == GMS().obj() and base.obj() == GMS().obj()
    derived = base.set("replicas", 2)  # a setter returns a new wrapper: the base stays as it was
    assert "replicas" not in base.spec() and derived.spec()["replicas"] == 2
    fields = {"cache": {"emptyDir": {}}}
    built = base.merge(model=fields)
    fields["cache"]["emptyDir"]["sizeLimit"] = "1Gi"  # the caller's dict is copied in, not shared
    assert built.spec()["model"]["cache"] == {"emptyDir": {}}
    pod = EnginePod().ready()
    p = pod.obj()
    p["status"]["conditions"].clear()
    assert pod.obj()["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_engine_pod_reads_as_the_operator_reads_a_pod():
    p = EnginePod("s-0-1").uid("u").server("s").worker(1, group=0).ip("127.0.0.3").phase("Running").ready().deleting()
    s = pod_summary(p.obj())
    assert (s["name"], s["uid"], s["ip"], s["phase"], s["ready"], s["deleting"]) == (
        "s-0-1",
        "u",
        "127.0.0.3",
        "Running",
        True,
        True,
    )
    assert (s["group"], s["leader"]) == ("0", False)
    labels = p.obj()["metadata"]["labels"]
    assert labels[LABEL_SERVER] == "s" and labels[LABEL_WORKER_INDEX] == "1" and labels[LABEL_GROUP_INDEX] == "0"
    assert pod_summary(EnginePod().ready(False).obj())["ready"] is False
    unschedulable = EnginePod().condition("PodScheduled", "False", reason="Unschedulable", message="0/2 nodes")
    assert pod_summary(unschedulable.obj())["unschedulable_message"] == "0/2 nodes"

    crashed = EnginePod().uid("u1").container(restartCount=3, lastState=EnginePod.terminated(1, "Error", "boom"))
    (d,) = deaths_in(crashed.obj())
    assert (d.restart_count, d.exit_code, d.message) == (3, 1, "boom")
    assert EnginePod.terminated(0, "Completed") == {"terminated": {"exitCode": 0, "reason": "Completed"}}
    two = EnginePod().container(restartCount=2).container("sidecar", restartCount=1).obj()["status"]["containerStatuses"]
    assert two == [{"name": "vllm", "restartCount": 2}, {"name": "sidecar", "restartCount": 1}]


def test_engine_pod_as_the_kubernetes_client_reads_it():
    c = EnginePod("g-0").uid("u").worker(0).ip("127.0.0.2").phase("Running").deleting().client()
    assert (c.metadata.name, c.metadata.uid, c.metadata.labels) == ("g-0", "u", {LABEL_WORKER_INDEX: "0"})
    assert (c.status.pod_ip, c.status.phase, c.metadata.deletion_timestamp) == ("127.0.0.2", "Running", "2026-01-01T00:00:00Z")
    bare = EnginePod().client()  # unset fields read None, as on a V1Pod
    assert (bare.metadata.labels, bare.metadata.deletion_timestamp, bare.status.pod_ip) == (None, None, None)


# ------------------------------------------------------------------------------------------ GDNGuard and workloads ---


def test_the_default_guard_is_one_the_api_admits_and_its_setters_set_what_they_name():
    body = Guard().obj()
    assert body == {
        "apiVersion": "serving.gdn-operator.io/v1alpha1",
        "kind": "GDNGuard",
        "metadata": {"name": "g", "namespace": "ns"},
        "spec": {"selector": {"matchLabels": {"app": "g"}}},
    }
    spec = GDNGuardSpec.model_validate(body["spec"])
    assert (spec.admission.policy, spec.features.crash_watch, spec.features.probes) == ("warn", True, False)
    big = {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}
    g = Guard("chat", namespace="team").uid("u").generation(2).select({"app": "chat"}).policy("deny")
    g = g.features(acceptance=False).features(stall=False)  # features merge: both stay off
    parsed = GDNGuardSpec.model_validate(g.spec())
    assert g.obj()["metadata"] == {"name": "chat", "namespace": "team", "uid": "u", "generation": 2}
    assert (parsed.admission.policy, parsed.features.acceptance, parsed.features.stall) == ("deny", False, False)
    assert parsed.selector.dump()["matchLabels"] == {"app": "chat"}
    assert Guard().selector(big).spec()["selector"] == big
    assert "namespace" not in Guard(namespace=None).obj()["metadata"]
    base = Guard()
    base.policy("deny")  # a setter returns a new wrapper
    assert "admission" not in base.spec()


def test_a_workload_holds_its_engine_where_the_guard_reads_each_kind():
    for kind, path in [
        ("Deployment", "spec.template.spec"),
        ("StatefulSet", "spec.template.spec"),
        ("ReplicaSet", "spec.template.spec"),
        ("LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate.spec"),
        ("Pod", "spec"),
    ]:
        w = Workload("chat", kind).labelled({"app": "chat"}).sidecar().tag("v0.17.1")
        body = w.obj()
        assert (body["kind"], body["metadata"]["name"]) == (kind, "chat")
        ((found, podspec),) = pod_specs(body)
        assert found == path
        container, argv = engine_container(podspec, None)  # past the sidecar
        assert container["name"] == "vllm" and container["image"] == "vllm/vllm-openai:v0.17.1"
        assert argv == ["vllm", "serve", *ENGINE_ARGS]
        assert selects_object({"matchLabels": {"app": "chat"}}, body)
        assert ("selector" in body["spec"]) == (kind in ("Deployment", "StatefulSet", "ReplicaSet"))
    d = Workload().obj()  # only what a setter put there
    assert d == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "my-vllm"},
        "spec": {"template": {"metadata": {}, "spec": {"containers": [Workload().container()]}}},
    }
    assert Workload().container() == {"name": "vllm", "image": "vllm/vllm-openai:v0.33.0", "args": ENGINE_ARGS}


def test_workload_setters_set_what_they_name():
    w = (
        Workload("d", namespace="team")
        .uid("u")
        .labels({"team": "x"})
        .template_labels({"app": "g"})
        .template_annotations({"gdn-operator.io/vllm-version": "0.17.1"})
        .selector({"app": "g"})
        .replicas(0)
        .owner("MyInferenceThing")
        .args(*CLEAN_ARGS)
    )
    b = w.obj()
    assert b["metadata"] == {
        "name": "d",
        "namespace": "team",
        "uid": "u",
        "labels": {"team": "x"},
        "ownerReferences": [{"apiVersion": "x/v1", "kind": "MyInferenceThing", "name": "o", "uid": "1", "controller": True}],
    }
    assert b["spec"]["replicas"] == 0 and b["spec"]["selector"] == {"matchLabels": {"app": "g"}}
    assert b["spec"]["template"]["metadata"] == {
        "labels": {"app": "g"},
        "annotations": {"gdn-operator.io/vllm-version": "0.17.1"},
    }
    assert w.container()["args"] == [*ENGINE_ARGS, *CLEAN_ARGS]
    argv = ["vllm", "serve", "/models/m", "--port", "8000"]
    e = Workload().argv(argv).engine(name="engine", terminationMessagePolicy="FallbackToLogsOnError").container()
    assert (e["name"], e["command"], e["args"], e["terminationMessagePolicy"]) == (
        "engine",
        ["vllm", "serve"],
        ["/models/m", "--port", "8000"],
        "FallbackToLogsOnError",
    )
    assert "args" not in Workload().engine(command=["sh", "-c", "vllm serve m"], args=None).container()
    assert Workload("p", "Pod").template_labels({"app": "g"}).obj()["metadata"]["labels"] == {"app": "g"}
    base = Workload()
    base.tag("v0.17.1").labels({"a": "b"})  # a setter returns a new wrapper
    assert base.obj() == Workload().obj()


def test_a_workloads_pod_leads_the_guard_up_its_owner_chain_to_the_workload(monkeypatch):
    """Workload.pod: the pod its controller makes, read by the guard's owner chain (handlers/guard/owners.py) back to
    the workload, with the ReplicaSet a Deployment makes (Workload.replica_set) and the StatefulSet as the API
    server holds them."""
    from gdn_operator.handlers.guard import client
    from gdn_operator.handlers.guard.owners import Owners

    held: dict[tuple[str, str], dict] = {}
    monkeypatch.setattr(client, "owner_metadata", lambda kind, ns, name: held.get((kind, name)))
    for kind, api_version in [
        ("Deployment", "apps/v1"),
        ("StatefulSet", "apps/v1"),
        ("LeaderWorkerSet", "leaderworkerset.x-k8s.io/v1"),
        ("Pod", "v1"),
    ]:
        w = Workload("chat", kind, namespace="ns").uid(f"{kind}-uid").labelled({"app": "chat"})
        held.clear()
        for body in (w.obj(), w.replica_set()):
            held[(body["kind"], body["metadata"]["name"])] = body["metadata"]
        pod = w.pod("chat-0" if kind != "Pod" else None).uid("p-uid").obj()
        assert pod["metadata"]["namespace"] == "ns" and pod["spec"] == w.pod_spec()
        assert pod["metadata"]["labels"]["app"] == "chat"  # the template's labels (a Pod's own)
        controller = {"Deployment": ["ReplicaSet"], "StatefulSet": ["StatefulSet"], "LeaderWorkerSet": ["StatefulSet"], "Pod": []}
        assert [r["kind"] for r in pod["metadata"].get("ownerReferences", [])] == controller[kind]
        ref = Owners().workload_of(pod)
        assert (ref.kind, ref.name, ref.api_version) == (kind, "chat", api_version), pod["metadata"]
    rs = Workload("chat").uid("d").labelled({"app": "chat"}).replica_set()["metadata"]
    assert (rs["name"], rs["labels"]["pod-template-hash"], rs["ownerReferences"][0]["uid"]) == ("chat-7d9f5b", "7d9f5b", "d")
    assert Workload("p", "Pod").pod().obj()["metadata"]["name"] == "p"
