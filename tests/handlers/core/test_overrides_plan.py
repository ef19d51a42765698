"""Overrides at render (handlers/core/plan.py) and the upgrade from spec-writing remediation (issue 23)."""

from __future__ import annotations

import copy

from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.api.overrides import CLEAR_ANNOTATION, add_override
from gdn_operator.api.specpatch import SpecPatch
from gdn_operator.handlers.core.plan import plan

from builders import GMS, SMALL_RESOURCES

#: as the operator reads it: no field the rules judge set
BARE = GMS().uid("u").generation(1).annotations({}).status({}).update(resources=SMALL_RESOURCES)
SERVER = BARE.update(tensorParallelSize=2, asyncScheduling=True)  # async set on: vllm#51508's mitigation overrides it
SPEC = SERVER.spec()
SIG = "cuda-illegal-address-accepted-sync"


def argv(p):
    dep = next(o for o in p.objects if o["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    return c.get("args", []) + c.get("command", [])


def remediated(spec=SPEC):
    status: dict = {}
    add_override(status, SpecPatch.of({"asyncScheduling": False}), reason=SIG, generation=1, since="t", spec=spec)
    return status


def test_the_workload_carries_the_override_and_the_spec_does_not(rt):
    b = SERVER.status(remediated()).obj()
    p = plan(b, rt)
    assert "--no-async-scheduling" in argv(p) and "--async-scheduling" not in argv(p)
    assert b["spec"]["asyncScheduling"] is True  # plan writes nothing
    assert [(o["path"], o["value"], o["reason"]) for o in p.overrides] == [("asyncScheduling", False, SIG)]
    # without the override the user's value runs
    assert "--async-scheduling" in argv(plan(SERVER.obj(), rt))


def test_ended_overrides_stop_at_render(rt):
    p = plan(SERVER.update(asyncScheduling=False).status(remediated()).obj(), rt)  # the user changed the field
    assert not p.overrides and p.ended and p.ended[0][1] == "the spec changed asyncScheduling"
    p = plan(SERVER.status(remediated()).annotations({CLEAR_ANNOTATION: "now"}).obj(), rt)
    assert not p.overrides and p.cleared == "now" and "--async-scheduling" in argv(p)


def test_mitigations_under_policy_mitigate_are_overrides_too(rt):
    mitigated = SERVER.update(prefixCaching=True, admissionPolicy="mitigate")
    p = plan(mitigated.obj(), rt)
    assert "--no-enable-prefix-caching" in argv(p)
    assert [(o["path"], o["value"], o["reason"], o["source"]) for o in p.overrides] == [
        ("prefixCaching", False, "vllm#43559", "mitigation")
    ]
    # the next reconcile keeps the recorded entry as it was (no status churn)
    again = plan(mitigated.status({"overrides": p.overrides}).obj(), rt)
    assert again.overrides == p.overrides


def test_unset_fields_render_their_safe_defaults(rt):
    p = plan(BARE.obj(), rt)
    a = argv(p)
    for flag in ("--no-enable-prefix-caching", "--no-async-scheduling"):
        assert flag in a
    assert a[a.index("--gdn-prefill-backend") + 1] == "triton"
    assert {d["field"]: d["rule"] for d in p.ev.effective.model_dump(by_alias=True)["defaults"]} == {
        "prefixCaching": "vllm#43559",
        "asyncScheduling": "vllm#51508",
        "gdnPrefillBackend": "flashinfer#3329",
    }
    assert not p.overrides  # defaults are not overrides: the user set nothing they replace


def test_upgrade_a_server_patched_by_the_old_remediation_keeps_running_its_patched_spec(rt, monkeypatch):
    """Before overrides the crash watch wrote the fix into .spec and the annotation last-remediation. After the
    upgrade those fields are the spec's own values (judged by the policy like any set value: the remediation
    was admitted when made), the annotation is left alone (never read, never written again), and the old
    status.remediations record (no revision) still counts for its generation."""
    from gdn_operator.handlers.core import kube
    from gdn_operator.handlers.core import remediation
    from gdn_operator.watch.signatures import classify_text

    old = (
        SERVER.update(asyncScheduling=False, remediation={"mode": "auto", "threshold": 1})
        .generation(2)
        .annotations({"serving.gdn-operator.io/last-remediation": f"{SIG}: asyncScheduling=false"})
        .status({"remediations": [{"signature": SIG, "generation": 1, "action": "asyncScheduling=false"}]})
        .obj()
    )
    p = plan(old, rt)
    assert p.objects and "--no-async-scheduling" in argv(p) and not p.overrides
    # the next crash loop on the new operator: an override; the spec and the annotation untouched
    obj = copy.deepcopy(old)

    def update_status(ns, name, mutate, retries=8, obj=obj):
        status = copy.deepcopy(obj["status"])
        mutate(status, obj)
        obj["status"] = status
        return obj

    monkeypatch.setattr(statusguard, "update_status", update_status)
    monkeypatch.setattr(kube, "emit_event", lambda *a, **k: None)
    r = classify_text(B4_TAIL)
    change = remediation.maybe_remediate(Servers(), "ns", "s", obj, r, 1, 2, policy="reject")
    # async is already off (the old patch, now the spec's own value): the ladder's last resort is left
    assert change is not None and change.action == "speculativeDecoding.enabled=false"
    assert obj["spec"] == old["spec"] and obj["metadata"] == old["metadata"]
    assert [(o["path"], o["reason"], o["generation"]) for o in obj["status"]["overrides"]] == [
        ("speculativeDecoding.enabled", r.signature, 2)
    ]
    assert len(obj["status"]["remediations"]) == 2  # the old record (generation 1) kept, the new one added


B4_TAIL = (
    '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu_model_runner.py", line 1927, in _update_states_after_model_execute\n'
    "    self.num_accepted_tokens_event.synchronize()\n"
    "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
)
