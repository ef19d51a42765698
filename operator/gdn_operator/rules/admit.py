"""The admission verdict: one function for the validating webhook (handlers/webhook/admission.py) and `gdnctl validate`.

Offline parity (issue 36): `gdnctl validate` gives exactly the webhook's answer because both call `verdict`,
in the webhook's order: the object's name (on create: it names the engine Service), the spec's schema and value
checks, the pod-isolation opt-ins (`NVIDIA_VISIBLE_DEVICES`, privileged, hostPath, ...: api/pod.py
`unsafe_refusals`, opted in by the operator's GDN_ALLOW_UNSAFE / `gdnctl validate --allow-unsafe`), then the
known-crash rules. The first refusal is the answer; the rules are evaluated whenever the spec parses, so the
offline report still lists them. What only a cluster can say (optional APIs it lacks) stays in the webhook.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gdn_operator.api import k8s
from gdn_operator.api.load import ManifestError, parse_spec
from gdn_operator.api.pod import unsafe_refusals
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules.evaluator import Evaluation, evaluate

#: HTTP status of each refusal (the webhook's AdmissionError code; the API server passes it on)
INVALID = 422
FORBIDDEN = 403


@dataclass(frozen=True)
class Verdict:
    """What admission answers for one object.

    reason: admitted, invalid-name, invalid-spec, unsafe-pod-settings or rules; message: the refusal text
    (empty when admitted); problems: one line per problem of a refusal; evaluation: the rules' evaluation
    (None when the spec does not parse).
    """

    reason: str
    message: str = ""
    code: int = 200
    problems: tuple[str, ...] = ()
    evaluation: Evaluation | None = None

    @property
    def allowed(self) -> bool:
        return self.reason == "admitted"


def verdict(
    spec: GDNModelServerSpec | Any,
    *,
    name: str | None,
    creating: bool,
    allow_unsafe: Iterable[str] = (),
    default_policy: str = "reject",
    vllm_version: str | None = None,
) -> Verdict:
    """The admission answer for a spec (a parsed one, or the raw body's `spec`) of an object named `name`."""
    refusal: Verdict | None = None
    if creating and name:
        problem = k8s.service_name_problem(name)
        if problem:
            refusal = Verdict("invalid-name", problem, INVALID, (problem,))
    if isinstance(spec, GDNModelServerSpec):
        s = spec
    else:
        try:
            s = parse_spec(spec)
        except ManifestError as e:
            problems = tuple(e.problems)
            return refusal or Verdict("invalid-spec", "; ".join(problems), INVALID, problems)
    ev = evaluate(s, default_policy=default_policy, vllm_version=vllm_version)
    if refusal is not None:
        return Verdict(refusal.reason, refusal.message, refusal.code, refusal.problems, ev)
    unsafe = tuple(unsafe_refusals(s, frozenset(allow_unsafe)))
    if unsafe:
        return Verdict("unsafe-pod-settings", "; ".join(unsafe), FORBIDDEN, unsafe, ev)
    if not ev.allowed:
        denial = ev.denial_message()
        return Verdict("rules", denial, FORBIDDEN, tuple(f.message for f in ev.rejected), ev)
    return Verdict("admitted", evaluation=ev)
