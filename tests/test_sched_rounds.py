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


def test_an_admission_round_keeps_the_shrink_count_and_takes_what_accounts_time():
    from elasticps.sched.policies.base import PolicyState
    from elasticps.sched.policies.tiresias import TiresiasState
    from elasticps.sched.rounds import state_after

    before, pinned = PolicyState(shrink_wishes={"run": 2}), PolicyState(shrink_wishes={})
    assert state_after(before, pinned, full=False).shrink_wishes == {"run": 2}  # pinned jobs wish nothing
    assert state_after(before, pinned, full=True).shrink_wishes == {}
    ran = TiresiasState(service={"new": 0.0, "run": 3.0}, ran_s={"run": 300.0}, age_s={"new": 0.0, "run": 600.0})
    kept = state_after(TiresiasState(service={"run": 1.0}), ran, full=False)
    assert isinstance(kept, TiresiasState) and kept.age_s == ran.age_s and kept.service == ran.service


def test_an_elastic_shrink_is_not_reset_by_admission_rounds_between_full_ones():
    """The fair share wants "big" smaller (shrink_rounds=3: three full rounds of wishing); admission rounds
    between them neither shrink it nor reset the count (pinned, it wishes nothing)."""
    from elasticps.sched.rounds import state_after

    policy = make_policy("elastic")
    cluster = make_cluster(n=1, cpu=14.0)
    jobs = [
        make_job("big", current=(4, 8), max_ps=4, max_workers=8, arrival=0.0, remaining_samples=1e9),
        make_job("small", current=(1, 1), max_ps=4, max_workers=8, arrival=5.0, remaining_samples=1e9),
    ]
    state, decisions = None, []
    for full in (True, False, True, False, True):
        decision, new = policy.decide(jobs if full else admission_only(jobs), cluster, state)
        state = state_after(state, new, full)
        decisions.append(decision["big"])
    assert decisions[:4] == [(4, 8)] * 4 and decisions[4] != (4, 8), decisions  # the third full round shrinks it
