"""Background tasks that never end for good (issue 48): a task whose body returns or raises an error nothing
foresaw (a urllib3 error that is not an OSError, a bug) is started again after a backoff, and its failure logged
with its traceback, instead of the feature it runs stopping silently for the rest of the process's life.
The runtime starts its tasks through `supervised` (runtime.Runtime.start); so do the guard supervisor's probe task
and the webhook front's report and certificate tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

#: a background task that ended is started again after this, doubled while it keeps failing, up to the most
RESTART_SECONDS = 1.0
RESTART_MAX_SECONDS = 60.0


async def supervised(run: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
    """Run `run()` for ever: started again whenever it returns or raises (cancellation ends it)."""
    backoff = RESTART_SECONDS
    while True:
        started = time.monotonic()
        try:
            await run()
            log.error("background task %s ended; starting it again in %.0f s", name, backoff)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task %s failed; starting it again in %.0f s", name, backoff)
        if time.monotonic() - started > RESTART_MAX_SECONDS:
            backoff = RESTART_SECONDS  # it ran a while: a new failure, not the same one again
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, RESTART_MAX_SECONDS)
