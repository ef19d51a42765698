"""kopf handlers. `kopf run -m gdn_operator.handlers` (or `python -m gdn_operator`) loads them all: every
registration is in handlers/main.py."""

from gdn_operator.handlers import main  # noqa: F401
