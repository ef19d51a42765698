"""Hang evidence (gdn_operator.watch.hang, data/hang-evidence.yaml) on the real TP=2 captures: the shared-memory
wording counts only after start-up (the healthy PIECEWISE engines print it while compiling), and the crash
catalogue never calls it a crash."""

from __future__ import annotations

import pytest
from stall_replay import TP2_LOGS

from gdn_operator.watch.hang import HangEvidence, HangRuleError, _parse
from gdn_operator.watch.signatures import classify_text


def _fed(name: str) -> HangEvidence:
    h = HangEvidence()
    text = (TP2_LOGS / name).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    for i in range(0, len(lines), 7):  # blocks of complete lines, as the log stream hands them over
        h.feed_text("".join(lines[i : i + 7]))
    return h


@pytest.mark.parametrize("name", ["compiled-serve-base-cudagraph.log", "compiled-serve-base-cg-full-decode-only.log"])
def test_stalled_full_graph_logs_show_the_wait_after_startup(name):
    h = _fed(name)
    assert h.started and h.counts == {"shm-broadcast-wait": 2}
    s = h.summary()
    assert "repeated, 2x" in s and "No available shared memory broadcast block found in 60 seconds" in s


@pytest.mark.parametrize(
    "name",
    ["compiled-serve-base-cg-piecewise.log", "stall-rerun-serve-base-cg-piecewise.log", "stall-rerun-serve-base-cudagraph.log"],
)
def test_startup_compilation_waits_are_not_hang_evidence(name):
    text = (TP2_LOGS / name).read_text(encoding="utf-8")
    assert "No available shared memory broadcast block found" in text  # it is there, before start-up completes
    h = _fed(name)
    assert h.started and not h.found and h.summary() == ""


@pytest.mark.parametrize("name", sorted(p.name for p in TP2_LOGS.glob("*.log")))
def test_hang_wording_is_never_a_crash(name):
    result = classify_text((TP2_LOGS / name).read_text(encoding="utf-8"))
    assert not result.crashed, result


def test_nccl_and_stream_sync_lines_count_with_or_without_startup():
    h = HangEvidence()
    h.feed_text(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4312, OpType=ALLREDUCE) "
        "ran for 600077 milliseconds before timing out.\n"
    )
    assert h.counts == {"nccl-collective-timeout": 1} and not h.started
    h.feed_text("INFO:     Application startup complete.\nThread 0x7f (most recent call first): cudaStreamSynchronize\n")
    assert h.counts["stream-synchronize"] == 1


def test_malformed_data_names_the_entry():
    with pytest.raises(HangRuleError, match=r"lines\.x: needs exactly regex, after_startup and says"):
        _parse({"schema": 1, "startup": "s", "keywords": ["k"], "lines": {"x": {"regex": "a"}}}, "f")
    with pytest.raises(HangRuleError, match=r"lines\.x\.regex"):
        _parse(
            {"schema": 1, "startup": "s", "keywords": ["k"], "lines": {"x": {"regex": "(", "after_startup": True, "says": "s"}}},
            "f",
        )


def test_the_crash_watch_log_stream_collects_it():
    from gdn_operator.watch.logstream import StreamClassifier

    sc = StreamClassifier()
    data = (TP2_LOGS / "compiled-serve-base-cudagraph.log").read_bytes()
    for off in range(0, len(data), 1000):  # split anywhere, as a stream is
        sc.feed(data[off : off + 1000])
    sc.close()
    assert not sc.crashed and sc.hang.counts == {"shm-broadcast-wait": 2}
