"""Fixtures of the handler tests."""

from __future__ import annotations

import guard_cluster as guard_cluster_module
import pytest
from runtime_helpers import make_runtime


@pytest.fixture
def rt():
    """A fresh runtime per test, as a newly started operator holds (no optional CRD installed)."""
    r = make_runtime()
    yield r
    r.log_pool.shutdown(wait=False)


@pytest.fixture
def guard_cluster(monkeypatch):
    """The API server behind handlers/guard/client.py: a fake holding pods and owners, recording every write."""
    return guard_cluster_module.install(monkeypatch)
