"""`gdnctl validate`: the admission answer the operator would give, offline.

    gdnctl validate -f FILE [--output text|json] [--vllm-version V] [--patch ID ...] [--strict]
    gdnctl validate --vllm-version 0.19.1 [--architecture ARCH] [--patch ID ...] [--strict] -- vllm serve MODEL --flags ...

Unset fields are shown with the value the rules chose for them (`default:` lines, rules/defaults.py);
advisories (risks no spec value avoids yet, and what the rules' mitigations measurably cost: MTPSlowerThanOff,
rules/cost.py) are listed apart from the warnings a user can act on.

Exit codes: 0 admitted unchanged (warnings allowed); 1 rejected, or changed by a mitigation;
2 malformed input (ManifestError, printed by gdnctl's main as one line per problem), or a launch line whose
model family no source reveals ("cannot tell: pass --architecture ...") or is known not to be a GDN hybrid;
4 with --strict, when every answer would be 0 but a vLLM version evaluated is not a release the catalogue read
(RuleSet.uncatalogued: newer than its newest, a pre-release or nightly, or a release it skipped; issue 46): it
was judged with the newest release's rules and defaults, which nobody has checked against it.
The family of a launch line is decided by rules/family.py from every source the line has (--architecture,
--hf-overrides / --additional-config, a readable local config.json, published checkpoints, the model name,
--served-model-name); sources that disagree are reported as notes.
A manifest is evaluated with its spec.admissionPolicy, else `--policy` (the operator's default policy, chart
value operator.defaultPolicy; default reject); a launch line with `--policy` (default reject).
Every document of a multi-document file is evaluated.

A manifest gets exactly the admission webhook's answer (rules/admit.py `verdict`, shared with
handlers/webhook/admission.py): a metadata.name that cannot name the engine Service and pod settings that loosen the
engine's isolation (GPU-visibility variables such as NVIDIA_VISIBLE_DEVICES, privileged, hostPath, added
capabilities, envFrom, ...) are REFUSED (exit 1) unless --allow-unsafe lists the operator's opt-in, before
the rules; the rules are still listed. Only what a cluster alone can tell (optional APIs it lacks) is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gdn_operator import KIND
from gdn_operator.api import k8s
from gdn_operator.api.enums import Architecture
from gdn_operator.api.guard import GDNGuardSpec
from gdn_operator.api.load import ManifestError, load_documents, parse_object, read_text
from gdn_operator.api.pod import UNSAFE_OPT_INS
from gdn_operator.api.resource import GDNModelServer
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules.admit import INVALID, Verdict, verdict
from gdn_operator.rules.evaluator import Evaluation
from gdn_operator.rules.launchline import LaunchLine, evaluate_launch
from gdn_operator.rules.rulefile import load_rules
from gdn_operator.rules.workload import judge_workload, pod_specs

CLI_DEFAULT_POLICY = "reject"
#: validate --strict: an answer given for a vLLM release the catalogue has not read
EXIT_UNCATALOGUED = 4


def _adjust_spec(spec: GDNModelServerSpec, args: argparse.Namespace) -> GDNModelServerSpec:
    patches = list(getattr(args, "patch", None) or [])
    arch = getattr(args, "architecture", None)
    if not patches and not arch:
        return spec
    d = spec.model_dump(by_alias=True, exclude_unset=True, mode="json")
    if patches:
        image = d.setdefault("image", {})
        image["patches"] = list(dict.fromkeys(list(image.get("patches", [])) + patches))
    if arch and not d.get("model", {}).get("architecture"):
        valid = {a.value.lower(): a.value for a in Architecture}
        if arch.lower() not in valid:
            raise ManifestError(
                f"--architecture: unknown architecture {arch!r}; use one of {', '.join(a.value for a in Architecture)}"
            )
        d["model"]["architecture"] = valid[arch.lower()]
    return GDNModelServerSpec.model_validate(d)


def _effective_line(ev: Evaluation) -> str:
    v = ev.detail.values

    def onoff(x: Any) -> str:
        return "unknown" if x is None else ("on" if x else "off")

    spec = f"{v['spec_method']} k={v['num_speculative_tokens']}" if v["spec_enabled"] else "spec decode off"
    parts = [
        f"vLLM {v['vllm_version']}",
        v["architecture"] or "architecture unrecognised",
        spec,
        f"async {onoff(v['async_scheduling'])}",
        f"prefix caching {onoff(v['prefix_caching'])}" + (f" (mamba {v['mamba_cache_mode']})" if v["mamba_cache_mode"] else ""),
        f"chunked prefill {onoff(v['chunked_prefill'])}",
        f"runner {(v['model_runner'] or 'unknown').upper()}",
        f"CUDA graphs {v['cudagraph_mode']} ({v['cudagraph_implementation'] or 'none'})",
        f"TP={v['tensor_parallel_size']}",
    ]
    if v.get("pipeline_parallel_size", 1) > 1:
        parts.append(f"PP={v['pipeline_parallel_size']}")
    if v.get("nodes", 1) > 1:
        parts.append(f"{v['nodes']} nodes per engine")
    return ", ".join(parts)


def _opt_ins(raw: str) -> frozenset[str]:
    listed = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in listed if n not in UNSAFE_OPT_INS]
    if unknown:
        raise ManifestError(
            f"--allow-unsafe: unknown opt-in {', '.join(unknown)}; use a comma-separated list of {', '.join(UNSAFE_OPT_INS)}"
        )
    return frozenset(listed)


def _objects(text: str, source: str) -> list[tuple[str, str | None, GDNModelServer | None]]:
    """(label, metadata.name, the parsed object) per document of `text`, in the webhook's order: a name the engine
    Service cannot take is refused before the spec is read (object None); other problems are raised together."""
    docs = load_documents(text, source)
    out: list[tuple[str, str | None, GDNModelServer | None]] = []
    problems: list[str] = []
    for i, doc in enumerate(docs):
        label = source if len(docs) == 1 else f"{source}[doc {i}]"
        meta = doc.get("metadata") if isinstance(doc, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str) and name and k8s.dns1123_subdomain(name) and k8s.service_name_problem(name):
            out.append((label, name, None))
            continue
        try:
            obj = parse_object(doc, label)
        except ManifestError as e:
            problems.extend(e.problems)
            continue
        out.append((label, obj.metadata.name, obj))
    if problems:
        raise ManifestError(problems)
    return out


def _text(results: list[dict[str, Any]], evs: list[Evaluation | None], verdicts: list[Verdict | None]) -> str:
    out = []
    for res, ev, v in zip(results, evs, verdicts, strict=True):
        label = res["source"] + (f" {res['name']}" if res.get("name") else "")
        if v is not None and v.reason not in ("admitted", "rules"):
            out.append(f"{label}: REFUSED ({v.reason}, as the admission webhook answers)")
            out.extend(f"  [refused] {p}" for p in v.problems)
            if ev is None:
                continue
            out.append(f"  known-crash rules (evaluated as well): {ev.summary()} (policy {ev.policy})")
        elif ev is None:  # pragma: no cover - only refusals lack an evaluation
            continue
        else:
            out.append(f"{label}: {ev.summary().upper()} (policy {ev.policy})")
        for f in ev.findings:
            if f.action != "advisory":
                out.append(f"  [{f.action}] ({f.kind}, {f.severity}) {f.message}")
        for d in ev.defaults:
            out.append(f"  default: {d.field}={json.dumps(d.value)} (unset; rule {d.rule})")
        out.append(f"  effective: {_effective_line(ev)}")
        if ev.advisories:
            out.append("  advisories (risks no spec value avoids yet, measured costs; reported once, not as warnings):")
            out.extend(f"    ({f.kind}, {f.severity}) {f.message}" for f in ev.advisories)
        for op in ev.patch:
            val = f" {json.dumps(op['value'])}" if "value" in op else ""
            out.append(f"  patch: {op['op']} {op['path']}{val}")
        for n in ev.notes:
            out.append(f"  note: {n}")
    return "\n".join(out) + "\n"


def _no_family(line: LaunchLine) -> str:
    """Why the rules cannot be evaluated for a launch line: a config names another family, or no source tells."""
    classes = ", ".join(a.value for a in Architecture)
    if line.overrides.not_gdn is not None:
        return (
            f"not a Gated DeltaNet hybrid: {line.overrides.architecture_source} names {line.overrides.not_gdn!r} "
            f"(the known-crash rules are for {classes}); if the checkpoint is one of them, pass --architecture ARCH"
        )
    return (
        f"cannot tell: the model name {line.model!r} does not reveal the model family, so the known-crash "
        f"rules cannot be evaluated; pass --architecture ARCH (the checkpoint's HF architecture class, one of "
        f"{classes}), --hf-overrides '{{\"architectures\": [ARCH]}}', or a local model path with its config.json"
    )


def _workload_documents(text: str, source: str) -> list[tuple[str, dict[str, Any]]]:
    """(label, document) of a file of workloads (Deployment, StatefulSet, LeaderWorkerSet, Pod, ...), or []
    when it holds a GDNModelServer (or anything without a pod template)."""
    docs = load_documents(text, source)
    if not docs or not all(isinstance(d, dict) and pod_specs(d) and d.get("kind") != KIND for d in docs):
        return []
    return [(source if len(docs) == 1 else f"{source}[doc {i}]", d) for i, d in enumerate(docs)]


def _validate_workloads(workloads: list[tuple[str, dict[str, Any]]], args: argparse.Namespace) -> int:
    """`gdnctl validate -f deployment.yaml`: the answer a GDNGuard's admission gives the workload (rules/workload.py),
    policy deny for --policy reject (the default), warn otherwise (a guard never mutates); --vllm-version pins
    the release, else it is read from the image tag or the gdn-operator.io/vllm-version annotation."""
    policy = "deny" if (getattr(args, "policy", None) or CLI_DEFAULT_POLICY) == "reject" else "warn"
    guard: dict[str, Any] = {"selector": {"matchLabels": {"gdnctl": "validate"}}, "admission": {"policy": policy}}
    if args.vllm_version:
        guard["vllmVersion"] = {"pinned": args.vllm_version}
    spec = GDNGuardSpec.model_validate(guard)
    results, lines, code = [], [], 0
    strict = False
    for label, doc in workloads:
        v = judge_workload(doc, spec, "(gdnctl validate)")
        name = f"{doc.get('kind')} {(doc.get('metadata') or {}).get('name') or ''}".strip()
        verdict_word = "REFUSED" if not v.allowed else ("WARNED" if v.warnings else "ADMITTED")
        lines.append(f"{label} {name}: {verdict_word} (GDNGuard admission, policy {policy})")
        lines += [f"  [refused] {m.removeprefix('- ')}" for m in v.denied.splitlines()[1:]]
        lines += [f"  [warned] {w}" for w in v.warnings]
        lines += [f"  note: {n}" for n in v.notes]
        results.append({"source": label, "name": name, "allowed": v.allowed, "rules": v.rules, "warnings": v.warnings,
                        "message": v.denied, "notes": v.notes})  # fmt: skip
        code = max(code, 0 if v.allowed else 1)
        if getattr(args, "strict", False):  # each vLLM container's release, as for a manifest
            whys = sorted({w for ev in v.evaluations if (w := load_rules().uncatalogued(ev.detail.values["vllm_version"]))})
            results[-1]["uncatalogued"] = "; ".join(whys) or None
            lines += [f"strict: not a catalogued release, {label} {name}: {w}" for w in whys]
            strict = strict or bool(whys)
    if strict and code == 0:
        code = EXIT_UNCATALOGUED
    sys.stdout.write(
        json.dumps(results, indent=2) + "\n" if getattr(args, "output", "text") == "json" else "\n".join(lines) + "\n"
    )
    return code


def _uncatalogued(results: list[dict[str, Any]], evs: list[Evaluation | None]) -> list[str]:
    """--strict: each result's vLLM version the catalogue has not read (results[i]["uncatalogued"]: why, or None)."""
    rules = load_rules()
    out = []
    for res, ev in zip(results, evs, strict=True):
        why = rules.uncatalogued(ev.detail.values["vllm_version"]) if ev is not None else None
        res["uncatalogued"] = why
        if why:
            out.append(f"{res['source']}{' ' + res['name'] if res.get('name') else ''}: {why}")
    return out


