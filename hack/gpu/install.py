"""Install an offline vLLM bundle on the GPU host (run by hack/gpu/install.sh; README.md beside it).

Runs with the host's own python3 (stdlib; `packaging` or pip's vendored copy; PyYAML for the accept
list).  Order: the live base environment against the manifest (needs only manifest.json, so
`--check-only` can run before all pieces have arrived), then the pieces, and only then unpack — a
conflict that is not accepted stops the install before anything is written.

Exit codes: 0 installed (or already installed), 2 usage / missing or corrupt pieces,
3 a version conflict with the base environment that the accept list does not cover.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

try:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.specifiers import SpecifierSet
    from pip._vendor.packaging.version import InvalidVersion, Version

STAMP = ".gdn-bundle.json"


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def die(code: int, msg: str) -> None:
    print(f"install: {msg}", file=sys.stderr)
    sys.exit(code)


def sha256_of(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def check_pieces(bundle: Path, manifest: dict) -> list[Path]:
    missing, bad, paths = [], [], []
    for piece in manifest["pieces"]:
        p = bundle / piece["file"]
        paths.append(p)
        if not p.is_file():
            missing.append(piece["file"])
        elif sha256_of([p]) != piece["sha256"]:
            bad.append(piece["file"])
    if missing or bad:
        die(
            2,
            f"{bundle}: missing pieces {missing}, corrupt pieces {bad} "
            f"(copy them again; hack/gpu/stage-piece.sh verifies each one as it arrives)",
        )
    if sha256_of(paths) != manifest["archive_sha256"]:
        die(2, "the reassembled archive's sha256 differs from the manifest's archive_sha256 (pieces from different builds?)")
    return paths


def live_base(python: str) -> dict[str, str]:
    out = subprocess.run(
        [python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=""),
    ).stdout
    return {norm(p["name"]): p["version"] for p in json.loads(out)}


def load_accept(path: Path | None, vllm_version: str) -> dict[str, dict]:
    if path is None or not path.exists():
        return {}
    try:
        import yaml
    except ImportError:
        die(2, f"{path}: reading the accept list needs PyYAML on the host (or pass --accept '' to use none)")
    data = yaml.safe_load(path.read_text()) or {}
    out = {}
    for n, e in enumerate(data.get("accepted") or []):
        for key in ("package", "installed", "vllm", "reason"):
            if not e.get(key):
                die(2, f"{path}: accepted[{n}].{key} is required (package, installed specifier, vllm versions, reason)")
        if Version(vllm_version) in SpecifierSet(str(e["vllm"])):
            out[norm(e["package"])] = e
    return out


def conflicts(manifest: dict, base: dict[str, str], accept: dict[str, dict]) -> tuple[list, list, list]:
    """(unaccepted, accepted, missing) — requirements the bundle places on the live base."""
    bad, ok, missing = [], [], []
    for pkg, reqs in manifest["base_requirements"].items():
        have = base.get(pkg)
        if have is None:
            missing.append({"package": pkg, "required_by": sorted({r["by"] for r in reqs})})
            continue
        for r in reqs:
            if not r["spec"]:
                continue
            try:
                good = SpecifierSet(r["spec"]).contains(Version(have), prereleases=True)
            except InvalidVersion:
                good = False
            if good:
                continue
            row = {"package": pkg, "installed": have, "required": r["spec"], "by": r["by"]}
            a = accept.get(pkg)
            if a and Version(have) in SpecifierSet(str(a["installed"])):
                ok.append({**row, "reason": a["reason"]})
            else:
                bad.append(row)
    return bad, ok, missing


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="install an offline vLLM bundle (see hack/gpu/README.md)")
    ap.add_argument("bundle", type=Path, help="directory with manifest.json and the pieces")
    ap.add_argument("target", type=Path, help="site directory to create (put it on PYTHONPATH)")
    ap.add_argument("--python", default=sys.executable, help="interpreter whose packages are the base")
    ap.add_argument(
        "--accept",
        default=str(Path(__file__).resolve().parent / "accept-conflicts.yaml"),
        help="accept list of known-harmless conflicts ('' for none)",
    )
    ap.add_argument("--check-only", action="store_true", help="verify pieces and conflicts, write nothing")
    args = ap.parse_args(argv)
    mf_path = args.bundle / "manifest.json"
    if not mf_path.is_file():
        die(2, f"{mf_path}: no manifest (BUNDLE_DIR must hold manifest.json and the pieces)")
    manifest = json.loads(mf_path.read_text())
    stamp = args.target / STAMP
    if stamp.is_file() and json.loads(stamp.read_text()).get("archive_sha256") == manifest["archive_sha256"]:
        print(f"install: {args.target} already holds this bundle (archive {manifest['archive_sha256'][:12]})")
        return
    want = manifest["target"]["python_version"]
    have_py = subprocess.run(
        [args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True, capture_output=True, text=True
    ).stdout.strip()
    if have_py != want:
        die(2, f"--python {args.python} is Python {have_py}; the bundle was built for {want} (bundle.sh target)")
    base = live_base(args.python)
    bad, ok, missing = conflicts(
        manifest, base, load_accept(Path(args.accept) if args.accept else None, manifest["vllm_version"])
    )
    shadow = [p["name"] for p in manifest["packages"] if p["name"] in base]
    for a in ok:
        print(
            f"install: accepted conflict: {a['package']} {a['installed']} (vllm needs {a['required']} via {a['by']}): {a['reason']}"
        )
    if shadow:
        print(f"install: the bundle's copy shadows the host's for: {', '.join(shadow)}")
    if missing or bad:
        for m in missing:
            print(
                f"install: MISSING base package {m['package']} (required by {', '.join(m['required_by'])}); "
                "rebuild the bundle with a --base list that does not name it",
                file=sys.stderr,
            )
        kept = manifest.get("kept_host") or {}
        for b in bad:
            why = (
                " (the bundle leaves it to the host: bundle.yaml keep_host; list this host version in the accept "
                "list, or rebuild with --no-keep-host)"
                if b["package"] in kept
                else ""
            )
            print(
                f"install: CONFLICT {b['package']} {b['installed']} on the host, {b['by']} requires "
                f"{b['package']}{b['required']}{why}",
                file=sys.stderr,
            )
        die(
            3,
            f"{len(bad)} version conflicts, {len(missing)} missing base packages. If a conflict is known to "
            f"be harmless, add it to {args.accept or 'an accept list'} with the installed version and a reason.",
        )
    if args.check_only:
        here = [p["file"] for p in manifest["pieces"] if (args.bundle / p["file"]).is_file()]
        print(
            f"install: --check-only: no conflicts left; {len(here)}/{len(manifest['pieces'])} pieces present "
            "(not verified); nothing written"
        )
        return
    pieces = check_pieces(args.bundle, manifest)
    print(f"install: {len(pieces)} pieces verified, archive sha256 {manifest['archive_sha256'][:12]}…")
    tmp = args.target.with_name(args.target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    opener = gzip.open if manifest.get("codec") == "gzip" else lzma.open
    with opener(_Concat(pieces)) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
        tar.extractall(tmp, filter="data")
    (tmp / STAMP).write_text(
        json.dumps(
            {"archive_sha256": manifest["archive_sha256"], "vllm_version": manifest["vllm_version"], "accepted": ok}, indent=1
        )
    )
    shutil.rmtree(args.target, ignore_errors=True)
    tmp.rename(args.target)
    print(
        f"install: vLLM {manifest['vllm_version']} → {args.target} ({len(manifest['packages'])} packages); "
        f"use PYTHONPATH={args.target}"
    )


class _Concat:
    """A read-only file object over the pieces in order (no temporary whole archive)."""

    def __init__(self, paths: list[Path]):
        self._paths = list(paths)
        self._f = None

    def read(self, n: int = -1) -> bytes:
        out = b""
        while n < 0 or len(out) < n:
            if self._f is None:
                if not self._paths:
                    break
                self._f = open(self._paths.pop(0), "rb")  # noqa: SIM115 - held across read() calls, closed by the reader
            chunk = self._f.read(-1 if n < 0 else n - len(out))
            if not chunk:
                self._f.close()
                self._f = None
                continue
            out += chunk
        return out

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._f:
            self._f.close()


if __name__ == "__main__":
    main()
