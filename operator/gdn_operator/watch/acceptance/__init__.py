"""Speculative-decoding acceptance of vLLM engines: from /metrics text to CR status and gauges.

One module per step, each usable on its own (imports run down this list, never back up):

=================  ===============================================================================
``parse.py``       one Prometheus exposition → :class:`EngineSnapshot` (:func:`parse_exposition`)
``window.py``      :class:`PodWindow` (sliding window of one pod, counter resets) → :class:`WindowStats`
``anomalies.py``   pure checks over windows → :class:`Finding` (near zero, drop, early-stop shift)
``gauges.py``      the ``gdn_spec_*`` gauges of one resource, stale label sets removed
``tracker.py``     :class:`AcceptanceTracker`: pods per resource, baselines, findings, status dict
=================  ===============================================================================

The names below are the package's API; import them from ``gdn_operator.watch.acceptance``.
"""

from gdn_operator.watch.acceptance.anomalies import (
    ANOMALY_REASONS,
    REASON_DROP,
    REASON_EARLY_STOP,
    REASON_NEAR_ZERO,
    AnomalyThresholds,
    Finding,
    detect_acceptance_drop,
    detect_anomalies,
    detect_early_stop_shift,
    detect_near_zero_acceptance,
    detect_pod_near_zero,
    detect_resource_anomalies,
)
from gdn_operator.watch.acceptance.parse import (
    SAMPLE_NAMES,
    EngineSnapshot,
    ExpositionParseError,
    ExpositionReader,
    GenerationHistogram,
    parse_exposition,
    snapshot_from_samples,
)
from gdn_operator.watch.acceptance.tracker import AcceptanceTracker, Baseline, PodKey
from gdn_operator.watch.acceptance.window import PodWindow, WindowStats, window_since_start

__all__ = [
    "ANOMALY_REASONS",
    "AcceptanceTracker",
    "AnomalyThresholds",
    "Baseline",
    "EngineSnapshot",
    "ExpositionParseError",
    "ExpositionReader",
    "Finding",
    "GenerationHistogram",
    "PodKey",
    "PodWindow",
    "window_since_start",
    "REASON_DROP",
    "REASON_EARLY_STOP",
    "REASON_NEAR_ZERO",
    "WindowStats",
    "detect_acceptance_drop",
    "detect_anomalies",
    "detect_early_stop_shift",
    "detect_near_zero_acceptance",
    "detect_pod_near_zero",
    "detect_resource_anomalies",
    "parse_exposition",
    "SAMPLE_NAMES",
    "snapshot_from_samples",
]
