"""`gdnctl classify-log FILE [--output text|json] [--spec MANIFEST] [--vllm-version X]`: the crash watch's
classifier, offline.

An upstream issue is named only when the log, or the server's spec (`--spec`, the same evidence the
operator has), carries what ties the crash to it; otherwise the generic class is reported with the
issues it may be listed as candidates.

Exit codes: 0 a crash was found (known signature or generic engine death), 3 the log shows no crash,
2 the file or the manifest cannot be read (one `error:` line per problem, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import BinaryIO

from gdn_operator.watch.catalogue import CatalogueError
from gdn_operator.watch.evidence import Evidence
from gdn_operator.watch.logstream import StreamClassifier
from gdn_operator.watch.result import ClassificationResult

EXIT_CRASH = 0
EXIT_USAGE = 2
EXIT_NO_CRASH = 3
_READ_SIZE = 1 << 20


def _classify_stream(fh: BinaryIO, evidence: Evidence | None = None) -> ClassificationResult:
    sc = StreamClassifier(evidence=evidence)
    while True:
        chunk = fh.read(_READ_SIZE)
        if not chunk:
            break
        sc.feed(chunk)
    sc.close()
    return sc.result()


def _format_text(r: ClassificationResult, name: str) -> str:
    if not r.crashed:
        return f"no crash: no crash signature in {r.lines_scanned} lines of {name}\n"
    out = [f"CRASH: {r.signature} - {r.title}"]
    out.append(f"  kind:        {r.kind}" + (" (generic: no known signature matched)" if r.generic else ""))
    if r.upstream:
        conf = " (probable match)" if r.confidence == "probable" else ""
        if r.upstream_if_versions:
            conf += f" (if vLLM {r.upstream_if_versions}: the version is not known)"
        out.append(f"  upstream:    {r.upstream}{conf} {r.upstream_url or ''}".rstrip())
        if r.related:
            out.append(f"  related:     {', '.join(r.related)}")
    elif r.candidates:
        out.append(f"  candidates:  {', '.join(r.candidates)} (not confirmed: the evidence that ties them is missing)")
    for note in r.attribution:
        out.append(f"  attribution: {note}")
    if r.evidence:
        out.append("  evidence:    " + ", ".join(f"{k}={v}" for k, v in sorted(r.evidence.items())))
    if r.root_cause:
        out.append(f"  root cause:  line {r.root_cause_line}: {r.root_cause}")
    for m in r.matched:
        if m.line != r.root_cause_line:
            out.append(f"  matched:     line {m.line}: {m.text.strip()}")
    if r.remediation:
        out.append(f"  remediation: [{r.remediation.action}] {r.remediation.hint}")
    if r.other_signatures:
        out.append(f"  also seen:   {', '.join(r.other_signatures)}")
    return "\n".join(out) + "\n"


def evidence_from_args(args: argparse.Namespace) -> Evidence | None:
    """--spec MANIFEST (optionally with --vllm-version overriding its image version) or --vllm-version alone.
    Raises ManifestError for an unreadable or invalid manifest."""
    spec = getattr(args, "spec", None)
    version = getattr(args, "vllm_version", None)
    if spec:
        return Evidence.from_manifest(spec, version)
    if version:
        return Evidence.version_only(version)
    return None


def run_classify_log(args: argparse.Namespace) -> int:
    name = args.file
    output = getattr(args, "output", "text") or "text"
    evidence = evidence_from_args(args)
    try:
        if name == "-":
            result = _classify_stream(sys.stdin.buffer, evidence)
            name = "<stdin>"
        else:
            with open(name, "rb") as fh:
                result = _classify_stream(fh, evidence)
    except OSError as e:
        reason = e.strerror or str(e)
        print(f"error: cannot read log file {name!r}: {reason}; pass a readable file, or '-' for stdin", file=sys.stderr)
        return EXIT_USAGE
    except CatalogueError as e:
        print(f"error: signature catalogue: {e}", file=sys.stderr)
        return EXIT_USAGE
    if output == "json":
        doc = result.to_dict()
        doc["file"] = name
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(_format_text(result, name))
    return EXIT_CRASH if result.crashed else EXIT_NO_CRASH
