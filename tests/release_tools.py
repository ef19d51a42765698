"""The release tier for tests (issue 39): crane and actionlint built from the Go module proxy by
`tests/cluster/build.sh release` (cached under ${GDN_CACHE_DIR:-~/.cache/gdn-operator}), and a real OCI
registry (`crane registry serve`, blobs on disk) on a free loopback port, stopped when the test ends.

The fixtures `release_bins` and `oci_registry` (tests/conftest.py) wrap these; tests that use them are marked
`release`, and hack/tiers.py tells hack/test.sh to build the tier first.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from controlplane import ControlPlaneError, free_port, http_ok, wait_started  # noqa: E402


def release_bins() -> dict[str, str]:
    """{"crane": path, "actionlint": path}; builds the tier when missing (instant when cached)."""
    res = subprocess.run(["bash", str(ROOT / "tests" / "cluster" / "build.sh"), "release"], capture_output=True, text=True)
    if res.returncode != 0:
        raise ControlPlaneError(f"tests/cluster/build.sh release failed:\n{res.stderr[-3000:]}")
    kv = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    out = {"crane": kv["CRANE"], "actionlint": kv["ACTIONLINT"]}
    for name, path in out.items():
        if not Path(path).is_file():
            raise ControlPlaneError(f"{name} missing at {path} after build.sh release")
    return out


@dataclass
class OciRegistry:
    """`crane registry serve` on 127.0.0.1:<port>; `host` is what helm and crane address it by."""

    crane: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> OciRegistry:
        self.port = free_port()
        log = self.workdir / "registry.log"
        blobs = self.workdir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as f:
            self.proc = subprocess.Popen(
                [self.crane, "registry", "serve", "--address", self.host, "--disk", str(blobs)],
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_started(self.proc, lambda: http_ok(f"http://{self.host}/v2/"), "crane registry serve", log, 30)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
