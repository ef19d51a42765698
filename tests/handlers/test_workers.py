"""Worker threads, pooled connections and handler retry delay: from the settings into kopf's settings
(issue 11 part 8: bench/bench_reconcile.py showed every worker busy waiting for the API server; part 7 /
bench/bench_faults.py: kopf's default 60 s retry delay after an API-server restart)."""

from __future__ import annotations

import asyncio
import logging

import kopf
import pytest
from runtime_helpers import make_runtime

from gdn_operator.handlers.core import kube

from gdn_operator.handlers import startup
from gdn_operator.settings import Settings


def test_max_workers_from_the_environment():
    assert Settings.from_env({}).max_workers == 64
    assert Settings.from_env({"GDN_MAX_WORKERS": "24"}).max_workers == 24


@pytest.mark.parametrize("bad", ["0", "-3", "many", "1.5"])
def test_bad_max_workers_names_the_variable_and_the_chart_value(bad):
    with pytest.raises(ValueError) as e:
        Settings.from_env({"GDN_MAX_WORKERS": bad})
    assert "GDN_MAX_WORKERS" in str(e.value) and "operator.maxWorkers" in str(e.value)


def _configure(max_workers: int) -> tuple[kopf.OperatorSettings, int]:
    """Run startup.configure with these workers; kopf's settings and the default executor's thread count."""
    rt = make_runtime(max_workers=max_workers, metrics_port=0)
    settings = kopf.OperatorSettings()
    seen = {}

    async def run() -> None:
        startup.configure(settings, logging.getLogger("test"), rt)
        ex = asyncio.get_running_loop()._default_executor  # type: ignore[attr-defined]
        seen["threads"] = ex._max_workers
        ex.shutdown(wait=False)

    try:
        asyncio.run(run())
    finally:
        rt.stop()
    return settings, seen["threads"]


def test_connection_pool_holds_one_connection_per_worker(monkeypatch):
    def fake_kubeconfig(client_configuration):
        client_configuration.host = "https://127.0.0.1:1"

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube.kubernetes.config, "load_kube_config", fake_kubeconfig)
    monkeypatch.setitem(kube._POOL, "size", kube._POOL["size"])  # restored after the test
    kube.api_client.cache_clear()
    try:
        _configure(100)
        client = kube.api_client()
        assert client.configuration.connection_pool_maxsize == 100
        assert client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 100
    finally:
        kube.api_client.cache_clear()


def test_configure_hands_the_workers_and_a_short_retry_delay_to_kopf(monkeypatch):
    monkeypatch.setitem(kube._POOL, "size", kube._POOL["size"])
    settings, threads = _configure(40)
    assert settings.execution.max_workers == 40
    assert threads == 40
    # well under kopf's 60 s default: a server whose reconcile hit an API-server outage is retried soon after
    assert settings.execution.default_backoff <= 10


def test_client_classes_are_imported_before_any_handler_runs():
    """kubernetes.client imports API classes on first use under the import lock; a burst's first reconciles
    all waited on it. Importing the handlers' client module must have resolved them (fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import kubernetes.client as c, gdn_operator.handlers.core.kube as k\n"
        "names = [cls.__name__ for cls in k.WARM_CLASSES]\n"
        "assert {'AppsV1Api', 'CoreV1Api', 'AutoscalingV2Api', 'CoreV1Event'} <= set(names), names\n"
        "print(sorted(n for n in names if n not in vars(c)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"not resolved at import: {out.stdout}"
