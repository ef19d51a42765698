"""GDNModelServer API: pydantic models (the CRD's single source), loading, CRD generation."""

from gdn_operator.api.load import ManifestError, load_file, parse_object, parse_spec  # noqa: F401
from gdn_operator.api.models import GDNModelServer, GDNModelServerSpec, GDNModelServerStatus  # noqa: F401
