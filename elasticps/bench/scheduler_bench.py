"""``elasticps bench scheduler``: how long a policy takes to decide, at scale.

Jobs are drawn from :data:`elasticps.sched.synthetic.MODEL_KINDS` (half of them
running); nodes have 32 CPUs and 256 GB, some partly used by other tenants.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from elasticps.sched import PolicyState, make_policy
from elasticps.sched.synthetic import synthetic_cluster, synthetic_jobs


def run(
    jobs: int, nodes: int, rounds: int = 11, policy: str = "elastic", seed: int = 0, **options: Any
) -> dict[str, Any]:
    """Time ``rounds`` decisions of ``policy`` made with ``options`` (its own, e.g. ``joint_trades``)."""
    job_views = synthetic_jobs(jobs, seed=seed)
    cluster = synthetic_cluster(nodes, seed=seed)
    pol = make_policy(policy, **options)
    state = PolicyState()
    times, cpu_times = [], []
    decision: dict = {}
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        decision, state = pol.decide(job_views, cluster, state)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return {
        "policy": policy,
        **({"options": options} if options else {}),
        "jobs": jobs,
        "nodes": nodes,
        "rounds": rounds,
        "median_ms": statistics.median(times) * 1e3,
        "p99_ms": p99 * 1e3,
        # CPU time of this process: on a machine others load, closer to what the decision costs than wall time
        "median_cpu_ms": statistics.median(cpu_times) * 1e3,
        "jobs_running": len(decision),
        "tasks_allocated": sum(p + w for p, w in decision.values()),
    }


def scaling(policy: str = "elastic", **options: Any) -> list[dict[str, Any]]:
    """Decision time as jobs and nodes grow (for the docs)."""
    out = []
    for jobs, nodes in [(100, 32), (300, 64), (1000, 64), (1000, 256), (3000, 256), (1000, 1024)]:
        out.append(run(jobs, nodes, rounds=5, policy=policy, **options))
    return out
