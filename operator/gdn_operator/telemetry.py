"""The operator's own Prometheus metrics (one registry, served on the operator's metrics port).

Every module that records operator telemetry imports its metric objects from here, so names, help
texts and label sets are defined once and the Grafana dashboard / PrometheusRule can rely on them.

Label names: a GDNModelServer is ``namespace`` + ``server`` in every series (the engine PodMonitors
relabel the engine pods' ``serving.gdn-operator.io/server`` label to ``server`` too, so one dashboard
variable selects both); ``pod`` is an engine pod. A workload a GDNGuard guards is ``server`` too (its name);
the gauges that hold one value per target without a ``pod`` (the acceptance figures, gdn_spec_anomaly,
gdn_output_inconsistent, gdn_probe_failing) also carry ``kind`` (GDNModelServer, or the workload's kind:
watch/target.py), so a server and a guarded workload of one name, or two guarded workloads of different kinds,
keep a series each instead of overwriting one. These are the labels of the servers the operator
reports on, not of the operator's own pod: the chart's ServiceMonitor scrapes with ``honorLabels:
true`` so Prometheus keeps them instead of renaming them ``exported_namespace`` / ``exported_pod``.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

METRICS_REGISTRY = CollectorRegistry(auto_describe=True)

# --- crash watch -------------------------------------------------------------------------------
CRASHES = Counter(
    "gdn_engine_crashes",
    "Engine crashes classified by the crash watch, by signature id.",
    ["namespace", "server", "signature", "upstream"],
    registry=METRICS_REGISTRY,
)
REMEDIATIONS = Counter(
    "gdn_remediations",
    "Automatic remediations applied after a repeated known crash signature.",
    ["namespace", "server", "signature", "action"],
    registry=METRICS_REGISTRY,
)

# --- admission ---------------------------------------------------------------------------------
ADMISSION_DECISIONS = Counter(
    "gdn_admission_decisions",
    "Admission decisions by outcome (admitted, denied, mitigated, warned) and rule id.",
    ["namespace", "decision", "rule"],
    registry=METRICS_REGISTRY,
)
#: the most namespaces gdn_admission_decisions names; later ones count as "_other" (issue 48: the namespace comes from
#: the review's body, which any caller of the webhook port may forge: series must not grow without bound)
MAX_ADMISSION_NAMESPACES = 256
ADMISSION_OTHER, ADMISSION_INVALID = "_other", "_invalid"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_admission_namespaces: set[str] = set()  # part of the counter's wiring: the label values it has handed out
_RULE_MAX = 128


def admission_decision(namespace: str | None, decision: str, rule: str) -> Counter:
    """The gdn_admission_decisions child for a decision, its labels from a bounded set: a namespace that is not a
    namespace name is "_invalid", the MAX_ADMISSION_NAMESPACES+1st distinct one "_other"; a rule id is cut at 128."""
    ns = namespace or ""
    if ns and not _DNS_LABEL.fullmatch(ns):
        ns = ADMISSION_INVALID
    elif ns and ns not in _admission_namespaces:
        if len(_admission_namespaces) >= MAX_ADMISSION_NAMESPACES:
            ns = ADMISSION_OTHER
        else:
            _admission_namespaces.add(ns)
    return ADMISSION_DECISIONS.labels(ns, decision, str(rule)[:_RULE_MAX])


# --- speculative-decoding acceptance ---------------------------------------------------------------
ACCEPTANCE_RATE = Gauge(
    "gdn_spec_acceptance_rate",
    "Speculative-decoding acceptance rate (accepted / draft tokens) over the sliding window.",
    ["namespace", "server", "kind"],
    registry=METRICS_REGISTRY,
)
MEAN_ACCEPTED_LENGTH = Gauge(
    "gdn_spec_mean_accepted_length",
    "Mean accepted length per draft (1 + accepted / drafts) over the sliding window.",
    ["namespace", "server", "kind"],
    registry=METRICS_REGISTRY,
)
ACCEPTANCE_PER_POSITION = Gauge(
    "gdn_spec_acceptance_per_position",
    "Acceptance rate per draft position over the sliding window.",
    ["namespace", "server", "kind", "position"],
    registry=METRICS_REGISTRY,
)
DRAFTS_PER_SECOND = Gauge(
    "gdn_spec_drafts_per_second",
    "Speculative drafts per second over the sliding window.",
    ["namespace", "server", "kind"],
    registry=METRICS_REGISTRY,
)
POD_ACCEPTANCE_RATE = Gauge(
    "gdn_spec_pod_acceptance_rate",
    "Per-pod speculative-decoding acceptance rate over the sliding window.",
    ["namespace", "server", "pod"],
    registry=METRICS_REGISTRY,
)
SCRAPE_ERRORS = Counter(
    "gdn_scrape_errors",
    "Failed /metrics scrapes of engine pods, by reason (timeout, connect, http, parse).",
    ["namespace", "server", "reason"],
    registry=METRICS_REGISTRY,
)
SCRAPE_DURATION = Histogram(
    "gdn_scrape_duration_seconds",
    "Duration of one engine /metrics scrape.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=METRICS_REGISTRY,
)
SPEC_ANOMALY = Gauge(
    "gdn_spec_anomaly",
    "1 while a speculative-decoding anomaly is detected for a GDNModelServer, by reason "
    "(SpecAcceptanceNearZero, SpecAcceptanceDrop, EarlyStopShift).",
    ["namespace", "server", "kind", "reason"],
    registry=METRICS_REGISTRY,
)

# --- workload ----------------------------------------------------------------------------------
READY_REPLICAS = Gauge(
    "gdn_ready_replicas",
    "Ready engine replicas per GDNModelServer.",
    ["namespace", "server"],
    registry=METRICS_REGISTRY,
)
DESIRED_REPLICAS = Gauge(
    "gdn_desired_replicas",
    "Desired engine replicas per GDNModelServer (spec.replicas as rendered).",
    ["namespace", "server"],
    registry=METRICS_REGISTRY,
)
ENGINE_RESTARTS = Gauge(
    "gdn_engine_restarts",
    "Sum of container restart counts over the engine pods of a GDNModelServer.",
    ["namespace", "server"],
    registry=METRICS_REGISTRY,
)

# --- output probes -----------------------------------------------------------------------------
PROBES = Counter(
    "gdn_probe",
    "Output probe answers by result (pass, learned, mismatch, early-stop, error), per server and probe.",
    ["namespace", "server", "probe", "result"],
    registry=METRICS_REGISTRY,
)
PROBE_DURATION = Histogram(
    "gdn_probe_duration_seconds",
    "Duration of one output probe request (greedy /v1/completions to one engine pod).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=METRICS_REGISTRY,
)
PROBE_ROUND_DURATION = Histogram(
    "gdn_probe_round_duration_seconds",
    "Duration of one probe round of a server (all probes on all its Ready engine pods).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=METRICS_REGISTRY,
)
OUTPUT_INCONSISTENT = Gauge(
    "gdn_output_inconsistent",
    "1 while OutputConsistent is False for a GDNModelServer (a wrong answer), by reason (ProbeMismatch, ProbeEarlyStop).",
    ["namespace", "server", "kind", "reason"],
    registry=METRICS_REGISTRY,
)
PROBE_FAILING = Gauge(
    "gdn_probe_failing",
    "1 while the output probes of a GDNModelServer got no answer for failureThreshold rounds (OutputConsistent "
    "Unknown), by reason (ProbeUnauthorized, ProbeUnreachable, ProbeTimeout, ProbeError).",
    ["namespace", "server", "kind", "reason"],
    registry=METRICS_REGISTRY,
)

# --- stall detector (handlers/engines/stall.py, issue 24) ---------------------------------------------------------
ENGINE_STALLED = Gauge(
    "gdn_engine_stalled",
    "1 while an engine pod holds requests but makes no progress for spec.health.stallSeconds (condition Stalled).",
    ["namespace", "server", "pod"],
    registry=METRICS_REGISTRY,
)
ENGINE_SECONDS_WITHOUT_PROGRESS = Gauge(
    "gdn_engine_seconds_without_progress",
    "Seconds an engine pod with requests in flight has produced under 0.5 output tokens per running request per "
    "second (0 while it progresses or is idle).",
    ["namespace", "server", "pod"],
    registry=METRICS_REGISTRY,
)

# --- GDNGuard (handlers/guard/supervisor.py, issue 35) ---------------------------------------------------------------
# A workload a GDNGuard guards is `server` in the series above (its name), so the same alerts and dashboard rows
# work for it; `kind` tells it from a GDNModelServer here.
GUARD_FINDINGS = Gauge(
    "gdn_guard_findings",
    "Findings of a GDNGuard on a guarded workload, by type (KnownCrash, CrashDiagnosed, Stalled, AcceptanceCollapsed, "
    "OutputInconsistent).",
    ["namespace", "server", "kind", "type"],
    registry=METRICS_REGISTRY,
)
