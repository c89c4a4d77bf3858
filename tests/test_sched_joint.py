"""The joint search after greedy growth (elasticps/sched/joint.py) and the elastic policy's use of it."""

from __future__ import annotations

import math
import random

import pytest

from elasticps import ConfigError
from elasticps.bench import scheduler_bench
from elasticps.sched import JobView, PolicyState, Resources, make_policy
from elasticps.sched.joint import trade
from elasticps.sched.rounds import admission_only
from elasticps.sim import SimConfig, simulate, synthetic_workload
from tests.builders import make_cluster, make_job, optimus_speed


def _capped(exponent: float, at: int = 2):
    """Speed w^exponent up to ``at`` workers, flat beyond."""
    return lambda p, w: min(w, at) ** exponent


def _ring(cost: float):
    """A job with no PS whose workers exchange gradients: each adds less."""
    return lambda p, w: w / (1.0 + cost * (w - 1))


def knapsack_jobs(current_b: tuple[int, int] | None = None) -> list[JobView]:
    """Greedy by gain per share is beaten here. On 5 CPUs, a (1-CPU workers,
    speed x1.2 from a second worker) and b (2-CPU workers, x1.35) start at one
    worker each, 2 CPUs left. Greedy: a's step gains log 1.2 = 0.18 on 1 CPU
    (0.18 a CPU), b's log 1.35 = 0.30 on 2 (0.15 a CPU): a grows, and the 1 CPU
    left holds no worker of b. Trading a's worker to b: 0.30 - 0.18 = +0.12."""
    a = make_job("a", _capped(0.263), min_ps=0, max_ps=0, max_workers=4, worker_resources=Resources(cpu=1.0))
    b = make_job(
        "b", _capped(0.433), min_ps=0, max_ps=0, max_workers=4, worker_resources=Resources(cpu=2.0), current=current_b
    )
    return [a, b]


def log_utility(jobs: list[JobView], decision: dict) -> float:
    return sum(math.log(j.speed(*decision[j.id])) for j in jobs if j.id in decision)


def test_trades_where_greedy_growth_is_beaten():
    jobs, cluster = knapsack_jobs(), make_cluster(1, cpu=5.0)
    greedy, _ = make_policy("elastic").decide(jobs, cluster)
    joint, _ = make_policy("elastic", joint_trades=4).decide(jobs, cluster)
    assert greedy == {"a": (0, 2), "b": (0, 1)}  # the case is one greedy loses
    assert joint == {"a": (0, 1), "b": (0, 2)}
    # sum of log speed: greedy log 1.2 = 0.182, joint log 1.35 = 0.300
    assert log_utility(jobs, joint) - log_utility(jobs, greedy) == pytest.approx(math.log(1.35 / 1.2), rel=1e-2)


def test_no_trade_for_a_running_job_whose_move_does_not_pay():
    # b runs at one worker and has almost no work left: the move saves less than its rescale costs
    a, b = knapsack_jobs(current_b=(0, 1))
    b = JobView(**{**b.__dict__, "remaining_samples": 1.0})
    decision, _ = make_policy("elastic", joint_trades=4).decide([a, b], make_cluster(1, cpu=5.0))
    assert decision["b"] == (0, 1)
    # with a lot of work left it pays: the trade is made
    b = JobView(**{**b.__dict__, "remaining_samples": 1e6})
    decision, _ = make_policy("elastic", joint_trades=4).decide([a, b], make_cluster(1, cpu=5.0))
    assert decision == {"a": (0, 1), "b": (0, 2)}


def test_no_trade_moves_a_pinned_job_in_an_admission_round():
    # b runs at one worker (a full round would trade a's second worker to it: test above);
    # a arrives between ticks: only a may start, b keeps its shape
    a, b = knapsack_jobs(current_b=(0, 1))
    b = JobView(**{**b.__dict__, "remaining_samples": 1e6})
    policy = make_policy("elastic", joint_trades=4)
    decision, _ = policy.decide(admission_only([a, b]), make_cluster(1, cpu=5.0))
    assert decision["b"] == (0, 1)
    assert decision["a"] == (0, 2)


def test_a_running_job_gives_no_task_below_its_shape_without_the_hysteresis():
    # a runs at 2 workers and wishes nothing smaller: its worker is not b's, whatever b would gain
    a, b = knapsack_jobs()
    a = JobView(**{**a.__dict__, "current": (0, 2)})
    decision, state = make_policy("elastic", joint_trades=4).decide([a, b], make_cluster(1, cpu=5.0))
    assert decision == {"a": (0, 2), "b": (0, 1)}
    assert state == PolicyState()


def test_joint_trades_is_a_count():
    with pytest.raises(ConfigError, match="joint trades"):
        make_policy("elastic", joint_trades=-1)


