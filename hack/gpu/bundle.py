"""Build an offline vLLM bundle for an air-gapped GPU host (see hack/gpu/README.md).

Steps (each idempotent; run by hack/gpu/bundle.sh):
  resolve   pip's resolver (dry run, metadata only) for the target Python/platform → report.json
  plan      walk vLLM's requirement graph from the report; stop at packages the base already has and at
            optional kernels not opted in; record every requirement on a base package (conflict check).
            A base package listed under `replace_base` in bundle.yaml (torch, triton, the CUDA libraries) whose
            version, as the base file gives it, does not satisfy a requirement is bundled instead, and the walk
            goes on into its own requirements: a release built against another torch carries its torch.
            A replaced package listed under `keep_host` whose base version is of the same release series as the pin
            (e.g. cuBLAS 13.1.x) is left to the host instead: the pin stays a requirement on the base (kept_host in
            the manifest) that install.sh accepts only where accept-conflicts.yaml lists it (--no-keep-host: bundle it)
  download  fetch the planned wheels (sha256 from the index) into a cache
  build     unpack the wheels into one site directory, trim (bundle.yaml), tar | xz (or gzip), split into pieces,
            write manifest.json

The manifest records the pieces' and the whole archive's sha256, the packages, the optional packages
left out, what was trimmed, and every requirement the bundle places on the base environment, with the
base version where the base file names one (install.sh re-checks them against the live host).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from install import sha256_of  # noqa: E402  (stdlib-only installer: one hashing helper for both ends)

HERE = Path(__file__).resolve().parent


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_base(path: Path) -> dict[str, str | None]:
    """Package → version (None when the file names it without one).

    Accepts `pip freeze` (name==ver, name @ url), `pip list` (columns, header lines skipped) and bare
    names, one per line; `#` comments and blank lines are ignored.
    """
    out: dict[str, str | None] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-") or re.fullmatch(r"Package\s+Version.*", line):
            continue
        if "==" in line:
            name, ver = line.split("==", 1)
        elif " @ " in line:
            name, ver = line.split(" @ ", 1)[0], None
        else:
            parts = line.split()
            if len(parts) > 2 and not parts[2].startswith("/"):
                raise SystemExit(f"{path}:{n}: cannot read {raw!r} (expected `name`, `name==version` or `name version`)")
            name, ver = parts[0], (parts[1] if len(parts) > 1 else None)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name.strip()):
            raise SystemExit(f"{path}:{n}: {name!r} is not a package name")
        out[norm(name.strip())] = ver.strip() if ver else None
    return out


def manylinux_tags(top: str, arch: str) -> list[str]:
    major, minor = (int(x) for x in top.split("_"))
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    return tags + [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]


def marker_env(cfg: dict) -> dict[str, str]:
    t = cfg["target"]
    return {
        "python_version": t["python_version"],
        "python_full_version": t["python_full_version"],
        "implementation_name": "cpython",
        "implementation_version": t["python_full_version"],
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": t["arch"],
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def cmd_resolve(args, cfg) -> None:
    t = cfg["target"]
    py = t["python_version"]
    plats = [a for tag in manylinux_tags(t["manylinux"], t["arch"]) for a in ("--platform", tag)]
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(args.work / "report.json"),
        "--only-binary=:all:",
        "--no-cache-dir",
        "--python-version",
        py,
        "--implementation",
        "cp",
        "--abi",
        "cp" + py.replace(".", ""),
        *plats,
        "--target",
        str(args.work / "dry-target"),
        f"vllm=={args.vllm_version}",
    ]
    print("resolve:", " ".join(argv[3:8]), "…", f"vllm=={args.vllm_version}", flush=True)
    optional = {norm(k) for k in cfg["optional"]} - {norm(w) for w in args.with_}
    stubs: dict[str, str] = {}
    while True:
        r = subprocess.run(argv, capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode == 0:
            break
        missing = _missing_pin(r.stderr)
        # An optional kernel the bundle leaves out, pinned at a version the index does not serve (vLLM 0.34.0 pins
        # flashinfer-python==0.7.3, which PyPI does not have): a metadata-only stand-in lets the resolver finish;
        # the package is never downloaded (the plan excludes optional packages not opted in).
        if missing is None or missing[0] not in optional or missing[0] in stubs:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"resolve: pip's resolver failed for vllm=={args.vllm_version} (above)")
        stubs[missing[0]] = missing[1]
        write_stub_wheel(args.work / "stubs", *missing)
        print(f"resolve: optional {missing[0]}=={missing[1]} is not on the index: resolved against a stand-in", flush=True)
        if "--find-links" not in argv:
            argv[-1:-1] = ["--find-links", str(args.work / "stubs")]
    (args.work / "stubs.json").write_text(json.dumps(stubs, sort_keys=True) + "\n")


_MISSING = re.compile(r"No matching distribution found for ([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)")


def _missing_pin(stderr: str) -> tuple[str, str] | None:
    """The exact pin pip's resolver could not find (``No matching distribution found for NAME==VERSION``)."""
    m = _MISSING.search(stderr)
    return (norm(m.group(1)), m.group(2)) if m else None


