"""Known-crash rules: version-aware admission for GDN + MTP configurations.

Public API (the webhook, the reconciler and gdnctl call these):

    evaluate(spec, *, default_policy="reject", vllm_version=None) -> Evaluation
    effective_config(spec, vllm_version=None) -> Effective      (.to_status() -> api EffectiveConfig)
    load_rules() -> RuleSet                                     (the rule file, validated once)
    parse_launch_line(argv, vllm_version=..., architecture=None, patches=()) -> LaunchLine
    evaluate_launch(argv, vllm_version=..., architecture=None, patches=()) -> (LaunchLine, Evaluation)
    read_endpoint(argv) -> Endpoint                             (port and served name, without a release)

The rules themselves are data: gdn_operator/rules/data/rules.yaml. Version parsing and ranges:
gdn_operator/versions.py (shared with api/, render/ and watch/).
"""

from gdn_operator.rules.effective import Effective, LaunchOverrides, effective_config
from gdn_operator.rules.evaluator import Evaluation, evaluate
from gdn_operator.rules.family import infer_architecture
from gdn_operator.rules.launchline import Endpoint, LaunchLine, evaluate_launch, parse_launch_line, read_endpoint
from gdn_operator.rules.rulefile import Rule, RuleFileError, RuleSet, load_rules

__all__ = [
    "Effective",
    "Endpoint",
    "Evaluation",
    "LaunchLine",
    "LaunchOverrides",
    "Rule",
    "RuleFileError",
    "RuleSet",
    "effective_config",
    "evaluate",
    "evaluate_launch",
    "infer_architecture",
    "load_rules",
    "parse_launch_line",
    "read_endpoint",
]
