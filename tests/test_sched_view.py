"""The one rule, shared by the manager and the simulator, for what a policy may choose for a job."""

from __future__ import annotations

import math

import pytest

from elasticps.sched import Observation, SpeedModel
from elasticps.sched.pooling import MIN_MISFIT, PRIOR_TOTAL
from elasticps.sched.speed import fleet_prior
from elasticps.sched.view import ShapeLimits, plan_view

LIMITS = ShapeLimits(1, 4, 1, 8)


def _speed(p: int, w: int) -> float:
    return 64 / (0.01 * 64 / w + 0.02 + 0.005 * w / p + 0.001 * w)


def _model(*shapes: tuple[int, int]) -> SpeedModel:
    return SpeedModel(64).fit([Observation(p, w, _speed(p, w)) for p, w in shapes])


def _reports(speed, shapes, noise: float, n: int) -> list[Observation]:
    """``n`` reports of each shape, their step times alternately ``noise`` above and
    below what ``speed`` says (the mean step time exact)."""
    return [Observation(p, w, speed(p, w) / (1 + noise * (-1) ** i)) for p, w in shapes for i in range(n)]


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
    confident = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)] * 2)  # its best seen twice
    plan = plan_view(confident, LIMITS, (2, 4))
    assert plan.limits == LIMITS and plan.explore is None and plan.speed(2, 4) > 0


def test_the_best_mean_seen_of_one_pass_is_measured_again_before_it_is_trusted():
    everything = [(p, w) for p in range(1, 5) for w in range(1, 9)]
    obs = [Observation(p, w, _speed(p, w)) for p, w in everything for _ in range(2)]
    lucky = Observation(1, 2, 1.5 * max(o.samples_per_s for o in obs))  # one pass, faster than all
    best = max(everything, key=lambda s: _speed(*s))
    once = SpeedModel(64).fit([*(o for o in obs if (o.num_ps, o.num_workers) != (1, 2)), lucky])
    plan = plan_view(once, LIMITS, best)
    assert plan.probes == ((1, 2),) and plan.explore == (1, 2) and plan.measured == tuple(sorted(everything))
    assert plan.limits == LIMITS and plan.speed(1, 2) == lucky.samples_per_s
    # the same with a fleet prior: the job's own confident model still judges, and still looks again
    prior = _model(*everything)
    assert prior.identified
    with_prior = plan_view(once, LIMITS, best, prior=prior)
    assert with_prior.probes == ((1, 2),) and with_prior.speed(1, 2) == lucky.samples_per_s
    # where the job already is, it is measured there anyway: no probe
    assert plan_view(once, LIMITS, (1, 2)).probes == ()
    # seen more than once, its mean stands (and is trusted)
    plan = plan_view(SpeedModel(64).fit([*obs, lucky]), LIMITS, best)
    assert plan.probes == () and plan.limits == LIMITS
    # one more look settles it, wherever it ran: on other nodes, or at another batch
    for again in (Observation(1, 2, _speed(1, 2), nodes=2), Observation(1, 2, _speed(1, 2), batch=128)):
        looked = SpeedModel(64).fit([*(o for o in obs if (o.num_ps, o.num_workers) != (1, 2)), lucky, again])
        assert looked.unconfirmed_best(*LIMITS.astuple()) is None and plan_view(looked, LIMITS, best).probes == ()


def test_a_confident_fleet_prior_lets_a_new_job_go_straight_to_its_best_shape():
    prior = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)])
    plan = plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior)
    assert plan.limits == LIMITS and plan.speed(2, 8) == pytest.approx(prior.form(2, 8), rel=1e-5)
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
    assert plan.limits == limits and plan.speed(0, 4) == pytest.approx(pooled.form(0, 4), rel=1e-5)


def test_a_job_is_judged_by_its_kinds_curve_at_its_own_level():
    prior = _model(*[(p, w) for p in range(1, 5) for w in range(1, 9)])

    def plan_after(runs: list[tuple[tuple[int, int], float, int]]):
        """The job ran each shape n times at factor x what the prior says."""
        obs = [Observation(*shape, f * prior.form(*shape)) for shape, f, n in runs for _ in range(n)]
        return plan_view(SpeedModel(64).fit(obs), LIMITS, runs[-1][0], prior=prior)

    one = plan_after([((2, 4), 1.2, 1)])  # 20% faster than its kind where it ran
    assert one.speed(3, 6) == pytest.approx(1.2 * prior.form(3, 6), rel=1e-5)  # and so everywhere
    assert one.speed(2, 4) == pytest.approx(1.2 * prior.form(2, 4), rel=1e-5)
    # at its kind's speed on one shape, 20% faster on another: its level between the two (geometric mean) ...
    few, many = (plan_after([((1, 2), 1.0, n), ((2, 4), 1.2, n)]) for n in (1, 10))
    level = math.sqrt(1.2)
    assert few.speed(3, 6) == pytest.approx(level * prior.form(3, 6), rel=1e-5)
    # ... and where it ran, between its own mean and that level: nearer its own with more observations
    assert level * prior.form(2, 4) < few.speed(2, 4) < many.speed(2, 4) < 1.2 * prior.form(2, 4)


