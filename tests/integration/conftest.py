"""Fixtures shared by the operator integration tests (real control plane, see tests/conftest.py)."""

from __future__ import annotations

import uuid

import pytest

from operator_harness import Kube


@pytest.fixture
def k(kube_api):
    return Kube(kube_api)


@pytest.fixture
def ns(k, request):
    """A fresh namespace per test, deleted afterwards (its pods release the shared fake GPUs)."""
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:10].replace("_", "-")
    name = k.create_namespace(f"{prefix}-{uuid.uuid4().hex[:6]}")
    yield name
    k.delete_namespace(name)
