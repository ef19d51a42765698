"""Every kopf registration lives in handlers/main.py; the optional ones are registered from start-up."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import kopf
import pytest
from runtime_helpers import make_runtime

from gdn_operator import GROUP, PLURAL
from gdn_operator.handlers.core import kopfcompat
from gdn_operator.handlers import main
from gdn_operator.handlers.runtime import MEMO_KEY, Runtime, runtime_of

HANDLERS = Path(main.__file__).parent


def _ids(registry: kopf.OperatorRegistry) -> dict[str, set[str]]:
    return {
        "webhooks": {h.id for h in registry._webhooks.get_all_handlers()},
        "watching": {h.id for h in registry._watching.get_all_handlers()},
    }


def test_no_module_but_main_registers_a_kopf_handler():
    offenders = []
    for path in (HANDLERS.parent).rglob("*.py"):
        if path.name == "main.py" and path.parent == HANDLERS:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"kopf\.(on\.\w+|index|daemon|timer)\(", line):
                offenders.append(f"{path.name}:{i}: {line.strip()}")
    assert not offenders, offenders


def test_import_registers_no_admission_handler():
    ids = _ids(kopf.get_default_registry())
    assert not {"gdn-mitigate", "gdn-admission"} & ids["webhooks"]  # only from start-up, with a server
    assert {"converge-generation", "acceptance-registry", "pod_event", "deployment_event"} <= ids["watching"]


#: GDNGuard (issue 35): its resource and every pod, registered with GDN_GUARDS (default on)
GUARD_HANDLERS = {"guard-event", "guarded-pod-event"}


@pytest.mark.parametrize(
    "settings, webhook, expected",
    [
        (
            {},
            True,
            {
                "leader_worker_set_event",
                "inference_pool_event",
                "node_event",
                "gdn-admission",
                "guard-admission-scope",
            }
            | GUARD_HANDLERS,
        ),
        # the mutating webhook only with GDN_MUTATE_SPEC (without it, it would change nothing, at a round trip each)
        (
            {"mutate_spec": True, "lws": False, "inference_pool": False, "watch_nodes": False, "guards": False},
            True,
            {"gdn-mitigate", "gdn-admission"},
        ),
        ({"lws": False, "inference_pool": False, "watch_nodes": False, "guards": False}, False, set()),
        ({"inference_pool": False}, False, {"leader_worker_set_event", "node_event"} | GUARD_HANDLERS),
    ],
)
def test_optional_handlers_follow_the_settings(settings, webhook, expected):
    registry = kopf.OperatorRegistry()
    rt = make_runtime(**settings)
    assert set(main.register_optional(rt, webhook=webhook, registry=registry)) == expected
    ids = _ids(registry)
    assert ids["webhooks"] | ids["watching"] == expected
    main.register_optional(rt, webhook=webhook, registry=registry)  # a retried startup handler: no duplicates
    assert len(registry._webhooks.get_all_handlers()) + len(registry._watching.get_all_handlers()) == len(expected)


def test_the_runtime_travels_in_kopfs_memo():
    memo = kopf.Memo()
    with pytest.raises(kopf.PermanentError, match="startup handler"):
        runtime_of(memo)
    rt = make_runtime()
    memo[MEMO_KEY] = rt
    assert runtime_of(memo) is rt
    rt.log_pool.shutdown(wait=False)


def _startup_inputs(monkeypatch):
    """What main.startup is handed in these tests: parsed settings in kopf's memo, a fresh registry, no metrics port."""
    from gdn_operator.handlers import startup
    from gdn_operator.settings import Settings

    monkeypatch.setattr(startup, "start_http_server", lambda *a, **k: None)
    registry = kopf.OperatorRegistry()
    monkeypatch.setattr(kopf, "get_default_registry", lambda: registry)
    cfg = Settings(default_policy="warn", lws=False, inference_pool=False, metrics_port=0)
    return cfg, kopf.Memo({main.SETTINGS_MEMO_KEY: cfg}), registry


def test_startup_builds_the_runtime_from_the_settings_main_parsed(monkeypatch):
    cfg, memo, registry = _startup_inputs(monkeypatch)

    async def run() -> Runtime:
        await main.startup(
            settings=kopf.OperatorSettings(), logger=kopf.LocalObjectLogger(body={}, settings=kopf.OperatorSettings()), memo=memo
        )
        rt = runtime_of(memo)
        names = sorted(t.get_name() for t in rt.tasks)
        rt.stop()
        await asyncio.sleep(0)
        assert names == ["acceptance-supervisor", "crash-quiet-period", "guard-supervisor", "probe-supervisor"]
        return rt

    rt = asyncio.run(run())
    assert rt.settings is cfg and not registry._webhooks.get_all_handlers()


