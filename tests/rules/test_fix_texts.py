"""Fix texts name only fixes that exist (issue 36): every gdn-guard patch id that a text shown to users as the
fix names (a rule's or built-in's workaround, a crash signature's remediation hint) ships in images/gdn-guard,
and the rule file's shipped `patches` are exactly the plugin's guards. Planned ids stay in `planned_patches`."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gdn_operator.rules import load_rules
from gdn_operator.watch.signatures import default_catalogue

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "images" / "gdn-guard" / "src"
PATCH_ID = re.compile(r"gdn-guard/vllm-\d+")


@pytest.fixture(scope="module")
def shipped() -> Iterator[set[str]]:
    """The patch ids of every guard the gdn-guard plugin in this checkout implements."""
    sys.path.insert(0, str(PLUGIN_SRC))
    try:
        from gdn_guard.guards import all_guards

        yield {g.patch_id for g in all_guards()}
    finally:
        sys.path.remove(str(PLUGIN_SRC))


def fix_texts() -> list[tuple[str, str]]:
    """(where, text) for every text shown as a fix."""
    cat = load_rules()
    out = [(f"rule {r.id} workaround", r.workaround) for r in cat.rules]
    out += [(f"builtin {b.id} workaround", b.workaround) for b in cat.builtin.values()]
    out += [(f"signature {s.id} hint", s.remediation.hint or "") for s in default_catalogue().signatures]
    return out


def named_ids(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(where, m) for where, t in texts for m in PATCH_ID.findall(t)]


def test_every_patch_id_a_fix_text_names_ships_in_gdn_guard(shipped):
    named = named_ids(fix_texts())
    assert named, "no fix text names a patch id: the check would check nothing"
    assert [(w, p) for w, p in named if p not in shipped] == []


def test_the_rule_files_shipped_patches_are_the_plugins_guards(shipped):
    cat = load_rules()
    assert set(cat.patch_ids) == shipped
    assert not set(cat.planned_patch_ids) & shipped  # a shipped guard moves out of planned_patches


def test_the_check_catches_a_planned_backport_named_as_a_fix(shipped):
    """The vllm#51562 text before issue 36 named a backport that is only planned."""
    old = "Upgrade to vLLM >= 0.31.0 (PR #51565) or use an image with the gdn-guard/vllm-51562 backport."
    assert [p for _, p in named_ids([("old vllm#51562", old)]) if p not in shipped] == ["gdn-guard/vllm-51562"]
    assert "gdn-guard/vllm-51562" in load_rules().planned_patch_ids
