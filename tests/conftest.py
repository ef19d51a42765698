"""Session fixtures for tests that need a real Kubernetes control plane.

- ``control_plane``: etcd + kube-apiserver (tier "core").  If the session also uses
  ``full_cluster``, the full cluster is reused instead of starting a second control plane.
- ``full_cluster``: + kube-controller-manager, kube-scheduler, kwok and 2 fake GPU nodes (8 GPUs each).
- ``kube_api``: a ``kubernetes.client.ApiClient`` (admin) for whichever of the two the session uses.

Binaries are built by tests/cluster/build.sh (cached under ``${GDN_CACHE_DIR:-~/.cache/gdn-operator}``;
a cold build takes tens of minutes on 2 cores) after collection and before the first test, for the tiers
the selected tests need, so the build is not charged to one test's timeout (pyproject ``timeout``).
A failed build or start is a test *error*.  ``GDN_SKIP_CLUSTER=1`` skips these tests instead.
Tests that use the fixtures are marked ``cluster`` / ``fullcluster`` automatically; tests under
``tests/harness/`` (of this harness itself: API server, kwok, teardown) are marked ``harness``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"
if str(_CLUSTER_DIR) not in sys.path:
    sys.path.insert(0, str(_CLUSTER_DIR))

from controlplane import ControlPlane, ControlPlaneError, ensure_built  # noqa: E402

_CORE_FIXTURES = {"control_plane", "kube_api"}
_FULL_FIXTURES = {"full_cluster"}
_RELEASE_FIXTURES = {"release_bins", "oci_registry"}


_HARNESS_DIR = Path(__file__).resolve().parent / "harness"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _HARNESS_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.harness)  # tests of the test harness itself, not of the operator
        names = set(getattr(item, "fixturenames", ()))
        if names & _FULL_FIXTURES:
            item.add_marker(pytest.mark.fullcluster)
            item.add_marker(pytest.mark.cluster)
        elif names & _CORE_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        if names & _RELEASE_FIXTURES:
            item.add_marker(pytest.mark.release)


_BUILD_ERROR = pytest.StashKey[str]()


def pytest_collection_finish(session):
    """Build what the selected cluster tests need (instant when cached) before any test's timer starts."""
    if session.config.option.collectonly or os.environ.get("GDN_SKIP_CLUSTER") == "1":
        return
    cluster = [i for i in session.items if i.get_closest_marker("cluster")]
    if not cluster:
        return
    tier = "full" if any(i.get_closest_marker("fullcluster") for i in cluster) else "core"
    try:
        ensure_built(tier)
    except ControlPlaneError as e:
        session.config.stash[_BUILD_ERROR] = f"building the {tier} control plane failed: {e}"
        return
    if any("addons" in getattr(i, "fixturenames", ()) for i in cluster):  # the LWS controller
        from addons import find_addons

        try:
            find_addons(build=True)
        except ControlPlaneError:
            pass  # only the tests that use `addons` need it: that fixture builds again and reports the error


def _skip_if_disabled() -> None:
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1: real control-plane tests disabled")


def _session_wants_full(session) -> bool:
    return any(set(getattr(i, "fixturenames", ())) & _FULL_FIXTURES for i in session.items)


def _start(tier: str, workdir: Path, config) -> ControlPlane:
    if _BUILD_ERROR in config.stash:  # the build before the first test failed: say so, do not retry
        pytest.fail(config.stash[_BUILD_ERROR], pytrace=False)
    try:
        bins = ensure_built(tier)
    except ControlPlaneError as e:
        pytest.fail(f"building the {tier} control plane failed: {e}", pytrace=False)
    cp = ControlPlane(workdir, tier=tier, binaries=bins)
    try:
        cp.start()
    except ControlPlaneError as e:
        pytest.fail(f"starting the {tier} control plane failed: {e}", pytrace=False)
    return cp


@pytest.fixture(scope="session")
def full_cluster(request, tmp_path_factory):
    """Full tier: kcm + scheduler + kwok + fake GPU nodes.  Started once per session."""
    _skip_if_disabled()
    cp = _start("full", tmp_path_factory.mktemp("full-cluster"), request.config)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(request, tmp_path_factory):
    """Core tier (etcd + kube-apiserver), or the session's full cluster if one is needed anyway."""
    _skip_if_disabled()
    if _session_wants_full(request.session):
        yield request.getfixturevalue("full_cluster")
        return
    cp = _start("core", tmp_path_factory.mktemp("control-plane"), request.config)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube_api(control_plane):
    """kubernetes.client.ApiClient authenticated as cluster admin (system:masters)."""
    api = control_plane.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def release_bins() -> dict[str, str]:
    """crane + actionlint (tests/cluster/build.sh release); a failed build is a test error, not a skip."""
    from release_tools import release_bins as build

    try:
        return build()
    except ControlPlaneError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def oci_registry(release_bins, tmp_path):
    """A real OCI registry (`crane registry serve`) on a free loopback port, for one test."""
    from release_tools import OciRegistry

    reg = OciRegistry(release_bins["crane"], tmp_path / "registry")
    try:
        yield reg.start()
    except ControlPlaneError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        reg.stop()
