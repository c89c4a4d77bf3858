"""The example loops of docs/user-loop.md (a transformer with AdamW, warm-up +
cosine, global-norm clipping and bf16 autocast; a recommendation model with
embedding tables and Adagrad), each trained through 1x1 -> 2x3 -> 1x2 live on
a real Ray cluster against the same loop run in one process."""

from __future__ import annotations

import functools

import pytest
import ray

from elasticps.examples import recsys_loop, transformer_loop
from elasticps.loop import api
from elasticps.loop.local import LocalSession
from elasticps.runtime import relative_error
from elasticps.runtime.flat import flat_params
from tests.helpers import make_job, run_until_applied

TRANSFORMER = {"epochs": 2, "samples": 384, "batch_size": 64, "width": 32, "warmup": 3}  # 12 steps
RECSYS = {"epochs": 2, "samples": 3072, "batch_size": 256, "users": 2000, "items": 20_000, "dim": 8}  # 24 steps


def rescaled_run(fn, kwargs, steps, at_2x3=None):
    """``fn(**kwargs)`` as a job: 1x1, then 2x3 after ``steps[0]`` steps, then 1x2
    after ``steps[1]`` more; its report and final parameters. ``at_2x3(job)``
    is called once the job is at 2x3."""
    job = make_job(1, 1, functools.partial(fn, **kwargs))
    job.run(max_steps=steps[0])
    for shape, n in zip([(2, 3), (1, 2)], [steps[1], None], strict=True):
        run_until_applied(job, job.rescale(*shape))
        assert (len(job.ps), len(job.workers)) == shape
        if shape == (2, 3) and at_2x3 is not None:
            at_2x3(job)
        report = job.run(max_steps=n)
    params = job.parameters()
    job.shutdown()
    return report, params


def one_process(fn, kwargs):
    with api.active(LocalSession()) as session:
        model = fn(**kwargs)
    return flat_params(model), session.reports


# float32: AdamW divides each gradient by its own running scale, so the float32
# rounding of a sum taken in another order (over 3 workers' shares, not one
# batch) moves near-zero components by up to the lr: 3.0e-5 measured. bfloat16
# autocast rounds each worker's share to 8 bits first: 3.4e-3 measured.
@pytest.mark.parametrize(("bf16", "tol"), [(False, 1e-4), (True, 2e-2)])
def test_the_transformer_loop_through_live_rescales_matches_one_process(ray_local, bf16, tol):
    kwargs = {**TRANSFORMER, "bf16": bf16}
    report, params = rescaled_run(transformer_loop.main, kwargs, (3, 3))
    assert report.state == "finished" and report.step == 12
    assert [r.to_shape for r in report.rescales] == [(2, 3), (1, 2)]
    want, reports = one_process(transformer_loop.main, kwargs)
    error = relative_error(params, want)
    print(f"transformer loop, bf16={bf16}: relative error {error:.2e}")
    assert error < tol
    assert [m.epoch for m in report.metrics] == [0, 1]
    for got, r in zip(report.metrics, reports, strict=True):  # at most a few of 512 test sequences flip
        assert got.values["accuracy"] == pytest.approx(r["metrics"]["accuracy"], abs=0.02 if bf16 else 0.004)


def test_the_recommendation_loop_through_live_rescales_matches_one_process(ray_local):
    held = []
    report, params = rescaled_run(
        recsys_loop.main,
        RECSYS,
        (5, 8),
        lambda job: held.extend(ray.get([w.handle.held_bytes.remote() for w in job.workers])),
    )
    # the tables are all of the model, and the PS holds them: a worker holds no parameter (and reads
    # the rows of its batch); the whole table is 792,000 bytes
    assert held == [0, 0, 0]
    assert report.state == "finished" and report.step == 24
    want, reports = one_process(recsys_loop.main, RECSYS)
    assert relative_error(params, want) < 1e-5
    assert [m.values["accuracy"] for m in report.metrics] == [r["metrics"]["accuracy"] for r in reports]
    # the tables are the model: 2000 x 9 + 20000 x 9 parameters, split over 2 shards at 2x3
    assert params.size == (2000 + 20_000) * 9
