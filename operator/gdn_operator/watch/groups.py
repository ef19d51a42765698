"""Multi-node engines: which LeaderWorkerSet group a dying pod belongs to, and whether its death is part of
a crash already counted.

One crash of a group kills several pods: when a worker's engine dies, the leader's dies with it (its
torch.distributed peers are gone), usually with a generic error. The crash watch counts such a group
incident once: a death in the same group and spec generation, within GROUP_INCIDENT_SECONDS of the last
recorded one, of a pod that has not died in this incident yet. A pod dying again is always a new crash.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from gdn_operator.labels import LABEL_GROUP_INDEX, LABEL_SET_NAME

#: How close (by the containers' finishedAt) the deaths of one group incident are.
GROUP_INCIDENT_SECONDS = 20.0


def group_of(labels: dict[str, str]) -> str | None:
    """ "<LeaderWorkerSet>/<group index>" for a pod of a multi-node engine, None otherwise."""
    if LABEL_GROUP_INDEX not in labels:
        return None
    return f"{labels.get(LABEL_SET_NAME, '')}/{labels[LABEL_GROUP_INDEX]}"


def seconds_between(a: str | None, b: str | None) -> float:
    if not a or not b:
        return float("inf")
    try:
        ta = dt.datetime.fromisoformat(a.replace("Z", "+00:00"))
        tb = dt.datetime.fromisoformat(b.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return abs((ta - tb).total_seconds())


def incident_members(last_crash: dict[str, Any]) -> list[str]:
    """The pods already counted in the last recorded crash (status.lastCrash)."""
    return list(last_crash.get("incidentPods") or ([last_crash["pod"]] if last_crash.get("pod") else []))


def same_incident(last_crash: dict[str, Any], group: str | None, pod: str, generation: int | None, finished: str | None) -> bool:
    return (
        group is not None
        and last_crash.get("group") == group
        and pod not in incident_members(last_crash)
        and last_crash.get("generation") == generation
        and seconds_between(last_crash.get("time"), finished) <= GROUP_INCIDENT_SECONDS
    )
