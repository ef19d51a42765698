"""The operator's runtime state: one object, built by the startup handler and carried in kopf's `memo`.

kopf passes `memo` to every handler (a shallow copy per resource object, so this one object is shared);
handlers/main.py takes the runtime from it and hands it to the handler bodies. Nothing else in handlers/
or watch/ keeps state between events: tests build their own Runtime instead of resetting globals.

The composition root: only handlers/main.py imports this module. The feature modules declare what they
read of it as a Protocol (plan.PlanInputs: settings and the CRD cache; crashwatch.CrashWatchState;
startup.Host) and never import it, so the imports in handlers/ only go down (the import-linter contract
in pyproject.toml).

Not here, on purpose: the Prometheus metric objects (gdn_operator/telemetry.py: immutable wiring defined
once at import, the way prometheus_client is meant to be used; their values are the process's metrics)
and the Kubernetes API client (kube.api_client: one connection pool per process, created on first use).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from gdn_operator.handlers.core import tasks
from gdn_operator.handlers.core.kube import CrdCache
from gdn_operator.handlers.core.servers import Servers
from gdn_operator.handlers.engines.acceptance import AcceptanceSupervisor
from gdn_operator.handlers.engines.crashwatch import SeenDeaths
from gdn_operator.handlers.engines.logfollow import LogFollowers, StreamedResults
from gdn_operator.handlers.engines.probes import ProbeSupervisor
from gdn_operator.handlers.engines.quiet import QuietPeriod
from gdn_operator.handlers.guard.admission import GuardAdmission
from gdn_operator.handlers.guard.supervisor import GuardSupervisor
from gdn_operator.handlers.server.disruption import DrainingNodes
from gdn_operator.handlers.server.reconcile import HandledSpecs
from gdn_operator.settings import Settings
from gdn_operator.watch.acceptance import AcceptanceTracker
from gdn_operator.watch.promsource import PrometheusSource
from gdn_operator.watch.scraper import Scraper

MEMO_KEY = "gdn_runtime"


class Runtime:
    """Settings plus everything the operator remembers while it runs."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: which optional CRDs (PodMonitor, LeaderWorkerSet, KEDA, InferencePool) the cluster serves
        self.crds = CrdCache()
        #: the newest GDNModelServer bodies seen (watch events and the operator's own status writes)
        self.servers = Servers()
        #: kopf's diff base: the last spec its handlers completed, per server uid (no annotation write)
        self.handled = HandledSpecs()
        #: nodes marked for a drain (node events; GDN_WATCH_NODES): DisruptionBlocked
        self.draining = DrainingNodes()
        # crash watch
        self.seen_deaths = SeenDeaths()  # deaths already handled, so re-delivered pod events count once
        self.streamed = StreamedResults()  # crash diagnoses from log streams, until the death is handled
        self.log_pool = ThreadPoolExecutor(max_workers=settings.max_log_streams, thread_name_prefix="gdn-log")
        self.followers = LogFollowers(self.log_pool, self.streamed, self.servers)
        self.quiet = QuietPeriod(self)
        # acceptance and output probes
        self.acceptance = AcceptanceSupervisor(
            AcceptanceTracker(window=settings.acceptance_window),
            PrometheusSource(settings.metrics_prometheus, timeout=settings.scrape_timeout)
            if settings.metrics_prometheus
            else Scraper(timeout=settings.scrape_timeout, concurrency=settings.scrape_concurrency),
            concurrency=settings.scrape_servers_concurrency,
            bodies=self.servers,
        )
        self.probes = ProbeSupervisor(self.acceptance.pods, concurrency=settings.probe_concurrency, rt=self)
        # a stall's supporting evidence: hang wording from the crash watch's log streams, output-probe timeouts
        self.acceptance.hang_of = self.followers.hang_summary
        self.acceptance.probe_timeouts_of = self.probes.timeouts_of
        self.acceptance.plan_inputs = self
        # GDNGuard: the same crash watch, acceptance and stall detection on workloads other tools create
        self.guards = GuardSupervisor(self)
        # start-up
        self.webhook_renewal: dict[str, Any] = {}  # where the operator-managed webhook certificate lives
        #: GDNGuard admission: the webhook server's clientConfig and the guard webhook configuration's rewrites
        self.guard_admission = GuardAdmission(
            settings.webhook_config_name, settings.namespaces, excluded=(settings.webhook_namespace or "",)
        )
        self.metrics_started = False
        self.optional_handlers: list[str] = []  # registered at start-up from the settings (main.register_optional)
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, run: Callable[[], Coroutine[Any, Any, None]], name: str) -> asyncio.Task[None]:
        """A background task of this runtime (cancelled by `stop`), supervised: `run()` is started again when it
        ends or fails (issue 48: a task that died on one unforeseen error stopped its feature for good), after
        tasks.RESTART_SECONDS, doubling while it keeps failing."""
        task = asyncio.get_running_loop().create_task(tasks.supervised(run, name), name=name)
        self.tasks.append(task)
        return task

    def start_supervisors(self) -> None:
        """Start each supervisor whose task is not running (idempotent: kopf may run the start-up handler again,
        and start-up may already have started other tasks of this runtime, e.g. the guard admission scope)."""

        def due(task: asyncio.Task[None] | None) -> bool:
            return task is None or task.done()

        if due(self.acceptance.task):
            self.acceptance.task = self.start(self.acceptance.run, "acceptance-supervisor")
        if due(self.probes.task):
            self.probes.task = self.start(self.probes.run, "probe-supervisor")
        if due(self.quiet.task):
            self.quiet.task = self.start(self.quiet.run, "crash-quiet-period")
        if self.settings.guards and due(self.guards.task):
            self.guards.task = self.start(self.guards.run, "guard-supervisor")

    def stop(self) -> None:
        self.followers.stop_all()
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        self.log_pool.shutdown(wait=False, cancel_futures=True)


def runtime_of(memo: Any) -> Runtime:
    """The runtime the startup handler put into kopf's memo."""
    rt = memo.get(MEMO_KEY) if hasattr(memo, "get") else None
    if not isinstance(rt, Runtime):
        raise kopf.PermanentError("no operator runtime in kopf's memo: the startup handler (handlers/main.py) did not run")
    return rt