def write_stub_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel with metadata only (no files, no requirements): a stand-in the resolver accepts for NAME==VERSION."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = re.sub(r"[-.]+", "_", name)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: gdn-bundle-stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def plan(report: dict, base: dict[str, str | None], cfg: dict, opt_in: set[str], keep_host: bool = True) -> dict:
    items = {norm(i["metadata"]["name"]): i for i in report["install"]}
    env = marker_env(cfg)
    optional = {norm(k): v for k, v in cfg["optional"].items()}
    unknown = opt_in - set(optional)
    if unknown:
        raise SystemExit(f"--with {sorted(unknown)}: not an optional package in bundle.yaml (choose from {sorted(optional)})")
    include: dict[str, set[str]] = {}  # name → extras activated
    excluded: dict[str, list[str]] = {}  # optional name → requirers
    base_reqs: dict[str, list[dict]] = {}  # base name → [{by, spec}]
    replaced: dict[str, dict] = {}  # base name → {base, spec, by}: bundled because the host's version does not do
    patterns = list(cfg.get("replace_base") or {})
    keep = {norm(k): v for k, v in (cfg.get("keep_host") or {}).items()} if keep_host else {}
    kept: dict[str, dict] = {}  # base name → {base, spec, by, why}: left out although its pin differs (keep_host)
    together = {norm(k): v for k, v in (cfg.get("replace_together") or {}).items()}
    todo = [("vllm", frozenset())]
    while True:
        if not todo:
            # a base package that pins a package the bundle now carries (the host's transformers 5.17.0 asks
            # huggingface-hub<2.0, vLLM 0.34.0 asks >=2.0) is bundled too, at the resolver's version, and walked
            for dep, rule in sorted(together.items()):
                by = [w for w in rule["with"] if norm(w) in replaced]
                if dep in base and dep not in replaced and by and dep in items:
                    replaced[dep] = {"base": base[dep], "spec": "", "by": f"replace_together ({', '.join(by)})"}
                    base_reqs.pop(dep, None)
                    todo.append((dep, frozenset()))
            if not todo:
                break
        name, extras = todo.pop()
        seen = include.setdefault(name, set())
        if extras and extras <= seen and name != "vllm":
            continue
        seen |= set(extras)
        meta = items[name]["metadata"]
        for spec in meta.get("requires_dist") or []:
            req = Requirement(spec)
            if req.marker is not None:
                ok = any(req.marker.evaluate(dict(env, extra=e)) for e in (extras or {""}))
                if not ok:
                    continue
            dep = norm(req.name)
            if dep in base and dep not in replaced and _must_replace(dep, base[dep], req, patterns):
                if _keeps_host(dep, base[dep], req, keep):
                    kept.setdefault(dep, {"base": base[dep], "spec": str(req.specifier), "by": name, "why": keep[dep]["why"]})
                else:
                    replaced[dep] = {"base": base[dep], "spec": str(req.specifier), "by": name}
                    base_reqs.pop(dep, None)
                    kept.pop(dep, None)
            if dep in base and dep not in replaced:
                base_reqs.setdefault(dep, []).append({"by": name, "spec": str(req.specifier)})
                continue
            if dep in optional and dep not in opt_in:
                excluded.setdefault(dep, []).append(name)
                continue
            if dep not in items:
                raise SystemExit(f"{name} requires {spec!r} but the resolver did not pick {dep}")
            if dep not in include or not set(req.extras) <= include[dep]:
                todo.append((dep, frozenset(req.extras)))
    conflicts, unverified = [], []
    for dep, reqs in sorted(base_reqs.items()):
        have = base[dep]
        for r in reqs:
            if not r["spec"]:
                continue
            if have is None:
                unverified.append({"package": dep, **r})
                continue
            try:
                ok = SpecifierSet(r["spec"]).contains(Version(have), prereleases=True)
            except InvalidVersion:
                ok = False
            if not ok:
                conflicts.append({"package": dep, "base": have, **r})
    pkgs = []
    for name in sorted(include):
        it = items[name]
        ai = it["download_info"]
        pkgs.append(
            {
                "name": name,
                "version": it["metadata"]["version"],
                "url": ai["url"],
                "sha256": ai.get("archive_info", {}).get("hashes", {}).get("sha256"),
            }
        )
    return {
        "packages": pkgs,
        "excluded_optional": {k: {"why": optional[k], "required_by": sorted(set(v))} for k, v in sorted(excluded.items())},
        "base_requirements": {k: v for k, v in sorted(base_reqs.items())},
        "replaced_base": {k: v for k, v in sorted(replaced.items())},
        "kept_host": {k: v for k, v in sorted(kept.items())},
        "conflicts_with_base_file": conflicts,
        "unverified_against_base_file": unverified,
    }