def test_a_view_says_how_sure_each_speed_is():
    shapes = [(p, w) for p in range(1, 5) for w in range(1, 9)]
    prior = fleet_prior(64, [Observation(p, w, _speed(p, w)) for p, w in shapes for _ in range(20)])
    own = SpeedModel(64).fit([Observation(2, 4, _speed(2, 4))])
    plan = plan_view(own, LIMITS, (2, 4), prior=prior)
    assert plan.sd is not None
    # its own one report and the kind's curve, weighed: surer than either alone
    assert plan.sd(2, 4) < min(own.noise, prior.spread(2, 4))
    # not run: the kind's curve, its mean of 20 reports and its form together (surer than either alone)
    assert plan.sd(3, 6) == pytest.approx(prior.pooled_sd(3, 6))
    assert prior.replicate_noise is not None and plan.sd(3, 6) < min(prior.replicate_noise / math.sqrt(20), MIN_MISFIT)
    confident = _model(*shapes)
    assert plan_view(confident, LIMITS, (2, 4)).sd(2, 4) == pytest.approx(confident.estimate_sd(2, 4))


def test_a_fleet_prior_counts_every_report_and_judges_by_its_form():
    # one job's model keeps to its latest reports of a shape; a fleet prior pools
    # many jobs' reports, so every one of them counts
    reports = [Observation(2, 4, 100.0)] * 20 + [Observation(2, 4, 120.0)] * 10 + [Observation(1, 2, 60.0)] * 5
    assert SpeedModel(64).fit(reports).observed(2, 4) == pytest.approx(120.0)
    assert fleet_prior(64, reports).observed(2, 4) == pytest.approx(3200 / 30)
    newest = [Observation(2, 4, 90.0)] * PRIOR_TOTAL  # ... of the newest PRIOR_TOTAL
    assert fleet_prior(64, reports + newest).observed(2, 4) == pytest.approx(90.0)

    # a bump in the pooled reports at one shape (few reports, off by their noise)
    # does not make that shape look better than its kind's curve says
    shapes = [(p, w) for p in range(1, 5) for w in range(1, 9) if (p, w) != (2, 5)]
    pooled = _reports(_speed, shapes, 0.14, 20) + [Observation(2, 5, 1.1 * _speed(2, 5))] * 2
    prior = fleet_prior(64, pooled)
    assert prior.predict(2, 5) > 1.05 * _speed(2, 5)  # its mean of the reports there
    assert prior.form(2, 5) == pytest.approx(_speed(2, 5), rel=0.01)  # the form, fitted on them all
    plan = plan_view(SpeedModel(64).fit([Observation(2, 4, _speed(2, 4))]), LIMITS, (2, 4), prior=prior)
    assert 0.99 * _speed(2, 5) < plan.speed(2, 5) < 1.02 * _speed(2, 5)  # the bump was 10%


def test_a_far_unmeasured_shape_counts_no_faster_than_the_fastest_measured():
    # a kind measured only on small shapes: its form, extrapolated, calls 4 x 8 far faster
    prior = fleet_prior(64, [Observation(p, w, _speed(p, w)) for p in (1, 2) for w in (1, 2, 3) for _ in range(5)])
    assert prior.identified and prior.form(4, 8) > 1.3 * max(_speed(p, w) for p in (1, 2) for w in (1, 2, 3))
    plan = plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior)
    fastest = max(plan.speed(p, w) for p in (1, 2) for w in (1, 2, 3))
    assert plan.speed(4, 8) == pytest.approx(fastest)  # capped
    assert plan.speed(3, 4) > fastest  # near a measured shape: the form's word stands
    # a job's own model, the same way
    own = _model((1, 1), (1, 2), (2, 1), (2, 2))
    plan = plan_view(own, LIMITS, (2, 2))
    assert plan.speed(4, 8) <= own.best_seen < own.predict(4, 8)


