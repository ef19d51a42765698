"""The key of a watched engine: the object whose engine pods the run-time watch measures (acceptance windows,
stall detectors, output-probe state, the gdn_* series), a GDNModelServer or a workload a GDNGuard guards.

A name alone does not say which: a GDNModelServer ``chat`` and a guarded StatefulSet ``chat`` (or a guarded
Deployment and a guarded StatefulSet, both ``chat``) may share one namespace, so every per-engine state is keyed
by (kind, namespace, name) — this one type, never a bare (namespace, name) pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from gdn_operator import KIND

__all__ = ["SERVER_KIND", "EngineTarget"]

#: the kind of a GDNModelServer target (a guarded workload's is its own: Deployment, StatefulSet, LeaderWorkerSet, ...)
SERVER_KIND = KIND


@dataclass(frozen=True, slots=True)
class EngineTarget:
    """A GDNModelServer or a guarded workload, by kind, namespace and name."""

    kind: str
    namespace: str
    name: str

    @classmethod
    def server(cls, namespace: str, name: str) -> EngineTarget:
        """The target of the GDNModelServer `namespace`/`name`."""
        return cls(SERVER_KIND, namespace, name)

    def series(self) -> tuple[str, str, str]:
        """Its ``namespace``, ``server`` and ``kind`` label values, in that order (gdn_operator.telemetry: the
        gauges that hold one value per target)."""
        return (self.namespace, self.name, self.kind)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"
