"""The operator logs its decisions: one INFO line each, with the server and its generation (issue 12)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import gdn_operator
from gdn_operator.handlers.core import kube
from gdn_operator.handlers.core import statusguard
from builders import GMS


def test_a_status_write_that_changes_a_condition_is_one_info_line(caplog):
    caplog.set_level(logging.DEBUG, logger="gdn_operator.handlers.core.statusguard")
    before = {"Ready": ("False", "EnginesNotReady")}
    status = {
        "phase": "Ready",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "EnginesReady"},
            {"type": "Validated", "status": "True", "reason": "Admitted"},
        ],
    }
    statusguard._log_status_written("ns", "s", 4, before, status)
    statusguard._log_status_written("ns", "s", 4, statusguard._condition_states(status), status)  # figures only
    (info,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert info.getMessage() == (
        "status written ns/s generation 4: phase Ready; Ready=True (EnginesReady), Validated=True (Admitted)"
    )
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.DEBUG]


def test_drift_correction_is_logged_with_the_generation(monkeypatch, caplog, rt):
    from gdn_operator.handlers.server import workload

    applied, events = [], []
    monkeypatch.setattr(kube, "apply", lambda obj: applied.append(obj["kind"]) or obj)
    monkeypatch.setattr(kube, "emit_event", lambda obj, reason, msg, type_="Normal": events.append(reason))
    server = GMS().uid("u").generation(7).update(prefixCaching=False).obj()
    caplog.set_level(logging.INFO, logger="gdn_operator.handlers.server.workload")
    assert workload.correct_drift(rt, "ns", "s", None, server)
    assert applied == ["Deployment"] and events == ["DriftCorrected"]
    assert [r.getMessage() for r in caplog.records] == [
        "drift corrected on ns/s generation 7: engine Deployment deleted outside the operator, re-applied"
    ]


def test_no_module_defines_a_logger_it_never_uses():
    pkg = Path(gdn_operator.__file__).parent
    unused = []
    for path in pkg.rglob("*.py"):
        text = path.read_text()
        if re.search(r"^log = logging\.getLogger", text, re.M) and not re.search(
            r"\blog\.(debug|info|warning|error|exception)\(", text
        ):
            unused.append(str(path.relative_to(pkg)))
    assert unused == []
