"""The runbooks (docs/runbooks/) name only remediation modes the CRD has (issue 38: GDNEngineStalled.md named
`off` / `report`, which the API never had)."""

from __future__ import annotations

import re
from pathlib import Path

from gdn_operator.api.crd import crd_manifest

RUNBOOKS = Path(__file__).resolve().parents[1] / "docs" / "runbooks"

#: `spec.remediation.mode: X`, `remediation.mode: X`, and "remediation mode `X` / `Y`" (any list of spans)
_SET = re.compile(r"remediation\.mode:\s*`?([A-Za-z_-]+)")
_PROSE = re.compile(r"remediation mode\s+((?:`[^`]+`(?:\s*(?:/|,|or)\s*)?)+)")


def crd_modes() -> set[str]:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return set(schema["properties"]["spec"]["properties"]["remediation"]["properties"]["mode"]["enum"])


def named_modes(text: str) -> set[str]:
    found = set(_SET.findall(text))
    for group in _PROSE.findall(text):
        found |= set(re.findall(r"`([^`]+)`", group))
    return found


def test_the_mode_reader_sees_both_spellings():
    assert named_modes("set `spec.remediation.mode: auto`; remediation mode `off` / `report`") == {"auto", "off", "report"}


def test_every_remediation_mode_a_runbook_names_exists_in_the_crd():
    modes = crd_modes()
    assert modes == {"auto", "none"}
    seen = set()
    for page in sorted(RUNBOOKS.glob("*.md")):
        named = named_modes(page.read_text())
        seen |= named
        assert named <= modes, f"{page.name} names remediation mode(s) {sorted(named - modes)}; the CRD has {sorted(modes)}"
    assert "auto" in seen  # the runbooks do name modes: the reader found them
