"""Known-crash rules on the launch line of a foreign workload's pod template (issue 35, rules/workload.py):
the same rule lines `gdnctl validate -- vllm serve ...` prints, warned or refused per the guard's policy.

The known-crash launch line is vllm#36917 (GDN attention AssertionError on a mixed decode / spec-decode
batch, vLLM < 0.18.0 with MTP); the clean one runs 0.33.0 with the known risks turned off."""

import pytest

from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.rules.launchline import evaluate_launch
from gdn_operator.rules.workload import judge_workload, launch_argv, pod_specs

from builders import CLEAN_ARGS, ENGINE_ARGS, Guard, Workload

#: the guard of these tests selects app=my-vllm (Guard's default for its name), and the Deployment it selects, with
#: a sidecar before the engine container
GUARD = Guard("my-vllm")
MY_VLLM = Workload("my-vllm").labelled({"app": "my-vllm"}).sidecar()


def spec_of(guard: Guard) -> GDNGuardSpec:
    return GDNGuardSpec.model_validate(guard.spec())


WARN, DENY = spec_of(GUARD.policy("warn")), spec_of(GUARD.policy("deny"))


def test_known_crash_is_warned_with_the_gdnctl_rule_line():
    v = judge_workload(MY_VLLM.tag("v0.17.1").obj(), WARN)
    assert v.allowed and "vllm#36917" in v.rules
    _, ev = evaluate_launch(["vllm", "serve", *ENGINE_ARGS], vllm_version="0.17.1", policy="warn")
    assert [f.line() for f in ev.findings if f.action == "warned"] == v.warnings  # the same messages as gdnctl validate


def test_known_crash_is_refused_under_policy_deny():
    v = judge_workload(MY_VLLM.tag("v0.17.1").obj(), DENY, "team/g")
    assert not v.allowed
    assert v.denied.startswith("Deployment my-vllm refused by GDNGuard team/g (admission policy deny)")
    assert "vllm#36917" in v.denied


def test_clean_launch_line_is_admitted_without_warnings():
    for policy in ("warn", "deny"):
        v = judge_workload(MY_VLLM.tag("v0.33.0").args(*CLEAN_ARGS).obj(), spec_of(GUARD.policy(policy)))
        assert v.allowed and v.warnings == [] and v.notes == [], (policy, v)
        assert len(v.evaluations) == 1


def test_unknown_release_is_a_note_not_a_verdict():
    v = judge_workload(MY_VLLM.tag("latest").obj(), DENY)
    assert v.allowed and v.rules == []
    assert "gdn-operator.io/vllm-version" in v.notes[0]
    annotated = MY_VLLM.tag("latest").template_annotations({"gdn-operator.io/vllm-version": "0.17.1"}).obj()
    assert not judge_workload(annotated, DENY).allowed  # the default falls back to the annotation
    pinned = spec_of(GUARD.policy("deny").update(vllmVersion={"pinned": "0.17.1"}))
    assert not judge_workload(MY_VLLM.tag("latest").obj(), pinned).allowed


def test_custom_tag_pattern():
    g = spec_of(GUARD.policy("deny").update(vllmVersion={"imageTag": {"pattern": r"^release-([0-9.]+)$"}}))
    assert not judge_workload(MY_VLLM.tag("release-0.17.1").obj(), g).allowed
    assert judge_workload(MY_VLLM.tag("v0.17.1").obj(), g).notes  # the pattern does not match: release unknown


