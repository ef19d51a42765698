"""docs/compatibility.md: the compatibility matrix (rules/compat.py) as Markdown, for a platform team choosing a release.

    text = render(ruleset, cells, captures)       (hack/gen_compat.py prints it; tests/rules/test_compat.py
                                                    fails when the committed file differs)

An overview (one row per group of consecutive releases whose cells read the same, MTP on per TP and CUDA-graph
mode, MTP off in one column when its cells agree), then per group a table of its twelve cells, then the GPU
captures the evidence column is derived from. Links are relative to docs/.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from gdn_operator.rules.compat import MODEL, MTP_K, POLICY, TPS, Capture, Cell, Measured, Mitigation
from gdn_operator.rules.rulefile import RuleSet

RULES_YAML = "../operator/gdn_operator/rules/data/rules.yaml"
#: upstream repositories of rule ids "<project>#<number>"
UPSTREAM = {
    "vllm": "https://github.com/vllm-project/vllm/issues/",
    "flashinfer": "https://github.com/flashinfer-ai/flashinfer/issues/",
}
MODE_TITLE = {"eager": "eager (`enforceEager`)", "PIECEWISE": "`PIECEWISE`", "default": "vLLM's default (unset)"}
MODE_SHORT = {"eager": "eager", "PIECEWISE": "PIECEWISE", "default": "default"}
VERDICT = {"refused": "**refused**", "mitigated": "mitigated", "advisory": "advisory", "safe": "safe"}


def link(ref: str) -> str:
    """A rule id as a Markdown link: its upstream issue, or the rule file for the project's own ids."""
    project, _, number = ref.partition("#")
    if number.isdigit() and project in UPSTREAM:
        return f"[{ref}]({UPSTREAM[project]}{number})"
    if "/" in ref:
        return f"[{ref}]({RULES_YAML})"
    return ref


def _advisory(text: str) -> str:
    code, _, rule = text.partition(" (")
    return f"{code} ({link(rule[:-1])})" if rule else link(text)


def _model(name: str) -> str:
    return name.split(" (", 1)[0]


def cost_text(m: Measured) -> str:
    ratios = " / ".join(f"{r:.2f}x" for _, r in m.points)
    conc = " / ".join(str(c) for c, _ in m.points)
    return f"MTP/off {ratios} at {conc} in flight ({m.hardware}, {_model(m.model)}{m.basis})"


def _mitigation(m: Mitigation) -> str:
    cost = "; ".join(cost_text(c) for c in m.costs) if m.costs else "cost unmeasured"
    return f"`{m.field}: {json.dumps(m.value)}` ({link(m.rule)}; {cost})"


def refusal(ref: str, ruleset: RuleSet | None) -> str:
    """A refusing rule, linked, with the release that fixed it (from its rule) where one did."""
    rule = ruleset.rule(ref) if ruleset is not None else None
    return link(ref) + (f" (fixed in {rule.fixed_in})" if rule is not None and rule.fixed_in else "")


def details(c: Cell, ruleset: RuleSet | None = None) -> str:
    """What the cell's verdict rests on, compactly (one table cell)."""
    parts = []
    if c.refused:
        parts.append("refused by " + ", ".join(refusal(r, ruleset) for r in c.refused))
    if c.mitigations:
        parts.append("runs " + "; ".join(_mitigation(m) for m in c.mitigations))
    if c.measured:
        parts.append("as set, measured: " + "; ".join(f"{link(m.rule)}'s mitigation {cost_text(m)}" for m in c.measured))
    if c.as_shipped:
        parts.append("set to vLLM's own values: refused by " + ", ".join(link(r) for r in c.as_shipped))
    return "<br>".join(parts) or "—"


def _folder(path: str, short: bool = True) -> str:
    """A capture folder as a link (GitHub shows its README); `short` drops "vllm-<release>-" from the label."""
    name = path.rsplit("/", 1)[-1]
    label = name.split("-", 2)[2] if short and name.count("-") >= 2 else name
    return f"[{label}](../{path}/)"


def _evidence(c: Cell) -> str:
    return ", ".join(_folder(f) for f in c.evidence) or "—"


