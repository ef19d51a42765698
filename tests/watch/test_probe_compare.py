"""Output probes, pure part: comparison modes, learning in a round, and the state machine."""

from __future__ import annotations

import pytest

from gdn_operator.api.probes import Probe
from gdn_operator.watch.probes import (
    EARLY_STOP,
    ERROR,
    LEARNED,
    MISMATCH,
    PASS,
    Answer,
    Asked,
    Outcome,
    ProbeBook,
    Verdict,
    compare,
    judge_round,
)

REF = Answer((11, 12, 13, 14, 15, 16, 17, 18, 19, 20), "", "length")


def ids(*t: int, finish: str = "length") -> Answer:
    return Answer(tuple(t), "", finish)


# ------------------------------------------------------------------------------- comparison modes ---


def test_exact_pass_and_first_differing_token():
    assert compare(REF, REF, ("exact", None)).result == PASS
    v = compare(REF, ids(11, 12, 13, 99, 15, 16, 17, 18, 19, 20), ("exact", None))
    assert (v.result, v.position) == (MISMATCH, 3)
    assert v.expected == "[14, 15, 16, 17, 18, 19, …]" and v.got == "[99, 15, 16, 17, 18, 19, …]"
    assert "token 3 differs" in v.message


def test_exact_early_stop_is_not_a_mismatch():
    v = compare(REF, ids(11, 12, 13, 14, finish="stop"), ("exact", None))
    assert (v.result, v.position) == (EARLY_STOP, 4)
    assert "stopped after 4 tokens (stop), expected 10" in v.message


def test_exact_longer_answer_is_a_mismatch_at_the_expected_end():
    v = compare(ids(11, 12, finish="stop"), ids(11, 12, 13), ("exact", None))
    assert (v.result, v.position, v.expected) == (MISMATCH, 2, "<end>")


def test_prefix_n_ignores_divergence_after_n():
    late = ids(11, 12, 13, 14, 15, 16, 17, 18, 0, 0)
    assert compare(REF, late, ("prefix", 8)).result == PASS
    assert compare(REF, late, ("exact", None)).result == MISMATCH
    early = ids(11, 12, 13, 14, 15, 16, 0, 18, 19, 20)
    v = compare(REF, early, ("prefix", 8))
    assert (v.result, v.position) == (MISMATCH, 6)


def test_prefix_n_early_stop_inside_the_prefix():
    v = compare(REF, ids(11, 12, 13, finish="stop"), ("prefix", 8))
    assert (v.result, v.position) == (EARLY_STOP, 3)


def test_prefix_n_reference_that_stopped_early_must_stop_there_too():
    ref = ids(11, 12, 13, finish="stop")  # the healthy engine ended after 3 tokens (EOS)
    assert compare(ref, ids(11, 12, 13, finish="stop"), ("prefix", 8)).result == PASS
    v = compare(ref, ids(11, 12, 13, 5, 5, 5, 5, 5), ("prefix", 8))
    assert (v.result, v.position) == (MISMATCH, 3)


def test_plain_prefix_with_text():
    exp = Answer(None, " Paris", None)
    assert compare(exp, Answer((1, 2, 3), " Paris is the capital", "length"), ("prefix", None)).result == PASS
    v = compare(exp, Answer((1, 2), " Pari", "stop"), ("prefix", None))
    assert (v.result, v.position) == (EARLY_STOP, 5)
    v = compare(exp, Answer((1, 2), " London", "length"), ("prefix", None))
    assert (v.result, v.position) == (MISMATCH, 1) and "character 1" in v.message


def test_text_expectation_against_a_tokenizer_less_engine_says_why():
    v = compare(Answer(None, "x", None), Answer((1, 2), "", "length"), ("exact", None))
    assert v.result == MISMATCH and "expectedTokenIds" in v.message


def test_min_length():
    assert compare(None, ids(*range(8)), ("minLength", 8)).result == PASS
    v = compare(None, ids(1, 2, finish="stop"), ("minLength", 8))
    assert (v.result, v.position) == (EARLY_STOP, 2) and "at least 8" in v.message


def test_compare_needs_an_expectation():
    with pytest.raises(ValueError):
        compare(None, REF, ("exact", None))


def test_snippets_never_carry_the_whole_answer():
    long = Answer(tuple(range(128)), "", "length")
    other = Answer((0,) + tuple(range(1000, 1127)), "", "length")
    v = compare(long, other, ("exact", None))
    assert v.position == 1 and v.got.count(",") <= 6 and v.expected.count(",") <= 6


# ------------------------------------------------------------------------------------ judge_round ---


def probe(name: str, **kw) -> Probe:
    return Probe(name=name, prompt_token_ids=[1, 2, 3], max_tokens=10, **kw)


