"""Conditions and phase: the phase is always derived from the conditions."""

from gdn_operator.handlers import status as st


def test_new_condition_gets_transition_time_and_phase():
    s = {}
    assert st.set_condition(s, st.VALIDATED, True, "Admitted", "ok", 1)
    c = st.get_condition(s, st.VALIDATED)
    assert c["status"] == "True" and c["reason"] == "Admitted" and c["observedGeneration"] == 1
    assert c["lastTransitionTime"].endswith("Z")
    assert s["phase"] == "Progressing"


def test_transition_time_only_changes_with_status(monkeypatch):
    s = {}
    monkeypatch.setattr(st, "now", lambda: "2026-01-01T00:00:00Z")
    st.set_condition(s, st.READY, False, "EnginesNotReady", "0/1")
    monkeypatch.setattr(st, "now", lambda: "2026-01-01T00:05:00Z")
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
