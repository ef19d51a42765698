"""The compatibility matrix: what admission makes of a minimal server per vLLM release, TP, CUDA-graph mode and MTP.

    cells = matrix(load_rules(), captures)          # one Cell per (release, TP, mode, MTP), catalogue order
    docs/compatibility.md = rules/compatdoc.py render(cells, ...)   (hack/gen_compat.py writes it)

Each cell is a minimal GDNModelServer (a Qwen3.5 checkpoint, the release as spec.image.vllmVersion, the cell's
TP / CUDA-graph mode / MTP k=2 or off, everything else unset) judged by the evaluator admission runs
(rules/evaluator.py, the operator's default policy `reject`, the rules' safe defaults filled in). A cell is

* ``refused``   — an enforced rule rejects it (the rule ids);
* ``mitigated`` — admitted with values the rules chose for unset fields (rules/defaults.py), each with its rule
  and its measured cost: the representative `cost` entries (rules/cost.py `covers`: same release, the cell runs
  their configuration) of the rules whose mitigation sets that field; none: "cost unmeasured";
* ``advisory``  — admitted unchanged, with warn-only findings;
* ``safe``      — no finding at all.

Warn-only findings (advisories, and warnings a user can act on) are listed apart for every cell. For a
mitigated cell, `as_shipped` says what the same server gets when the defaulted fields are SET to vLLM's own
values (the evaluator without defaults, as for a raw `vllm serve` line): the rules that then refuse it.

GPU evidence (`Capture`) comes from the committed captures themselves, in tests/fixtures/vllm-<release>-<gpu>[-what]/:
every engine log whose vLLM start-up line ("Initializing a V1 LLM engine (vX) with config: ...") says the release,
TP, CUDA-graph mode and speculative config the engine really ran; every engine a JSON capture records with its
command line (`argv`) and the seconds it took to become ready (`ready_s`), the command line read by the project's
launch-line parser; and the fixtures of the cost entries that cover a cell. A new capture folder is picked up
when it is committed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gdn_operator.api.load import ManifestError
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.rules.cost import basis_text, costs_of_field, covers
from gdn_operator.rules.effective import effective_config
from gdn_operator.rules.evaluator import Evaluation, evaluate
from gdn_operator.rules.launchline import parse_launch_line
from gdn_operator.rules.rulefile import Cost, RuleSet
from gdn_operator.versions import parse_version

#: the checkpoint every cell serves (a Qwen3.5 dense model: architecture from the name, rules/family.py)
MODEL = "hf://Qwen/Qwen3.5-27B"
POLICY = "reject"
TPS = (1, 2)
#: CUDA-graph mode axis: key -> the spec fields it sets
MODES: dict[str, dict[str, Any]] = {"eager": {"enforceEager": True}, "PIECEWISE": {"cudagraphMode": "PIECEWISE"}, "default": {}}
#: each mode of the axis as vLLM's start-up line names it (CUDAGraphMode; NONE = eager) or as a command line
#: resolves (rules/effective.py cudagraph_mode: "auto" = not set, vLLM's default)
RAN_MODE = {"NONE": "eager", "PIECEWISE": "PIECEWISE", "FULL_AND_PIECEWISE": "default", "auto": "default"}
MTP_K = 2
#: the captures serve Qwen3-Next checkpoints (tests/models): their command lines name a path, not the family
CAPTURED_ARCHITECTURE = "Qwen3NextForCausalLM"

#: vLLM's engine start-up line and the values it prints (vllm/engine: "Initializing a V1 LLM engine (v0.22.0) with config:")
_START = re.compile(r"Initializing a \S+ LLM engine \(v([^)\s]+)\) with config: (.*)")
_TP = re.compile(r"\btensor_parallel_size=(\d+)")
_SPEC = re.compile(r"\bspeculative_config=(None|SpeculativeConfig\(method='([^']*)'[^\n]*?num_spec_tokens=(\d+))")
_GRAPHS = re.compile(r"'cudagraph_mode': <CUDAGraphMode\.([A-Z_]+)")
_EAGER = re.compile(r"\benforce_eager=True\b")
#: a GPU capture folder: vllm-<release>-<gpu, e.g. h100, h100x2, h200x2>[-what]
_FOLDER = re.compile(r"^vllm-(\d+\.\d+\.\d+)-([a-z]+\d+(?:x\d+)?)(?:-[a-z0-9.-]+)?$")


@dataclass(frozen=True)
class Axes:
    release: str
    tp: int
    mode: str  # a key of MODES
    mtp: bool


@dataclass(frozen=True)
class Measured:
    """A representative cost entry that covers a cell: MTP with the rule's mitigation / MTP off, per concurrency."""

    rule: str
    hardware: str
    model: str
    points: tuple[tuple[int, float], ...]  # (concurrency, vs_off)
    fixture: str
    basis: str = ""  # rules/cost.py basis_text: how a projected entry's ratios were obtained ("" when measured)


@dataclass(frozen=True)
class Mitigation:
    """A value the rules chose for an unset field, with its rule and what it measurably costs (empty: unmeasured)."""

    field: str
    value: Any
    rule: str
    costs: tuple[Measured, ...]


