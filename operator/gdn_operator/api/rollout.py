"""spec.rollout and spec.disruptionBudget: how engine pods are replaced (rollouts) and how many a voluntary
disruption (a node drain) may take at once.

GPUs are scarce, so the rollout strategy is a real choice: `Surge` brings a new engine up before an old one
goes (no capacity dip, but it needs a spare GPU set — spare nodes for a multi-node engine — or it waits
forever); `InPlace` takes an old engine down first (no spare GPUs needed; one engine less during the
rollout).
"""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from gdn_operator.api.base import _Model


class RolloutStrategy(str, enum.Enum):
    SURGE = "Surge"
    IN_PLACE = "InPlace"


#: strategy -> (maxSurge, maxUnavailable) of the Deployment / LeaderWorkerSet rolling update
ROLLING_UPDATE = {RolloutStrategy.SURGE.value: (1, 0), RolloutStrategy.IN_PLACE.value: (0, 1)}


class RolloutSpec(_Model):
    """How a new generation replaces the engines."""

    strategy: RolloutStrategy = Field(
        default=RolloutStrategy.SURGE,
        description=(
            "Surge (default): a new engine (group) comes up before an old one goes (maxSurge 1, maxUnavailable 0; "
            "needs a spare GPU set, or spare nodes for multi-node). InPlace: an old engine goes first (maxSurge 0, "
            "maxUnavailable 1; no spare GPUs needed, one engine less while it rolls)."
        ),
    )

    @property
    def max_surge(self) -> int:
        return ROLLING_UPDATE[str(self.strategy)][0]

    @property
    def max_unavailable(self) -> int:
        return ROLLING_UPDATE[str(self.strategy)][1]


#: Engine pods a drain may evict at once when spec.disruptionBudget.maxUnavailable is unset: one, whatever the
#: replica count, so a drain, a cluster upgrade or an autoscaler scale-down always makes progress (one engine at a
#: time) and never waits forever on a single replica — what the vLLM production-stack chart renders
#: (maxUnavailable 1); KServe renders no budget unless asked (kserve#4574). Keeping the only engine through a
#: drain is the opt-in `maxUnavailable: 0` (issue 38).
DEFAULT_MAX_UNAVAILABLE = 1


class DisruptionBudgetSpec(_Model):
    """The engine PodDisruptionBudget (voluntary disruptions: node drains, cluster upgrades)."""

    enabled: bool = Field(default=True, description="Render a PodDisruptionBudget for the engine pods.")
    max_unavailable: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description=(
            "Engine pods a drain may evict at once. Unset: 1 (one engine at a time; a drain of a one-replica "
            "server takes it down and the Deployment recreates it elsewhere, so drains, upgrades and autoscaler "
            "scale-downs never wait forever). 0 is the opt-in protection: a drain waits until you act, and the "
            "DisruptionBlocked condition says so and names the way out. Multi-node engines count pods."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> DisruptionBudgetSpec:
        if not self.enabled and self.max_unavailable is not None:
            raise ValueError("maxUnavailable has no effect with enabled: false; drop one of them")
        return self

    @property
    def effective_max_unavailable(self) -> int | None:
        """The rendered budget's maxUnavailable (None: no budget is rendered)."""
        if not self.enabled:
            return None
        return DEFAULT_MAX_UNAVAILABLE if self.max_unavailable is None else self.max_unavailable
