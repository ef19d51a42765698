"""(b) Every flag the renderer emits for vLLM 0.22.0 parses with vLLM 0.22.0's own `vllm serve` parser.

Variants cover every field the renderer turns into a flag (render/engine.py vllm_args), each enum value
of attentionBackend / gdnPrefillBackend / cudagraphMode, both values of every boolean.  A variant the
operator would refuse at 0.22.0 renders nothing, so it is not a flag "the renderer emits" and is skipped
(listed in the assertion message when something else fails).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import harness

from gdn_operator.api.enums import AttentionBackend, CudagraphMode, GDNPrefillBackend
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.render.engine import vllm_args
from gdn_operator.rules import evaluate

PROBE = Path(__file__).with_name("vllm_parse_probe.py")


def _variants() -> list[dict]:
    base = harness.adapted_manifest(kv_cache_memory=None)["spec"]  # extraArgs are the user's, not rendered
    out = [{}]
    for b in (True, False):
        out += [{"asyncScheduling": b}, {"prefixCaching": b}, {"chunkedPrefill": b}, {"enforceEager": b}]
    out += [{"maxNumSeqs": 64, "maxNumBatchedTokens": 4096}, {"speculativeDecoding": {"enabled": False}}]
    # With MTP at 0.22.0 the operator always renders --no-async-scheduling (vllm#45100 is enforced), so
    # --async-scheduling is only emitted without speculative decoding.
    out += [{"speculativeDecoding": {"enabled": False}, "asyncScheduling": True}]
    out += [{"attentionBackend": a.value} for a in AttentionBackend]
    out += [{"gdnPrefillBackend": g.value} for g in GDNPrefillBackend]
    out += [{"cudagraphMode": c.value, "enforceEager": False} for c in CudagraphMode]
    return [dict(base, **v) for v in out]


def _expected(argv: list[str]) -> dict[str, str]:
    """dest → value the parser must give, from the rendered flags themselves."""
    exp = {}
    i = 1  # argv[0] is the model
    while i < len(argv):
        flag = argv[i]
        dest = flag[2:].replace("-", "_")
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is not None and not nxt.startswith("--"):
            exp[dest] = nxt
            i += 2
        elif dest.startswith("no_"):
            exp[dest[3:]] = "False"
            i += 1
        else:
            exp[dest] = "True"
            i += 1
    return exp


def _matches(dest: str, want: str, got: str | None) -> bool:
    if got is None:
        return False
    if want in ("True", "False"):
        return got == want
    if want.startswith("{"):  # JSON flag: every key/value survives parsing (dict or enum member repr)
        return all(
            re.search(rf"'{re.escape(k)}': (<[A-Za-z]+\.)?'?{re.escape(str(v))}\b", got) for k, v in json.loads(want).items()
        )
    return want.lower() in got.lower() or got.strip("'\"[]") == want


def test_every_rendered_flag_parses_with_vllm_0_22_parser(gpu_site, engines):
    # `engines` is requested so the engines boot while this CPU-only test runs.
    argvs, skipped = [], []
    for spec_dict in _variants():
        spec = GDNModelServerSpec.model_validate(spec_dict)
        ev = evaluate(spec, default_policy="mitigate")
        if not ev.allowed:
            skipped.append(
                (
                    spec_dict.get("gdnPrefillBackend"),
                    spec_dict.get("attentionBackend"),
                    [f.rule for f in ev.findings if f.action == "rejected"],
                )
            )
            continue
        argvs.append(vllm_args("tiny-recall", ev.mitigated_spec or spec))
    assert len(argvs) >= 20, f"too few admitted variants to cover the renderer: skipped {skipped}"
    p = subprocess.run(
        [harness.PYTHON, str(PROBE)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=gpu_site),
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    mark = [ln for ln in p.stdout.splitlines() if ln.startswith("GDN-PARSE-PROBE-RESULT ")]
    assert len(mark) == 1, p.stdout[-3000:]
    results = json.loads(mark[0].split(" ", 1)[1])
    failures = []
    for argv, res in zip(argvs, results):
        if not res["ok"]:
            failures.append((argv[1:], res["error"]))
            continue
        for dest, want in _expected(argv).items():
            got = res["values"].get(dest, res["values"].get(f"engine_args.{dest}"))
            if not _matches(dest, want, got):
                failures.append((argv[1:], f"{dest}: rendered {want!r}, vLLM parsed {got!r}"))
    assert not failures, (
        f"{len(failures)} rendered launch lines vLLM 0.22.0 does not take as meant "
        f"(operator-refused variants skipped: {skipped}):\n" + "\n".join(map(str, failures))
    )