def test_env_literal_values_lead_the_line_and_sh_c_is_read():
    c = {
        "name": "e",
        "command": ["/bin/sh", "-c", "exec vllm serve Qwen/Qwen3.5-9B --port 9000"],
        "env": [{"name": "A", "value": "1"}],
    }
    assert launch_argv(c) == ["A=1", "vllm", "serve", "Qwen/Qwen3.5-9B", "--port", "9000"]  # `exec` dropped
    c["command"] = ["/bin/sh", "-c", "vllm serve Qwen/Qwen3.5-9B --port 9000; sleep 5"]
    assert launch_argv(c)[-2:] == ["sleep", "5"]  # a script is read as written: the reader reports the stray words
    c["command"] = ["/bin/sh", "-c", "vllm serve Qwen/Qwen3.5-9B --port 9000"]
    c["env"] += [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    assert launch_argv(c) == ["A=1", "vllm", "serve", "Qwen/Qwen3.5-9B", "--port", "9000"]
    assert launch_argv({"name": "x", "image": "busybox", "args": ["serve"]}) is None


def test_named_container_and_no_engine():
    g = spec_of(GUARD.policy("deny").update(container="proxy"))
    v = judge_workload(MY_VLLM.tag("v0.17.1").obj(), g)
    assert v.allowed and "container 'proxy'" in v.notes[0]


@pytest.mark.parametrize(
    ("obj", "paths"),
    [
        ({"kind": "Pod", "spec": {"containers": []}}, ["spec"]),
        ({"kind": "StatefulSet", "spec": {"template": {"spec": {}}}}, ["spec.template.spec"]),
        (
            {
                "kind": "LeaderWorkerSet",
                "spec": {"leaderWorkerTemplate": {"leaderTemplate": {"spec": {}}, "workerTemplate": {"spec": {}}}},
            },
            ["spec.leaderWorkerTemplate.leaderTemplate.spec", "spec.leaderWorkerTemplate.workerTemplate.spec"],
        ),
        (
            {"kind": "LLMInferenceService", "spec": {"template": {}, "prefill": {"template": {}, "worker": {}}}},
            ["spec.template", "spec.prefill.template", "spec.prefill.worker"],
        ),
        ({"kind": "Workspace", "inference": {"template": {"spec": {}}}}, ["inference.template.spec"]),
        ({"kind": "ConfigMap", "data": {}}, []),
    ],
)
def test_pod_templates_per_kind(obj, paths):
    assert [p for p, _ in pod_specs(obj)] == paths


def test_bare_pod_and_lws_are_judged():
    pod = Workload("p", "Pod").sidecar().tag("v0.17.1").obj()
    assert not judge_workload(pod, DENY).allowed
    lws = Workload("l", "LeaderWorkerSet").sidecar().tag("v0.17.1").obj()
    assert "vllm#36917" in judge_workload(lws, DENY).denied
    llmisvc = {
        "kind": "LLMInferenceService",
        "metadata": {"name": "k"},
        "spec": {"template": Workload("k").sidecar().tag("v0.17.1").pod_spec()},
    }
    assert "vllm#36917" in judge_workload(llmisvc, DENY).denied


def test_gdnctl_validate_reads_a_deployment(tmp_path, capsys):
    """`gdnctl validate -f deployment.yaml`: the guard admission answer, offline (exit 1 when refused)."""
    import json

    import yaml

    from gdn_operator.cli import main

    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(MY_VLLM.tag("v0.17.1").obj()))
    assert main(["validate", "-f", str(path)]) == 1  # --policy reject (the default) is a deny guard
    out = capsys.readouterr().out
    assert "Deployment my-vllm: REFUSED (GDNGuard admission, policy deny)" in out and "[refused] vllm#36917:" in out
    assert main(["validate", "-f", str(path), "--policy", "warn", "--output", "json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert res["allowed"] and "vllm#36917" in res["rules"]
    path.write_text(yaml.safe_dump(MY_VLLM.tag("latest").obj()))
    assert main(["validate", "-f", str(path), "--vllm-version", "0.33.0"]) == 1  # pinned: judged (vllm#43559)
    capsys.readouterr()
    path.write_text(yaml.safe_dump(MY_VLLM.tag("v0.33.0").args(*CLEAN_ARGS).obj()))
    assert main(["validate", "-f", str(path)]) == 0
    assert capsys.readouterr().out == f"{path} Deployment my-vllm: ADMITTED (GDNGuard admission, policy deny)\n"


def test_gdnctl_validate_strict_judges_a_workloads_release_too(tmp_path, capsys):
    """Issue 46 item 3: --strict exits 4 for a workload whose vLLM container runs a release the catalogue has not
    read (from the image tag here), 0 for a catalogued one; a refusal stays 1."""
    import yaml

    from gdn_operator.cli import main

    path = tmp_path / "deployment.yaml"
    path.write_text(yaml.safe_dump(MY_VLLM.tag("v0.35.0").args(*CLEAN_ARGS).obj()))
    assert main(["validate", "-f", str(path)]) == 0
    capsys.readouterr()
    assert main(["validate", "-f", str(path), "--strict"]) == 4
    assert "strict: not a catalogued release" in capsys.readouterr().out
    path.write_text(yaml.safe_dump(MY_VLLM.tag("v0.34.0").args(*CLEAN_ARGS).obj()))
    assert main(["validate", "-f", str(path), "--strict"]) == 0
    path.write_text(yaml.safe_dump(MY_VLLM.tag("v0.17.1").obj()))
    assert main(["validate", "-f", str(path), "--strict", "--vllm-version", "0.17.1rc1"]) == 1
