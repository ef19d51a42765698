"""GDNModelServer API (serving.gdn-operator.io/v1alpha1): pydantic models, loading, CRD generation.

The pydantic models are the single source of truth: the CRD's OpenAPI schema is generated from them
(`gdnctl crd`, see api/crd.py), the webhook and the reconciler validate with them, and gdnctl reads
manifests with them. Field names follow Kubernetes API conventions (camelCase in YAML/JSON).

    api/enums.py     enumerations (spec values, status.phase)
    api/parts.py     spec parts: model, image, speculative decoding, env, resources, remediation, metrics
    api/probes.py    spec.probes and status.probes
    api/scaleout.py  spec.autoscaling and spec.router
    api/spec.py      GDNModelServerSpec (and the checks that span its parts)
    api/status.py    GDNModelServerStatus and its parts
    api/resource.py  GDNModelServer (the whole object)
    api/base.py      base classes (camelCase aliases; strict spec, tolerant status)
"""

from gdn_operator.api.load import ManifestError, load_file, parse_object, parse_spec  # noqa: F401
from gdn_operator.api.resource import GDNModelServer  # noqa: F401
from gdn_operator.api.spec import GDNModelServerSpec  # noqa: F401
from gdn_operator.api.status import GDNModelServerStatus  # noqa: F401
