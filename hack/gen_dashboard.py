"""Generate the chart's Grafana dashboard (charts/gdn-operator/files/dashboards/gdn-operator.json) with
Grafana's own typed models (grafana-foundation-sdk, a test extra), instead of hand-edited JSON.

    .venv/bin/python hack/gen_dashboard.py           write the JSON
    .venv/bin/python hack/gen_dashboard.py --check   exit 1 if the committed JSON differs (tests run this)

A panel is one `P(...)` line in ROWS: a title, one or more (PromQL, legend) targets, a unit. Selectors:
`SRV` (the operator's gdn_* series) and `ENG` (vLLM's series) select the same servers, because the
operator's series and the engine PodMonitors both name a server `namespace` + `server` (telemetry.py,
render/engine.pod_monitor, the chart's global PodMonitor). Grafana variables `$namespace`, `$server`,
`$model`, `$__rate_interval`, `$__range` are substituted by tests (tests/charts, and the live
Prometheus test in tests/integration/test_monitoring_live.py, which runs every query).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    MatcherConfig,
    VariableRefresh,
    VariableSort,
)

OUT = Path(__file__).resolve().parents[1] / "charts" / "gdn-operator" / "files" / "dashboards" / "gdn-operator.json"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

#: the operator's gdn_* series of the selected servers
SRV = 'namespace=~"$namespace", server=~"$server"'
#: vLLM's series of the same servers (the PodMonitors add `server`)
ENG = 'namespace=~"$namespace", server=~"$server", model_name=~"$model"'
RI = "[$__rate_interval]"
BY = "namespace, server"


def rate(metric: str, sel: str = ENG, by: str = BY, window: str = RI) -> str:
    return f"sum by ({by}) (rate({metric}{{{sel}}}{window}))"


def quantile(q: float, hist: str, by: str = BY) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({hist}_bucket{{{ENG}}}{RI})))"


def percentiles(hist: str) -> list[tuple[str, str]]:
    return [(quantile(q, hist), f"{{{{namespace}}}}/{{{{server}}}} p{round(q * 100)}") for q in (0.5, 0.9, 0.99)]


ACCEPTANCE = f"{rate('vllm:spec_decode_num_accepted_tokens_total')}\n/\n{rate('vllm:spec_decode_num_draft_tokens_total')}"
PER_SERVER = "{{namespace}}/{{server}}"
FAILED = ENG + ', finished_reason=~"error|abort"'


@dataclass
class P:
    """One panel: title, (expr, legend) targets, unit, width (24 = the full row)."""

    title: str
    targets: list[tuple[str, str]]
    unit: str = "short"
    width: int = 12
    kind: str = "timeseries"
    description: str = ""
    min: float | None = None
    max: float | None = None
    #: refIds drawn on the right axis with this unit (e.g. acceptance beside tokens/s)
    right_axis: dict[str, str] = field(default_factory=dict)


ROWS: list[tuple[str, list[P]]] = [
    (
        "Serving SLOs (vLLM engine metrics)",
        [
            P("Time to first token", percentiles("vllm:time_to_first_token_seconds"), "s", 8),
            P("Inter-token latency", percentiles("vllm:inter_token_latency_seconds"), "s", 8),
            P("End-to-end request latency", percentiles("vllm:e2e_request_latency_seconds"), "s", 8),
            P(
                "Requests running / waiting",
                [
                    (f"sum by ({BY}) (vllm:num_requests_running{{{ENG}}})", PER_SERVER + " running"),
                    (f"sum by ({BY}) (vllm:num_requests_waiting{{{ENG}}})", PER_SERVER + " waiting"),
                ],
                "short",
                8,
            ),
            P(
                "KV-cache usage",
                [(f"max by ({BY}, pod) (vllm:kv_cache_usage_perc{{{ENG}}})", "{{namespace}}/{{pod}}")],
                "percentunit",
                8,
                min=0,
                max=1,
            ),
            P("Preemptions", [(rate("vllm:num_preemptions_total"), PER_SERVER)], "ops", 8),
            P(
                "Finished requests by reason",
                [(rate("vllm:request_success_total", by=BY + ", finished_reason"), PER_SERVER + " {{finished_reason}}")],
                "reqps",
                8,
            ),
            P(
                "Request error rate",
                [(f"{rate('vllm:request_success_total', sel=FAILED)}\n/\n{rate('vllm:request_success_total')}", PER_SERVER)],
                "percentunit",
                8,
                min=0,
                description="Share of finished requests that ended in error or abort (vllm:request_success_total).",
            ),
            P("Generation tokens/s", [(rate("vllm:generation_tokens_total"), PER_SERVER)], "short", 8),
            P(
                "MTP value: generation tokens/s against acceptance",
                [
                    (rate("vllm:generation_tokens_total"), PER_SERVER + " tokens/s"),
                    (ACCEPTANCE, PER_SERVER + " acceptance"),
                ],
                "short",
                24,
                right_axis={"B": "percentunit"},
                description="What MTP buys: output tokens per second (left) next to the draft acceptance rate (right). "
                "Falling acceptance with flat tokens/s means MTP costs compute without speeding anything up.",
            ),
        ],
    ),
    (
        "Speculative decoding (engine metrics)",
        [
            P("Acceptance rate per server", [(ACCEPTANCE, PER_SERVER)], "percentunit", min=0, max=1),
            P(
                "Acceptance rate per pod",
                [
                    (
                        f"{rate('vllm:spec_decode_num_accepted_tokens_total', by=BY + ', pod')}\n/\n"
                        f"{rate('vllm:spec_decode_num_draft_tokens_total', by=BY + ', pod')}",
                        "{{namespace}}/{{pod}}",
                    )
                ],
                "percentunit",
                min=0,
                max=1,
            ),
            P(
                "Mean accepted length per server",
                [
                    (
                        f"1 + {rate('vllm:spec_decode_num_accepted_tokens_total')}\n/\n{rate('vllm:spec_decode_num_drafts_total')}",
                        PER_SERVER,
                    )
                ],
            ),
            P(
                "Mean accepted length per pod",
                [
                    (
                        f"1 + {rate('vllm:spec_decode_num_accepted_tokens_total', by=BY + ', pod')}\n/\n"
                        f"{rate('vllm:spec_decode_num_drafts_total', by=BY + ', pod')}",
                        "{{namespace}}/{{pod}}",
                    )
                ],
            ),
            P("Drafts per second", [(rate("vllm:spec_decode_num_drafts_total"), PER_SERVER)], "ops"),
            P(
                "Acceptance per draft position",
                [
                    (
                        f"{rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', by=BY + ', position')}\n/ on ({BY}) group_left\n"
                        f"{rate('vllm:spec_decode_num_drafts_total')}",
                        PER_SERVER + " pos {{position}}",
                    )
                ],
                "percentunit",
                min=0,
                max=1,
            ),
        ],
    ),
    (
        "Operator view (windowed, from the operator's scraper)",
        [
            P(
                "Acceptance rate (operator)",
                [(f"max by ({BY}) (gdn_spec_acceptance_rate{{{SRV}}})", PER_SERVER)],
                "percentunit",
                8,
                min=0,
                max=1,
            ),
            P(
                "Mean accepted length (operator)",
                [(f"max by ({BY}) (gdn_spec_mean_accepted_length{{{SRV}}})", PER_SERVER)],
                "short",
                8,
            ),
            P(
                "Acceptance rate per pod (operator)",
                [(f"max by ({BY}, pod) (gdn_spec_pod_acceptance_rate{{{SRV}}})", "{{namespace}}/{{pod}}")],
                "percentunit",
                8,
                min=0,
                max=1,
            ),
            P("Drafts per second (operator)", [(f"max by ({BY}) (gdn_spec_drafts_per_second{{{SRV}}})", PER_SERVER)], "ops", 8),
            P(
                "Engine scrape errors",
                [(rate("gdn_scrape_errors_total", sel=SRV, by=BY + ", reason"), PER_SERVER + " {{reason}}")],
                "ops",
                8,
            ),
            P(
                "Engine scrape duration p95",
                [("histogram_quantile(0.95, sum by (le) (rate(gdn_scrape_duration_seconds_bucket[$__rate_interval])))", "p95")],
                "s",
                8,
            ),
        ],
    ),
    (
        "Engine health",
        [
            P(
                "Engine crashes by signature",
                [
                    (
                        f"sum by ({BY}, signature, upstream) (increase(gdn_engine_crashes_total{{{SRV}}}{RI}))",
                        PER_SERVER + " {{signature}} ({{upstream}})",
                    )
                ],
            ),
            P(
                "Crashes in range by signature",
                [
                    (
                        f"sum by (signature, upstream) (increase(gdn_engine_crashes_total{{{SRV}}}[$__range]))",
                        "{{signature}} ({{upstream}})",
                    )
                ],
                "short",
                6,
                kind="bargauge",
            ),
            P(
                "Remediations in range",
                [
                    (
                        f"sum by (signature, action) (increase(gdn_remediations_total{{{SRV}}}[$__range]))",
                        "{{signature}}: {{action}}",
                    )
                ],
                "short",
                6,
                kind="bargauge",
            ),
            P("Engine restarts", [(f"max by ({BY}) (gdn_engine_restarts{{{SRV}}})", PER_SERVER)]),
            P(
                "Ready engine replicas",
                [
                    (f"max by ({BY}) (gdn_ready_replicas{{{SRV}}})", PER_SERVER + " ready"),
                    (f"max by ({BY}) (gdn_desired_replicas{{{SRV}}})", PER_SERVER + " desired"),
                ],
            ),
        ],
    ),
    (
        "Admission",
        [
            P(
                "Admission denials by rule",
                [
                    (
                        'sum by (namespace, rule) (increase(gdn_admission_decisions_total{namespace=~"$namespace", decision="denied"}'
                        + RI
                        + "))",
                        "{{namespace}} {{rule}}",
                    )
                ],
            ),
            P(
                "Admission decisions",
                [
                    (
                        'sum by (decision) (increase(gdn_admission_decisions_total{namespace=~"$namespace"}' + RI + "))",
                        "{{decision}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Output probes",
        [
            P(
                "Output probes by result",
                [(rate("gdn_probe_total", sel=SRV, by=BY + ", result"), PER_SERVER + " {{result}}")],
                "ops",
            ),
            P(
                "Output inconsistent",
                [
                    (f"max by ({BY}, reason) (gdn_output_inconsistent{{{SRV}}})", PER_SERVER + " {{reason}}"),
                    (f"max by ({BY}, reason) (gdn_probe_failing{{{SRV}}})", PER_SERVER + " {{reason}} (no answer)"),
                ],
                "short",
                6,
                min=0,
                max=1,
            ),
            P(
                "Probe latency p95",
                [
                    (
                        "histogram_quantile(0.95, sum by (le) (rate(gdn_probe_duration_seconds_bucket[$__rate_interval])))",
                        "request p95",
                    ),
                    (
                        "histogram_quantile(0.95, sum by (le) (rate(gdn_probe_round_duration_seconds_bucket[$__rate_interval])))",
                        "round p95",
                    ),
                ],
                "s",
                6,
            ),
        ],
    ),
    (
        "Engine stalls (requests in flight, no progress; /health still 200)",
        [
            P(
                "Engines stalled",
                [(f"max by ({BY}, pod) (gdn_engine_stalled{{{SRV}}})", "{{namespace}}/{{pod}}")],
                "short",
                min=0,
                max=1,
            ),
            P(
                "Seconds without progress",
                [(f"max by ({BY}, pod) (gdn_engine_seconds_without_progress{{{SRV}}})", "{{namespace}}/{{pod}}")],
                "s",
            ),
        ],
    ),
]

VARIABLES = [
    # (name, label, query): every gdn_* series and, through the PodMonitors, every vLLM series carry
    # namespace + server of the GDNModelServer
    ("namespace", "Namespace", "label_values(gdn_ready_replicas, namespace)"),
    ("server", "GDNModelServer", 'label_values(gdn_ready_replicas{namespace=~"$namespace"}, server)'),
    ("model", "Served model", 'label_values(vllm:num_requests_running{namespace=~"$namespace", server=~"$server"}, model_name)'),
]


def _panel(p: P, pid: int) -> timeseries.Panel | bargauge.Panel:
    b = bargauge.Panel() if p.kind == "bargauge" else timeseries.Panel()
    b = b.id(pid).title(p.title).datasource(DS).unit(p.unit).span(p.width).height(8)
    if p.description:
        b = b.description(p.description)
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    for i, (expr, legend) in enumerate(p.targets):
        b = b.with_target(prometheus.Dataquery().ref_id(chr(ord("A") + i)).expr(expr).legend_format(legend).datasource(DS))
    for ref, unit in p.right_axis.items():
        b = b.with_override(
            MatcherConfig(id_val="byFrameRefID", options=ref),
            [DynamicConfigValue(id_val="custom.axisPlacement", value="right"), DynamicConfigValue(id_val="unit", value=unit)],
        )
    return b


def build() -> dict:
    d = (
        dashboard.Dashboard("gdn-operator: MTP speculative decoding, serving SLOs and engine health")
        .uid("gdn-operator-overview")
        .description(
            "Serving SLOs from vLLM's own metrics, MTP acceptance per server and pod, engine crashes by "
            "signature, restarts, stalls, admission and output probes. Shipped by the gdn-operator Helm chart."
        )
        .tags(["gdn-operator", "vllm", "speculative-decoding"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("30s")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    for name, label, query in VARIABLES:
        d = d.with_variable(
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    pid = 0
    for title, panels in ROWS:
        pid += 1
        d = d.with_row(dashboard.Row(title).id(pid))
        for p in panels:
            pid += 1
            d = d.with_panel(_panel(p, pid))
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed dashboard differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run .venv/bin/python hack/gen_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT} ({sum(len(p) for _, p in ROWS)} panels in {len(ROWS)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