def random_round(seed: int) -> tuple[list[JobView], object]:
    """Jobs of several task sizes and speed surfaces, some running, on a small busy cluster."""
    rng = random.Random(seed)
    jobs = []
    for i in range(rng.randint(3, 14)):
        min_ps, min_w = rng.randint(0, 2), rng.randint(1, 2)
        max_ps = min_ps + rng.randint(0, 4) if min_ps else 0
        max_w = min_w + rng.randint(0, 8)
        current = None
        if rng.random() < 0.5:
            current = (rng.randint(min_ps, max_ps), rng.randint(min_w, max_w))
        t = tuple(x * rng.uniform(0.3, 3.0) for x in (0.002, 0.01, 0.03, 0.001, 0.002))
        speed = optimus_speed(batch=rng.choice([64, 256]), t=t) if max_ps else _ring(rng.uniform(0.01, 0.2))
        jobs.append(
            make_job(
                f"j{i:02d}",
                speed,
                min_ps=min_ps, max_ps=max_ps, min_workers=min_w, max_workers=max_w,
                ps_resources=Resources(cpu=rng.choice([1.0, 2.0]), memory_gb=rng.choice([2.0, 8.0])),
                worker_resources=Resources(cpu=rng.choice([1.0, 2.0, 3.0]), memory_gb=4.0),
                remaining_samples=rng.uniform(1e3, 1e7),
                current=current,
                arrival=float(i),
            )
        )  # fmt: skip
    return jobs, make_cluster(rng.randint(1, 4), cpu=8.0, others_cpu=rng.choice([0.0, 2.0]))


@pytest.mark.parametrize("seed", range(40))
def test_trades_keep_limits_capacity_floors_and_raise_the_sum(seed):
    jobs, cluster = random_round(seed)
    rng = random.Random(seed)
    decision, left = {}, cluster.available
    for job in jobs:  # some feasible allocation, to trade from
        shape = (rng.randint(job.min_ps, job.max_ps), rng.randint(job.min_workers, job.max_workers))
        if job.resources(*shape).fits_in(left):
            decision[job.id] = shape
            left = left - job.resources(*shape)
    by_id = {j.id: j for j in jobs}
    floor = {i: (by_id[i].min_ps, by_id[i].min_workers) for i in decision}
    floor[next(iter(decision))] = decision[next(iter(decision))]  # one job may give nothing
    cap = {i: (by_id[i].max_ps, by_id[i].max_workers) for i in decision}

    def gain(job, old, new):
        return math.log(job.speed(*new) / job.speed(*old))

    def anything(job, old, new):
        return True

    new, new_left, out = trade(jobs, decision, left, cluster.capacity, gain, floor, cap, anything, anything, (1, 2))
    assert set(new) == set(decision)
    for job_id, (p, w) in new.items():
        assert by_id[job_id].allows(p, w)
        assert floor[job_id][0] <= p and floor[job_id][1] <= w
    used = sum((by_id[i].resources(*s) for i, s in new.items()), Resources())
    assert used.fits_in(cluster.available)
    assert (used + new_left).cpu == pytest.approx(cluster.available.cpu)
    assert log_utility(jobs, new) >= log_utility(jobs, decision) + 0.01 * out.trades - 1e-9
    again = trade(jobs, decision, left, cluster.capacity, gain, floor, cap, anything, anything, (1, 2))
    assert again[0] == new  # deterministic


@pytest.mark.parametrize("seed", range(40))
def test_the_policy_with_trades_keeps_its_rules(seed):
    jobs, cluster = random_round(seed)
    policy = make_policy("elastic", joint_trades=16)
    decision, _ = policy.decide(jobs, cluster)
    by_id = {j.id: j for j in jobs}
    used = sum((by_id[i].resources(*s) for i, s in decision.items()), Resources())
    assert used.fits_in(cluster.available)
    for job_id, shape in decision.items():
        assert by_id[job_id].allows(*shape)
    # a running job is never dropped, and shrinks only as the greedy shrinks it (not in the first round)
    greedy, _ = make_policy("elastic").decide(jobs, cluster)
    for job in jobs:
        if job.current is not None and job.id in greedy:
            assert job.id in decision
            assert decision[job.id][0] >= min(job.current[0], greedy[job.id][0])
            assert decision[job.id][1] >= min(job.current[1], greedy[job.id][1])
    # an admission round moves no running job
    pinned, _ = policy.decide(admission_only(jobs), cluster)
    for job in jobs:
        if job.current is not None and job.id in pinned:
            assert pinned[job.id] == job.current
    # deterministic, whatever the order jobs come in
    shuffled = list(jobs)
    random.Random(seed).shuffle(shuffled)
    assert policy.decide(shuffled, cluster)[0] == decision


def test_the_simulator_and_the_bench_pass_the_search_on():
    # a small contended run with trades: every job ends, and the config carries the count
    work = synthetic_workload(60, seed=3)
    on = simulate(work, SimConfig(nodes=4, seed=3, joint_trades=8))
    off = simulate(work, SimConfig(nodes=4, seed=3))
    assert on.metrics["jobs"] == off.metrics["jobs"] == 60
    assert on.to_dict()["config"]["joint_trades"] == 8
    timed = scheduler_bench.run(60, 4, rounds=1, joint_trades=8)
    assert timed["options"] == {"joint_trades": 8} and timed["jobs_running"] > 0
    with pytest.raises(ConfigError, match="no option 'joint_trades'"):
        scheduler_bench.run(10, 2, rounds=1, policy="greedy", joint_trades=8)
