"""The API server as the guard path sees it (handlers/guard/client.py, its one door to the cluster): a fake that
holds pods and owner objects and records every write, installed by the `guard_cluster` fixture (conftest.py) in
place of client.py's functions. Any other call to the cluster fails the test."""

from __future__ import annotations

from typing import Any

import pytest

from gdn_operator.handlers.core import kube
from gdn_operator.handlers.guard import client


class FakeGuardCluster:
    """The API server as handlers/guard/client.py sees it: the pods and owner objects it holds, and every write."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.owners: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, namespace, name) → metadata
        self.owner_reads: list[tuple[str, str]] = []
        self.status_writes: list[tuple[str, str, dict[str, Any]]] = []
        self.events: list[tuple[str, str, str, str]] = []  # (kind, name, reason, message)
        self.reports: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def hold(self, *bodies: dict[str, Any]) -> None:
        """Objects the API server holds: pods (listed by selector) and owners (read by kind and name)."""
        for b in bodies:
            meta = b["metadata"]
            if b.get("kind", "Pod") == "Pod":
                self.pods.append(b)
            else:
                self.owners[(b["kind"], meta["namespace"], meta["name"])] = meta

    # handlers/guard/client.py, function by function
    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        terms = dict(t.split("=", 1) for t in label_selector.split(","))  # (the guards here select by matchLabels)
        return [
            p
            for p in self.pods
            if p["metadata"].get("namespace") == namespace and terms.items() <= (p["metadata"].get("labels") or {}).items()
        ]

    def owner_metadata(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.owner_reads.append((kind, name))
        return self.owners.get((kind, namespace, name))

    def write_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        self.status_writes.append((namespace, name, status))
        return True

    def emit_event(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((obj["kind"], obj["metadata"]["name"], reason, message))

    def apply_policy_report(self, report: dict[str, Any]) -> bool:
        self.reports.append(report)
        return True

    def delete_pod(self, namespace: str, name: str, uid: str | None) -> bool:
        self.deleted.append(name)
        return True


def install(monkeypatch: pytest.MonkeyPatch) -> FakeGuardCluster:
    """Replace handlers/guard/client.py's functions with a fresh fake's; the Kubernetes client itself fails."""
    fake = FakeGuardCluster()
    for name in ("list_pods", "owner_metadata", "write_status", "emit_event", "apply_policy_report", "delete_pod"):
        monkeypatch.setattr(client, name, getattr(fake, name))

    def no_cluster(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the guard path reached for the API server past handlers/guard/client.py's fake")

    for name in ("list_guards", "read_webhook_configuration", "set_webhooks", "create_webhook_configuration"):
        monkeypatch.setattr(client, name, no_cluster)
    monkeypatch.setattr(kube, "api_client", no_cluster)
    return fake
