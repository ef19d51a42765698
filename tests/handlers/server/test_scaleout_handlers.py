"""Group-aware crash counting (multi-node engines) and the InferencePool condition mirror."""

from __future__ import annotations

import pytest

from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.server import router as router_h
from builders import GMS, EnginePod

BASE = GMS().spec()
B1 = "AssertionError: num_decodes: 1, num_spec_decodes: 4"
NCCL = "RuntimeError: NCCL communicator was aborted on rank 0"


class Fake:
    def __init__(self):
        self.obj = GMS().generation(1).status({}).update(nodes=2, tensorParallelSize=2, remediation={"mode": "none"}).obj()
        self.events: list[tuple[str, str]] = []

    def update_status(self, ns, name, mutate, retries=8, obj=None):
        status = dict(self.obj["status"])
        mutate(status, self.obj)
        self.obj["status"] = status
        return self.obj

    def emit_event(self, obj, reason, message, type_="Normal"):
        self.events.append((reason, message))


@pytest.fixture
def fake(monkeypatch):
    from gdn_operator.handlers.engines import crashwatch
    from gdn_operator.handlers.core import kube

    f = Fake()
    monkeypatch.setattr(statusguard, "update_status", f.update_status)
    monkeypatch.setattr(kube, "emit_event", f.emit_event)
    monkeypatch.setattr(crashwatch, "_current_args", lambda obj, rt: None)
    return f


def death(pod, restarts, finished, message, group="s/0"):
    from gdn_operator.handlers.engines.crashwatch import Death

    return Death(pod, f"uid-{pod}", "vllm", restarts, 1, "Error", message, finished, False, (), group)


def test_group_pods_are_labelled_with_their_group():
    from gdn_operator.handlers.engines.crashwatch import deaths_in

    pod = (
        EnginePod("s-0-1")
        .uid("u")
        .worker(set_name="s", group=0)
        .container(restartCount=1, lastState=EnginePod.terminated(1))
        .obj()
    )
    assert deaths_in(pod)[0].group == "s/0"


def test_one_group_crash_counts_once_and_keeps_the_workers_root_cause(fake, rt):
    from gdn_operator.handlers.engines import crashwatch

    crashwatch.handle_death(rt, "ns", "s", death("s-0-1", 1, "2026-11-22T10:00:00Z", B1))  # worker: the root cause
    crashwatch.handle_death(rt, "ns", "s", death("s-0", 1, "2026-11-22T10:00:03Z", NCCL))  # leader follows
    lc = fake.obj["status"]["lastCrash"]
    assert lc["count"] == 1 and lc["signature"] == "gdn-mixed-spec-decode-assert" and lc["group"] == "s/0"
    assert lc["pod"] == "s-0"
    assert "counted once" in fake.events[-1][1] and fake.events[-1][1].startswith("Engine group s/0")
    # the next crash of the group (after the restart) counts again
    crashwatch.handle_death(rt, "ns", "s", death("s-0-1", 2, "2026-11-22T10:02:00Z", B1))
    assert fake.obj["status"]["lastCrash"]["count"] == 2
    assert any(c["type"] == "CrashLooping" and c["status"] == "True" for c in fake.obj["status"]["conditions"])


def test_deaths_in_different_groups_are_separate_crashes(fake, rt):
    from gdn_operator.handlers.engines import crashwatch

    crashwatch.handle_death(rt, "ns", "s", death("s-0-1", 1, "2026-11-22T10:00:00Z", B1, group="s/0"))
    crashwatch.handle_death(rt, "ns", "s", death("s-1-1", 1, "2026-11-22T10:00:02Z", B1, group="s/1"))
    assert fake.obj["status"]["lastCrash"]["count"] == 2


def pool(*parents):
    return {"status": {"parents": [{"parentRef": {"name": gw}, "conditions": conds} for gw, conds in parents]}}


def cond(t, s, reason="R", msg=""):
    return {"type": t, "status": s, "reason": reason, "message": msg}


def test_pool_conditions_are_aggregated_over_parents():
    agg = router_h.aggregate(
        pool(
            ("gw-a", [cond("Accepted", "True", "Accepted"), cond("ResolvedRefs", "True")]),
            ("gw-b", [cond("Accepted", "False", "NotSupportedByParent", "no EPP"), cond("Exported", "True")]),
        )
    )
    assert agg["Accepted"] == (False, "NotSupportedByParent", "gateway gw-b: no EPP")
    assert agg["ResolvedRefs"][0] is True and "Exported" not in agg
    assert router_h.aggregate({"status": {}}) == {}


