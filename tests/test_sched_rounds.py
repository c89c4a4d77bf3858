"""elasticps.sched.rounds: a round on a job's arrival or end only starts waiting jobs."""

from __future__ import annotations

import pytest

from elasticps.sched import make_policy
from elasticps.sched.rounds import admission_only
from tests.builders import make_cluster, make_job


def _jobs(running: tuple[int, int]):
    return [
        make_job("run", current=running, max_ps=4, max_workers=8, arrival=0.0, probes=((2, 4),), remaining_samples=1e9),
        make_job("new", max_ps=4, max_workers=8, arrival=10.0, remaining_samples=1e9),
    ]


@pytest.mark.parametrize("name", ["elastic", "greedy", "optimus"])
def test_running_jobs_keep_their_shapes_and_a_waiting_one_starts_in_the_free_room(name):
    policy = make_policy(name)
    jobs, cluster = _jobs((1, 1)), make_cluster(n=2, cpu=8.0)
    full, _ = policy.decide(jobs, cluster)
    assert full["run"] != (1, 1)  # a full round grows the running job into the empty cluster
    held, _ = policy.decide(admission_only(jobs), cluster)
    assert held["run"] == (1, 1) and "new" in held  # this one holds it, and starts the new job


def test_a_full_cluster_leaves_the_waiting_job_waiting_instead_of_shrinking_the_running_one():
    policy = make_policy("elastic")
    jobs, cluster = _jobs((4, 8)), make_cluster(n=1, cpu=12.0)  # the running job holds all 12 CPUs
    full, _ = policy.decide(jobs, cluster)
    assert "new" in full and full["run"] != (4, 8)  # a full round shrinks the running job to start the new one
    held, _ = policy.decide(admission_only(jobs), cluster)
    assert held == {"run": (4, 8)}


def test_only_running_jobs_are_pinned_and_their_probes_dropped():
    jobs = _jobs((2, 3))
    run, new = admission_only(jobs)
    assert (run.min_ps, run.max_ps, run.min_workers, run.max_workers) == (2, 2, 3, 3)
    assert run.probes == () and run.explore is None
    assert new is jobs[1]
