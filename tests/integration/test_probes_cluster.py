"""Output probes on the real control plane: kwok gives the engine pod a loopback IP, and a stand-in engine
bound to that IP answers the operator's greedy /v1/completions probes correctly, then wrongly, then stops
early, then not at all. Checked: status.probes, the OutputConsistent / Degraded conditions, Events, the
exported metrics, no alarm on one blip, and the remediation hook: a spec that sets asyncScheduling true is
admitted with the silent-corruption warning vllm#51508, whose mitigation asyncScheduling=false is recorded
exactly once as an operator override (status.overrides; the spec and its generation never change, the
Deployment renders it), after which the probes re-learn on the new revision (generation + overrides in force)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from probe_standin import CORRECT, EARLY, SLOW, WRONG, WRONG_AT, ProbeStandIn, answer_for  # noqa: E402

from operator_harness import Kube, gms, metric, running_operator, wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(600)

PORT = 8000  # render/engine.py ENGINE_PORT: the operator probes pod-ip:8000
COUNT, RECALL = [5, 6, 7], [100, 200]
PROBES = {
    "intervalSeconds": 5,
    "timeoutSeconds": 2,
    "failureThreshold": 3,
    "prompts": [
        {"name": "count", "promptTokenIds": COUNT, "maxTokens": 8},  # expected: learn
        {"name": "recall", "promptTokenIds": RECALL, "maxTokens": 8, "expectedTokenIds": answer_for(RECALL, 8)},
    ],
}


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-probes")) as proc:
        yield proc


def result(k: Kube, ns: str, name: str, probe: str) -> dict:
    for r in (k.status(ns, name).get("probes") or {}).get("results") or []:
        if r["probe"] == probe:
            return r
    return {}


def test_probe_lifecycle_blip_alarms_remediation_relearn(op, kube_api):
    k = Kube(kube_api)
    ns = k.create_namespace(f"probe-{uuid.uuid4().hex[:6]}")
    engines: dict[str, ProbeStandIn] = {}
    try:
        # asyncScheduling set on (unset, the rules' safe default is off and vllm#51508 is not warned at all)
        k.create(ns, gms("pr", probes=PROBES, asyncScheduling=True))
        k.wait_condition(ns, "pr", "Ready", timeout=90)
        pod = k.ready_pod(ns, "pr")
        ip = pod.status.pod_ip
        assert ip.startswith("127."), f"kwok pod IP {ip} is not loopback"
        eng = engines[ip] = ProbeStandIn(ip, PORT)
        submitted = k.get(ns, "pr")
        gen, spec = submitted["metadata"]["generation"], submitted["spec"]
        assert "--async-scheduling" in k.deployment(ns, "pr").spec.template.spec.containers[0].args

        # ---- learn, then consistent -----------------------------------------------------------
        c = k.wait_condition(ns, "pr", "OutputConsistent", "True", timeout=60)
        assert c["reason"] == "ProbesPassing"
        probes = k.status(ns, "pr")["probes"]
        ref = probes["reference"]
        assert ref["generation"] == gen and ref["pod"] == pod.metadata.name and ref["image"] == "vllm/vllm-openai:v0.33.0"
        assert [a["tokenIds"] for a in ref["answers"]] == [answer_for(COUNT, 8)]  # recall has its own expectation
        assert probes["podsProbed"] == 1 and probes["generation"] == gen
        body = eng.bodies[0]
        assert body["temperature"] == 0.0 and body["model"] == "pr" and body["return_token_ids"] is True
        wait_for(lambda: k.events(ns, "pr", "OutputConsistent"), 15, what="OutputConsistent Event")
        wait_for(
            lambda: metric(op.metrics(), "gdn_probe_total", absent=0.0, server="pr", probe="count", result="pass") >= 1,
            30,
            what="a counted pass",
        )
        text = op.metrics()
        assert metric(text, "gdn_probe_total", absent=0.0, namespace=ns, server="pr", probe="count", result="learned") == 1
        assert metric(text, "gdn_probe_duration_seconds_count", absent=0.0) >= 2

        # ---- one blip: counted, no alarm ------------------------------------------------------
        eng.set(WRONG)
        r = wait_for(
            lambda: (lambda r: r if r.get("consecutiveFailures") == 1 else None)(result(k, ns, "pr", "count")),
            30,
            interval=0.2,
            what="one failed round",
        )
        eng.set(CORRECT)
        assert r["lastResult"] == "mismatch" and r["lastFailure"]["position"] == WRONG_AT
        assert k.condition(ns, "pr", "OutputConsistent")["status"] == "True"
        wait_for(lambda: result(k, ns, "pr", "count").get("consecutiveFailures") == 0, 30, interval=0.5, what="recovery")
        assert k.condition(ns, "pr", "OutputConsistent")["status"] == "True"
        assert not k.events(ns, "pr", "ProbeMismatch")

        # ---- consistently wrong: alarm, diagnosis, remediation once ---------------------------
        eng.set(WRONG)
        c = k.wait_condition(ns, "pr", "OutputConsistent", "False", timeout=60, reason="ProbeMismatch")
        # the round that wrote this condition set the gauge before its status write: read it now. The remediation
        # below changes the revision, and a round on the new revision (relearning) sets it back to 0, which a loaded
        # run reached before a read placed after the remediation's checks
        wait_for(
            lambda: (
                metric(op.metrics(), "gdn_output_inconsistent", absent=0.0, namespace=ns, server="pr", reason="ProbeMismatch")
                == 1
            ),
            15,
            what="gdn_output_inconsistent{reason=ProbeMismatch} = 1",
        )
        assert "vllm#51508" in c["message"] and f"token {WRONG_AT} differs" in c["message"]
        d = k.condition(ns, "pr", "Degraded")
        assert d["status"] == "True" and d["reason"] == "ProbeMismatch"
        ev = wait_for(lambda: k.events(ns, "pr", "ProbeMismatch"), 15, what="ProbeMismatch Event")
        assert ev[0].type == "Warning"
        # the remediation is an operator-owned override: listed in status, rendered into the Deployment; the
        # spec, its generation and the user's annotations are never written
        obj = wait_for(
            lambda: (lambda o: o if (o.get("status") or {}).get("overrides") else None)(k.get(ns, "pr")),
            30,
            what="the remediation's override in status.overrides",
        )
        assert obj["spec"] == spec and obj["spec"]["asyncScheduling"] is True and obj["metadata"]["generation"] == gen
        assert "serving.gdn-operator.io/last-remediation" not in (obj["metadata"].get("annotations") or {})
        (ov,) = obj["status"]["overrides"]
        assert (ov["path"], ov["value"], ov["reason"], ov["source"], ov["generation"], ov["userValue"]) == (
            "asyncScheduling",
            False,
            "vllm#51508",
            "remediation",
            gen,
            True,
        )
        (rem,) = obj["status"]["remediations"]
        assert rem["signature"] == "vllm#51508" and rem["generation"] == gen and rem["changes"] == {"asyncScheduling": False}
        assert rem["revision"] == str(gen)  # made on the revision before the override
        assert k.condition(ns, "pr", "Overridden")["status"] == "True"
        wait_for(
            lambda: "--no-async-scheduling" in k.deployment(ns, "pr").spec.template.spec.containers[0].args,
            30,
            what="the override rendered into the Deployment",
        )
        assert wait_for(lambda: k.events(ns, "pr", "Remediated"), 15, what="Remediated Event")

        # ---- the overridden engine (a new revision, same generation) is learned afresh ---------
        new = k.ready_pod(ns, "pr", not_named=pod.metadata.name)
        assert "--no-async-scheduling" in new.spec.containers[0].args
        ip2 = new.status.pod_ip
        if ip2 not in engines:
            engines[ip2] = ProbeStandIn(ip2, PORT)
        eng = engines[ip2]
        eng.set(CORRECT)

        def relearned():
            p = k.status(ns, "pr").get("probes") or {}
            c = k.condition(ns, "pr", "OutputConsistent") or {}
            ref = p.get("reference") or {}
            ok = (
                p.get("revision") not in (None, str(gen))
                and ref.get("revision") == p.get("revision")
                and c.get("status") == "True"
            )
            return p if ok else None

        p2 = wait_for(relearned, 90, interval=0.5, what="re-learned reference on the overridden revision")
        assert p2["reference"]["pod"] == new.metadata.name and p2["generation"] == gen == p2["reference"]["generation"]
        assert p2["revision"].startswith(f"{gen}+")
        assert k.condition(ns, "pr", "Degraded")["status"] == "False"

        # ---- early stop: alarm with its own reason, and no second remediation ------------------
        eng.set(EARLY)
        c = k.wait_condition(ns, "pr", "OutputConsistent", "False", timeout=60, reason="ProbeEarlyStop")
        assert "stopped after 2 tokens (stop)" in c["message"] and "vllm#51508" not in c["message"]
        obj = k.get(ns, "pr")
        assert len(obj["status"]["remediations"]) == 1 and len(obj["status"]["overrides"]) == 1
        assert obj["metadata"]["generation"] == gen and obj["spec"] == spec
        assert len(k.events(ns, "pr", "Remediated")) == 1

        # ---- no answer in time (issue 38): Unknown/ProbeTimeout, a warning, not an inconsistency ----
        eng.set(CORRECT)
        k.wait_condition(ns, "pr", "OutputConsistent", "True", timeout=60)
        eng.set(SLOW)
        c = k.wait_condition(ns, "pr", "OutputConsistent", "Unknown", timeout=60, reason="ProbeTimeout")
        assert "timeout" in c["message"] and "not a wrong answer" in c["message"]
        assert k.condition(ns, "pr", "Degraded")["status"] == "False"  # no answer does not degrade the server
        assert k.status(ns, "pr")["probes"]["state"] == "NoAnswer"
        evs = wait_for(lambda: k.events(ns, "pr", "ProbeTimeout"), 30, what="ProbeTimeout Event")
        assert [e.type for e in evs] == ["Warning"]
        text = op.metrics()
        assert metric(text, "gdn_probe_failing", absent=0.0, namespace=ns, server="pr", reason="ProbeTimeout") == 1
        assert metric(text, "gdn_output_inconsistent", absent=0.0, namespace=ns, server="pr") == 0
        eng.set(CORRECT)
        k.wait_condition(ns, "pr", "OutputConsistent", "True", timeout=60)
        assert k.condition(ns, "pr", "Degraded")["status"] == "False"
        text = op.metrics()
        for res in ("mismatch", "early-stop", "error"):
            assert metric(text, "gdn_probe_total", absent=0.0, namespace=ns, server="pr", result=res) >= 2, res
        assert metric(text, "gdn_output_inconsistent", absent=0.0, namespace=ns, server="pr") == 0
        assert metric(text, "gdn_probe_failing", absent=0.0, namespace=ns, server="pr", reason="ProbeTimeout") == 0
        assert op.alive()

        # ---- probes removed: Unknown, status.probes gone --------------------------------------
        k.patch(ns, "pr", {"spec": {"probes": None}})
        k.wait_condition(ns, "pr", "OutputConsistent", "Unknown", timeout=30, reason="ProbesDisabled")
        assert "probes" not in k.status(ns, "pr")
    finally:
        for e in engines.values():
            e.close()
        k.delete_namespace(ns)
