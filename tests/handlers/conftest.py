"""Fixtures of the handler tests."""

from __future__ import annotations

import pytest
from runtime_helpers import make_runtime


@pytest.fixture
def rt():
    """A fresh runtime per test, as a newly started operator holds (no optional CRD installed)."""
    r = make_runtime()
    yield r
    r.log_pool.shutdown(wait=False)
