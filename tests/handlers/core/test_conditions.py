"""Conditions and phase: the phase is always derived from the conditions."""

from gdn_operator.handlers.core import condition_list
from gdn_operator.handlers.core import conditions as st


def test_new_condition_gets_transition_time_and_phase():
    s = {}
    assert st.set_condition(s, st.VALIDATED, True, "Admitted", "ok", 1)
    c = st.get_condition(s, st.VALIDATED)
    assert c["status"] == "True" and c["reason"] == "Admitted" and c["observedGeneration"] == 1
    assert c["lastTransitionTime"].endswith("Z")
    assert s["phase"] == "Progressing"


def test_transition_time_only_changes_with_status(monkeypatch):
    s = {}
    monkeypatch.setattr(condition_list, "now", lambda: "2026-01-01T00:00:00Z")
    st.set_condition(s, st.READY, False, "EnginesNotReady", "0/1")
    monkeypatch.setattr(condition_list, "now", lambda: "2026-01-01T00:05:00Z")
    assert st.set_condition(s, st.READY, False, "EnginesNotReady", "0/2")  # message changed
    assert st.get_condition(s, st.READY)["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert not st.set_condition(s, st.READY, False, "EnginesNotReady", "0/2")  # no change at all
    st.set_condition(s, st.READY, True, "EnginesReady", "2/2")
    assert st.get_condition(s, st.READY)["lastTransitionTime"] == "2026-01-01T00:05:00Z"


def test_phase_precedence():
    s = {}
    assert st.derive_phase(s) == "Pending"
    st.set_condition(s, st.VALIDATED, True, "Admitted")
    assert s["phase"] == "Progressing"
    st.set_condition(s, st.READY, True, "EnginesReady")
    assert s["phase"] == "Ready"
    st.set_condition(s, st.DEGRADED, True, "AcceptanceCollapsed")
    assert s["phase"] == "Degraded"
    st.set_condition(s, st.UNSCHEDULABLE, True, "InsufficientGPUs")
    assert s["phase"] == "Unschedulable"
    st.set_condition(s, st.CRASH_LOOPING, True, "KnownCrash")
    assert s["phase"] == "CrashLooping"


def test_rejected_only_when_nothing_runs():
    s = {}
    st.set_condition(s, st.VALIDATED, False, "KnownIssue")
    assert s["phase"] == "Rejected"
    s2 = {"readyReplicas": 1}
    st.set_condition(s2, st.READY, True, "EnginesReady")
    st.set_condition(s2, st.VALIDATED, False, "KnownIssue")  # a later spec was refused; the old one runs
    assert s2["phase"] == "Ready"


def test_replicas_display():
    s = {}
    st.set_replicas(s, 3, 1)
    assert s["ready"] == "1/3" and s["replicas"] == 3 and s["readyReplicas"] == 1


# ------------------------------------------------------------------------------------------------
# Degraded: derived from its owners' conditions, every cause at once (issue 12)


def test_degraded_merges_every_owner_and_clears_only_when_none_is_left():
    s = {"readyReplicas": 1}
    st.set_condition(s, st.READY, False, "EnginesNotReady", "1/2 engine pods ready.", 3)
    d = st.get_condition(s, st.DEGRADED)
    assert (d["status"], d["reason"], d["message"]) == ("True", "PartiallyReady", "only 1/2 engine pods ready.")
    st.set_condition(s, st.OUTPUT_CONSISTENT, False, "ProbeMismatch", "probe q: token 3 differs", 3)
    st.set_condition(s, st.CRASH_LOOPING, False, "EngineCrashed", "engine in pod p died: B1", 3)
    d = st.get_condition(s, st.DEGRADED)
    assert d["reason"] == "EngineCrashed" and d["message"].startswith("engine in pod p died: B1 (also: ProbeMismatch:")
    assert "PartiallyReady: only 1/2" in d["message"] and d["observedGeneration"] == 3
    assert s["phase"] == "Degraded"
    # the probes recover: Degraded stays for the others (no owner clears another's cause)
    st.set_condition(s, st.OUTPUT_CONSISTENT, True, "ProbesPassing", "ok", 3)
    assert st.get_condition(s, st.DEGRADED)["reason"] == "EngineCrashed"
    st.set_condition(s, st.CRASH_LOOPING, False, "EnginesRunning", "engines are running", 3)
    d = st.get_condition(s, st.DEGRADED)
    assert (d["status"], d["reason"]) == ("True", "PartiallyReady")
    st.set_replicas(s, 2, 2, 3)
    st.set_condition(s, st.READY, True, "EnginesReady", "2/2 engine pods ready.", 3)
    d = st.get_condition(s, st.DEGRADED)
    assert (d["status"], d["reason"], d["message"]) == ("False", "Recovered", "PartiallyReady cleared")
    assert s["phase"] == "Ready"


def test_degraded_is_not_created_to_say_false_and_ignores_healthy_reasons():
    s = {}
    st.set_condition(s, st.ACCEPTANCE, True, "AcceptanceOk", "acceptance 80%")
    st.set_condition(s, st.ACCEPTANCE, None, "NoTraffic", "acceptance state NoTraffic")
    st.set_condition(s, st.PATCH_SET, True, "PatchSetVerified", "ok")
    st.set_condition(s, st.CRASH_LOOPING, False, "EnginesRunning", "")
    assert st.get_condition(s, st.DEGRADED) is None
    st.set_condition(s, st.ACCEPTANCE, False, "SpecAcceptanceNearZero", "acceptance 0.1%")
    assert st.get_condition(s, st.DEGRADED)["reason"] == "SpecAcceptanceNearZero"


def test_crash_loop_and_a_single_recent_crash_both_degrade():
    s = {}
    st.set_condition(s, st.CRASH_LOOPING, True, "RepeatedCrash", "2 crashes of x on generation 1")
    assert st.crash_recent(s) and st.get_condition(s, st.DEGRADED)["reason"] == "EngineCrashed"
    assert s["phase"] == "CrashLooping"


def test_only_the_conditions_module_writes_degraded():
    from pathlib import Path

    import gdn_operator

    pkg = Path(gdn_operator.__file__).parent
    writers = [
        f"{p.relative_to(pkg)}:{i}"
        for p in pkg.rglob("*.py")
        if p != pkg / "handlers" / "core" / "conditions.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "DEGRADED" in line and "set_condition" in line
    ]
    assert writers == []


def test_the_readme_condition_table_lists_every_condition():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    block = readme.split("<!-- conditions-table -->")[1].split("<!-- /conditions-table -->")[0]
    listed = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", block, re.M)
    assert listed == [(type_, writer) for type_, (writer, _what) in st.CONDITIONS.items()]
    pkg = Path(st.__file__).resolve().parents[2]
    for _type, (writer, _what) in st.CONDITIONS.items():  # every writer named is a module that exists
        for module in writer.replace(" (derived)", "").split(", "):
            assert (pkg / module).is_file(), module


def test_the_neutral_writer_derives_nothing(monkeypatch):
    """condition_list.put_condition sets the one condition it is given: no phase and no Degraded, even for a type the
    server's writer derives Degraded from (a GDNGuard's Stalled condition, issue 49); the server's set_condition is the
    same write plus its derivations."""
    monkeypatch.setattr(condition_list, "now", lambda: "2026-01-01T00:00:00Z")
    guard: dict = {}
    assert condition_list.put_condition(guard, st.STALLED, True, "Stalled", "pod p: no progress", 2)
    assert [c["type"] for c in guard["conditions"]] == [st.STALLED] and set(guard) == {"conditions"}
    server: dict = {}
    assert st.set_condition(server, st.STALLED, True, "Stalled", "pod p: no progress", 2)
    assert [c["type"] for c in server["conditions"]] == [st.STALLED, st.DEGRADED] and server["phase"] == "Degraded"
    assert server["conditions"][0] == guard["conditions"][0]  # one write: the same condition either way
    before = guard["conditions"]
    assert not condition_list.put_condition(guard, st.STALLED, True, "Stalled", "pod p: no progress", 2)
    assert condition_list.put_condition(guard, st.STALLED, False, "NoFinding", "", 2)
    assert before[0]["status"] == "True"  # a new list and entry: what the caller held is unchanged
