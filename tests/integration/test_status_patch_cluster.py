"""statusguard.update_status (what handlers/core/servers.py writes status with) against the real kube-apiserver (issue 11 part 8): one guarded JSON patch, no read when
the body is current or only other keys moved, a concurrent change of the same key detected and kept, values
the API server's `test` cannot compare (non-ASCII, `>=`) guarded by the resourceVersion instead."""

from __future__ import annotations

import copy
import uuid

import kubernetes
import pytest

from gdn_operator.handlers.core import kube

from gdn_operator.handlers.core import statusguard
from gdn_operator.handlers.core import conditions as st
from operator_harness import Kube, gms, install_crd


@pytest.fixture
def server(kube_api, monkeypatch):
    install_crd(kube_api)
    k = Kube(kube_api)
    core = kubernetes.client.CoreV1Api(kube_api)
    ns = f"sp-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})  # core tier: no service-account controller to wait for
    k.create(ns, gms("s"))
    monkeypatch.setattr(kube, "api_client", lambda: kube_api)
    reads: list[str] = []
    get = statusguard.get_server
    monkeypatch.setattr(statusguard, "get_server", lambda n, name: reads.append(name) or get(n, name))
    yield k, ns, reads
    core.delete_namespace(ns)


def _set(type_, value, reason, message):
    return lambda status, obj: st.set_condition(status, type_, value, reason, message, obj["metadata"].get("generation"))


def test_one_patch_without_a_read_and_other_writers_keys_kept(server):
    k, ns, reads = server
    body = k.get(ns, "s")
    first = statusguard.update_status(
        ns, "s", _set(st.VALIDATED, True, "Admitted", "Admitted; known issues to watch: vllm#1"), obj=body
    )
    assert reads == []  # the body was current: written by version, not read
    # kopf's own annotation patch and another writer's key move the object on
    k.patch(ns, "s", {"metadata": {"annotations": {"kopf.serving.gdn-operator.io/last-handled-configuration": "{}"}}})
    statusguard.update_status(ns, "s", lambda status, _o: status.__setitem__("workload", "Deployment"))
    reads.clear()
    # a writer holding the body from before both changes: its conditions key did not move, so no read
    out = statusguard.update_status(ns, "s", _set(st.READY, False, "EnginesNotReady", "0/1 engine pods ready."), obj=first)
    assert reads == []
    assert out["status"]["workload"] == "Deployment"  # the other writer's key is kept
    assert st.get_condition(out["status"], st.VALIDATED)["message"] == "Admitted; known issues to watch: vllm#1"
    assert st.get_condition(out["status"], st.READY)["reason"] == "EnginesNotReady"


def test_a_concurrent_change_of_the_same_key_is_read_again_and_kept(server):
    k, ns, reads = server
    body = statusguard.update_status(ns, "s", _set(st.VALIDATED, True, "Admitted", "ok"), obj=k.get(ns, "s"))
    stale = copy.deepcopy(body)
    statusguard.update_status(ns, "s", _set(st.READY, True, "EnginesReady", "1/1 engine pods ready."), obj=body)
    reads.clear()
    out = statusguard.update_status(ns, "s", _set(st.PROGRESSING, False, "RolloutComplete", "done"), obj=stale)
    assert reads == ["s"]  # the conditions it was computed from moved: refused, read again, re-applied
    conds = {c["type"]: c["status"] for c in out["status"]["conditions"]}
    assert conds == {"Validated": "True", "Ready": "True", "Progressing": "False"}


def test_a_non_ascii_value_is_guarded_by_the_version(server):
    k, ns, reads = server
    body = statusguard.update_status(
        ns, "s", _set(st.VALIDATED, True, "AdmittedWithWarnings", "vllm#1 — affects >=0.18.0"), obj=k.get(ns, "s")
    )
    reads.clear()
    # the API server's test would not find this text equal to itself: the resourceVersion guards instead
    out = statusguard.update_status(ns, "s", _set(st.VALIDATED, True, "Admitted", "plain"), obj=body)
    assert reads == [] and st.get_condition(out["status"], st.VALIDATED)["message"] == "plain"
    k.patch(ns, "s", {"metadata": {"annotations": {"x": "y"}}})
    reads.clear()
    out = statusguard.update_status(ns, "s", _set(st.VALIDATED, True, "Admitted", "again"), obj=body)
    assert reads == ["s"] and st.get_condition(out["status"], st.VALIDATED)["message"] == "again"
