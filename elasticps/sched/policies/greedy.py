"""``greedy``: the classic configuration manager. Whenever resources are free,
running jobs get one more task each in turn (alternately a worker and a PS),
without asking whether it helps."""

from __future__ import annotations

from elasticps.sched.policies.base import PolicyState, admission_order, admit
from elasticps.sched.types import ClusterView, Decision, JobView


class GreedyPolicy:
    name = "greedy"

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        decision, left = admit(jobs, cluster.available)
        order = [j for j in admission_order(jobs) if j.id in decision]
        progress = True
        while progress:
            progress = False
            for job in order:
                p, w = decision[job.id]
                options = [(p, w + 1), (p + 1, w)] if w <= p or job.max_ps == 0 else [(p + 1, w), (p, w + 1)]
                for np_, nw in options:
                    if np_ > job.max_ps or nw > job.max_workers:
                        continue
                    need = job.resources(np_ - p, nw - w)
                    if need.fits_in(left):
                        decision[job.id] = (np_, nw)
                        left = left - need
                        progress = True
                        break
        return decision, state or PolicyState()