def _must_replace(dep: str, have: str | None, req: Requirement, patterns: list[str]) -> bool:
    """A `replace_base` package whose base version is known and outside the requirement."""
    if have is None or not str(req.specifier) or not any(fnmatch.fnmatch(dep, p) for p in patterns):
        return False
    try:
        return not req.specifier.contains(Version(have.split("+", 1)[0]), prereleases=True)
    except InvalidVersion:
        return True


def _keeps_host(dep: str, have: str | None, req: Requirement, keep: dict[str, dict]) -> bool:
    """A `keep_host` package whose base version shares the first `same` release components with every version the
    requirement allows (e.g. cuBLAS 13.1.0.3 on the host, 13.1.1.3 pinned: same 13.1)."""
    rule = keep.get(dep)
    if rule is None or have is None:
        return False
    n = int(rule["same"])
    try:
        host = Version(have.split("+", 1)[0]).release[:n]
    except InvalidVersion:
        return False
    pinned = [sp.version.rstrip(".*") for sp in req.specifier if sp.operator in ("==", "===", "~=")]
    if not pinned:
        return False
    try:
        return all(Version(v).release[:n] == host for v in pinned)
    except InvalidVersion:
        return False


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(pkg: dict, cache: Path) -> Path:
    dest = cache / pkg["url"].rsplit("/", 1)[1]
    if dest.exists() and (not pkg["sha256"] or sha256_file(dest) == pkg["sha256"]):
        return dest
    tmp = dest.with_suffix(".part")
    with urllib.request.urlopen(pkg["url"], timeout=120) as r, open(tmp, "wb") as f:
        shutil.copyfileobj(r, f, 1 << 20)
    got = sha256_file(tmp)
    if pkg["sha256"] and got != pkg["sha256"]:
        tmp.unlink()
        raise SystemExit(f"{dest.name}: sha256 {got} does not match the index's {pkg['sha256']}")
    tmp.rename(dest)
    return dest


