"""The traffic model of a PS job as placed (one for the simulator and the live metrics).

Every step each worker pulls its slice of the parameters from every PS shard
and pushes a gradient of the same size back. For a job with S bytes of
parameters and P shards, a (worker, shard) pair moves 2*S/P bytes a step; it
crosses the network when the two sit on different nodes:

    cross_bytes_per_step = sum over pairs on different nodes of 2*S/P
                         = 2*S*W * (1 - sum_n (w_n/W) * (p_n/P))

so cross traffic is least when the job sits on few nodes and its shards are
spread in proportion to where its workers are.
"""

from __future__ import annotations

#: ``{task name ("ps-0", "worker-3"): node name}``
JobPlacement = dict[str, str]


def cross_node_bytes_per_step(placement: JobPlacement, param_bytes: float) -> float:
    ps = [n for t, n in placement.items() if t.startswith("ps-")]
    workers = [n for t, n in placement.items() if t.startswith("worker-")]
    if not ps:
        return 0.0
    per_pair = 2.0 * param_bytes / len(ps)
    return sum(per_pair for w in workers for p in ps if w != p)


def cross_share(placement: JobPlacement, param_bytes: float, w: int) -> float:
    """The share of a PS job's traffic that crosses nodes as placed (1 with no
    placement): what its speed depends on, and what its reports carry."""
    return cross_node_bytes_per_step(placement, param_bytes) / (2.0 * param_bytes * w) if placement else 1.0
