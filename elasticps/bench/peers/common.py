"""What every system's run returns, and the timing rules they share."""

from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, field
from typing import Any

#: Each Ray node's object store. ``ray.cluster_utils.Cluster`` gives a node 150 MiB, less than one
#: step's gradients of the 10M-parameter model at W = 4 (4 x 40 MB): the plain PS, and elasticps
#: between nodes, then spill to disk every step and fall to ~100 samples/s. A Ray node started
#: by hand gets 30% of the machine's memory; 2 GiB a node is what these runs need.
NODE_OBJECT_STORE_BYTES = 2 * 1024**3


def add_node(cluster: Any, **args: Any) -> Any:
    """``cluster.add_node(**args)`` with this benchmark's object store size."""
    return cluster.add_node(object_store_memory=NODE_OBJECT_STORE_BYTES, **args)


@dataclass
class RunResult:
    """One timed run of one system.

    ``losses``: the global batch's mean loss at every step trained (warm-up
    included), so a run that did not train shows it. ``comm_share``: the part
    of a step's wall time spent neither in the forward/backward pass nor in
    the optimizer update (communication, and waiting on it), or None.
    ``worker_peak_mib`` / ``ps_peak_mib``: the largest high-water mark of
    resident memory among its worker (DDP rank) / PS processes, or None.
    """

    system: str
    samples_per_s: float
    comm_share: float | None
    losses: list[float]
    detail: dict[str, Any] = field(default_factory=dict)
    worker_peak_mib: float | None = None
    ps_peak_mib: float | None = None

    @property
    def trained(self) -> bool:
        """The loss of the last steps is below that of the first ones."""
        k = max(1, len(self.losses) // 4)
        return len(self.losses) >= 2 and statistics.fmean(self.losses[-k:]) < statistics.fmean(self.losses[:k])


def most(values: list[float | None]) -> float | None:
    """The largest of ``values`` that are known, or None."""
    known = [v for v in values if v is not None]
    return max(known) if known else None


def comm_share(step_s: float, compute_s: float) -> float:
    """``1 - compute / step``, clipped to [0, 1]."""
    if step_s <= 0:
        return float("nan")
    return min(1.0, max(0.0, 1.0 - compute_s / step_s))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
