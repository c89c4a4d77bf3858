"""Holding a task to a CPU limit, as a container's CPU quota would.

On a cluster each task runs in a container with its own cores; on one small
machine every process shares the same cores, so no allocation could matter.
A task given ``cpu_limit`` (cores) sleeps after each piece of work until the
CPU time it used is at most ``cpu_limit`` times the wall time that passed:
what the kernel's CFS quota does to a container with ``limits.cpu``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class CpuLimit:
    def __init__(self, cores: float | None) -> None:
        if cores is not None and cores <= 0:
            raise ValueError(f"cpu_limit must be > 0 cores, got {cores}")
        self.cores = cores

    @contextmanager
    def held(self) -> Iterator[None]:
        """Run the block; then wait until its CPU time fits the limit."""
        if self.cores is None:
            yield
            return
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        yield
        used = time.thread_time() - cpu0
        owed = used / self.cores - (time.perf_counter() - wall0)
        if owed > 0:
            time.sleep(owed)
