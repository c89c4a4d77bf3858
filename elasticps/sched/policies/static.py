"""``static``: the counts in the job's spec, for its whole life."""

from __future__ import annotations

from elasticps.sched.policies.base import PolicyState, admit
from elasticps.sched.types import ClusterView, Decision, JobView


class StaticPolicy:
    name = "static"

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        def shape(job: JobView) -> tuple[int, int]:
            if job.current is not None:
                return job.current
            return job.static_shape or (job.min_ps, job.min_workers)

        decision, _ = admit(jobs, cluster.available, shape)
        return decision, state or PolicyState()
