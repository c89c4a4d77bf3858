"""What both kinds of worker share: the actor's liveness calls, the next step's
samples read in the background, the pull of parameters, and the gradient handed
back as one slice per PS shard (a shared-memory reference where the shard is on
this node). :class:`~elasticps.runtime.worker.Worker` computes the gradient from
a :class:`TrainingProgram`; :class:`~elasticps.runtime.loop_worker.LoopWorker`
lets the user's own loop compute it."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
import torch

from elasticps.runtime.bounded_get import get_within
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S
from elasticps.runtime.cpu_limit import CpuLimit
from elasticps.runtime.membership import task_name
from elasticps.runtime.shm import Attachments, OwnedVector


class WorkerBase:
    """``wait_s``: how long a pull waits for the shards' parameters (the job's
    ``step_timeout_s``): a worker waiting on a hung shard gives up."""

    def __init__(self, threads: int, cpu_limit: float | None, wait_s: float = DEFAULT_STEP_TIMEOUT_S) -> None:
        torch.set_num_threads(max(1, threads))
        self.wait_s = wait_s
        self.cpu_limit = CpuLimit(cpu_limit)
        self._grad_shm: OwnedVector | None = None
        self._attached = Attachments()
        # the next step's samples, read in the background while this step computes
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self._next: tuple[np.ndarray, Future] | None = None

    def ping(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """Unlink this worker's shared memory (before the actor is killed)."""
        if self._grad_shm is not None:
            self._grad_shm.close()
            self._grad_shm = None
        self._reader.shutdown(wait=False, cancel_futures=True)

    def _samples(
        self, indices: np.ndarray, prefetch: np.ndarray | None, fetch: Callable[[np.ndarray], Any] | None
    ) -> tuple[Future | None, bool]:
        """The samples ``indices`` being read (None without a reader), whether they
        were read ahead; and ``prefetch`` starts being read for the next step."""
        prefetched = self._next is not None and np.array_equal(self._next[0], indices)
        batch = self._next[1] if prefetched and self._next else None
        if batch is None and fetch is not None:
            batch = self._reader.submit(fetch, indices)
        self._next = None
        if prefetch is not None and len(prefetch) and fetch is not None:
            self._next = (np.asarray(prefetch), self._reader.submit(fetch, prefetch))
        return batch, prefetched

    def _pull(self, param_refs: list[ray.ObjectRef]) -> list[np.ndarray]:
        """Every shard's parameters (same-node ones read in place)."""
        shards = [task_name("ps", j) for j in range(len(param_refs))]
        parts = get_within(param_refs, self.wait_s, "the shards' parameters", shards)
        return [self._attached.resolve(p) for p in parts]

    def _handoff(self, g: np.ndarray, bounds: list[tuple[int, int]], same_node: list[bool] | None) -> list[Any]:
        """The gradient ``g`` as one slice per shard: for shards marked ``same_node``,
        a :class:`ShmRef` into this worker's shared buffer instead of a copy."""
        local = same_node if (same_node is not None and self._grad_shm is not None) else [False] * len(bounds)
        return [
            self._grad_shm.ref(lo, hi) if here and self._grad_shm else g[lo:hi]
            for (lo, hi), here in zip(bounds, local, strict=True)
        ]

    @staticmethod
    def _transfer_stats(parts: list[np.ndarray], slices: list[Any], prefetched: bool) -> dict[str, Any]:
        return {
            "prefetched": prefetched,
            "pull_bytes": [int(p.nbytes) for p in parts],  # same-node bytes are read in place
            "push_bytes": [int(s.nbytes) for s in slices],
            "sent_at": time.time(),
        }