def unpack_wheel(whl: Path, site: Path) -> None:
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            name = info.filename
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
                    name = "/".join(parts[2:])
                elif len(parts) > 2 and parts[1] == "scripts":
                    name = "bin/" + "/".join(parts[2:])
                else:
                    continue  # headers / data: not needed to import or run
            if name.endswith("/"):
                continue
            out = site / name
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode & 0o111:
                out.chmod(0o755)


def trim(site: Path, cfg: dict) -> list[dict]:
    done = []
    for rule in cfg["trim"]:
        for p in sorted(site.glob(rule["glob"])):
            size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            done.append({"path": str(p.relative_to(site)), "bytes": size, "why": rule["why"]})
    for pattern in cfg.get("strip_debug", []):
        for p in sorted(site.glob(pattern)):
            before = p.stat().st_size
            subprocess.run(["strip", "--strip-debug", str(p)], check=True)
            done.append({"path": str(p.relative_to(site)), "bytes": before - p.stat().st_size, "why": "strip --strip-debug"})
    return done


def parse_size(s: str) -> int:
    m = re.fullmatch(r"(\d+)([KMG]?)", s.strip().upper())
    if not m:
        raise SystemExit(f"--piece-size {s!r}: use a byte count with an optional K/M/G suffix (e.g. 45M)")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)]