def run_validate(args: argparse.Namespace) -> int:
    launch = list(getattr(args, "launch", None) or [])
    if launch and launch[0] == "--":
        launch = launch[1:]
    filename = getattr(args, "filename", None)
    if launch and filename:
        raise ManifestError("give either -f FILE or a launch line after --, not both")
    if not launch and not filename:
        raise ManifestError("nothing to validate: give -f FILE or a launch line after -- (e.g. -- vllm serve MODEL ...)")

    results: list[dict[str, Any]] = []
    evs: list[Evaluation | None] = []  # None: refused before the spec was read (its name)
    verdicts: list[Verdict | None] = []  # None: a launch line (no object, no pod settings)
    allow_unsafe = _opt_ins(getattr(args, "allow_unsafe", "") or "")
    if launch:
        line, ev = evaluate_launch(
            launch,
            vllm_version=args.vllm_version,
            architecture=getattr(args, "architecture", None),
            patches=list(getattr(args, "patch", None) or []),
            policy=getattr(args, "policy", None) or CLI_DEFAULT_POLICY,
        )
        if not ev.detail.values.get("gdn_hybrid"):
            # not a known-crash finding: the rules cannot be evaluated at all without the model family
            raise ManifestError(_no_family(line))
        res: dict[str, Any] = {"source": "launch line", "name": None, "namespace": None, "model": line.model, "argv": line.argv}
        res.update(ev.to_dict())
        results.append(res)
        evs.append(ev)
        verdicts.append(None)
    elif filename:  # always, after the checks above
        source = "<stdin>" if filename == "-" else filename
        text = read_text(filename)  # once: "-" is standard input
        workloads = _workload_documents(text, source)
        if workloads:
            return _validate_workloads(workloads, args)
        for label, named, obj in _objects(text, source):
            if obj is None:  # the webhook refuses the name before it reads the spec
                problem = k8s.service_name_problem(named or "") or ""
                results.append(
                    {
                        "source": label,
                        "name": named,
                        "admission": {"allowed": False, "reason": "invalid-name", "code": INVALID, "message": problem},
                    }
                )
                evs.append(None)
                verdicts.append(Verdict("invalid-name", problem, INVALID, (problem,)))
                continue
            spec = _adjust_spec(obj.spec, args)
            meta = obj.metadata
            v = verdict(
                spec,
                name=meta.name,
                creating=True,
                allow_unsafe=allow_unsafe,
                default_policy=getattr(args, "policy", None) or CLI_DEFAULT_POLICY,
                vllm_version=args.vllm_version,
            )
            if v.evaluation is None:  # pragma: no cover - verdict evaluates every parsed spec
                raise ManifestError(f"{meta.name}: the rules could not be evaluated")
            ev = v.evaluation
            name = f"{meta.namespace}/{meta.name}" if meta.namespace and meta.name else meta.name
            res = {
                "source": label,
                "name": name,
                "namespace": meta.namespace,
                "admission": {"allowed": v.allowed, "reason": v.reason, "code": v.code, "message": v.message},
            }
            res.update(ev.to_dict())
            results.append(res)
            evs.append(ev)
            verdicts.append(v)

    code = max(
        1 if ev is None or (v is not None and not v.allowed) else ev.exit_code for ev, v in zip(evs, verdicts, strict=True)
    )
    strict = _uncatalogued(results, evs) if getattr(args, "strict", False) else []
    if strict and code == 0:
        code = EXIT_UNCATALOGUED
    if getattr(args, "output", "text") == "json":
        sys.stdout.write(json.dumps({"exitCode": code, "results": results}, indent=2, sort_keys=False) + "\n")
    else:
        sys.stdout.write(_text(results, evs, verdicts))
        sys.stdout.writelines(f"strict: not a catalogued release, {why}\n" for why in strict)
    return code
