"""Shared fixtures."""

from __future__ import annotations

import time

import pytest
from hypothesis import settings

from skippipe.planner.routing import decompose, site_groups

# the tests assert behaviour, not time: on the shared 2-core machine one example of a property
# test took 336 ms once (CI, 2026-12-02) against hypothesis's default 200-ms deadline
settings.register_profile("skippipe", deadline=None)
settings.load_profile("skippipe")


class FakeClock:
    """``time.perf_counter`` that advances a fixed step per reading, so time limits can be tested
    without depending on the machine's speed."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now = 1000.0
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        self.now += self.step_s
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    clock = FakeClock(0.01)
    monkeypatch.setattr(time, "perf_counter", clock)
    return clock


@pytest.fixture
def small_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The groups of sites from 24 nodes with groups of 8, so that a test plans in seconds."""
    monkeypatch.setattr(site_groups, "SPLIT_NODES", 24)
    monkeypatch.setattr(site_groups, "GROUP_NODES", 8)


@pytest.fixture
def large_path(small_split: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules above ``decompose.DECOMPOSE_NODES`` nodes from 24 nodes (groups of 8)."""
    monkeypatch.setattr(decompose, "DECOMPOSE_NODES", 24)
