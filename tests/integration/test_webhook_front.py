"""The webhook front (front.py, GDN_WEBHOOK_PROCESS=own, the default): the admission webhook in a
process of its own, through the real API server.

It must answer exactly as kopf's server in the operator's process does (the same reviews sent to both, answers
compared), keep answering while the operator's process is busy (here: stopped outright), end with the operator's
process however it ends, and be started again when it exits on its own.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import ssl
import urllib.request
from typing import Any

import pytest

from controlplane import port_refuses
from gdn_operator import GROUP, PLURAL, VERSION
from gdn_operator.handlers.guard.admission import GUARD_WEBHOOK_ID
from operator_harness import gms, running_webhook_operator, wait_for
from test_hostile_input import post_raw

_LISTENS = re.compile(r"webhook front \(pid (\d+)\) listens on [^:]*:(\d+); kopf's server on 127\.0\.0\.1:(\d+)")


def front_of(op: Any, nth: int = -1) -> tuple[int, int, int]:
    """(the front's pid, its port, the port of kopf's server behind it) from the operator's log: its `nth` start."""
    found = _LISTENS.findall(op.log_path.read_text(errors="replace"))
    assert found, f"no webhook front in the operator's log:\n{op.log_tail()}"
    pid, port, backend = found[nth]
    return int(pid), int(port), int(backend)


def answering(kube_api: Any) -> bool:
    return post_raw(kube_api, "default", json.dumps(gms("warmup")), dry_run=True)[0] == 201


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    with running_webhook_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-front")) as proc:
        wait_for(lambda: answering(kube_api), 60, interval=0.5, what="webhook answering")
        yield proc


def review(obj: Any, *, operation: str = "CREATE", old: Any = None, uid: str = "u-1", **request: Any) -> dict[str, Any]:
    req = {
        "uid": uid,
        "kind": {"group": GROUP, "version": VERSION, "kind": "GDNModelServer"},
        "resource": {"group": GROUP, "version": VERSION, "resource": PLURAL},
        "namespace": "ml",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def with_ns(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"]["namespace"] = "ml"
    return obj


def post_review(port: int, path: str, body: Any) -> tuple[int, Any]:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"https://127.0.0.1:{port}{path}", data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


FINE = with_ns(gms("fine"))
REFUSED = with_ns(gms("refused", image={"tag": "v0.17.1", "vllmVersion": "0.17.1"}, admissionPolicy="reject"))
CASES = {
    "admitted": review(FINE),
    "refused by a rule": review(REFUSED),
    "invalid spec": review(with_ns(gms("badflag", extraArgs=["--speculative-config={}"]))),
    "spec not a mapping": review({**FINE, "spec": "text"}),
    "no spec": review({k: v for k, v in FINE.items() if k != "spec"}),
    "bad name": review(with_ns(gms("Not_A_Name"))),
    "update, spec unchanged": review(REFUSED, operation="UPDATE", old=REFUSED),
    "update to a refused spec": review(
        {**FINE, "spec": {**FINE["spec"], "prefixCaching": True, "admissionPolicy": "reject"}}, operation="UPDATE", old=FINE
    ),
    "delete": review(None, operation="DELETE", old=FINE),
    # kopf runs a validating handler for any operation its webhook gets (the configurations send CREATE and UPDATE)
    "connect": review(REFUSED, operation="CONNECT"),
    "another version": review(REFUSED, resource={"group": GROUP, "version": "v1", "resource": PLURAL}),
    "no user": review(FINE, userInfo=None),
    "no object": review(None, operation="CREATE"),
    "another resource": review(FINE, resource={"group": "apps", "version": "v1", "resource": "deployments"}),
    "a subresource": review(FINE, operation="UPDATE", old=FINE, subResource="status"),
    "warned": review(with_ns(gms("warned", asyncScheduling=True, admissionPolicy="warn"))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_front_answers_as_kopfs_server_in_the_operators_process(op, case):
    _, port, backend = front_of(op)
    body = CASES[case]
    via_front = post_review(port, "/gdn-admission", body)
    in_operator = post_review(backend, "/gdn-admission", body)
    assert via_front == in_operator
    assert via_front[0] != 500


def test_the_paths_the_front_does_not_answer_reach_the_operators_process(op):
    _, port, backend = front_of(op)
    for path, body in [
        ("/gdn-admission", b"{not json"),  # kopf's server refuses it
        ("/no-such-webhook", review(FINE)),
        (f"/{GUARD_WEBHOOK_ID}", review(FINE)),
    ]:
        assert post_review(port, path, body) == post_review(backend, path, body), path


def test_admission_is_answered_while_the_operators_process_is_stopped(op, kube_api):
    """The point of the front: the operator's process can be as busy as it likes (here: not running at all) and
    GDNModelServer admission is still answered, refusals included."""
    os.kill(op.proc.pid, signal.SIGSTOP)
    try:
        assert answering(kube_api)
        refused = gms("refused", image={"tag": "v0.17.1", "vllmVersion": "0.17.1"}, admissionPolicy="reject")
        code, status = post_raw(kube_api, "default", json.dumps(refused), dry_run=True)
        assert code == 403 and "vllm#36917" in status["message"]
    finally:
        os.kill(op.proc.pid, signal.SIGCONT)


def test_a_front_that_exits_is_started_again(op, kube_api):
    pid, port, _ = front_of(op)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: front_of(op)[0] != pid, 30, what="a new webhook front in the operator's log")
    new_pid, new_port, _ = front_of(op)
    assert new_port == port
    assert "the webhook front exited with -9; starting it again" in op.log_path.read_text(errors="replace")
    wait_for(lambda: answering(kube_api), 30, interval=0.5, what="webhook answering again")


def test_the_front_ends_with_the_operators_process(full_cluster, kube_api, tmp_path):
    with running_webhook_operator(full_cluster, kube_api, tmp_path / "op") as proc:
        pid, port, _ = wait_for(lambda: _LISTENS.search(proc.log_path.read_text(errors="replace")), 60).groups()
        assert not port_refuses(int(port))
        os.kill(proc.proc.pid, signal.SIGKILL)  # the operator's process alone: no clean-up, the front is not told
        proc.proc.wait(10)
        wait_for(lambda: port_refuses(int(port)), 15, what="the front's port closed")
        wait_for(lambda: gone(int(pid)), 15, what=f"front pid {pid} gone")


def gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie until whoever adopted it reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
