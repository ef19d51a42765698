"""`gdnctl render`: print the objects the operator would create for a manifest."""

from __future__ import annotations

import argparse
import json
import sys

import yaml

from gdn_operator.api.load import ManifestError, load_file
from gdn_operator.render.meta import RenderError
from gdn_operator.render.objects import render_all
from gdn_operator.render.scaleout import ScaleOutOptions
from gdn_operator.rules import evaluate


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases (`&id001` / `*id001`): objects that share a sub-dict (the engine's
    probes share one httpGet) print it in full each time, as kubectl and a reader expect."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def run_render(args: argparse.Namespace) -> int:
    servers = load_file(args.filename)
    keda = getattr(args, "autoscaler", "hpa") == "keda"
    address = getattr(args, "prometheus_address", "") or ""
    if keda and not address:
        raise ManifestError("--autoscaler keda needs --prometheus-address (the Prometheus the ScaledObject queries)")
    opts = ScaleOutOptions(keda=keda, prometheus_address=address)
    objects = []
    rejected = 0
    for gms in servers:
        name = gms.metadata.name
        if not name:
            raise ManifestError("metadata.name: required field is missing")
        namespace = gms.metadata.namespace or "default"
        spec = gms.spec
        ev = evaluate(spec)  # the admission decision decides what gets created
        for d in ev.defaults:
            print(f"# {name}: default {d.field}={json.dumps(d.value)} ({d.rule})", file=sys.stderr)
        for f in ev.findings:
            print(f"# {name}: {f.action} {f.line()}", file=sys.stderr)
        if ev.run_spec is None:
            print(f"# {name}: rejected by admission, the operator creates nothing", file=sys.stderr)
            rejected += 1
            continue
        spec = ev.run_spec  # unset fields resolved to the rules' safe values, mitigations applied
        try:
            objects.extend(render_all(name, namespace, spec, uid=None, scaleout=opts))
        except RenderError as e:
            raise ManifestError(str(e)) from None
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.dump_all(objects, Dumper=_PlainDumper, sort_keys=False, width=120))
    return 1 if rejected else 0