def groups(cells: Sequence[Cell]) -> list[tuple[list[str], list[Cell]]]:
    """Consecutive releases whose cells read the same: (releases, the first release's cells)."""
    by_release = [(r, list(cs)) for r, cs in groupby(cells, key=lambda c: c.axes.release)]
    out: list[tuple[list[str], list[Cell]]] = []
    for release, cs in by_release:
        if out and [c.row() for c in out[-1][1]] == [c.row() for c in cs]:
            out[-1][0].append(release)
        else:
            out.append(([release], cs))
    return out


def _span(releases: list[str]) -> str:
    return releases[0] if len(releases) == 1 else f"{releases[0]} – {releases[-1]}"


def _anchor(releases: list[str]) -> str:
    return "vllm-" + _span(releases).replace(".", "").replace(" – ", "--")


def short(c: Cell, ruleset: RuleSet | None = None) -> str:
    """The cell in a few words: its verdict and the rules or fields it rests on."""
    if c.verdict == "refused":
        text = "**refused** (" + ", ".join(refusal(r, ruleset) for r in c.refused) + ")"
    elif c.verdict == "mitigated":
        costs = any(m.costs for m in c.mitigations) or c.measured
        fields = ", ".join(
            f"`{m.field}: {m.value if isinstance(m.value, str) else json.dumps(m.value)}` ({link(m.rule)})" for m in c.mitigations
        )
        text = f"mitigated: {fields}" + ("; cost measured" if costs else "")
    else:
        text = VERDICT[c.verdict]
    return text


def _summary(cs: list[Cell], ruleset: RuleSet) -> str:
    """One text for cells that read the same in short, else one per set of TP / modes that does."""
    texts: dict[str, list[Cell]] = {}
    for c in cs:
        texts.setdefault(short(c, ruleset), []).append(c)
    if len(texts) == 1:
        return next(iter(texts))
    parts = []
    for text, same in texts.items():
        where = "; ".join(
            f"TP={tp if tp == 1 else '2+'} " + ", ".join(MODE_SHORT[c.axes.mode] for c in same if c.axes.tp == tp)
            for tp in TPS
            if any(c.axes.tp == tp for c in same)
        )
        parts.append(f"({where}) {text}")
    return "<br>".join(parts)


