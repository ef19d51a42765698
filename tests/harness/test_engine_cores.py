"""tests/engine_fixtures.own_cores: engines that serve at the same time get disjoint CPUs (vLLM's automatic binding
gives every engine core 0 of a 2-CPU machine; the live monitoring test's healthy engine starved beside a busy one)."""

from __future__ import annotations

import os

import pytest

from engine_fixtures import own_cores


def _cpus(env: dict[str, str]) -> set[int]:
    return {int(c) for c in env["VLLM_CPU_OMP_THREADS_BIND"].split(",")}


def test_a_lone_engine_keeps_vllms_own_binding():
    assert own_cores(1) == [{}]


@pytest.mark.parametrize("cpus", [[0, 1], [0, 1, 2, 3], [2, 5, 7], [0, 1, 2, 3, 4, 5, 6, 7]])
def test_engines_get_disjoint_cpus_covering_what_the_process_may_use(monkeypatch, cpus):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus))
    for count in range(2, len(cpus) + 1):
        envs = own_cores(count)
        assert len(envs) == count
        sets = [_cpus(e) for e in envs]
        assert all(sets), envs
        assert set().union(*sets) == set(cpus)
        assert sum(len(s) for s in sets) == len(cpus), f"overlapping lists: {envs}"


def test_more_engines_than_cpus_share_round_robin(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert [_cpus(e) for e in own_cores(3)] == [{0}, {1}, {0}]


def test_count_below_one_is_refused():
    with pytest.raises(ValueError, match="count must be >= 1"):
        own_cores(0)
