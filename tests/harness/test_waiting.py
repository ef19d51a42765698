"""tests/waiting.py: the shared poll/wait helper returns the first value that holds, says what it waited
for when it gives up, retries only the exceptions it is told to, and never blocks the event loop."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from waiting import async_poll, async_wait_for, poll, wait_for


def test_wait_for_returns_the_first_truthy_value():
    calls = itertools.count()
    assert wait_for(lambda: next(calls) >= 2 and "ready", timeout=5, interval=0.001) == "ready"
    assert next(calls) == 3  # called exactly until it held


def test_wait_for_names_what_and_the_last_value_on_timeout():
    with pytest.raises(AssertionError, match=r"timed out after 0.05s waiting for the thing; last value: \[\]"):
        wait_for(list, timeout=0.05, interval=0.01, what="the thing")


def test_retry_swallows_only_matching_exceptions():
    seen = []

    def flaky():
        seen.append(1)
        if len(seen) < 3:
            raise KeyError("not yet")
        return "ok"

    assert wait_for(flaky, timeout=5, interval=0.001, retry=lambda e: isinstance(e, KeyError)) == "ok"
    with pytest.raises(ValueError):
        wait_for(lambda: int("x"), timeout=5, interval=0.001, retry=lambda e: isinstance(e, KeyError))


def test_poll_gives_the_last_value_and_whether_it_held():
    values = iter(range(100))
    last, met = poll(lambda: next(values), until=lambda v: v > 1000, timeout=0.05, interval=0.001)
    assert met is False and isinstance(last, int) and last > 0
    assert poll(lambda: 7, until=lambda v: v == 7, timeout=1) == (7, True)


async def test_async_wait_lets_other_tasks_run_and_awaits_coroutines():
    box: list[str] = []

    async def producer():
        await asyncio.sleep(0.05)
        box.append("done")

    async def read():
        return box[:]

    task = asyncio.get_running_loop().create_task(producer())
    # a blocking sleep here would starve the producer and time out
    assert await async_wait_for(read, timeout=5, interval=0.01, what="producer") == ["done"]
    await task
    last, met = await async_poll(lambda: box, until=lambda b: len(b) > 1, timeout=0.05, interval=0.01)
    assert (last, met) == (["done"], False)
