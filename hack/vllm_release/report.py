"""The DIFF step of hack/vllm-release-diff.py: two extracts (extract.py) -> every change, each with the parts of
this repo that read the fact (its consumers), as text or JSON.

Consumers come from `watch.yaml` and from the repo itself, read when the report is made (so they cannot go
stale): the flags the renderer writes (operator/gdn_operator/api/flags.py), the extraArgs / env policy
(api/data/extra-args-policy.yaml), the rule predicates that name a flag (`has_arg`) or a variable (`env.NAME`)
(rules/data/rules.yaml), and the metric names the scraper reads (watch/acceptance/parse.py SAMPLE_NAMES).

A change with a consumer is listed in full; one without (a new option nobody here reads, an environment
variable of another platform) is summarised by name in the text and listed in full in --json.

Size (~330 lines): one comparison per section of the extract, and the two renderings.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gdn_operator.api import flags as render_flags
from gdn_operator.watch.acceptance import SAMPLE_NAMES

ROOT = Path(__file__).resolve().parents[2]
POLICY = "operator/gdn_operator/api/data/extra-args-policy.yaml"
RULES = "operator/gdn_operator/rules/data/rules.yaml"
TABLES = "operator/gdn_operator/api/data/vllm-options"
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


@dataclass
class Change:
    section: str
    kind: str  # added | removed | changed
    item: str
    old: Any = None
    new: Any = None
    consumers: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def read_here(self) -> bool:
        return bool(self.consumers or self.note)


class Repo:
    """What this repo reads, by fact: the consumers of a flag destination, a variable, a topic."""

    def __init__(self, watch: dict[str, Any], root: Path = ROOT):
        self.watch = watch
        self.root = root
        self.policy = yaml.safe_load((root / POLICY).read_text())
        rules = yaml.safe_load((root / RULES).read_text())["rules"]
        self.has_arg: dict[str, list[str]] = {}
        self.env_rules: dict[str, list[str]] = {}
        for rule in rules:
            for kind, value in _predicates(rule.get("when")):
                if kind == "has_arg":
                    self.has_arg.setdefault(str(value), []).append(f"rule:{rule['id']}")
                elif kind.startswith("env."):
                    self.env_rules.setdefault(kind[4:], []).append(f"rule:{rule['id']}")
        self.rendered: dict[str, list[str]] = {}
        for name, value in vars(render_flags).items():
            spellings: tuple[str, ...] = ()
            if isinstance(value, render_flags.Flag):
                spellings = value.spellings
            elif isinstance(value, str) and value.startswith("--"):
                spellings = (value,)
            for s in spellings:
                self.rendered.setdefault(s, []).append(f"operator/gdn_operator/api/flags.py:{name}")
        self.scraped = sorted({_metric_base(n) for n in SAMPLE_NAMES})

    def flag(self, dest: str, options: list[str]) -> tuple[list[str], str]:
        out: list[str] = []
        for s in options:
            out += self.rendered.get(s, []) + self.has_arg.get(s, [])
        for section in ("owned", "rule_relevant"):
            if dest in self.policy[section]:
                out.append(f"{POLICY}:{dest}")
        out += self.watch["flags"]["consumers"].get(dest, [])
        note = ""
        if dest in self.policy["owned"]:
            note = f"owned by {self.policy['owned'][dest]}"
        elif dest in self.policy["rule_relevant"]:
            note = "refused in extraArgs (rule-relevant)"
        elif dest in self.policy["reviewed_allowed"]:
            note = "reviewed, allowed in extraArgs"
        elif re.search(self.policy["review_pattern"], dest):
            note = f"UNCLASSIFIED: matches review_pattern; classify it in {POLICY}"
        return list(dict.fromkeys(out)), note

    def env(self, name: str) -> tuple[list[str], str]:
        env = self.policy["env"]
        out = list(self.watch["env"].get(name) or []) + self.env_rules.get(name, [])
        note = ""
        for section in ("owned", "injected", "rule_relevant"):
            if name in env[section]:
                out.append(f"{POLICY}:{name}")
                note = f"{section} in the env policy: {env[section][name]}"
        return list(dict.fromkeys(out)), note


def _predicates(node: Any) -> list[tuple[str, Any]]:
    """(key, value) of every leaf predicate: `has_arg: X` and the keys of `eq` / `in` maps."""
    out: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "has_arg":
                out.append(("has_arg", v))
            elif k in ("eq", "in", "ne", "not_in") and isinstance(v, dict):
                out += [(kk, vv) for kk, vv in v.items()]
            else:
                out += _predicates(v)
    elif isinstance(node, list):
        for item in node:
            out += _predicates(item)
    return out


def _metric_base(name: str) -> str:
    base = name[5:] if name.startswith(("vllm:", "vllm_")) else name
    for suffix in _SUFFIXES:
        if base.endswith(suffix) and base != suffix.lstrip("_"):
            return base[: -len(suffix)]
    return base


# ------------------------------------------------------------------------------------ the diff ---


def _dict_diff(section: str, old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str, Any, Any]]:
    out = [(section, "removed", k, old[k]) for k in sorted(set(old) - set(new))]
    out += [(section, "added", k, new[k]) for k in sorted(set(new) - set(old))]
    return out + [(section, "changed", k, (old[k], new[k])) for k in sorted(set(old) & set(new)) if old[k] != new[k]]


def diff(old: dict[str, Any], new: dict[str, Any], repo: Repo) -> list[Change]:  # noqa: C901 - one block per section
    w = repo.watch
    changes: list[Change] = []

    for _, kind, name, val in _dict_diff("requires", old["requires"], new["requires"]):
        o, n = val if kind == "changed" else (val, None) if kind == "removed" else (None, val)
        changes.append(Change("requires", kind, name, o, n, list(w["requires"].get(name, []))))

    runners_old, runners_new = old["model_runners"], new["model_runners"]
    for f in sorted(set(runners_old) | set(runners_new)):
        o, n = set(runners_old.get(f, [])), set(runners_new.get(f, []))
        for cls in sorted(o - n):
            changes.append(Change("model_runners", "removed", f"{f}:{cls}", consumers=list(w["model_runners"]["consumers"])))
        for cls in sorted(n - o):
            changes.append(Change("model_runners", "added", f"{f}:{cls}", consumers=list(w["model_runners"]["consumers"])))

    table = f"{TABLES}/{new['vllm_version']}.yaml"
    for _, kind, dest, val in _dict_diff("flags", old["flags"], new["flags"]):
        entry = val[1] if kind == "changed" else val
        consumers, note = repo.flag(dest, entry["options"])
        item = entry["options"][0]
        if kind == "changed":
            (o, n) = val
            for key in ("default", "options"):
                if o[key] != n[key]:
                    changes.append(Change("flags", f"{key} changed", item, o[key], n[key], consumers, note))
            continue
        if kind == "added":
            if (repo.root / table).exists():
                note = note or "no consumer here; admitted in extraArgs (the release's parser table has it)"
            else:
                note = (
                    note + "; " if note else ""
                ) + "NO PARSER TABLE: refused in extraArgs until hack/gen_vllm_options.py makes it"
            consumers = [*consumers, table]
        changes.append(
            Change("flags", kind, item, entry if kind == "removed" else None, entry if kind == "added" else None, consumers, note)
        )

    for section in ("env", "env_removed"):
        for _, kind, name, val in _dict_diff(section, old[section], new[section]):
            consumers, note = repo.env(name)
            o, n = val if kind == "changed" else (val, None) if kind == "removed" else (None, val)
            if section == "env_removed" and kind == "added":
                note = ("vLLM now FAILS AT START when it is set; " + note).strip("; ")
            elif section == "env" and kind == "removed" and name.startswith("VLLM_") and name not in new["env_removed"]:
                raises = new["env_checks"].get(name, {}).get("raises", [])
                how = (
                    "it still raises where named (env_checks below)"
                    if raises
                    else "a warning at start, a failure with --fail-on-environ-validation"
                )
                note = (f"no longer a vLLM variable: {how}; " + note).strip("; ")
            changes.append(Change("env" if section == "env" else "env_removed", kind, name, o, n, consumers, note))

    for name in sorted(set(old["env_checks"]) | set(new["env_checks"])):
        o = old["env_checks"].get(name, {"files": [], "raises": []})
        n = new["env_checks"].get(name, {"files": [], "raises": []})
        consumers, note = repo.env(name)
        for r in sorted(set(o["raises"]) - set(n["raises"])):
            changes.append(Change("env_checks", "removed", name, r, None, consumers, note))
        for r in sorted(set(n["raises"]) - set(o["raises"])):
            changes.append(Change("env_checks", "added", name, None, r, consumers, note))
        gone = sorted(set(o["files"]) - set(n["files"]))
        came = sorted(set(n["files"]) - set(o["files"]))
        if gone or came:
            changes.append(Change("env_checks", "readers changed", name, gone, came, consumers, note))

    config_consumers = {e["file"]: e.get("consumers", []) for e in w["config"]}
    for key in sorted(set(old["config"]) | set(new["config"])):
        consumers = config_consumers.get(key.split(":", 1)[0], [])
        for _, kind, name, val in _dict_diff("config", old["config"].get(key, {}), new["config"].get(key, {})):
            o, n = val if kind == "changed" else (val, None) if kind == "removed" else (None, val)
            changes.append(Change("config", kind, f"{key}.{name}", o, n, list(consumers)))
    for _, kind, name, val in _dict_diff("constants", old["constants"], new["constants"]):
        o, n = val if kind == "changed" else (val, None) if kind == "removed" else (None, val)
        changes.append(Change("constants", kind, name, o, n, list(config_consumers.get(name.split(":", 1)[0], []))))

    for topic, spec in w["branches"].items():
        o_topic, n_topic = old["branches"].get(topic, {}), new["branches"].get(topic, {})
        for scope in sorted(set(o_topic) | set(n_topic)):
            o, n = o_topic.get(scope, []), n_topic.get(scope, [])
            gone, came = [x for x in o if x not in n], [x for x in n if x not in o]
            if gone or came:
                changes.append(Change(f"branches:{topic}", "changed", scope, gone, came, list(spec.get("consumers", []))))

    targets = {e["target"]: e for e in w.get("patch_targets", [])}
    for target, spec in targets.items():
        o = old.get("patch_targets", {}).get(target)
        n = new.get("patch_targets", {}).get(target)
        if o != n:
            missing = sorted(set(spec["members"]) - set((n or {}).get("members", [])))
            note = f"the guard needs {missing}" if missing else ""
            changes.append(Change("patch_targets", "changed", target, o, n, list(spec.get("consumers", [])), note))

    o_metrics, n_metrics = set(old["metrics"]), set(new["metrics"])
    scraped = {f"vllm:{b}" for b in repo.scraped}
    for m in sorted(o_metrics - n_metrics):
        note = "SCRAPED: the scraper reads it" if m in scraped else ""
        changes.append(Change("metrics", "removed", m, consumers=list(w["metrics"]["consumers"]) if note else [], note=note))
    for m in sorted(n_metrics - o_metrics):
        changes.append(Change("metrics", "added", m))
    for m in sorted(scraped - n_metrics - o_metrics):  # never spelled by either release: the scraper reads nothing
        changes.append(
            Change("metrics", "absent", m, consumers=list(w["metrics"]["consumers"]), note="SCRAPED but in neither release")
        )
    return changes


# ------------------------------------------------------------------------------------ rendering ---

_TITLES = {
    "requires": "requirements (dist-info METADATA Requires-Dist)",
    "model_runners": "model runners (vllm/v1/worker)",
    "flags": "`vllm serve` options and their defaults",
    "env": "environment variables (vllm/envs.py environment_variables)",
    "env_removed": "removed environment variables (vllm/envs.py removed_environment_variables)",
    "env_checks": "where the watched environment variables are checked (raise) and read",
    "config": "config class defaults",
    "constants": "config module constants",
    "patch_targets": "classes the gdn-guard plugin patches",
    "metrics": "metric names (vllm:*)",
}
_MARK = {"added": "+", "removed": "-"}


def _show(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_text(old: dict[str, Any], new: dict[str, Any], changes: list[Change]) -> str:
    read = [c for c in changes if c.read_here]
    lines = [
        f"vLLM release diff {old['vllm_version']} -> {new['vllm_version']} (extracts of {old['source']}, {new['source']})",
        f"{len(changes)} changes; {len(read)} touch what this repo reads (listed in full), "
        f"{len(changes) - len(read)} others (named per section; all in --json).",
    ]
    sections: list[str] = []
    for c in changes:
        if c.section not in sections:
            sections.append(c.section)
    for section in sections:
        title = (
            _TITLES.get(section) or f"config branches: {section.split(':', 1)[1]} (statements and the conditions they sit under)"
        )
        lines += ["", f"== {title}"]
        mine = [c for c in changes if c.section == section and c.read_here]
        others = [c for c in changes if c.section == section and not c.read_here]
        for i, c in enumerate(mine):
            nxt = mine[i + 1] if i + 1 < len(mine) else None
            same_readers = nxt is not None and (nxt.consumers, nxt.note) == (c.consumers, c.note)
            lines += _render_change(c, readers=not same_readers)  # consecutive changes with one set of readers: once
        for kind in ("added", "removed", "changed", "default changed", "options changed"):
            names = [c.item for c in others if c.kind == kind]
            if names:
                lines.append(f"  ({kind}, read by nothing here: {len(names)}) " + ", ".join(names))
    return "\n".join(lines) + "\n"


def _render_change(c: Change, readers: bool = True) -> list[str]:
    out: list[str] = []
    if c.section.startswith("branches:"):
        out.append(f"  ~ {c.item}")
        out += [f"      - {x}" for x in c.old] + [f"      + {x}" for x in c.new]
    elif c.kind in _MARK and c.section == "flags":
        entry = c.new if c.kind == "added" else c.old
        aliases = [o for o in entry["options"] if o != c.item]
        out.append(
            f"  {_MARK[c.kind]} {c.item} (default {entry['default']}" + (f"; also {', '.join(aliases)})" if aliases else ")")
        )
    elif c.kind in _MARK:
        value = c.new if c.kind == "added" else c.old
        out.append(f"  {_MARK[c.kind]} {c.item}" + (f": {_show(value)}" if value not in (None, "", [], {}) else ""))
    else:
        out.append(f"  ~ {c.item} {c.kind}: {_show(c.old)} -> {_show(c.new)}")
    if readers and c.note:
        out.append(f"      note: {c.note}")
    if readers and c.consumers:
        out.append("      read by: " + ", ".join(c.consumers))
    return out


def render_json(old: dict[str, Any], new: dict[str, Any], changes: list[Change]) -> str:
    doc = {
        "old": {"vllm_version": old["vllm_version"], "source": old["source"]},
        "new": {"vllm_version": new["vllm_version"], "source": new["source"]},
        "changes": [{**asdict(c), "read_here": c.read_here} for c in changes],
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
