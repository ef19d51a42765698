"""Label keys on the objects the operator renders and watches: ours, the recommended app.kubernetes.io
ones, and those the LeaderWorkerSet controller puts on the pods of a multi-node engine.

At the package root because every layer reads them: render/ writes them, watch/ groups crashed pods by
them, handlers/ selects the pods and workloads it watches with them.
"""

from __future__ import annotations

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_PART_OF = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_VERSION = "app.kubernetes.io/version"
LABEL_SERVER = "serving.gdn-operator.io/server"
MANAGED_BY = "gdn-operator"
#: the selector of everything the operator manages (kopf handlers for pods, Deployments, LeaderWorkerSets)
MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}

# set by the LeaderWorkerSet controller (sigs.k8s.io/lws) on every pod of a group
LABEL_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LABEL_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LABEL_GROUP_KEY = "leaderworkerset.sigs.k8s.io/group-key"
LABEL_SET_NAME = "leaderworkerset.sigs.k8s.io/name"
#: Pods that serve the API in a group (LWS gives the leader worker index 0).
LEADER_SELECTOR = {LABEL_WORKER_INDEX: "0"}
