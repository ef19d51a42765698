"""gdnctl: the operator's offline tool.

Sub-commands are thin: each parses its arguments here and calls the owning module, so the CLI gives
exactly the answer the operator would give in the cluster.

Exit codes: 0 ok, 1 would be rejected/changed (validate), 2 malformed input or usage, 3 no crash
found (classify-log), 4 an uncatalogued vLLM release under validate --strict.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gdn_operator import GUARD_KIND, KIND, __version__
from gdn_operator.api.crd import crd_yaml, guard_crd_yaml
from gdn_operator.api.enums import ADMISSION_POLICIES
from gdn_operator.api.load import ManifestError
from gdn_operator.render.cli import run_render
from gdn_operator.rules.cli import run_validate
from gdn_operator.watch.cli import run_classify_log

#: A problem with the input the user gave us; printed as one line per problem, exit 2.
UsageError = ManifestError


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"gdnctl {__version__}")
    return 0


def _cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(guard_crd_yaml() if args.kind == GUARD_KIND else crd_yaml())
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    return run_render(args)


def _cmd_validate(args: argparse.Namespace) -> int:
    return run_validate(args)


def _cmd_classify_log(args: argparse.Namespace) -> int:
    return run_classify_log(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gdnctl", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("version", help="print the gdnctl version")
    s.set_defaults(func=_cmd_version)

    s = sub.add_parser("crd", help="print a CRD generated from the API models (GDNModelServer, or --kind GDNGuard)")
    s.add_argument("--kind", choices=[KIND, GUARD_KIND], default=KIND, help="which resource's CRD (default: %(default)s)")
    s.set_defaults(func=_cmd_crd)

    s = sub.add_parser("render", help="print the Kubernetes objects the operator would create")
    s.add_argument("-f", "--filename", required=True, help="GDNModelServer manifest ('-' for stdin)")
    s.add_argument("--output", choices=["yaml", "json"], default="yaml")
    s.add_argument(
        "--autoscaler",
        choices=["hpa", "keda"],
        default="hpa",
        help="for spec.autoscaling: an HPA (default) or a KEDA ScaledObject, as the operator picks when KEDA is installed",
    )
    s.add_argument(
        "--prometheus-address",
        default="",
        help="Prometheus URL for KEDA triggers (the chart's scaleOut.autoscaling.keda.prometheusAddress)",
    )
    s.set_defaults(func=_cmd_render)

    s = sub.add_parser(
        "validate",
        help="check a GDNModelServer manifest, or a raw vLLM launch line after '--', against the known-crash rules",
    )
    s.add_argument("-f", "--filename", help="GDNModelServer manifest ('-' for stdin)")
    s.add_argument("--output", choices=["text", "json"], default="text")
    s.add_argument("--vllm-version", help="vLLM version to evaluate against (overrides spec.image.vllmVersion)")
    s.add_argument(
        "--policy",
        choices=list(ADMISSION_POLICIES),
        default=None,
        help="the operator's default admission policy (chart value operator.defaultPolicy; default reject): used where "
        "a manifest sets no spec.admissionPolicy, and for a launch line",
    )
    s.add_argument("--architecture", help="HF architecture class of the model (for raw launch lines)")
    s.add_argument("--patch", action="append", default=[], help="patch id the image carries (repeatable; raw launch lines)")
    s.add_argument(
        "--allow-unsafe",
        default="",
        metavar="OPT-INS",
        help="the operator's opt-ins for pod settings refused by default, comma-separated, as its chart value "
        "operator.allowUnsafe / GDN_ALLOW_UNSAFE lists them (default: none, as the operator)",
    )
    s.add_argument(
        "--strict",
        action="store_true",
        help="exit 4 when the vLLM version is not a release the known-issue catalogue has read (newer than its "
        "newest, a pre-release or nightly, or a release it skipped): such a release keeps the newest release's "
        "rules and defaults unchecked, so a CI pipeline can refuse to roll it out",
    )
    s.add_argument("launch", nargs=argparse.REMAINDER, help="-- vllm serve MODEL --flags ...")
    s.set_defaults(func=_cmd_validate)

    s = sub.add_parser(
        "classify-log",
        help="classify a vLLM log or termination message ('-' for stdin)",
        description="Classify a vLLM log (or a container's termination message). An upstream issue is named only "
        "when the log, or the spec given with --spec, carries the evidence that ties the crash to it; otherwise "
        "the generic class is reported with the issues it may be as candidates. Exit 0 crash, 3 no crash, "
        "2 unreadable input.",
    )
    s.add_argument("file", help="log file, or '-' for stdin")
    s.add_argument("--output", choices=["text", "json"], default="text")
    s.add_argument(
        "--spec",
        metavar="MANIFEST",
        help="GDNModelServer manifest of the server that wrote the log: its model family, speculative decoding and "
        "GDN prefill backend count as evidence (what the operator uses in the cluster)",
    )
    s.add_argument(
        "--vllm-version",
        metavar="X",
        help="vLLM release that wrote the log (overrides the manifest's spec.image.vllmVersion)",
    )
    s.set_defaults(func=_cmd_classify_log)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as e:
        for line in e.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