def test_learn_takes_the_first_answer_then_compares_the_others():
    p = probe("q", mode="exact")
    asked = [
        Asked("pod-a", "q", REF),
        Asked("pod-b", "q", REF),
        Asked("pod-c", "q", ids(11, 12, finish="stop")),
        Asked("pod-d", "q", ids(11, 0)),
    ]
    out, learned = judge_round([p], {}, asked)
    assert [o.result for o in out] == [LEARNED, PASS, EARLY_STOP, MISMATCH]
    assert learned == {"q": ("pod-a", REF)}


def test_an_error_is_never_learned():
    p = probe("q")
    out, learned = judge_round([p], {}, [Asked("pod-a", "q", None, "timeout", "no answer within 1s"), Asked("pod-b", "q", REF)])
    assert [o.result for o in out] == [ERROR, LEARNED] and learned["q"][0] == "pod-b"
    assert "timeout" in out[0].verdict.message


def test_given_expectation_is_used_and_nothing_is_learned():
    p = probe("q", expected_token_ids=[11, 12, 13])
    out, learned = judge_round([p], {}, [Asked("pod-a", "q", ids(11, 12, 13, finish="stop"))])
    assert [o.result for o in out] == [PASS] and learned == {}
    out, _ = judge_round([p], {}, [Asked("pod-a", "q", ids(11, 99, 13, finish="stop"))])
    assert out[0].result == MISMATCH and out[0].verdict.position == 1


def test_existing_reference_is_compared_with_default_prefix():
    p = probe("q")  # learn, default prefix:8
    late_change = ids(11, 12, 13, 14, 15, 16, 17, 18, 0, 0)
    out, learned = judge_round([p], {"q": REF}, [Asked("pod-a", "q", late_change)])
    assert out[0].result == PASS and not learned


# ---------------------------------------------------------------------------------- state machine ---


def o(probe: str, result: str, pod: str = "pod-a", position: int | None = None) -> Outcome:
    return Outcome(
        pod,
        probe,
        Verdict(
            result, position, "[1]" if position is not None else None, "[2]" if position is not None else None, f"{result} here"
        ),
    )


def test_one_blip_never_alarms_and_a_pass_resets():
    b = ProbeBook(["q"], threshold=2)
    assert b.observe([o("q", LEARNED)]).value is True
    c = b.observe([o("q", MISMATCH, position=3)])
    assert c.value is True and b.tracks["q"].consecutive == 1 and b.state == "Failing"
    assert b.observe([o("q", PASS)]).value is True and b.tracks["q"].consecutive == 0
    assert b.state == "Consistent"


def test_threshold_consecutive_failures_alarm_with_the_failure_reason():
    b = ProbeBook(["q", "r"], threshold=3)
    b.observe([o("q", PASS), o("r", PASS)])
    for _ in range(2):
        assert b.observe([o("q", EARLY_STOP, pod="pod-b", position=2), o("r", PASS)]).value is True
    c = b.observe([o("q", EARLY_STOP, pod="pod-b", position=2), o("r", PASS)], now="2026-11-23T14:00:00Z")
    assert (c.value, c.reason, c.failure) == (False, "ProbeEarlyStop", EARLY_STOP)
    assert "probe q failed 3 rounds in a row on pod pod-b" in c.message and "expected [1], got [2]" in c.message
    assert b.tracks["q"].last_failure == {
        "time": "2026-11-23T14:00:00Z",
        "pod": "pod-b",
        "result": EARLY_STOP,
        "position": 2,
        "expected": "[1]",
        "got": "[2]",
        "message": "early-stop here",
    }
    assert b.state == "Inconsistent"


def test_worst_pod_names_the_round_and_mismatch_outranks_errors():
    b = ProbeBook(["q"], threshold=1)
    c = b.observe([o("q", ERROR, pod="a"), o("q", MISMATCH, pod="b", position=0), o("q", PASS, pod="c")])
    assert (c.value, c.reason) == (False, "ProbeMismatch")
    b2 = ProbeBook(["q"], threshold=1)
    c2 = b2.observe([o("q", ERROR), o("q", PASS, pod="b")])
    assert (c2.value, c2.reason) == (None, "ProbeError")  # no answer is not a wrong answer


def test_partial_recovery_keeps_the_alarm_full_recovery_clears_it():
    b = ProbeBook(["q", "r"], threshold=1)
    assert b.observe([o("q", MISMATCH, position=1), o("r", MISMATCH, position=1)]).value is False
    c = b.observe([o("q", PASS), o("r", MISMATCH, position=1)])
    assert c.value is False and "probe r" in c.message
    c = b.observe([o("q", PASS), o("r", ERROR)])
    assert (c.value, c.reason) == (False, "ProbeMismatch")  # r's streak had a wrong answer: still inconsistent
    assert "mismatch here" in c.message
    assert b.observe([o("q", PASS), o("r", PASS)]).value is True


