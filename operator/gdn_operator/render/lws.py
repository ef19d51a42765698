"""Multi-node engines (spec.nodes > 1): a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) per server.

One group = one engine spread over `nodes` pods, one per node: the leader (worker index 0) runs the
OpenAI API server, the others run `vllm serve --headless`. vLLM's multiprocessing launcher joins them
(`--nnodes N --node-rank $(LWS_WORKER_INDEX) --master-addr $(LWS_LEADER_ADDRESS)`; the LWS pod webhook
injects both variables and the kubelet expands `$(VAR)` in args). `replicas` counts groups.

Choices (and why):
- restartPolicy None. RecreateGroupOnPodRestart (LWS's default) deletes and recreates every pod of the
  group on any container restart: new pods have restartCount 0, so the kubelet's CrashLoopBackOff never
  grows and a deterministic crash loops as fast as the group can be recreated ("30 group recreations in
  90 seconds", lws#1048). With None the kubelet restarts the dead container in place with its backoff;
  the pod keeps its uid and restart count, so the crash watch counts and remediates once per signature
  per generation, exactly as for a Deployment. A worker's death takes the leader's engine down with it
  (its torch.distributed peers fail); both restart in place and meet again at the leader's address.
- startupPolicy LeaderCreated, not LeaderReady: the leader's /health (its readiness) only answers once
  every rank has joined (MultiprocExecutor waits for the remote workers' queues before the API server
  starts), so with LeaderReady the workers would never be created: a deadlock.
- rollout as the Deployment's (spec.rollout): Surge (maxSurge 1 / maxUnavailable 0) brings a new group up
  before an old one goes, InPlace (maxSurge 0 / maxUnavailable 1) takes an old group down first.
- networkConfig.subdomainPolicy UniquePerReplica. With LWS's default (Shared) the LWS controller makes a
  headless Service named after the LeaderWorkerSet — the server's name, which is also the name of the engine
  Service clients use. Whichever comes first wins: if ours, no per-pod DNS records exist and the workers cannot
  resolve LWS_LEADER_ADDRESS; if LWS's, our apply is refused (two controller owners). Per replica, LWS names
  each group's headless Service after its leader pod (`<name>-<group>`) and points the group's subdomain there.
"""

from __future__ import annotations

from typing import Any

from gdn_operator.api import flags
from gdn_operator.api.spec import GDNModelServerSpec
from gdn_operator.labels import LABEL_WORKER_INDEX
from gdn_operator.render import podparts
from gdn_operator.render.engine import pod_template, vllm_args
from gdn_operator.render.meta import check_names, object_meta

GROUP = "leaderworkerset.x-k8s.io"
VERSION = "v1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LeaderWorkerSet"
PLURAL = "leaderworkersets"
CRD = f"{PLURAL}.{GROUP}"

#: torch.distributed rendezvous port on the leader (vLLM's --master-port default, rendered explicitly).
MASTER_PORT = 29501
RESTART_POLICY = "None"
STARTUP_POLICY = "LeaderCreated"


def multinode_args(name: str, spec: GDNModelServerSpec, *, leader: bool) -> list[str]:
    """vllm serve arguments for one pod of a group."""
    args = vllm_args(name, spec) + [
        flags.NNODES,
        str(spec.nodes),
        flags.NODE_RANK,
        "$(LWS_WORKER_INDEX)",
        flags.MASTER_ADDR,
        "$(LWS_LEADER_ADDRESS)",
        flags.MASTER_PORT,
        str(MASTER_PORT),
    ]
    if not leader:
        args.append(flags.HEADLESS)
    return args


def _worker_template(name: str, spec: GDNModelServerSpec) -> dict[str, Any]:
    tpl = pod_template(name, spec, multinode_args(name, spec, leader=False))
    c = tpl["spec"]["containers"][0]
    # Headless workers serve no HTTP: no API port, no HTTP probes (their liveness is the leader's: when a
    # worker's engine dies the leader's /health fails and its container restarts).
    c["ports"] = [{"name": "dist", "containerPort": MASTER_PORT, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        c.pop(probe, None)
    c.pop("lifecycle", None)  # nothing to drain: requests only reach the leader
    if podparts.shared_download(spec):
        # one download per group, on the leader, into the shared (ReadWriteMany) cache: the workers wait for it
        tpl["spec"]["initContainers"] = [podparts.wait_container(spec)]
    return tpl


#: one headless Service per group, named after the leader pod: never the server's (engine Service's) name
SUBDOMAIN_POLICY = "UniquePerReplica"


def leader_worker_set(name: str, namespace: str, spec: GDNModelServerSpec, uid: str | None = None) -> dict[str, Any]:
    check_names(name)
    leader = pod_template(name, spec, multinode_args(name, spec, leader=True))
    leader["spec"]["containers"][0]["ports"].append({"name": "dist", "containerPort": MASTER_PORT, "protocol": "TCP"})
    out: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": object_meta(name, namespace, uid, spec),
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": STARTUP_POLICY,
            "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "leaderWorkerTemplate": {
                "size": spec.nodes,
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": leader,
                "workerTemplate": _worker_template(name, spec),
            },
        },
    }
    if spec.autoscaling is not None:
        del out["spec"]["replicas"]  # owned by the autoscaler through the LWS scale subresource
    return out


def is_leader(labels: dict[str, str]) -> bool | None:
    """True/False for a pod of a LeaderWorkerSet group, None for a single-node engine pod."""
    idx = labels.get(LABEL_WORKER_INDEX)
    return None if idx is None else idx == "0"