@dataclass(frozen=True)
class Capture:
    """One engine a committed GPU capture ran: as its own start-up line says, or as the capture's JSON records the
    command line of an engine that became ready."""

    folder: str  # path of the capture folder in the checkout, e.g. tests/fixtures/vllm-0.22.0-h100x2-tp2
    source: str  # the engine log's path in it, or JSON file + "#" + the engine's place in it
    gpu: str  # from the folder name: h100, h100x2, ...
    release: str
    tp: int
    mode: str | None  # a key of MODES, None for a mode outside the axis (FULL_DECODE_ONLY, ...)
    ran_mode: str  # CUDAGraphMode as logged (NONE: eager) or as the command line set it ("auto": left to vLLM)
    mtp: bool
    k: int | None

    def backs(self, a: Axes) -> bool:
        return self.release == a.release and min(self.tp, 2) == a.tp and self.mode == a.mode and self.mtp == a.mtp


@dataclass(frozen=True)
class Cell:
    axes: Axes
    verdict: str  # safe | mitigated | refused | advisory
    refused: tuple[str, ...] = ()
    mitigations: tuple[Mitigation, ...] = ()
    #: covering costs of rules whose mitigation the cell runs because the cell SETS it (e.g. cudagraphMode PIECEWISE)
    measured: tuple[Measured, ...] = ()
    #: warn-only findings: rule ids, or the cost advisory's code with its rule ("MTPSlowerThanOff (rule)")
    advisories: tuple[str, ...] = ()
    #: the rules that refuse the same server with the defaulted fields set to vLLM's own values
    as_shipped: tuple[str, ...] = ()
    #: capture folders (checkout paths) backing the cell: engine logs of this configuration, covering cost fixtures
    evidence: tuple[str, ...] = field(default=())

    def row(self) -> tuple[Any, ...]:
        """Everything a reader sees of the cell except its release (releases with equal rows are collapsed)."""
        a = self.axes
        return (
            a.tp,
            a.mode,
            a.mtp,
            self.verdict,
            self.refused,
            self.mitigations,
            self.measured,
            self.advisories,
            self.as_shipped,
            self.evidence,
        )


def cell_spec(a: Axes) -> GDNModelServerSpec:
    d: dict[str, Any] = {
        "model": {"uri": MODEL},
        "image": {"tag": f"v{a.release}", "vllmVersion": a.release},
        "tensorParallelSize": a.tp,
        **MODES[a.mode],
        "speculativeDecoding": {"method": "mtp", "numSpeculativeTokens": MTP_K} if a.mtp else {"enabled": False},
    }
    return GDNModelServerSpec.model_validate(d)


def _measured(rule: str, c: Cost) -> Measured:
    return Measured(rule, c.hardware, c.model, tuple((p.concurrency, p.vs_off) for p in c.points), c.fixture, basis_text(c))


def _costs_of(ruleset: RuleSet, field: str, ev: Evaluation) -> tuple[Measured, ...]:
    """What a value the rules chose costs (rules/cost.py costs_of_field, the one home of that lookup)."""
    return tuple(_measured(rule.id, c) for rule, c in costs_of_field(ruleset, field, ev.detail))


def _capture_folder(fixture: str) -> str:
    """The capture folder of a cost entry's fixture (tests/fixtures/<folder>/..., however deep the file is)."""
    parts = fixture.split("/")
    return "/".join(parts[:3]) if fixture.startswith("tests/fixtures/") and len(parts) > 3 else fixture.rsplit("/", 1)[0]


def judge(ruleset: RuleSet, a: Axes, captures: Iterable[Capture] = ()) -> Cell:
    """One cell, with the evaluator admission runs (policy reject, safe defaults)."""
    spec = cell_spec(a)
    ev = evaluate(spec, default_policy=POLICY, ruleset=ruleset)
    advisories = tuple(f"{f.code} ({f.rule})" if f.code else f.rule for f in ev.findings if f.action in ("advisory", "warned"))
    backing = sorted({c.folder for c in captures if c.backs(a)})
    if not ev.allowed:
        refused = tuple(dict.fromkeys(f.rule for f in ev.rejected))
        return Cell(a, "refused", refused=refused, advisories=advisories, evidence=tuple(backing))
    mitigations = tuple(Mitigation(d.field, d.value, d.rule, _costs_of(ruleset, d.field, ev)) for d in ev.defaults)
    mitigations += tuple(
        Mitigation(p, v, f.rule, _costs_of(ruleset, p, ev)) for f in ev.mitigated for p, v in (f.mitigation or {}).items()
    )
    chosen = {m.field for m in mitigations}
    # measurements of values the cell SETS itself (e.g. cudagraphMode PIECEWISE): none of its paths was chosen
    covering = [
        (frozenset(rule.mitigation or {}), _measured(rule.id, c))
        for rule in ruleset.costed
        for c in rule.cost
        if c.representative and covers(c, ev.detail)
    ]
    measured = tuple(m for paths, m in covering if not paths & chosen)
    backing = sorted(
        {
            *backing,
            *(
                _capture_folder(m.fixture)
                for m in (*measured, *(c for mi in mitigations for c in mi.costs))
                if m.fixture.startswith("tests/")
            ),
        }
    )
    if mitigations:
        raw = evaluate(spec, default_policy=POLICY, ruleset=ruleset, defaults=False)
        shipped = tuple(dict.fromkeys(f.rule for f in raw.rejected))
        return Cell(
            a,
            "mitigated",
            mitigations=mitigations,
            measured=measured,
            advisories=advisories,
            as_shipped=shipped,
            evidence=tuple(backing),
        )
    verdict = "advisory" if advisories else "safe"
    return Cell(a, verdict, measured=measured, advisories=advisories, evidence=tuple(backing))