def _overview(grouped: list[tuple[list[str], list[Cell]]], ruleset: RuleSet) -> list[str]:
    lines = [
        f"| vLLM | MTP k={MTP_K} (every TP and CUDA-graph mode unless named) | MTP off | advisories (some cells) | cells with GPU evidence |",
        "| --- | --- | --- | --- | --- |",
    ]
    for releases, cs in grouped:
        on = [c for c in cs if c.axes.mtp]
        off = [c for c in cs if not c.axes.mtp]
        backed = sum(1 for c in cs if c.evidence)
        advisories = ", ".join(_advisory(x) for x in dict.fromkeys(x for c in cs for x in c.advisories)) or "—"
        row = [
            f"[{_span(releases)}](#{_anchor(releases)})",
            _summary(on, ruleset),
            _summary(off, ruleset),
            advisories,
            f"{backed} of {len(cs)}" if backed else "—",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _group(releases: list[str], cs: list[Cell], ruleset: RuleSet) -> list[str]:
    lines = [f"### vLLM {_span(releases)}", ""]
    if len(releases) > 1:
        lines += [f"Releases {', '.join(releases)}: every cell reads the same.", ""]
    lines += [
        "| TP | CUDA graphs | MTP | verdict | what admission decides (rule, measured cost) | advisories | GPU evidence |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in cs:
        a = c.axes
        lines.append(
            f"| {a.tp if a.tp == 1 else '2+'} | {MODE_TITLE[a.mode]} | {f'k={MTP_K}' if a.mtp else 'off'} | {VERDICT[c.verdict]} | "
            f"{details(c, ruleset)} | {', '.join(_advisory(x) for x in c.advisories) or '—'} | {_evidence(c)} |"
        )
    return lines + [""]


def _captures(captures: Sequence[Capture]) -> list[str]:
    lines = [
        "| capture | engine (its log, or its record in a JSON capture) | vLLM | TP | CUDA graphs | MTP |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in captures:
        mtp = f"k={c.k}" if c.mtp else "off"
        ran = "unset (vLLM's default)" if c.ran_mode == "auto" else c.ran_mode
        lines.append(f"| {_folder(c.folder, short=False)} | `{c.source}` | {c.release} | {c.tp} | {ran} | {mtp} |")
    return lines


def render(ruleset: RuleSet, cells: Sequence[Cell], captures: Sequence[Capture]) -> str:
    grouped = groups(cells)
    out = [
        "# Compatibility matrix",
        "",
        "<!-- Generated by hack/gen_compat.py from operator/gdn_operator/rules/data/rules.yaml and the captures in",
        "     tests/fixtures/; do not edit. Regenerate: .venv/bin/python hack/gen_compat.py > docs/compatibility.md -->",
        "",
        "What admission makes of a minimal `GDNModelServer` per vLLM release, tensor parallelism, CUDA-graph mode and",
        f"MTP: `model.uri: {MODEL}`, `image.vllmVersion: <release>`, `tensorParallelSize`, the mode",
        f"(`enforceEager: true`, `cudagraphMode: PIECEWISE`, or neither: vLLM's default), and MTP k={MTP_K}",
        "(`speculativeDecoding: {method: mtp, numSpeculativeTokens: 2}`) or off (`speculativeDecoding.enabled: false`);",
        f"everything else unset. Each cell is judged by the operator's own evaluator (`rules/evaluator.py`, policy `{POLICY}`,",
        "the operator's default), the code the admission webhook and `gdnctl validate` run, against the rules in",
        f"[`rules.yaml`]({RULES_YAML}) (catalogue of vLLM {ruleset.data.catalogue.oldest} – {ruleset.data.catalogue.newest}).",
        "",
        "* **refused** — an enforced rule rejects the server (linked upstream); the same cell with MTP off says what runs instead.",
        "* **mitigated** — admitted, with values the rules chose for unset fields (`status.effective.defaults`): each",
        "  with its rule and, where a GPU capture measured it at that release and TP, the tokens/s of MTP with the",
        "  mitigation over MTP off (vLLM's defaults) per number of requests in flight (`cost` in `rules.yaml`);",
        "  otherwise *cost unmeasured* (no loss is claimed without a measurement). *Set to vLLM's own values* names the",
        "  rules that refuse the same server when those fields are set to what vLLM ships (a raw `vllm serve` line).",
        "* **advisory** — admitted unchanged, with warn-only findings; **safe** — no finding at all.",
        "* **advisories** — warn-only findings of the cell (known risks no spec value avoids yet, and",
        "  `MTPSlowerThanOff`: a covering measurement where the mitigated MTP lost to MTP off), reported in",
        "  `status.advisories`, never blocking.",
        "* **GPU evidence** — committed captures of a real vLLM engine on a GPU at that release, TP and CUDA-graph",
        "  mode, with MTP as in the cell (`tests/fixtures/vllm-<release>-<gpu>*/`: each engine's own start-up line, where",
        "  *vLLM's default* is `FULL_AND_PIECEWISE`, or its recorded command line; listed under [GPU captures](#gpu-captures)),",
        "  and the fixtures of the measurements quoted. A cell without any is judged from the catalogue of upstream",
        "  issues and fixes alone.",
        "",
        "From vLLM 0.34.0 vLLM captures this model's graphs (`PIECEWISE`, and the default's) as breakable CUDA graphs,",
        "without torch.compile: its default for the Qwen3.5 classes on NVIDIA (`status.effective.cudagraphImplementation`,",
        "[docs/safe-defaults.md](safe-defaults.md)); `spec.cudagraphImplementation: compiled` picks torch.compile's.",
        "",
        "TP=2+ stands for every `tensorParallelSize` of 2 or more (no rule distinguishes them). A patched image",
        "(`spec.image.patches`) or another `admissionPolicy` can change a verdict: `gdnctl validate -f manifest.yaml`",
        "answers for one manifest.",
        "",
        "## Overview",
        "",
        *_overview(grouped, ruleset),
        "",
        "## Per release",
        "",
    ]
    for releases, cs in grouped:
        out += _group(releases, cs, ruleset)
    out += [
        "## GPU captures",
        "",
        "The engines of the committed GPU captures (the source of the evidence column): each engine log's vLLM start-up",
        "line (CUDA graphs as vLLM logged them: `NONE` is eager), and each engine a JSON capture records with its command",
        "line and the time it became ready (read by the project's launch-line parser).",
        "",
        *_captures(captures),
        "",
    ]
    return "\n".join(out)
