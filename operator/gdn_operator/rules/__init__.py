"""Known-crash rules: version-aware admission for GDN + MTP configurations.

Public API (the webhook, the reconciler and gdnctl call these):

    evaluate(spec, *, default_policy="reject", vllm_version=None) -> Evaluation
    effective_config(spec, vllm_version=None) -> Effective      (.to_status() -> api EffectiveConfig)
    load_rules() -> RuleSet                                     (the rule file, validated once)
    parse_launch_line(argv, vllm_version=..., architecture=None, patches=()) -> LaunchLine
    evaluate_launch(argv, vllm_version=..., architecture=None, patches=()) -> (LaunchLine, Evaluation)

The rules themselves are data: gdn_operator/rules/data/rules.yaml.
"""

from gdn_operator.rules.effective import Effective, LaunchOverrides, effective_config, infer_architecture
from gdn_operator.rules.evaluator import Evaluation, evaluate
from gdn_operator.rules.rulefile import Rule, RuleFileError, RuleSet, load_rules
from gdn_operator.rules.versions import Version, VersionRange, parse_version

__all__ = [
    "Effective",
    "Evaluation",
    "LaunchOverrides",
    "Rule",
    "RuleFileError",
    "RuleSet",
    "Version",
    "VersionRange",
    "effective_config",
    "evaluate",
    "evaluate_launch",
    "infer_architecture",
    "load_rules",
    "parse_launch_line",
    "parse_version",
]


def __getattr__(name: str):  # launch-line helpers are imported lazily (shlex/json parsing)
    if name in ("parse_launch_line", "evaluate_launch", "LaunchLine"):
        from gdn_operator.rules import launchline

        return getattr(launchline, name)
    raise AttributeError(name)