def err(probe: str, cause: str, pod: str = "pod-a") -> Outcome:
    return Outcome(pod, probe, Verdict(ERROR, message=f"{cause}: boom", cause=cause))


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        ("auth", "ProbeUnauthorized"),
        ("connect", "ProbeUnreachable"),
        ("timeout", "ProbeTimeout"),
        ("http", "ProbeError"),
        ("parse", "ProbeError"),
    ],
)
def test_no_answer_is_unknown_by_cause_never_inconsistent(cause, reason):
    """Issue 38: a probe that gets no answer (401 without the key, a refused connection, a timeout) cannot tell
    whether the output is right: OutputConsistent is Unknown with the cause as reason, never False."""
    b = ProbeBook(["q"], threshold=3)
    b.observe([o("q", PASS)])
    for _ in range(2):
        assert b.observe([err("q", cause)]).value is True  # below the threshold: unchanged
    c = b.observe([err("q", cause)])
    assert (c.value, c.reason, c.failure) == (None, reason, ERROR)
    assert "got no answer 3 rounds in a row on pod pod-a" in c.message and "not a wrong answer" in c.message
    assert b.state == "NoAnswer" and b.tracks["q"].last_failure["cause"] == cause
    assert b.observe([o("q", PASS)]).value is True


def test_a_wrong_answer_outranks_no_answer_and_survives_a_restore():
    b = ProbeBook(["q", "r"], threshold=2)
    b.observe([err("q", "timeout"), o("r", MISMATCH, position=1)])
    c = b.observe([err("q", "timeout"), err("r", "timeout")])
    assert (c.value, c.reason) == (False, "ProbeMismatch") and "probe r" in c.message
    results = b.results()
    assert results[1]["lastFailure"]["cause"] == "timeout" and results[1]["lastWrongAnswer"]["result"] == MISMATCH
    cond = {"status": "False", "reason": "ProbeMismatch", "message": c.message}
    again = ProbeBook.restore(["q", "r"], 2, results, cond)
    assert again.condition.value is False
    assert again.observe([err("q", "timeout"), err("r", "timeout")]).reason == "ProbeMismatch"
    unknown = ProbeBook.restore(["q"], 2, results[:1], {"status": "Unknown", "reason": "ProbeTimeout", "message": "m"})
    assert (unknown.condition.value, unknown.condition.failure, unknown.state) == (None, ERROR, "NoAnswer")


def test_a_clean_round_clears_the_alarm_and_a_later_blip_does_not_refire_it():
    b = ProbeBook(["q"], threshold=2)
    b.observe([o("q", MISMATCH, position=1)])
    assert b.observe([o("q", MISMATCH, position=1)]).value is False
    assert b.observe([o("q", PASS)]).value is True
    assert b.observe([o("q", MISMATCH, position=1)]).value is True  # one new blip: counted, no alarm
    assert b.tracks["q"].consecutive == 1


def test_empty_round_changes_nothing():
    b = ProbeBook(["q"], threshold=1)
    before = b.condition
    assert b.observe([]) is before and b.rounds == 0 and b.condition.value is None


def test_restore_from_status_keeps_counts_and_alarm():
    b = ProbeBook.restore(
        ["q"],
        3,
        [{"probe": "q", "consecutiveFailures": 2, "lastResult": MISMATCH}, {"probe": "old", "consecutiveFailures": 9}],
        {"type": "OutputConsistent", "status": "True", "reason": "ProbesPassing", "message": "m"},
    )
    assert set(b.tracks) == {"q"} and b.tracks["q"].consecutive == 2 and b.condition.value is True
    c = b.observe([o("q", MISMATCH, position=0)])
    assert (c.value, c.reason) == (False, "ProbeMismatch")
    alarmed = ProbeBook.restore(["q"], 3, [], {"status": "False", "reason": "ProbeEarlyStop", "message": "x"})
    assert alarmed.condition.failure == EARLY_STOP and alarmed.state == "Inconsistent"


def test_status_shapes():
    b = ProbeBook(["q"], threshold=1)
    b.observe([o("q", MISMATCH, position=4)], now="t")
    (r,) = b.results()
    assert r["probe"] == "q" and r["consecutiveFailures"] == 1 and r["lastResult"] == MISMATCH
    assert r["lastFailure"]["position"] == 4
    a = Answer((1, 2), "ab", "stop")
    assert Answer.from_status(a.to_status("q")) == a
    assert Answer(None, "t").to_status("q") == {"probe": "q", "text": "t"}
