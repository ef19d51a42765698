"""A fresh operator runtime (handlers/runtime.py): what a newly started operator process holds."""

from __future__ import annotations

from gdn_operator.handlers.runtime import Runtime
from gdn_operator.settings import Settings


class FakeCrds:
    """Stands in for the runtime's CRD cache: the cluster serves exactly `served` (or every CRD)."""

    def __init__(self, *served: str, all: bool = False) -> None:
        self.served, self.all = set(served), all

    def exists(self, name: str) -> bool:
        return self.all or name in self.served


def make_runtime(**settings) -> Runtime:
    rt = Runtime(Settings(**settings))
    rt.crds = FakeCrds()  # type: ignore[assignment]  # no API server: no optional CRD is installed
    return rt
