"""Gauges: the operator's ``gdn_spec_*`` Prometheus gauges for one target (a GDNModelServer or a guarded
workload, watch/target.py), kept in step with its windows and findings.

:class:`AcceptanceGauges` sets the label sets that apply now and removes the ones it set earlier that
no longer apply (a pod gone, a position no longer drafted, speculative decoding switched off), and
all of a resource's label sets when it is forgotten. The metric objects (names, help, labels) live in
:mod:`gdn_operator.telemetry`; what was published is remembered here by our own keys (the
:class:`~.window.WindowStats` figure names, positions, pods, reasons), never by reading attributes of
the prometheus_client objects.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client import Gauge

from gdn_operator import telemetry
from gdn_operator.watch.acceptance.anomalies import ANOMALY_REASONS
from gdn_operator.watch.acceptance.window import WindowStats
from gdn_operator.watch.target import EngineTarget

__all__ = ["AcceptanceGauges", "RESOURCE_FIGURES"]

#: resource-level gauges: (WindowStats figure, gauge labelled namespace, server, kind)
RESOURCE_FIGURES: tuple[tuple[str, Gauge], ...] = (
    ("acceptance_rate", telemetry.ACCEPTANCE_RATE),
    ("mean_accepted_length", telemetry.MEAN_ACCEPTED_LENGTH),
    ("drafts_per_second", telemetry.DRAFTS_PER_SECOND),
)


@dataclass(slots=True)
class _Published:
    """Label values set for one resource (beyond namespace, server and kind)."""

    figures: set[str] = field(default_factory=set)  # RESOURCE_FIGURES keys
    positions: set[str] = field(default_factory=set)  # gdn_spec_acceptance_per_position{position}
    pods: set[str] = field(default_factory=set)  # gdn_spec_pod_acceptance_rate{pod}
    reasons: set[str] = field(default_factory=set)  # gdn_spec_anomaly{reason}


class AcceptanceGauges:
    """Publishes one resource's figures; remembers what it set so stale label sets are removed."""

    def __init__(self) -> None:
        self._published: dict[EngineTarget, _Published] = {}

    def publish(
        self,
        target: EngineTarget,
        stats: WindowStats | None,
        pod_stats: Iterable[tuple[str, WindowStats | None]],
        active_reasons: Iterable[str],
    ) -> None:
        """Set the gauges from the resource's summed window ``stats``, its pods' windows and the reasons
        of its current findings; remove the label sets published before that no longer apply.

        Resource figures, per-position rates and ``gdn_spec_anomaly{reason}`` (0/1 for every known
        reason) are set only while speculative decoding is on; a figure that is ``None`` (no traffic)
        is not set."""
        labels = target.series()
        namespace, name = target.namespace, target.name
        now = _Published()
        if stats is not None and stats.spec_decode:
            active = set(active_reasons)
            for reason in ANOMALY_REASONS:
                telemetry.SPEC_ANOMALY.labels(*labels, reason).set(1.0 if reason in active else 0.0)
                now.reasons.add(reason)
            for figure, gauge in RESOURCE_FIGURES:
                val = getattr(stats, figure)
                if val is not None:
                    gauge.labels(*labels).set(val)
                    now.figures.add(figure)
            for i, v in enumerate(stats.per_position or ()):
                telemetry.ACCEPTANCE_PER_POSITION.labels(*labels, str(i)).set(v)
                now.positions.add(str(i))
        for pod, s in pod_stats:
            rate = s.acceptance_rate if s is not None else None
            if rate is not None:
                telemetry.POD_ACCEPTANCE_RATE.labels(namespace, name, pod).set(rate)
                now.pods.add(pod)
        before = self._published.get(target)
        if before is not None:
            _remove_label_sets(
                target,
                _Published(
                    figures=before.figures - now.figures,
                    positions=before.positions - now.positions,
                    pods=before.pods - now.pods,
                    reasons=before.reasons - now.reasons,
                ),
            )
        self._published[target] = now

    def clear(self, target: EngineTarget) -> None:
        """Remove every label set published for this resource (it was deleted or metrics turned off)."""
        before = self._published.pop(target, None)
        if before is not None:
            _remove_label_sets(target, before)


def _remove_label_sets(target: EngineTarget, gone: _Published) -> None:
    labels = target.series()
    for figure, gauge in RESOURCE_FIGURES:
        if figure in gone.figures:
            _remove(gauge, *labels)
    for p in gone.positions:
        _remove(telemetry.ACCEPTANCE_PER_POSITION, *labels, p)
    for p in gone.pods:  # per pod (a pod is one target's): no kind
        _remove(telemetry.POD_ACCEPTANCE_RATE, target.namespace, target.name, p)
    for r in gone.reasons:
        _remove(telemetry.SPEC_ANOMALY, *labels, r)


def _remove(gauge: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        gauge.remove(*labels)
