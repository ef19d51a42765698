"""The one way tests wait: poll a condition until it holds, never a fixed sleep.

- ``poll(fn, until=..., timeout=..., interval=...)`` → ``(last value, met)``: calls ``fn`` until
  ``until(value)`` holds or the timeout passes; for tests that assert on the last value themselves.
- ``wait_for(fn, timeout, interval, what)`` → the first truthy value of ``fn()``; an ``AssertionError``
  naming ``what`` and the last value when the timeout passes.
- ``async_poll`` / ``async_wait_for``: the same inside async tests (``fn`` may be a coroutine function);
  they sleep with ``asyncio.sleep`` so the event loop (and the code under test on it) keeps running.

``retry``: a predicate on an exception ``fn`` raised; true means "not yet" (e.g. a 404 before the
object exists), anything else propagates.

Negative assertions ("X did not happen") come after a wait for positive evidence that the code under test
has seen the event (an observedGeneration, an Event, a log line), not after a fixed sleep.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any, TypeVar
from collections.abc import Awaitable, Callable

T = TypeVar("T")
Retry = Callable[[BaseException], bool] | None


def _call(fn: Callable[[], T], retry: Retry) -> tuple[T | None, bool]:
    try:
        return fn(), True
    except Exception as e:  # noqa: BLE001 - re-raised unless retry says "not yet"
        if retry is not None and retry(e):
            return None, False
        raise


def poll(
    fn: Callable[[], T], *, until: Callable[[T], Any] = bool, timeout: float = 60.0, interval: float = 0.25, retry: Retry = None
) -> tuple[T | None, bool]:
    """Call ``fn`` every ``interval`` s until ``until(value)`` holds; return (last value, whether it held)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        value, called = _call(fn, retry)
        if called:
            last = value
            if until(value):  # type: ignore[arg-type]
                return value, True
        if time.monotonic() >= deadline:
            return last, False
        time.sleep(interval)


def wait_for(
    fn: Callable[[], T], timeout: float = 60.0, interval: float = 0.25, what: str = "condition", *, retry: Retry = None
) -> T:
    """The first truthy ``fn()``; AssertionError naming ``what`` after ``timeout`` seconds."""
    value, met = poll(fn, timeout=timeout, interval=interval, retry=retry)
    if not met:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
    return value  # type: ignore[return-value]


async def _acall(fn: Callable[[], Any], retry: Retry) -> tuple[Any, bool]:
    try:
        value = fn()
        if inspect.isawaitable(value):
            value = await value
        return value, True
    except Exception as e:  # noqa: BLE001 - re-raised unless retry says "not yet"
        if retry is not None and retry(e):
            return None, False
        raise


async def async_poll(
    fn: Callable[[], T | Awaitable[T]],
    *,
    until: Callable[[T], Any] = bool,
    timeout: float = 60.0,
    interval: float = 0.25,
    retry: Retry = None,
) -> tuple[T | None, bool]:
    """``poll`` for async tests: ``fn`` may return an awaitable; sleeps without blocking the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: T | None = None
    while True:
        value, called = await _acall(fn, retry)
        if called:
            last = value
            if until(value):
                return value, True
        if loop.time() >= deadline:
            return last, False
        await asyncio.sleep(interval)


async def async_wait_for(
    fn: Callable[[], T | Awaitable[T]],
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
    *,
    retry: Retry = None,
) -> T:
    """``wait_for`` for async tests."""
    value, met = await async_poll(fn, timeout=timeout, interval=interval, retry=retry)
    if not met:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
    return value  # type: ignore[return-value]
