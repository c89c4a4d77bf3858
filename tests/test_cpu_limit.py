"""The CPU limit that stands in for a container's CPU quota."""

from __future__ import annotations

import time

import pytest

from elasticps.errors import ConfigError
from elasticps.runtime import TaskResources
from elasticps.runtime.cpu_limit import CpuLimit


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@pytest.mark.parametrize("cores", [0.25, 0.5])
def test_a_limited_block_uses_at_most_its_share_of_a_core(cores):
    limit = CpuLimit(cores)
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(5):
        with limit.held():
            _spin(0.02)
    used, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
    assert used >= 0.1
    assert used / wall <= cores * 1.02  # it sleeps until the share fits, never less


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="cpu_limit must be > 0"):
        CpuLimit(0)
    with pytest.raises(ConfigError, match="cpu_limit must be > 0"):
        TaskResources(cpu=1, cpu_limit=-1)
