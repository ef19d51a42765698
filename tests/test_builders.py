"""tests/builders.py: the default body is one the API admits, each setter does what it says, bodies are copies."""

from gdn_operator.api.load import parse_object, parse_spec
from gdn_operator.handlers.engines.crashwatch import deaths_in
from gdn_operator.handlers.core.pods import pod_summary
from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SERVER, LABEL_WORKER_INDEX

from builders import GMS, EnginePod


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
