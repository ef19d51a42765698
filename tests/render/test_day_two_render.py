"""Issue 38 in render: labels and annotations on the workload object itself (Kueue, cost tools read them on the
Deployment / LeaderWorkerSet, not only on pods), and the engine PodDisruptionBudget's default."""

import pytest

from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.render.objects import render_all
from gdn_operator.render.scaleout import workload_of

from builders import GMS

V32 = GMS().version("0.32.0")
WL = {
    "workloadLabels": {"kueue.x-k8s.io/queue-name": "gpu", "cost-center": "ml-42"},
    "workloadAnnotations": {"example.com/owner": "team-ml"},
}


@pytest.mark.parametrize(("extra", "kind"), [({}, "Deployment"), ({"nodes": 2, "tensorParallelSize": 2}, "LeaderWorkerSet")])
def test_workload_labels_and_annotations_land_on_the_workload_object(extra, kind):
    objs = render_all("srv", "ns", parse_spec(V32.update(pod=WL, **extra).spec()))
    w = workload_of(objs)
    assert w["kind"] == kind
    assert w["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu" and w["metadata"]["labels"]["cost-center"] == "ml-42"
    assert w["metadata"]["labels"]["serving.gdn-operator.io/server"] == "srv"  # the operator's stay
    assert w["metadata"]["annotations"] == {"example.com/owner": "team-ml"}
    # workload metadata only: the other objects and the pods are unchanged
    for o in objs:
        if o is not w:
            assert "cost-center" not in o["metadata"].get("labels", {}), o["kind"]


def test_unset_workload_metadata_renders_nothing_new():
    w = workload_of(render_all("srv", "ns", parse_spec(V32.spec())))
    assert "annotations" not in w["metadata"] and "cost-center" not in w["metadata"]["labels"]


@pytest.mark.parametrize(
    ("pod", "needle"),
    [
        ({"workloadLabels": {"app.kubernetes.io/name": "x"}}, "is set by the operator"),
        ({"workloadLabels": {"bad key!": "x"}}, "workloadLabels"),
        ({"workloadAnnotations": {"leaderworkerset.sigs.k8s.io/size": "3"}}, "set by the operator or the LeaderWorkerSet"),
    ],
)
def test_operator_owned_or_invalid_workload_keys_are_refused_naming_the_field(pod, needle):
    with pytest.raises(ManifestError) as ei:
        parse_spec(V32.update(pod=pod).spec())
    text = "; ".join(ei.value.problems)
    assert needle in text and "spec.pod.workload" in text, text


#: ports GPU clusters already use for something else: node exporter, DCGM exporter, Prometheus, Alertmanager,
#: Pushgateway, the OpenTelemetry Prometheus exporter, the kubelet
WELL_KNOWN = {9100, 9400, 9090, 9093, 9091, 9464, 10250}


def test_the_engine_service_metrics_port_is_not_a_well_known_exporter_port():
    svc = next(o for o in render_all("srv", "ns", parse_spec(V32.spec())) if o["kind"] == "Service")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["metrics"]["port"] not in WELL_KNOWN | {ports["http"]["port"]}  # 9400 was DCGM's (issue 38)
    assert ports["metrics"]["targetPort"] == "http"  # vLLM serves /metrics on its API port