def test_a_fleet_prior_knows_its_report_noise_from_repeated_shapes():
    shapes = [(p, w) for p in range(1, 5) for w in range(1, 9)]
    prior = fleet_prior(64, _reports(_speed, shapes, 0.14, 10))
    # each report 14% off its shape's mean: the replicate noise is that, whatever the form
    assert prior.replicate_noise == pytest.approx(0.14 * math.sqrt(10 / 9), rel=0.05)
    assert SpeedModel(64).fit([Observation(2, 4, 100.0)]).replicate_noise is None  # nothing repeated


def test_the_pooled_curve_where_nothing_is_known_is_no_speed_with_no_certainty():
    prior = fleet_prior(64, _reports(_speed, [(p, w) for p in range(1, 5) for w in range(1, 9)], 0.14, 2))
    for model, (p, w) in ((prior, (2, 0)), (SpeedModel(64), (2, 4))):  # no workers; nothing fitted
        assert model.form(p, w) == 0.0
        assert model.pooled(p, w) == 0.0 and model.pooled_sd(p, w) == math.inf


def test_a_kind_whose_means_the_form_misses_is_judged_by_its_means():
    shapes = [(p, w) for p in range(1, 5) for w in range(1, 9)]

    def bumpy(p: int, w: int) -> float:  # not the form: every other shape 25% slower
        return _speed(p, w) * (0.75 if (p + w) % 2 else 1.0)

    missed = fleet_prior(64, _reports(bumpy, shapes, 0.14, 10))
    assert missed.noise > 1.3 * missed.replicate_noise  # the form misses by more than the reports vary
    new_job = SpeedModel(64)
    plan = plan_view(new_job, LIMITS, None, start=(1, 1), prior=missed)
    # where the kind measured, its mean leads: the slow shapes look slow, not as the form says
    for shape in ((2, 5), (3, 4), (1, 6)):
        assert plan.speed(*shape) == pytest.approx(bumpy(*shape), rel=0.05)
        assert abs(plan.speed(*shape) - bumpy(*shape)) < 0.3 * abs(missed.form(*shape) - bumpy(*shape))
    # and a fast one is surer than the form alone says there
    assert plan.sd is not None and plan.sd(2, 4) < missed.spread(2, 4)

    # the same reports' noise on a kind the form fits: the form leads (a mean's noise is not news)
    fits = fleet_prior(64, _reports(_speed, shapes, 0.14, 10) + [Observation(2, 5, 1.2 * _speed(2, 5))] * 4)
    plan = plan_view(new_job, LIMITS, None, start=(1, 1), prior=fits)
    assert plan.speed(2, 5) < 1.03 * _speed(2, 5) < fits.observed(2, 5)


def test_new_jobs_of_a_kind_start_at_draws_of_its_curve_that_spread_where_it_is_unsure():
    """Under a fleet prior that measured shapes up to 2 x 4, each new job is judged by a draw of its
    curve keyed by its id: the same draw every time; the draws' bests differ among the shapes the
    kind never ran, where its curve is unsure, and a shape it measured keeps about its value; a far
    corner is drawn from the kind's form too (new jobs are how a kind learns beyond what it ran),
    where the curve that judges a job once it has run stays capped at the fastest measured."""
    measured = [(p, w) for p in (1, 2) for w in (1, 2, 3, 4)]
    prior = fleet_prior(64, _reports(_speed, measured, 0.14, 10))
    assert prior.identified
    shapes = [(p, w) for p in range(1, 5) for w in range(1, 9)]
    plans = [plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior, draw=f"job-{i}") for i in range(40)]
    again = plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior, draw="job-0")
    assert [again.speed(*s) for s in shapes] == [plans[0].speed(*s) for s in shapes]
    curve = plan_view(SpeedModel(64), LIMITS, None, start=(1, 1), prior=prior)
    assert len({max(shapes, key=lambda s, plan=plan: plan.speed(*s)) for plan in plans}) > 1

    def spread(shape: tuple[int, int]) -> float:
        ratios = [plan.speed(*shape) / curve.speed(*shape) for plan in plans]
        return max(ratios) / min(ratios)

    assert spread((2, 4)) < 1.1 < spread((2, 6))  # measured ten times / never run
    assert curve.speed(4, 8) <= max(curve.speed(*s) for s in measured) < prior.pooled(4, 8)
    drawn = sorted(plan.speed(4, 8) / prior.pooled(4, 8) for plan in plans)
    assert spread((4, 8)) > 1.1 and 0.9 < drawn[len(drawn) // 2] < 1.1  # draws about the form, not capped

    ran = SpeedModel(64).fit([Observation(2, 4, _speed(2, 4))])
    mine = plan_view(ran, LIMITS, (2, 4), prior=prior, draw="job-0")
    assert all(mine.speed(*s) == plan_view(ran, LIMITS, (2, 4), prior=prior).speed(*s) for s in shapes)