def axes(releases: Iterable[str]) -> list[Axes]:
    return [Axes(r, tp, mode, mtp) for r in releases for mtp in (True, False) for tp in TPS for mode in MODES]


def matrix(ruleset: RuleSet, captures: Iterable[Capture] = ()) -> list[Cell]:
    """Every cell of the catalogue's releases (rules.yaml `catalogue.releases`), in release order."""
    caps = list(captures)
    return [judge(ruleset, a, caps) for a in axes(ruleset.releases)]


# ---------------------------------------------------------------------------------- GPU evidence ---


def engine_of(log_text: str) -> tuple[str, int, str, bool, int | None] | None:
    """(release, TP, logged CUDAGraphMode or "?", MTP, k) from an engine log's vLLM start-up line; None without one."""
    for line in log_text.splitlines():
        m = _START.search(line)
        if not m:
            continue
        release, config = m.group(1), m.group(2)
        tp = _TP.search(config)
        spec = _SPEC.search(config)
        graphs = _GRAPHS.search(config)
        if tp is None or spec is None:
            return None
        logged = graphs.group(1) if graphs else ("NONE" if _EAGER.search(config) else None)
        mtp = spec.group(2) == "mtp"
        return release, int(tp.group(1)), logged or "?", mtp, int(spec.group(3)) if mtp else None
    return None


def _argv_engines(doc: Any, where: str = "") -> Iterator[tuple[str, list[str]]]:
    """(place in the JSON, argv) of every engine record that became ready (a numeric `ready_s`) in a capture."""
    if isinstance(doc, dict):
        argv, ready = doc.get("argv"), doc.get("ready_s")
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv) and isinstance(ready, int | float):
            yield where or "/", argv
        for key, value in doc.items():
            yield from _argv_engines(value, f"{where}/{key}")
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _argv_engines(value, f"{where}[{i}]")


def engines_of_json(text: str, release: str) -> list[tuple[str, int, str, bool, int | None]]:
    """(place, TP, cudagraph mode, MTP, k) of the ready engines a JSON capture of `release` records, each command
    line read by the project's own launch-line parser (rules/launchline.py); [] for another release's capture."""
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    recorded = doc.get("vllm_version") if isinstance(doc, dict) else None
    if recorded is not None and parse_version(str(recorded)) != parse_version(release):
        return []
    out: list[tuple[str, int, str, bool, int | None]] = []
    for where, argv in _argv_engines(doc):
        try:
            line = parse_launch_line(["vllm", "serve", *argv], vllm_version=release, architecture=CAPTURED_ARCHITECTURE)
        except ManifestError:
            continue
        v = effective_config(line.spec, release, overrides=line.overrides).values
        mtp = bool(v["mtp"])
        out.append(
            (
                where,
                int(v["tensor_parallel_size"]),
                str(v["cudagraph_mode"]),
                mtp,
                int(v["num_speculative_tokens"]) if mtp else None,
            )
        )
    return out


def scan_captures(root: Path, fixtures: str = "tests/fixtures") -> list[Capture]:
    """Every engine of every GPU capture folder under root/fixtures (folders named vllm-<release>-<gpu>[-what]):
    the engine logs' start-up lines, and the ready engines the folder's JSON files record."""
    out: list[Capture] = []
    base = root / fixtures
    for folder in sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []:
        m = _FOLDER.match(folder.name)
        if not m:
            continue
        release, gpu, path = m.group(1), m.group(2), f"{fixtures}/{folder.name}"
        for log in sorted(folder.rglob("*.log")):
            eng = engine_of(log.read_text(encoding="utf-8", errors="replace"))
            if eng is None or parse_version(eng[0]) != parse_version(release):
                continue
            _, tp, ran, mtp, k = eng
            out.append(Capture(path, log.relative_to(folder).as_posix(), gpu, release, tp, RAN_MODE.get(ran), ran, mtp, k))
        for capture in sorted(folder.rglob("*.json")):
            for where, tp, ran, mtp, k in engines_of_json(capture.read_text(encoding="utf-8", errors="replace"), release):
                name = f"{capture.relative_to(folder).as_posix()}#{where}"
                out.append(Capture(path, name, gpu, release, tp, RAN_MODE.get(ran), ran, mtp, k))
    return out