def cmd_build(args, cfg) -> None:
    base = parse_base(args.base)
    report = json.loads((args.work / "report.json").read_text())
    p = plan(report, base, cfg, {norm(w) for w in args.with_}, keep_host=not args.no_keep_host)
    stubs_file = args.work / "stubs.json"
    if stubs_file.exists():  # optional pins the index does not serve (cmd_resolve): named in the manifest
        p["optional_not_on_index"] = json.loads(stubs_file.read_text())
    cache = args.cache
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        wheels = list(ex.map(lambda pk: fetch(pk, cache), p["packages"]))
    wheel_mb = sum(w.stat().st_size for w in wheels) / 1e6
    print(
        f"download: {len(wheels)} wheels, {wheel_mb:.1f} MB ({time.time() - t0:.0f}s)",
        flush=True,
    )
    site = args.work / "site"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    for w in wheels:
        unpack_wheel(w, site)
    trimmed = trim(site, cfg)
    unpacked = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    print(f"unpack+trim: {unpacked / 2**20:.1f} MiB left, {sum(t['bytes'] for t in trimmed) / 2**20:.1f} MiB trimmed", flush=True)
    out = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    stem = f"vllm-{args.vllm_version}-site.tar.{'gz' if args.codec == 'gzip' else 'xz'}"
    archive = args.work / stem
    t0 = time.time()
    files = sorted(f for f in site.rglob("*") if f.is_file())
    compressor = ["gzip", f"-{args.level}"] if args.codec == "gzip" else ["xz", f"-{args.level}", f"-T{args.xz_threads}"]
    xz = subprocess.Popen(
        ["nice", "-n", "10", *compressor, "-c"],
        stdin=subprocess.PIPE,
        stdout=open(archive, "wb"),  # noqa: SIM115 - xz owns it
    )
    with tarfile.open(fileobj=xz.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for f in files:
            ti = tar.gettarinfo(str(f), arcname=str(f.relative_to(site)))
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            ti.mtime = 0
            with open(f, "rb") as fh:
                tar.addfile(ti, fh)
    xz.stdin.close()
    if xz.wait() != 0:
        raise SystemExit(f"{args.codec} failed")
    xz_s = time.time() - t0
    pieces = write_pieces([archive], out, stem, parse_size(args.piece_size))
    manifest = {
        "vllm_version": args.vllm_version,
        "target": cfg["target"],
        "base_file": args.base.name,
        "with": sorted(norm(w) for w in args.with_),
        "keep_host": not args.no_keep_host,
        "wheel_bytes": round(wheel_mb * 1e6),
        "archive": stem,
        "archive_bytes": archive.stat().st_size,
        "archive_sha256": sha256_file(archive),
        "unpacked_bytes": unpacked,
        "pieces": pieces,
        "codec": args.codec,
        "compression": {
            "codec": args.codec,
            "level": args.level,
            "threads": args.xz_threads if args.codec == "xz" else "1",
            "seconds": round(xz_s, 1),
        },
        "trimmed": trimmed,
        **p,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    archive.unlink()
    print(
        f"bundle: {out} — {len(pieces)} pieces, {manifest['archive_bytes'] / 1e6:.1f} MB "
        f"({' '.join(compressor)}: {xz_s:.0f}s), {len(p['packages'])} packages, {wheel_mb:.1f} MB of wheels",
        flush=True,
    )
    for c in p["conflicts_with_base_file"]:
        print(f"conflict with base: {c['package']} {c['base']} but {c['by']} requires {c['spec']}")
    if p["unverified_against_base_file"]:
        names = sorted({u["package"] for u in p["unverified_against_base_file"]})
        print(
            f"base file gives no version for {len(names)} required packages ({', '.join(names)}); "
            "install.sh checks them on the host"
        )


def write_pieces(sources: list[Path], out: Path, stem: str, size: int) -> list[dict]:
    """Split the concatenation of `sources` into `out/stem.NN` pieces of at most `size` bytes."""
    pieces, buf = [], b""

    def flush(chunk: bytes) -> None:
        name = f"{stem}.{len(pieces):02d}"
        (out / name).write_bytes(chunk)
        pieces.append({"file": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})

    for src in sources:
        with open(src, "rb") as f:
            while chunk := f.read(size - len(buf)):
                buf += chunk
                if len(buf) == size:
                    flush(buf)
                    buf = b""
    if buf:
        flush(buf)
    return pieces


def cmd_resplit(args, cfg) -> None:
    """Re-split a built bundle (args.out) into pieces of --piece-size without compressing again."""
    mf_path = args.out / "manifest.json"
    mf = json.loads(mf_path.read_text())
    old = [args.out / p["file"] for p in mf["pieces"]]
    if sha256_of(old) != mf["archive_sha256"]:
        raise SystemExit(f"{args.out}: pieces do not reassemble to archive_sha256; rebuild")
    tmp = args.out / ".resplit"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    pieces = write_pieces(old, tmp, mf["archive"], parse_size(args.piece_size))
    for p in old:
        p.unlink()
    for p in pieces:
        (tmp / p["file"]).rename(args.out / p["file"])
    tmp.rmdir()
    mf["pieces"] = pieces
    mf_path.write_text(json.dumps(mf, indent=1) + "\n")
    print(f"resplit: {args.out} — {len(pieces)} pieces of at most {args.piece_size}")


def cmd_plan(args, cfg) -> None:
    p = plan(
        json.loads((args.work / "report.json").read_text()),
        parse_base(args.base),
        cfg,
        {norm(w) for w in args.with_},
        keep_host=not args.no_keep_host,
    )
    json.dump(p, sys.stdout, indent=1)
    print()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["resolve", "plan", "build", "resplit"])
    ap.add_argument("vllm_version")
    ap.add_argument("--base", type=Path)
    ap.add_argument("--with", dest="with_", action="append", default=[])
    ap.add_argument("--piece-size", default="45M")
    ap.add_argument("--no-keep-host", action="store_true", help="bundle every replaced base package (ignore keep_host)")
    ap.add_argument(
        "--codec",
        choices=["xz", "gzip"],
        default="xz",
        help="xz (smallest) or gzip (~8x faster to build on a busy 2-core builder, ~6%% larger; README.md)",
    )
    ap.add_argument("--level", "--xz-level", dest="level", default="9", help="compression level of --codec")
    ap.add_argument("--xz-threads", default="2")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--config", type=Path, default=HERE / "bundle.yaml")
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(args.config.read_text())
    if args.step != "resplit":
        for opt in ("base", "work", "cache"):
            if getattr(args, opt) is None:
                ap.error(f"--{opt} is required for {args.step}")
        args.work.mkdir(parents=True, exist_ok=True)
    {"resolve": cmd_resolve, "plan": cmd_plan, "build": cmd_build, "resplit": cmd_resplit}[args.step](args, cfg)


if __name__ == "__main__":
    main()
