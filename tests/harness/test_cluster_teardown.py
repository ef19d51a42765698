"""ControlPlane.stop() leaves nothing behind: no process, no tmpfs data dir; failures say why."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from controlplane import ControlPlane, ControlPlaneError, ensure_built
from waiting import poll

pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent
CLUSTER_DIR = HERE.parent / "cluster"


def _alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group_members(pgid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(p.name))
    return out


@pytest.fixture(scope="module")
def core_bins():
    if os.environ.get("GDN_SKIP_CLUSTER") == "1":
        pytest.skip("GDN_SKIP_CLUSTER=1")
    return ensure_built("core", quiet=True)


def test_stop_kills_every_process_and_removes_tmpfs(core_bins, tmp_path):
    cp = ControlPlane(tmp_path / "cp", tier="core", binaries=core_bins)
    with cp:
        pids = dict(cp.pids)
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(_alive(p) for p in pids.values())
        assert all(cp.alive().values())
        data_dirs = list(cp._tmpdirs)
        assert data_dirs and all(d.exists() for d in data_dirs)
        assert cp.kubeconfig.is_file()
    for name, pid in pids.items():
        assert not _alive(pid), f"{name} (pid {pid}) survived stop()"
        assert _group_members(pid) == [], f"{name}'s process group survived stop()"
    assert not any(d.exists() for d in data_dirs)
    assert (tmp_path / "cp" / "logs" / "kube-apiserver.log").is_file(), "logs are kept for debugging"
    cp.stop()  # idempotent


def test_own_workdir_is_deleted(core_bins):
    cp = ControlPlane(tier="core", binaries=core_bins).start()
    wd = cp.workdir
    assert wd.is_dir()
    cp.stop()
    assert not wd.exists()


def test_failed_start_reports_log_tail_and_cleans_up(core_bins, tmp_path):
    # An apiserver that dies at startup: unknown flag via a wrapper that execs the real binary.
    wrapper = tmp_path / "kube-apiserver"
    wrapper.write_text(f'#!/bin/sh\nexec {core_bins.kube_apiserver} --no-such-flag-for-test "$@"\n')
    wrapper.chmod(0o755)
    bad = core_bins.__class__(**{**core_bins.__dict__, "kube_apiserver": wrapper})
    cp = ControlPlane(tmp_path / "cp", tier="core", binaries=bad)
    with pytest.raises(ControlPlaneError) as err:
        cp.start()
    text = str(err.value)
    assert "kube-apiserver exited with code" in text
    assert "no-such-flag-for-test" in text, "the error must carry the component's log tail"
    assert not _alive(cp.pids["etcd"]), "etcd must be stopped when a later component fails"


def test_killed_parent_leaves_no_orphans(core_bins, tmp_path):
    """Even a SIGKILLed Python process (no atexit) takes its components down (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(
        f"""
        import sys, json
        sys.path.insert(0, {str(CLUSTER_DIR)!r})
        from controlplane import ControlPlane
        cp = ControlPlane({str(tmp_path / "orphan")!r}, tier="core").start()
        print(json.dumps({{"pids": cp.pids, "tmp": [str(d) for d in cp._tmpdirs]}}), flush=True)
        sys.stdin.read()
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        import json

        line = proc.stdout.readline()
        assert line, "child failed to start a control plane"
        info = json.loads(line)
        pids, tmpdirs = info["pids"], info["tmp"]
        assert all(_alive(p) for p in pids.values())
    finally:
        proc.kill()
        proc.wait()
    poll(lambda: [p for p in pids.values() if _alive(p)], until=lambda alive: not alive, timeout=10, interval=0.1)
    import shutil

    for d in tmpdirs:  # the killed child could not clean its tmpfs dir; do it for it
        shutil.rmtree(d, ignore_errors=True)
    assert not any(_alive(p) for p in pids.values()), f"orphans left: {pids}"
