"""Issue 38 item 3 in render: the model's Hub revision pinned into the download step and the engine, the
download through the `hf` CLI with include patterns, the created cache claim kept when the server is deleted
unless retainPolicy Delete, and a multi-node engine with a shared (ReadWriteMany) cache downloading once, on
the leader, its workers waiting for the leader's download."""

from pathlib import Path

import pytest
import yaml

from gdn_operator.api.cache import DEFAULT_INCLUDE
from gdn_operator.api.load import parse_spec
from gdn_operator.render import podparts
from gdn_operator.render.engine import deployment
from gdn_operator.render.lws import leader_worker_set
from gdn_operator.render.objects import render_all

from builders import GMS, MODEL

ROOT = Path(__file__).resolve().parents[2]
V32 = GMS().version("0.32.0")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MULTI = {"nodes": 2, "tensorParallelSize": 2}


def hf_args(init):
    """What the init container passes to `hf download` (after sh's $0 and the ready marker)."""
    assert init["command"][:3] == ["sh", "-c", podparts.DOWNLOAD_SCRIPT]
    return init["command"][5:]


def pod(spec_):
    return deployment("srv", "ns", spec_)["spec"]["template"]["spec"]


def test_revision_is_pinned_into_the_download_and_the_engine():
    s = parse_spec(V32.merge(model={"uri": MODEL, "revision": COMMIT}).spec())
    ps = pod(s)
    args = hf_args(ps["initContainers"][0])
    assert args[:3] == ["Qwen/Qwen3.5-27B", "--revision", COMMIT]
    engine = ps["containers"][0]["args"]
    assert engine[engine.index("--revision") + 1] == COMMIT  # the offline engine loads that snapshot


def test_unset_revision_renders_none_and_default_include_patterns():
    ps = pod(parse_spec(V32.spec()))
    args = hf_args(ps["initContainers"][0])
    assert "--revision" not in args and "--revision" not in ps["containers"][0]["args"]
    assert args[1:] == [a for p in DEFAULT_INCLUDE for a in ("--include", p)]
    assert "*.safetensors" in DEFAULT_INCLUDE and "*.gguf" not in DEFAULT_INCLUDE


def test_include_patterns_and_the_ready_marker_depend_on_them():
    base = parse_spec(V32.spec())
    s = parse_spec(V32.merge(model={"uri": MODEL, "cache": {"include": ["*.json", "model-0000*.safetensors"]}}).spec())
    args = hf_args(pod(s)["initContainers"][0])
    assert args == ["Qwen/Qwen3.5-27B", "--include", "*.json", "--include", "model-0000*.safetensors"]
    assert podparts.ready_marker(s) != podparts.ready_marker(base)
    assert podparts.ready_marker(s).startswith(podparts.READY_DIR + "/Qwen--Qwen3.5-27B@default-")
    pinned = parse_spec(V32.merge(model={"uri": MODEL, "revision": "v1.0"}).spec())
    assert "@v1.0-" in podparts.ready_marker(pinned)


@pytest.mark.parametrize(("policy", "owned"), [(None, False), ("Retain", False), ("Delete", True)])
def test_created_claim_is_retained_unless_delete(policy, owned):
    claim = {"size": "900Gi"} | ({"retainPolicy": policy} if policy else {})
    s = parse_spec(V32.merge(model={"uri": MODEL, "cache": {"persistentVolumeClaim": claim}}).spec())
    pvc = {o["kind"]: o for o in render_all("srv", "ns", s, uid="u")}["PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "srv-model-cache"
    assert bool(pvc["metadata"].get("ownerReferences")) is owned
    if owned:
        assert pvc["metadata"]["ownerReferences"][0]["uid"] == "u"


def test_multinode_with_a_shared_claim_downloads_once_on_the_leader():
    s = parse_spec(
        V32.merge(model={"uri": MODEL, "revision": COMMIT, "cache": {"persistentVolumeClaim": {"size": "900Gi"}}})
        .update(**MULTI)
        .spec()
    )
    t = leader_worker_set("srv", "ns", s)["spec"]["leaderWorkerTemplate"]
    [lead] = t["leaderTemplate"]["spec"]["initContainers"]
    [wait] = t["workerTemplate"]["spec"]["initContainers"]
    assert lead["name"] == podparts.DOWNLOAD_CONTAINER and hf_args(lead)[:3] == ["Qwen/Qwen3.5-27B", "--revision", COMMIT]
    assert wait["name"] == podparts.WAIT_CONTAINER
    marker = podparts.ready_marker(s)
    assert lead["command"][4] == marker and wait["command"] == ["sh", "-c", podparts.WAIT_SCRIPT, "model-wait", marker]
    assert "hf" not in wait["command"][2]  # the worker never reaches the Hub
    for tpl in (t["leaderTemplate"], t["workerTemplate"]):
        assert {"name": "cache", "persistentVolumeClaim": {"claimName": "srv-model-cache"}} in tpl["spec"]["volumes"]


@pytest.mark.parametrize("cache", [{}, {"emptyDir": {"sizeLimit": "900Gi"}}])
def test_multinode_without_a_shared_cache_downloads_on_every_pod(cache):
    s = parse_spec(V32.merge(model={"uri": MODEL, "cache": cache}).update(**MULTI).spec())
    t = leader_worker_set("srv", "ns", s)["spec"]["leaderWorkerTemplate"]
    for tpl in (t["leaderTemplate"], t["workerTemplate"]):
        assert [c["name"] for c in tpl["spec"]["initContainers"]] == [podparts.DOWNLOAD_CONTAINER]


def test_the_397b_example_downloads_once_into_a_retained_shared_claim():
    """The 2-node example (~800 GB): one ReadWriteMany claim, kept on delete, filled once by the leader."""
    doc = yaml.safe_load((ROOT / "examples" / "qwen3.5-397b-a17b-2node.yaml").read_text())
    s = parse_spec(doc["spec"])
    name = doc["metadata"]["name"]
    objs = {o["kind"]: o for o in render_all(name, "default", s, uid="u")}
    pvc = objs["PersistentVolumeClaim"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and "ownerReferences" not in pvc["metadata"]
    t = objs["LeaderWorkerSet"]["spec"]["leaderWorkerTemplate"]
    assert [c["name"] for c in t["leaderTemplate"]["spec"]["initContainers"]] == [podparts.DOWNLOAD_CONTAINER]
    assert [c["name"] for c in t["workerTemplate"]["spec"]["initContainers"]] == [podparts.WAIT_CONTAINER]
