"""``tiresias``: Tiresias's discretized two-dimensional least-attained-service
scheduler (Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep
Learning", NSDI'19), written from the paper as the non-elastic peer baseline.

- **Non-elastic**: a job runs at the shape it asked for (``static_shape``,
  else its minimum) or not at all; it is never resized.
- **2D attained service**: resources held x time run. Here a job's resources
  are its dominant share of an average node (a 2-GPU job on 4-GPU nodes holds
  0.5; a 16-CPU job on 32-CPU nodes 0.5), so service is in node-seconds.
  Time comes from the jobs' ages (``JobView.age_s``): between two rounds a job
  that ran attained its share x the seconds its age grew (no clock; where ages
  are unknown each round counts as ``round_s`` seconds).
- **Discretized queues**: a job is in queue k while its attained service is
  below ``thresholds_node_s[k]`` (the last queue has no limit); lower queues
  first, first come first served within a queue, jobs of a higher queue
  preempting those of lower ones. A job only moves down.
- **Starvation**: a job that has waited (since its arrival, or since it last
  ran) longer than ``promote_knob`` x the time it has run is promoted back to
  the first queue (its attained service counted from zero again).

Admission walks the queues in order and starts every job whose shape fits in
what is left (a job that does not fit does not block smaller ones behind it).
Placement is the project's (docs/placement.md); Tiresias's own skew-based
consolidation is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticps.errors import ConfigError
from elasticps.sched.policies.base import PolicyState
from elasticps.sched.types import ClusterView, Decision, JobView, Resources


@dataclass(frozen=True)
class TiresiasState(PolicyState):
    """Per job: attained service (node-seconds), seconds run, seconds waited
    since it last ran (or arrived), and its age at the last round."""

    service: dict[str, float] = field(default_factory=dict)
    ran_s: dict[str, float] = field(default_factory=dict)
    waited_s: dict[str, float] = field(default_factory=dict)
    age_s: dict[str, float] = field(default_factory=dict)


class TiresiasPolicy:
    name = "tiresias"

    def __init__(
        self, thresholds_node_s: tuple[float, ...] = (3600.0,), promote_knob: float = 8.0, round_s: float = 300.0
    ) -> None:
        if list(thresholds_node_s) != sorted(thresholds_node_s) or any(t <= 0 for t in thresholds_node_s):
            raise ConfigError(f"tiresias: thresholds must be positive and increasing, got {thresholds_node_s}")
        if not promote_knob > 0 or not round_s > 0:
            raise ConfigError(f"tiresias: promote_knob and round_s must be above 0, got {promote_knob}, {round_s}")
        self.thresholds = tuple(thresholds_node_s)
        self.promote_knob = promote_knob
        self.round_s = round_s

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        prev = state if isinstance(state, TiresiasState) else TiresiasState()
        node = cluster.capacity.scaled(1.0 / max(1, len(cluster.nodes)))
        service, ran, waited, ages = {}, {}, {}, {}
        for job in jobs:
            age = job.age_s if job.age_s is not None else prev.age_s.get(job.id, -self.round_s) + self.round_s
            dt = max(0.0, age - prev.age_s.get(job.id, age))
            s, r, w = prev.service.get(job.id, 0.0), prev.ran_s.get(job.id, 0.0), prev.waited_s.get(job.id, 0.0)
            if job.current is not None:  # it ran since the last round at the shape it holds
                s, r, w = s + job.resources(*job.current).dominant_share(node) * dt, r + dt, 0.0
            else:
                w += dt if job.id in prev.age_s else age
            if w > self.promote_knob * r and r > 0:  # starving: back to the first queue
                s, w = 0.0, 0.0
            service[job.id], ran[job.id], waited[job.id], ages[job.id] = s, r, w, age

        def priority(job: JobView) -> tuple:
            queue = sum(service[job.id] >= t for t in self.thresholds)
            return (queue, job.arrival, job.id)

        decision: Decision = {}
        left: Resources = cluster.available
        for job in sorted(jobs, key=priority):
            shape = job.current or job.static_shape or (job.min_ps, job.min_workers)
            if not job.allows(*shape):
                shape = (job.min_ps, job.min_workers)
            need = job.resources(*shape)
            if need.fits_in(left):
                decision[job.id] = shape
                left = left - need
        return decision, TiresiasState(service=service, ran_s=ran, waited_s=waited, age_s=ages)
