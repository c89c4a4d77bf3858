"""The lower bound: exact where it can be worked by hand, and never above a run."""

from __future__ import annotations

import pytest

from elasticps.sched.synthetic import kind_speed
from elasticps.sched.types import Resources
from elasticps.sim import SimConfig, simulate, synthetic_workload
from elasticps.sim.bound import _least_cross, lower_bound, srpt_completions
from elasticps.sim.workload import KINDS, WorkloadJob


def test_srpt_runs_the_shortest_remaining_job_first_from_its_arrival():
    # t=0: sizes 3 and 1 -> the 1 runs 0..1; t=1: the new 1 beats the 3's remaining 3 -> 1..2; the 3 runs 2..5
    assert srpt_completions([0.0, 0.0, 1.0], [3.0, 1.0, 1.0]) == [5.0, 1.0, 2.0]
    # an idle gap: the second job arrives after the first is done
    assert srpt_completions([0.0, 10.0], [2.0, 2.0]) == [2.0, 12.0]
    # preemption: a 1 arriving at t=1 into a 4 that has 3 left
    assert srpt_completions([0.0, 1.0], [4.0, 1.0]) == [5.0, 2.0]


@pytest.mark.parametrize(
    ("p", "w", "cross"),
    [
        (1, 3, 0.0),  # 2 + 3*2 = 8 CPUs: one node
        (1, 4, 0.25),  # 10 CPUs: 1 PS + 3 workers on one node, 1 worker away -> 3 of 4 pairs local
        (2, 4, 0.5),  # 12 CPUs: 2 PS + 2 workers together (4 pairs of 8), the other 2 workers alone
    ],
)
def test_the_least_cross_node_share_is_the_most_pairs_that_share_a_node(p, w, cross):
    ps = worker = Resources(cpu=2.0, memory_gb=1.0)
    node = Resources(cpu=8.0, memory_gb=64.0)
    assert _least_cross(KINDS["resnet-like"], ps, worker, node, p, w) == pytest.approx(cross)


def test_a_lone_job_bound_is_its_work_at_its_best_shape_and_the_oracle_meets_it_but_for_its_start():
    job = WorkloadJob(id="a", arrival_s=0, kind="mlp-small", samples=2e7, max_ps=2, max_workers=4, worker_cpu=2.0)
    node = Resources(cpu=32.0, memory_gb=256.0)
    bound = lower_bound([job], 2, node, 0.25)
    # every shape fits on one node: nothing crosses, the traffic costs a quarter
    best = max(kind_speed(KINDS["mlp-small"], p, w, 0.0, 0.25) for p in (1, 2) for w in range(1, 5))
    assert bound.per_job_s[0] == pytest.approx(2e7 / best)
    assert bound.binding == "per_job"
    run = simulate([job], SimConfig(nodes=2, policy="oracle", tenant_max_share=0))
    # the oracle runs it at its best shape from the first decision, after the 30 s start pause
    assert run.metrics["avg_jct_s"] == pytest.approx(bound.avg_jct_s + 30.0, rel=0.01)
    assert run.metrics["gap_to_bound"] > 0 and run.metrics["lower_bound_s"] == bound.avg_jct_s


def test_many_jobs_at_once_on_a_small_cluster_are_bound_by_its_capacity():
    jobs = [WorkloadJob(id=f"j{i}", arrival_s=0, kind="resnet-like", samples=5e6) for i in range(40)]
    bound = lower_bound(jobs, 1, Resources(cpu=32.0, memory_gb=256.0), 0.25)
    assert bound.binding == "fluid_cpu" and bound.fluid_avg_jct_s > 2 * bound.per_job_avg_jct_s
    # 40 equal jobs on one machine, SRPT: the k-th finishes at k x size, so the mean is 20.5 x size
    size = bound.makespan_s / 40
    assert bound.fluid_avg_jct_s == pytest.approx(20.5 * size)


def test_no_policy_beats_the_bound():
    work = synthetic_workload(40, seed=3, gpu_share=0.3, adaptive_share=0.5)
    for policy in ("static", "elastic", "oracle"):
        run = simulate(work, SimConfig(nodes=6, node_gpu=4, policy=policy, seed=3, job_speed_spread=0.2))
        assert run.metrics["gap_to_bound"] > 0, policy
        assert run.metrics["makespan_s"] >= run.metrics["lower_bound"]["makespan_s"]
