"""Offline parity (issue 36): `gdnctl validate` gives exactly the admission webhook's answer.

The whole fuzz corpus of bench/bench_fuzz.py (tests/fuzz_corpus.py: the same seed and count, so the same
manifests; pod-isolation settings included) goes through the validating webhook's handler and through
`gdnctl validate -f FILE --output json`, and the verdicts are compared: admitted or refused, the refusal's
reason and code, and its text (problem by problem for a spec that does not parse, which gdnctl prints one per
line). gdnctl never prints a traceback, with or without the Kubernetes client.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

import kopf
import pytest
from runtime_helpers import make_runtime

from gdn_operator.cli import main
from gdn_operator.api import k8s
from gdn_operator.handlers.webhook.admission import admission
from gdn_operator.handlers.webhook.limits import precheck

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration"))
from fuzz_corpus import manifest  # noqa: E402
from operator_harness import gms  # noqa: E402  (the cluster tests' base server, as bench_fuzz uses)

SEED = 11  # bench/bench_fuzz.py's defaults
COUNT = 3000


def webhook(obj: dict[str, Any] | str, **settings: Any) -> tuple[bool, int, str]:
    """(allowed, code, message) of the webhook for a new object (or its JSON text): the bounded reading of the
    AdmissionReview (handlers/webhook/limits.py `precheck`), then the validating handler."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    review_text = '{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "object": '
    review, denial = precheck(review_text + text + "}}")
    if denial is not None:
        status = json.loads(denial.text)["response"]["status"]
        return False, status["code"], status["message"]
    assert review is not None
    new = review["request"]["object"]
    try:
        admission(new["spec"], [], "fuzz", new["metadata"]["name"], None, make_runtime(**settings))
    except kopf.AdmissionError as e:
        return False, e.code or 0, str(e)
    return True, 200, ""


def gdnctl(path: Path, *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """(exit code, JSON output or None, stderr) of `gdnctl validate -f path --output json` run in-process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["validate", "-f", str(path), "--output", "json", *args])
    return code, (json.loads(out.getvalue()) if out.getvalue() else None), err.getvalue()


def offline(path: Path, *args: str) -> tuple[bool, int, str]:
    """gdnctl's verdict in the webhook's terms: a spec that does not parse is the webhook's 422 with the same
    problems (gdnctl prints `error: FILE: problem` per line and exits 2)."""
    code, doc, err = gdnctl(path, *args)
    assert "Traceback" not in err, err[-2000:]
    if code == 2:
        prefix = f"error: {path}: "
        problems = [ln.removeprefix(prefix) for ln in err.splitlines()]
        return False, 422, "; ".join(problems)
    assert doc is not None and len(doc["results"]) == 1
    adm = doc["results"][0]["admission"]
    assert code == (0 if adm["allowed"] and doc["results"][0]["exitCode"] == 0 else 1) or adm["allowed"]
    return adm["allowed"], adm["code"], adm["message"]


def corpus() -> list[tuple[str, str]]:
    rng, used = random.Random(SEED), set()
    return [manifest(rng, i, used, gms) for i in range(COUNT)]


@pytest.mark.timeout(600)
def test_gdnctl_and_the_webhook_agree_on_the_whole_fuzz_corpus(tmp_path):
    mismatches: list[str] = []
    tally = {"admitted": 0, "refused": 0}
    pod_settings = 0
    skipped = 0
    for name, text in corpus():
        if not k8s.dns1123_subdomain(name):  # the API server refuses the name itself; no webhook sees it
            skipped += 1
            continue
        path = tmp_path / f"{name}.json"
        path.write_text(text)
        hook = webhook(text)
        off = offline(path)
        tally["admitted" if hook[0] else "refused"] += 1
        pod_settings += '"pod": {' in text or '"NVIDIA_' in text or '"CUDA_VISIBLE' in text
        if hook != off:
            mismatches.append(f"{name}: webhook {hook!r:.300} / gdnctl {off!r:.300}")
    assert mismatches == [], f"{len(mismatches)} of {COUNT - skipped} disagree:\n" + "\n".join(mismatches[:20])
    assert skipped < COUNT // 10, skipped
    assert tally["admitted"] > 100 and tally["refused"] > 100, tally  # both verdicts are exercised
    assert pod_settings > 100, pod_settings


@pytest.mark.parametrize(
    "spec, opt_in",
    [
        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "gpu-visibility-env"),
        ({"pod": {"containerSecurityContext": {"privileged": True}}}, "privileged"),
        (
            {
                "pod": {
                    "volumes": [{"name": "h", "hostPath": {"path": "/data"}}],
                    "volumeMounts": [{"name": "h", "mountPath": "/h"}],
                }
            },
            "host-path",
        ),
    ],
)
def test_pod_isolation_refusals_agree_with_and_without_the_opt_in(tmp_path, spec, opt_in):
    obj = gms("iso", **spec)
    path = tmp_path / "iso.json"
    path.write_text(json.dumps(obj))
    refused = webhook(obj)
    assert refused[0] is False and refused[1] == 403 and opt_in in refused[2]
    assert offline(path) == refused
    admitted = webhook(obj, allow_unsafe=(opt_in,))
    assert admitted == (True, 200, "") == offline(path, "--allow-unsafe", opt_in)


def test_a_name_the_engine_service_cannot_take_is_refused_alike(tmp_path):
    obj = gms("a.b")
    path = tmp_path / "n.json"
    path.write_text(json.dumps(obj))
    hook = webhook(obj)
    assert hook[:2] == (False, 422) and "DNS-1035" in hook[2]
    assert offline(path) == hook


def test_gdnctl_without_the_kubernetes_client_names_the_field_instead_of_a_traceback(tmp_path):
    """GPU hosts run gdnctl with only the offline vLLM bundle (pydantic, PyYAML, no Kubernetes client)."""
    import subprocess

    obj = gms("vol", pod={"volumes": [{"name": "v", "emptyDir": {}}], "volumeMounts": [{"name": "v", "mountPath": "/v"}]})
    path = tmp_path / "vol.json"
    path.write_text(json.dumps(obj))
    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys, runpy; sys.modules['kubernetes'] = None; "  # any `import kubernetes` now raises ImportError
        f"sys.argv = ['gdnctl', 'validate', '-f', {str(path)!r}]; "
        "runpy.run_module('gdn_operator.cli', run_name='__main__')"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        env={"PYTHONPATH": str(root / "operator"), "PATH": "/usr/bin:/bin"},
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "spec.pod.volumes" in p.stderr and "pip install 'kubernetes>=37,<38'" in p.stderr
    # with the client, the same manifest is admitted, as the webhook admits it
    assert offline(path) == webhook(obj) == (True, 200, "")
