"""Known-crash rules on a workload's pod template (issue 35): the launch line of the vLLM container of a
Deployment, StatefulSet, LeaderWorkerSet, Pod (or any object with a pod template) that some other tool
created, judged exactly as `gdnctl validate -- vllm serve ...` judges it (rules/launchline.py, the same rule
messages). The GDNGuard admission webhook (handlers/guard/admission.py) and `gdnctl validate -f deployment.yaml`
both call `judge_workload`.

Where the pod templates are, per kind (the real types' field paths):

    Pod                                   spec
    Deployment, StatefulSet, ReplicaSet,  spec.template.spec
    DaemonSet, Job
    LeaderWorkerSet (leaderworkerset.x-k8s.io)   spec.leaderWorkerTemplate.leaderTemplate.spec (when set),
                                                 spec.leaderWorkerTemplate.workerTemplate.spec
    CronJob                               spec.jobTemplate.spec.template.spec
    LLMInferenceService (serving.kserve.io/v1alpha1)   spec.template, spec.worker, spec.prefill.template,
                                          spec.prefill.worker (PodSpecs; the vLLM command often comes from the
                                          LLMInferenceServiceConfig presets, then no container launches vLLM here)
    Workspace (kaito.sh)                  inference.template.spec

The engine container: the one named by the guard, else the first whose command + args launch vLLM. A
container without `command` on a vLLM image (vllm/vllm-openai: ENTRYPOINT `vllm serve`) is read as
`vllm serve` + args. Environment variables with literal values lead the line (`VAR=value vllm serve ...`);
values from Secrets or ConfigMaps are not read (the webhook reads nothing but the object under review).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.api.load import ManifestError
from gdn_operator.rules.evaluator import Evaluation
from gdn_operator.rules.launchline import evaluate_launch

_SHELLS = frozenset({"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "/usr/bin/env"})
_VLLM_IMAGE = re.compile(r"(^|/)vllm-openai(:|@|$)|(^|/)vllm(:|@|$)")

#: kind -> the path of its pod template's PodSpec (LeaderWorkerSet has two, see below)
_POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


#: kinds with several pod templates: every path that may hold one
_MULTI_POD_SPEC_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "LeaderWorkerSet": (
        ("spec", "leaderWorkerTemplate", "leaderTemplate", "spec"),
        ("spec", "leaderWorkerTemplate", "workerTemplate", "spec"),
    ),
    "LLMInferenceService": (
        ("spec", "template"),
        ("spec", "worker"),
        ("spec", "prefill", "template"),
        ("spec", "prefill", "worker"),
    ),
    "Workspace": (("inference", "template", "spec"),),
}


def pod_specs(obj: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(field path, PodSpec) of each pod template of `obj` ([] for a kind without one)."""
    kind = obj.get("kind") or ""
    single = _POD_SPEC_PATHS.get(kind)
    paths = _MULTI_POD_SPEC_PATHS.get(kind) or ((single,) if single else ())
    out = []
    for path in paths:
        spec = _get(obj, path)
        if isinstance(spec, dict):
            out.append((".".join(path), spec))
    return out


def _image_tag(image: str) -> str:
    ref = image.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def _script_words(script: str) -> list[str]:
    """The words of a shell script, as the shell reads them. A script shlex cannot split (an apostrophe in
    `echo it's up; vllm serve ...`: issue 48, it raised and the webhook answered HTTP 500) is read from the command
    that launches vLLM alone: the script cut at ; && || and newlines, that command's words."""
    try:
        return shlex.split(script)
    except ValueError:
        pass
    for command in re.split(r"\n|;|&&|\|\|", script):
        if re.search(r"(^|/|\s)vllm\s+serve(\s|$)|vllm\.entrypoints\.", command):
            try:
                return shlex.split(command)
            except ValueError:
                return command.split()
    return script.split()


