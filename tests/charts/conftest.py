import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _chart_helpers import ToolError, tools  # noqa: E402


@pytest.fixture(scope="session")
def chart_tools() -> dict[str, str]:
    """helm/kubectl/promtool paths; a failed install is a test error, not a skip."""
    try:
        return tools()
    except ToolError as e:
        pytest.fail(str(e), pytrace=False)