def test_pool_conditions_are_mirrored_and_dropped(monkeypatch):

    f = Fake()
    monkeypatch.setattr(statusguard, "update_status", f.update_status)
    router_h.mirror(
        Servers(),
        "ns",
        "s",
        pool(("gw", [cond("Accepted", "True", "Accepted"), cond("ResolvedRefs", "False", "InvalidExtensionRef")])),
    )
    conds = {c["type"]: c for c in f.obj["status"]["conditions"]}
    assert conds["InferencePoolAccepted"]["status"] == "True"
    assert (
        conds["InferencePoolResolvedRefs"]["status"] == "False"
        and conds["InferencePoolResolvedRefs"]["reason"] == "InvalidExtensionRef"
    )
    router_h.mirror(Servers(), "ns", "s", None)  # pool deleted
    assert not [c for c in f.obj["status"]["conditions"] if c["type"].startswith("InferencePool")]


def test_a_pod_of_the_incident_dying_again_is_a_new_crash(fake, rt):
    from gdn_operator.handlers.engines import (
        crashwatch,
    )  # worker, leader (same incident), then the worker again a few seconds later: that is the next crash

    crashwatch.handle_death(rt, "ns", "s", death("s-0-1", 1, "2026-11-22T10:00:00Z", B1))
    crashwatch.handle_death(rt, "ns", "s", death("s-0", 1, "2026-11-22T10:00:01Z", NCCL))
    assert fake.obj["status"]["lastCrash"]["incidentPods"] == ["s-0-1", "s-0"]
    crashwatch.handle_death(rt, "ns", "s", death("s-0-1", 2, "2026-11-22T10:00:04Z", B1))
    lc = fake.obj["status"]["lastCrash"]
    assert lc["count"] == 2 and lc["incidentPods"] == ["s-0-1"]


def test_missing_apis_are_refused_with_the_field_and_the_fix(rt):
    from gdn_operator.handlers.core import plan

    body = GMS().uid("u").update(tensorParallelSize=2, nodes=2, prefixCaching=False).obj()
    p = plan.plan(body, rt)  # rt: no optional CRD installed
    assert p.objects is None
    assert p.problem.startswith("spec.nodes 2 needs the LeaderWorkerSet API") and "set spec.nodes to 1" in p.problem
    body["spec"] = {**BASE, "prefixCaching": False, "router": {"inferencePool": {"endpointPicker": {"name": "epp"}}}}
    assert plan.plan(body, rt).problem.startswith("spec.router.inferencePool needs the Gateway API Inference Extension")


def test_keda_only_with_a_prometheus_address_and_its_crd():
    from runtime_helpers import FakeCrds, make_runtime
    from gdn_operator.handlers.core import plan

    spec_body = GMS().status({}).update(prefixCaching=False, autoscaling={"maxReplicas": 3, "target": 2}).obj()
    hpa_only = make_runtime()
    hpa_only.crds = FakeCrds(all=True)
    kinds = [o["kind"] for o in plan.plan(spec_body, hpa_only).objects]
    assert "HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds
    keda = make_runtime(keda_prometheus_address="http://prom:9090")
    keda.crds = FakeCrds(all=True)
    kinds = [o["kind"] for o in plan.plan(spec_body, keda).objects]
    assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    spec_body["status"] = {"conditions": [{"type": "CrashLooping", "status": "True"}]}
    so = next(o for o in plan.plan(spec_body, keda).objects if o["kind"] == "ScaledObject")
    from gdn_operator.render.autoscale import scale_up_paused

    assert scale_up_paused(so)


def test_only_group_leaders_are_scraped():
    from gdn_operator.handlers.core.pods import api_pods, pod_summary

    def p(name, labels):
        return pod_summary(EnginePod(name).labels(labels).obj())

    single = p("s-abc", {})
    leader = p("q-0", {"leaderworkerset.sigs.k8s.io/worker-index": "0", "leaderworkerset.sigs.k8s.io/group-index": "0"})
    worker = p("q-0-1", {"leaderworkerset.sigs.k8s.io/worker-index": "1", "leaderworkerset.sigs.k8s.io/group-index": "0"})
    assert (single["leader"], leader["leader"], worker["leader"]) == (None, True, False)
    assert [x["name"] for x in api_pods([single, leader, worker])] == ["s-abc", "q-0"]