def launch_argv(container: dict[str, Any]) -> list[str] | None:
    """The container's vLLM launch line (command + args, led by literal env assignments), or None when it
    does not launch vLLM."""
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command and _VLLM_IMAGE.search(str(container.get("image") or "")):
        command = ["vllm", "serve"]
    line = command + args
    if len(line) >= 3 and line[0] in _SHELLS and line[1] == "-c":
        line = _script_words(line[2])  # sh -c "vllm serve ..." (what follows the script are $0, $1...)
        if line[:1] == ["exec"]:
            line = line[1:]
    joined = " ".join(line[:4])
    if not (re.search(r"(^|/|\s)vllm\s+serve(\s|$)", joined) or any(m in joined for m in ("vllm.entrypoints.",))):
        return None
    env = [f"{e['name']}={e['value']}" for e in container.get("env") or [] if isinstance(e, dict) and "value" in e]
    return env + line


def engine_container(podspec: dict[str, Any], name: str | None) -> tuple[dict[str, Any], list[str]] | None:
    """The engine container of a PodSpec and its launch line: the container `name` (when given and it
    launches vLLM), else the first container that launches vLLM; None when there is none."""
    for c in podspec.get("containers") or []:
        if not isinstance(c, dict) or (name is not None and c.get("name") != name):
            continue
        argv = launch_argv(c)
        if argv is not None:
            return c, argv
    return None


def resolve_version(guard: GDNGuardSpec, image: str, annotations: dict[str, str]) -> tuple[str | None, str]:
    """(the vLLM release, how it was known: imageTag, annotation or pinned) of an engine; the release is None
    when the source named by the guard does not tell it."""
    return guard.vllm_version.resolve(_image_tag(image), annotations)


@dataclass
class WorkloadVerdict:
    """The admission answer for one guarded object: warnings (each a rule line, as gdnctl validate prints
    it), `denied` with the refusal message under policy deny, and notes (why nothing was judged)."""

    warnings: list[str] = field(default_factory=list)
    denied: str = ""
    notes: list[str] = field(default_factory=list)
    evaluations: list[Evaluation] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.denied


def _denial(obj: dict[str, Any], guard_name: str, ev: Evaluation) -> str:
    meta = obj.get("metadata") or {}
    rej = ev.rejected
    head = (
        f"{obj.get('kind')} {meta.get('name') or meta.get('generateName') or ''} refused by GDNGuard {guard_name} "
        f"(admission policy deny): {len(rej)} known-crash rule{'s' if len(rej) > 1 else ''} match its vLLM launch line:"
    )
    return "\n".join([head, *(f"- {f.message}" for f in rej)])


def judge_workload(obj: dict[str, Any], guard: GDNGuardSpec, guard_name: str = "") -> WorkloadVerdict:
    """Evaluate the launch line of every pod template of `obj` under the guard's policy (warn or deny)."""
    out = WorkloadVerdict()
    meta = obj.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {})}
    deny = guard.admission.policy == "deny"
    for path, podspec in pod_specs(obj):
        template_meta = _get(obj, tuple(path.split(".")[:-1]) + ("metadata",)) if path.endswith(".spec") else None
        notes_of = {**annotations, **((template_meta or {}).get("annotations") or {})}
        found = engine_container(podspec, guard.container)
        if found is None:
            out.notes.append(
                f"{path}: no container launches vLLM" + (f" (container {guard.container!r})" if guard.container else "")
            )
            continue
        container, argv = found
        version, source = resolve_version(guard, str(container.get("image") or ""), notes_of)
        if version is None:
            out.notes.append(
                f"{path}.containers[{container.get('name')}]: the vLLM release is unknown ({source}): set the "
                "guard's spec.vllmVersion (pinned, or annotation) or annotate the workload gdn-operator.io/vllm-version"
            )
            continue
        try:
            _, ev = evaluate_launch(argv, vllm_version=version, policy="reject" if deny else "warn")
        except ManifestError as e:
            out.notes.append(
                f"{path}.containers[{container.get('name')}]: the launch line was not judged: {'; '.join(e.problems)}"
            )
            continue
        out.evaluations.append(ev)
        for f in ev.findings:
            if f.action in ("warned", "rejected"):
                out.rules.append(f.rule)
                if f.action == "warned":
                    out.warnings.append(f.line())
        if not ev.allowed and not out.denied:
            out.denied = _denial(obj, guard_name, ev)
    return out
