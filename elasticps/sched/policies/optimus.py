"""``optimus``: repeatedly give one more PS or worker to the job whose remaining
time drops the most per unit of its dominant resource (Optimus, EuroSys'18):

    gain = (R / u(p, w) - R / u(p', w')) / dominant share of the added task
"""

from __future__ import annotations

from elasticps.sched.objectives import Objective, utility
from elasticps.sched.policies.base import PolicyState, admit, grow, objective_of, task_share
from elasticps.sched.types import ClusterView, Decision, JobView


class OptimusPolicy:
    name = "optimus"

    def __init__(self, objective: str = "goodput") -> None:
        self.objective = Objective.parse(objective)

    def decide(
        self, jobs: list[JobView], cluster: ClusterView, state: PolicyState | None = None
    ) -> tuple[Decision, PolicyState]:
        total = cluster.capacity

        def score(job: JobView, old: tuple[int, int], new: tuple[int, int]) -> float | None:
            obj = objective_of(job, self.objective)
            u_old, u_new = utility(job, *old, obj), utility(job, *new, obj)
            if u_new <= u_old or u_new <= 0:
                return None
            t_old = job.remaining_samples / u_old if u_old > 0 else float("inf")
            saved = t_old - job.remaining_samples / u_new
            if saved == float("inf"):
                saved = 1e12
            return saved / task_share(job, old, new, total)

        decision, left = admit(jobs, cluster.available)
        decision, _ = grow(jobs, decision, left, score)
        return decision, state or PolicyState()
