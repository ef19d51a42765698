"""The generated hostile GDNModelServer manifests of bench/bench_fuzz.py (its "fuzz corpus"), shared with the
offline-parity test (tests/handlers/webhook/test_admission_parity.py): the same seed gives the same manifests.

Each manifest is a valid base with 1-3 generated mutations: extraArgs spellings from vLLM's option table, env
names, affinity/tolerations shapes, quantities, names, versions, wrong types, huge and deeply nested values, and
(issue 36) pod settings that loosen the engine's isolation (GPU-visibility variables, privileged, hostPath,
capabilities, envFrom, volumes).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import yaml

from gdn_operator.api import vllm_args

TABLE = yaml.safe_load((vllm_args._TABLES / "0.32.0.yaml").read_text())
POLICY = vllm_args.policy()
GUARDED = set(POLICY["owned"]) | set(POLICY["rule_relevant"])
OPTS = [s for o in TABLE["options"] for s in o["options"]]
GUARDED_OPTS = [s for o in TABLE["options"] if o["dest"] in GUARDED for s in o["options"]]
VALUES = ["1", "0", "2", "mtp", "{}", '{"mode":0}', "fp8", "auto", "NONE", "8k", "-1", "x", "hf_AbCdEfGhIjKlMnOp"]
HOSTILE_STR = [
    "",
    " ",
    "a\n",
    "0.28.0\n",
    "x" * 300,
    "ünï",
    "$(id)",
    "../../etc",
    "-",
    "--",
    "1abc",
    "A",
    "a.b",
    "a" * 64,
    "\t",
    "null",
    "16\n",
    "-1Gi",
    "0",
    "1e3",
    "64Gi",
    "500m",
]


def spelling(rng: random.Random) -> str:
    opt = rng.choice(GUARDED_OPTS if rng.random() < 0.4 else OPTS)
    r = rng.random()
    if r < 0.25 and len(opt) > 4:
        return opt[: rng.randint(3 if opt.startswith("--") else 2, len(opt) - 1)]
    if r < 0.4 and opt.startswith("--"):
        return "--" + opt[2:].replace("-", "_")
    return opt


def extra_args(rng: random.Random) -> list[str]:
    out: list[str] = []
    for _ in range(rng.randint(1, 3)):
        form = rng.random()
        sp = spelling(rng)
        if form < 0.3:
            out += [sp, rng.choice(VALUES)]
        elif form < 0.55:
            out.append(f"{sp}={rng.choice(VALUES)}")
        elif form < 0.7:
            out.append(sp)
        elif form < 0.8:
            out.append(f"{sp}.{rng.choice(['mode', 'method', 'cudagraph_mode', 'backend'])}={rng.choice(VALUES)}")
        elif form < 0.85:
            out.append(rng.choice(["-O3", "-O0", "--config", "--", "stray", "--help"]))
        else:
            out += rng.choice([["--trust-remote-code"], ["--max-logprobs", "5"], ["--seed", "1"], ["-q", "fp8"]])
    return out


def deep_text(text: str) -> str:
    """Replace "__DEEP_N__" placeholders with N levels of nested JSON."""
    return re.sub(r'"__DEEP_(\d+)__"', lambda m: '{"x":[' * int(m.group(1)) + "1" + "]}" * int(m.group(1)), text)


def mutate(rng: random.Random, obj: dict) -> None:
    spec = obj["spec"]
    kind = rng.choice(
        ["extraArgs"] * 6
        + [
            "env",
            "affinity",
            "tolerations",
            "resources",
            "name",
            "image",
            "type",
            "nodeSelector",
            "deep",
            "big",
            "model",
            "numbers",
            "pod",
            "pod",
        ]
    )
    if kind == "extraArgs":
        spec["extraArgs"] = extra_args(rng)
        spec["image"] = {**spec["image"], "tag": "v0.32.0", "vllmVersion": rng.choice(["0.32.0"] * 4 + ["0.33.0"])}
    elif kind == "env":
        name = rng.choice(
            [
                "LD_PRELOAD",
                "PYTHONPATH",
                "PATH",
                "VLLM_ATTENTION_BACKEND",
                "HF_TOKEN",
                "VLLM_LOGGING_LEVEL",
                "NCCL_P2P_DISABLE",
                "FOO\n",
                "1BAD",
                "OK_NAME",
                "VLLM_GDN_DECODE_KERNEL",
            ]
        )
        spec["env"] = [{"name": name, "value": rng.choice(HOSTILE_STR)}]
        if rng.random() < 0.2:
            spec["allowUnsafeEnv"] = [name]
    elif kind == "affinity":
        spec["affinity"] = rng.choice(
            [
                {"x": 1},
                {"node_affinity": {}},
                {"nodeAffinity": {}},
                {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "a", "operator": rng.choice(["In", "Bogus"]), "values": ["b"]}]}
                            ]
                        }
                    }
                },
                {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]
                    }
                },
            ]
        )
    elif kind == "tolerations":
        spec["tolerations"] = [
            rng.choice(
                [
                    {"key": "a", "tolerationSeconds": "10"},
                    {"key": "a", "bogus": 1},
                    {"operator": "Exists"},
                    {"key": "a", "operator": "Exists", "value": "x"},
                    {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                    {"key": "a", "effect": "Sometimes"},
                    {"key": 1},
                ]
            )
        ]
    elif kind == "resources":
        spec["resources"] = {rng.choice(["cpu", "memory", "shmSize", "gpuType"]): rng.choice(HOSTILE_STR)}
    elif kind == "name":
        obj["metadata"]["name"] = rng.choice(["1abc", "a.b", "a" * 64, "ok-name", "x-" + "y" * 60, "abc-"])
    elif kind == "image":
        spec["image"] = {**spec["image"], rng.choice(["tag", "vllmVersion", "repository"]): rng.choice(HOSTILE_STR)}
    elif kind == "type":
        field = rng.choice(
            ["replicas", "tensorParallelSize", "maxModelLen", "prefixCaching", "extraArgs", "env", "speculativeDecoding"]
        )
        spec[field] = rng.choice(["two", -1, 1.5, [], {}, None, True, "x" * 10, 10**12])
    elif kind == "nodeSelector":
        spec["nodeSelector"] = {rng.choice(["a", "a\n", "bad key", "x/" * 3, "ok/key"]): rng.choice(HOSTILE_STR)}
    elif kind == "deep":
        # a placeholder: json.dumps cannot encode 1000 levels; the raw text is spliced in by deep_text()
        spec[rng.choice(["affinity", "unknownField"])] = f"__DEEP_{rng.choice([40, 100, 1000])}__"
    elif kind == "big":
        spec["env"] = [{"name": f"V{i}", "value": "x" * 30000} for i in range(rng.choice([5, 20, 40]))]
    elif kind == "pod":  # issue 36: what loosens the engine's isolation, refused unless the operator opts in
        choice = rng.choice(["gpu-env", "privileged", "host-path", "capabilities", "env-from", "volume", "media"])
        pod = spec.setdefault("pod", {})
        if choice == "gpu-env":
            name = rng.choice(["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_X"])
            spec["env"] = [{"name": name, "value": rng.choice(["all", "0", "void"])}]
        elif choice == "privileged":
            pod["containerSecurityContext"] = {"privileged": rng.choice([True, False])}
        elif choice == "host-path":
            pod["volumes"] = [{"name": "h", "hostPath": {"path": rng.choice(["/", "/data", "/dev"])}}]
            pod["volumeMounts"] = [{"name": "h", "mountPath": "/h"}]
        elif choice == "capabilities":
            pod["containerSecurityContext"] = {"capabilities": {"add": [rng.choice(["SYS_ADMIN", "IPC_LOCK"])]}}
        elif choice == "env-from":
            pod["envFrom"] = [{"secretRef": {"name": "s"}}]
        elif choice == "volume":
            pod["volumes"] = [
                rng.choice([{"name": "v", "emptyDir": {}}, {"name": "v", "bogus": 1}, {"name": "cache", "emptyDir": {}}])
            ]
            pod["volumeMounts"] = [{"name": "v", "mountPath": rng.choice(["/v", "relative"])}]
        else:
            spec["extraArgs"] = ["--allowed-local-media-path", rng.choice(["/", "/v", "/etc"])]
            pod["volumes"] = [{"name": "v", "emptyDir": {}}]
            pod["volumeMounts"] = [{"name": "v", "mountPath": "/v"}]
    elif kind == "model":
        spec["model"] = {"uri": rng.choice(["hf://Qwen/Qwen3.5-27B\n", "pvc://Claim/x", "ftp://x", "hf://", "pvc://ok/x"])}
    else:
        spec[rng.choice(["gpuMemoryUtilization", "startupBudgetSeconds", "maxNumSeqs"])] = rng.choice([0, 1e9, -5, 0.5, 99999])


def manifest(rng: random.Random, i: int, used: set[str], gms: Callable[[str], dict[str, Any]]) -> tuple[str, str]:
    """(name, JSON text) of the i-th generated manifest; `gms(name)` gives the valid base object."""
    obj = gms(f"f{i:05d}")
    obj["spec"]["image"] = {**obj["spec"]["image"], "tag": "v0.32.0", "vllmVersion": "0.32.0"}
    for _ in range(rng.randint(1, 3)):
        mutate(rng, obj)
    name = obj["metadata"]["name"]
    if name in used:  # a generated name repeats: keep it unique (409 is not what is measured)
        obj["metadata"]["name"] = name = f"{name[:54]}-{i}"
    used.add(name)
    return name, deep_text(json.dumps(obj))
