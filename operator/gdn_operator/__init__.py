"""gdn-operator: serve Qwen3.5-family (Gated DeltaNet hybrid) models with MTP on vLLM, safely."""

__version__ = "0.2.0"

GROUP = "serving.gdn-operator.io"
VERSION = "v1alpha1"
KIND = "GDNModelServer"
PLURAL = "gdnmodelservers"
SINGULAR = "gdnmodelserver"
SHORT_NAMES = ["gms"]
API_VERSION = f"{GROUP}/{VERSION}"

# GDNGuard (api/guard.py): guards vLLM workloads that other tools create (issue 35)
GUARD_KIND = "GDNGuard"
GUARD_PLURAL = "gdnguards"
GUARD_SINGULAR = "gdnguard"
GUARD_SHORT_NAMES = ["gdng"]