def test_startup_under_kopf_run_parses_the_environment_and_stops_on_a_bad_value(monkeypatch):
    """`kopf run -m gdn_operator.handlers` (hack/dev.py) passes no settings: the startup handler parses them."""
    monkeypatch.setenv("GDN_WEBHOOK_MODE", "remote")
    with pytest.raises(kopf.PermanentError, match=r"GDN_WEBHOOK_MODE='remote': not a valid value; set one of"):
        asyncio.run(main.startup(settings=kopf.OperatorSettings(), logger=None, memo=kopf.Memo()))


def test_supervisors_start_even_when_start_up_already_started_another_task(monkeypatch):
    """The guard admission scope task (a webhook server with GDN_GUARDS) is started by start-up before the
    supervisors: they must still start (a dev cluster with webhooks once scraped nothing), and only once."""
    cfg, memo, registry = _startup_inputs(monkeypatch)

    async def other() -> None:
        await asyncio.sleep(3600)

    async def run() -> list[str]:
        rt = Runtime(cfg)
        memo[main.MEMO_KEY] = rt
        rt.start(other, "guard-admission-scope")  # what starter.configure starts with a webhook server
        log = kopf.LocalObjectLogger(body={}, settings=kopf.OperatorSettings())
        await main.startup(settings=kopf.OperatorSettings(), logger=log, memo=memo)
        await main.startup(settings=kopf.OperatorSettings(), logger=log, memo=memo)  # kopf may run it again
        names = sorted(t.get_name() for t in rt.tasks)
        rt.stop()
        await asyncio.sleep(0)
        return names

    names = asyncio.run(run())
    assert names == [
        "acceptance-supervisor",
        "crash-quiet-period",
        "guard-admission-scope",
        "guard-supervisor",
        "probe-supervisor",
    ]


def test_the_operator_process_settles_its_start_up_heap_before_kopf_runs():
    """__main__ (the operator process, not tests importing the handlers) freezes what start-up made, the rule set
    included, out of the cyclic GC and makes full collections rarer (handlers/heap.settle_heap): a full
    collection holds the GIL and paused admission's answers. Run in a child: the freeze lasts for the process."""
    code = (
        "import gc, kopf, gdn_operator.__main__ as m\n"
        "from gdn_operator.handlers.core.heap import GC_THRESHOLDS\n"
        "from gdn_operator.rules import load_rules\n"
        "seen = {}\n"
        "def run(**kw):\n"
        "    rules = load_rules()\n"
        "    seen.update(frozen=gc.get_freeze_count(), thresholds=gc.get_threshold(),\n"
        "                rules_collectable=any(o is rules for o in gc.get_objects()), want=GC_THRESHOLDS)\n"
        "kopf.run = run\n"
        "assert gc.get_freeze_count() == 0\n"
        "assert m.main() == 0\n"
        "print(seen)\n"
    )
    env = {**os.environ, "GDN_WEBHOOK_MODE": ""}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert seen["frozen"] > 10_000 and seen["thresholds"] == seen["want"] and not seen["rules_collectable"]


def test_kopf_builds_essences_only_for_servers():
    """Only GDNModelServers have changing handlers (create/update/resume): kopf's essence of every other watched
    kind's events (Deployments, pods, nodes, guards) is read by no handler, so main.startup narrows HandledSpecs
    to servers; a changing or spawning handler on another kind widens it back to every kind."""
    optional = kopf.OperatorRegistry()
    main.register_optional(make_runtime(), webhook=True, registry=optional)  # every optional handler on
    selected = kopfcompat.essence_resources(kopf.get_default_registry()) | kopfcompat.essence_resources(optional)
    assert selected == {(GROUP, PLURAL)}
    rt = make_runtime()
    main.narrow_essences(rt, kopf.get_default_registry())
    assert rt.handled.essential_kinds == {"GDNModelServer"}
    for register in (kopf.on.update, kopf.daemon):
        other = kopf.OperatorRegistry()
        register("apps", "v1", "deployments", registry=other)(lambda **_: None)
        main.narrow_essences(rt, other)
        assert rt.handled.essential_kinds is None
    rt.log_pool.shutdown(wait=False)


def test_a_background_task_that_fails_is_started_again(monkeypatch):
    """Issue 48: every background task of the runtime is supervised: one that raises (or returns) is started again."""
    from gdn_operator.handlers.core import tasks

    monkeypatch.setattr(tasks, "RESTART_SECONDS", 0.01)
    cfg, _, _ = _startup_inputs(monkeypatch)
    runs = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("an error nothing foresaw")
        await asyncio.sleep(3600)

    async def go() -> int:
        rt = Runtime(cfg)
        task = rt.start(flaky, "flaky")
        for _ in range(300):
            if len(runs) >= 3:
                break
            await asyncio.sleep(0.01)
        alive = not task.done()
        rt.stop()
        await asyncio.sleep(0)
        return len(runs) if alive else -1

    assert asyncio.run(go()) == 3
