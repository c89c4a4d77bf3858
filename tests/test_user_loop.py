"""A user's own PyTorch loop as an elastic job (elasticps.torch) on a real Ray cluster."""

from __future__ import annotations

import functools

import pytest

from elasticps import JobFailedError, ProgramError, load_program
from elasticps.examples import digits_loop
from elasticps.loop import api
from elasticps.loop.local import LocalSession
from elasticps.runtime import relative_error
from elasticps.runtime.flat import flat_params
from tests.helpers import make_job, run_until_applied

TOL = 1e-5


def reference(**kwargs):
    """The same loop in one process (no job): final flat parameters and its reports."""
    with api.active(LocalSession()) as session:
        model = digits_loop.main(**kwargs)
    return flat_params(model), session.reports


@pytest.mark.parametrize(
    ("optimizer", "lr", "shapes"),
    [
        ("sgd", 0.05, [(2, 3), (1, 4), (1, 2)]),  # 1x4 crosses epoch 0's last batch of 3: one worker pads
        ("adamw", 1e-3, [(2, 3), (1, 2)]),
    ],
)
def test_a_loop_through_live_rescales_matches_one_process(ray_local, optimizer, lr, shapes):
    kwargs = {"epochs": 2, "optimizer": optimizer, "lr": lr, "log_interval": 0}
    job = make_job(1, 1, functools.partial(digits_loop.main, **kwargs))
    assert (job.program.epochs, job.program.batch_size, job.program.num_samples) == (2, 64, 1347)
    job.run(max_steps=4)
    for shape, steps in zip(shapes, [6, 12, 100], strict=False):
        run_until_applied(job, job.rescale(*shape))
        assert (len(job.ps), len(job.workers)) == shape
        job.run(max_steps=steps)
    report = job.run()
    assert report.state == "finished" and report.step == 44 and report.epoch == 2
    assert [r.to_shape for r in report.rescales] == shapes and all(r.ok for r in report.rescales)
    params, reports = reference(**kwargs)
    assert relative_error(job.parameters(), params) < TOL
    # the loop's own test pass after each epoch, reported once per epoch, as in one process
    assert [(m.step, m.epoch) for m in report.metrics] == [(22, 0), (44, 1)]
    for got, want in zip(report.metrics, reports, strict=True):
        assert got.values["accuracy"] == want["metrics"]["accuracy"]
        assert got.values["test_loss"] == pytest.approx(want["metrics"]["test_loss"], rel=1e-4)
    # the loss the loop called backward() on, each worker's noted: falling as the job trains
    assert 0 < report.windows[-1].loss < report.windows[0].loss
    job.shutdown()


def test_a_factory_still_gives_its_program_and_a_loop_is_described():
    program = load_program("elasticps.examples.digits:program")
    assert program.batch_size == 64
    loop = load_program("elasticps.examples.digits_loop:main", {"epochs": 3, "batch_size": 32})
    assert (loop.epochs, loop.batch_size, loop.num_samples, loop.shuffle) == (3, 32, 1347, True)
    assert loop.registered == ("scheduler",) and loop.optimizer_name == "torch.optim.adadelta.Adadelta"
    assert [s[2] for s in loop.layout.segments] == [0]


def _no_epochs():
    import torch

    import elasticps.torch as ept

    model = torch.nn.Linear(2, 1)
    ept.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    loader = ept.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4, 1)), batch_size=2)
    for _ in loader:
        pass


def test_a_loop_that_does_not_say_its_epochs_is_refused_with_what_to_change():
    with pytest.raises(ProgramError, match=r"needs for epoch in elasticps.torch.epochs\(n\)"):
        load_program(_no_epochs)


def _fails_at_step(at: int = 3):
    import torch

    import elasticps.torch as ept

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = ept.prepare(model, opt)
    loader = ept.DataLoader(digits_loop.train_set(), batch_size=64)
    for _ in ept.epochs(1):
        for x, y in loader:
            if ept.step() == at:
                raise ValueError("a bug in the user's loop")
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()


def test_an_error_in_the_loop_fails_the_job_with_the_users_error(ray_local):
    job = make_job(1, 1, _fails_at_step)
    with pytest.raises(JobFailedError, match="a bug in the user's loop"):
        job.run()
    assert job.report().state == "failed" and job.step == 3
    job.shutdown()


def _clipped(max_norm: float | None = 0.05):
    import torch

    import elasticps.torch as ept

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    model, opt = ept.prepare(model, opt)
    loader = ept.DataLoader(digits_loop.train_set(), batch_size=64, shuffle=True)
    for _ in ept.epochs(1):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if max_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            opt.step()
    return model


# two shards each hold part of the norm (they share it before applying); one holds all of it;
# two workers each hold part of the gradient
@pytest.mark.parametrize("num_ps", [2, 1])
def test_global_norm_clipping_in_the_loop_clips_the_global_gradient_exactly(ray_local, num_ps):
    job = make_job(num_ps, 2, _clipped)
    report = job.run()
    assert report.state == "finished" and report.step == 22
    with api.active(LocalSession()):
        want = flat_params(_clipped())
        unclipped = flat_params(_clipped(None))
    assert relative_error(job.parameters(), want) < TOL
    assert relative_error(unclipped, want) > 1e-3  # the clipping mattered: the test can fail
    job.shutdown()
