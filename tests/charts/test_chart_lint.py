"""`helm lint --strict` on every value set; bad values fail lint and template with a clear message."""

from __future__ import annotations

import pytest

from _chart_helpers import CHART, VALUE_SETS, helm, value_args


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_helm_lint_passes(chart_tools, name):
    res = helm("lint", "--strict", str(CHART), "-n", "gdn-system", *value_args(VALUE_SETS[name]), check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in res.stdout


# (--set arguments, text the error must contain: the value's path and what is allowed)
BAD_VALUES = [
    ({"operator.defaultPolicy": "fast"}, ["/operator/defaultPolicy", "'reject', 'mitigate', 'warn'"]),
    ({"replicaCount": 0}, ["/replicaCount", "minimum"]),
    ({"webhok.enabled": False}, ["additional properties 'webhok' not allowed"]),
    ({"peering.priority": "high"}, ["/peering/priority", "'auto'"]),
    ({"monitoring.enginePodMonitor.mode": "both"}, ["/monitoring/enginePodMonitor/mode", "'perServer', 'global', 'none'"]),
    ({"operator.watchNamespaces[0]": "Team_A"}, ["/operator/watchNamespaces/0", "does not match pattern"]),
    (
        {"monitoring.prometheusRule.acceptanceCollapse.threshold": 1.5},
        ["/monitoring/prometheusRule/acceptanceCollapse/threshold", "maximum"],
    ),
    ({"webhook.certManager.issuerRef.kind": "Vault"}, ["/webhook/certManager/issuerRef/kind", "'Issuer', 'ClusterIssuer'"]),
    ({"monitoring.serviceMonitor.interval": "soon"}, ["/monitoring/serviceMonitor/interval", "does not match pattern"]),
    # HA (replicaCount > 1) needs kopf peering with a per-pod priority (schema if/then)
    ({"peering.enabled": False}, ["/peering/enabled", "value must be true"]),
    ({"peering.priority": 5}, ["/peering/priority", "value must be 'auto'"]),
]


@pytest.mark.parametrize("sets,needles", BAD_VALUES, ids=[",".join(s) for s, _ in BAD_VALUES])
def test_bad_values_fail_template_and_lint_clearly(chart_tools, sets, needles):
    tpl = helm("template", "t", str(CHART), *value_args(sets=sets), check=False)
    assert tpl.returncode != 0, f"helm template accepted {sets}"
    for n in needles:
        assert n in tpl.stderr, f"{n!r} not in helm's error:\n{tpl.stderr}"
    assert "panic" not in tpl.stderr.lower()
    lint = helm("lint", str(CHART), *value_args(sets=sets), check=False)
    assert lint.returncode != 0, f"helm lint accepted {sets}"
    assert any(n in lint.stdout + lint.stderr for n in needles), lint.stdout + lint.stderr


def test_good_overrides_pass_schema(chart_tools):
    sets = {
        "operator.watchNamespaces[0]": "team-a",
        "peering.priority": 7,
        "replicaCount": 1,
        "webhook.certManager.enabled": True,
        "webhook.certManager.issuerRef.name": "corp-ca",
        "webhook.certManager.issuerRef.kind": "ClusterIssuer",
        "monitoring.prometheusRule.acceptanceCollapse.threshold": 0.35,
        "podDisruptionBudget.minAvailable": "50%",
    }
    res = helm("template", "t", str(CHART), *value_args(sets=sets), check=False)
    assert res.returncode == 0, res.stderr
