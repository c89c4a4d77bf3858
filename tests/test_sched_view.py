"""The one rule, shared by the manager and the simulator, for what a policy may choose for a job."""

from __future__ import annotations

from elasticps.sched import Observation, SpeedModel
from elasticps.sched.view import ShapeLimits, plan_view

LIMITS = ShapeLimits(1, 4, 1, 8)


def _speed(p: int, w: int) -> float:
    return 64 / (0.01 * 64 / w + 0.02 + 0.005 * w / p + 0.001 * w)


def _model(*shapes: tuple[int, int]) -> SpeedModel:
    return SpeedModel(64).fit([Observation(p, w, _speed(p, w)) for p, w in shapes])


def test_a_new_job_starts_at_the_asked_shape_or_its_minimum():
    plan = plan_view(SpeedModel(64), LIMITS, None, start=(2, 4))
    assert plan.limits == ShapeLimits(2, 2, 4, 4) and plan.explore is None
    assert plan_view(SpeedModel(64), LIMITS, None, start=(9, 0)).limits == ShapeLimits(4, 4, 1, 1)  # clipped
    assert plan_view(SpeedModel(64), LIMITS, None).limits == ShapeLimits(1, 1, 1, 1)


def test_one_shape_seen_probes_and_a_confident_model_frees_the_range():
    plan = plan_view(_model((1, 2)), LIMITS, (1, 2))
    assert plan.explore is not None and plan.explore != (1, 2) and plan.explore == plan.probes[0]
    assert plan.limits.max_ps == max(1, *(s[0] for s in plan.probes))
    assert plan.limits.max_workers == max(2, *(s[1] for s in plan.probes))
    confident = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)])
    plan = plan_view(confident, LIMITS, (2, 4))
    assert plan.limits == LIMITS and plan.explore is None and plan.speed(2, 4) > 0


def test_a_confident_fleet_prior_lets_a_new_job_go_straight_to_its_best_shape():
    prior = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)])
    plan = plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior)
    assert plan.limits == LIMITS and plan.speed(2, 8) == prior.predict(2, 8)
    unsure = _model((1, 2))
    assert plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=unsure).limits == ShapeLimits(1, 1, 1, 1)


def test_a_fleet_prior_of_a_kind_with_no_ps_counts_once_its_worker_counts_vary():
    def ring(p: int, w: int) -> float:  # all-reduce: no PS, the ring within one node
        return 256 / (0.002 * 256 / w + 0.01 + 2 * (w - 1) / w * 0.012)

    pooled = SpeedModel(256).fit([Observation(0, w, ring(0, w)) for w in range(1, 6)])
    assert pooled.identified  # p never varies for such a kind: it cannot be asked to
    assert not SpeedModel(256).fit([Observation(0, w, ring(0, w)) for w in range(1, 5)]).identified
    assert not _model(*[(1, w) for w in range(1, 9)]).identified  # a PS kind must still vary its PS
    limits = ShapeLimits(0, 0, 1, 16)
    plan = plan_view(SpeedModel(256), limits, None, start=(0, 2), prior=pooled)
    assert plan.limits == limits and plan.speed(0, 4) == pooled.predict(0, 4)


def test_a_jobs_own_mean_is_weighed_against_the_fleet_prior_by_how_many_observations_it_has():
    prior = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)])
    truth = prior.predict(2, 4)

    def plan_after(n: int):
        own = SpeedModel(64).fit([Observation(2, 4, 1.2 * truth)] * n)  # 20% faster than the prior says
        return plan_view(own, LIMITS, (2, 4), prior=prior)

    one, ten = plan_after(1).speed(2, 4), plan_after(10).speed(2, 4)
    assert truth < one < ten < 1.2 * truth  # between the two; more observations, nearer the job's own
    assert plan_after(1).speed(3, 6) == prior.predict(3, 6)  # where the job has no mean: the prior
