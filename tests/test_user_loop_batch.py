"""A user's own loop with an adaptive global batch (``ept.DataLoader(...,
max_batch_size=, lr_scaling=)``) on a real Ray cluster: the batch changed
live matches one process at the same batches with the scaled lr; a batch out
of range is refused; the gradient noise scale is measured with several
workers; the manager's describe step sees the loop as adaptive."""

from __future__ import annotations

import functools
import json
import re
import types

import numpy as np
import pytest
import torch

from elasticps import ProgramError, load_program
from elasticps.examples.digits import train_set
from elasticps.loop import api
from elasticps.loop.local import LocalSession
from elasticps.loop.worker_session import WorkerSession
from elasticps.manager.describe import describe_program
from elasticps.manager.job_views import batch_sizes
from elasticps.manager.runtime import ProgramInfo
from elasticps.manager.spec import JobSpec
from elasticps.manager.wire import answer, decode
from elasticps.runtime import JobController, relative_error, steps
from elasticps.runtime.data import DataPosition, GlobalBatches
from elasticps.runtime.flat import flat_params
from elasticps.runtime.reports import noise_scale
from tests import loops
from tests.helpers import make_config, make_job, run_until_applied

TOL = 1e-5


class ScheduledBatches(LocalSession):
    """The loop in one process with step t at global batch ``batch_at(t)`` and,
    for that step's update only, every lr of its optimizer times
    (batch / base) ** 0.5 (the sqrt rule), the optimizer's own lr kept."""

    def __init__(self, batch_at) -> None:
        super().__init__()
        self.batch_at = batch_at
        self.batch = 0

    def prepare(self, model, opt, inexact):
        step = opt.step

        def scaled(this, *args, **kwargs):
            lrs = [g["lr"] for g in this.param_groups]
            for g in this.param_groups:
                g["lr"] = g["lr"] * (self.batch / self.loader.batch_size) ** 0.5
            try:
                return step(*args, **kwargs)
            finally:
                for g, lr in zip(this.param_groups, lrs, strict=True):
                    g["lr"] = lr

        opt.step = types.MethodType(scaled, opt)  # a method, as an LR scheduler expects to wrap
        return model, opt

    def add_loader(self, loader) -> None:
        self.loader = loader

    def iterate(self, loader):
        order = GlobalBatches(loader.seed, len(loader.dataset), loader.batch_size, loader.shuffle)
        pos = DataPosition(self.epoch, 0)
        while pos.epoch == self.epoch:
            self.batch = self.batch_at(self.batches)
            idx, pos = order.take(pos, self.batch)
            yield loader.fetch(idx)
            self.batches += 1


def test_the_batch_changed_live_matches_one_process_at_those_batches_with_the_scaled_lr(ray_local):
    kwargs = {"epochs": 2, "batch_size": 32, "max_batch_size": 128}
    job = make_job(1, 1, functools.partial(loops.scheduled_mlp, **kwargs))
    assert (job.program.max_batch_size, job.program.lr_scaling) == (128, "sqrt")
    job.run(max_steps=4)
    job.set_batch_size(64)
    run_until_applied(job, job.rescale(2, 3))  # step 4: 2x3 at batch 64
    job.run(max_steps=7)
    job.set_batch_size(48)
    run_until_applied(job, job.rescale(1, 2))  # step 12: 1x2 at batch 48
    report = job.run()

    def batch_at(step: int) -> int:
        return 32 if step < 4 else 64 if step < 12 else 48

    with api.active(ScheduledBatches(batch_at)) as session:
        want = flat_params(loops.scheduled_mlp(**kwargs))
    assert report.state == "finished" and report.step == session.batches == 56
    assert all(r.ok for r in report.rescales) and [r.to_shape for r in report.rescales] == [(2, 3), (1, 2)]
    # every window trained at the batch of its steps (a window closes where the batch changes)
    assert [(w.batch_size, w.batch_size) for w in report.windows] == [
        (batch_at(w.first_step), batch_at(w.last_step)) for w in report.windows
    ]
    assert "step 4: global batch 32 -> 64 (the optimizer's lr x1.414, sqrt scaling)" in report.events
    assert relative_error(job.parameters(), want) < TOL
    # the loop's own lr (its scheduler's, reported after each epoch) is not the scaled one
    want_lrs = [(r["step"], r["metrics"]["lr"]) for r in session.reports]
    assert [(m.step, m.values["lr"]) for m in report.metrics] == want_lrs
    job.shutdown()


def test_a_job_started_again_on_its_checkpoints_resumes_at_the_batch_it_had(ray_local, tmp_path):
    fn = functools.partial(loops.scheduled_mlp, epochs=1, max_batch_size=128)
    first = make_job(1, 2, fn, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    first.run(max_steps=3)
    first.set_batch_size(128)
    first.run(max_steps=4)  # steps 3..6 at 128, checkpointed at step 5
    first.shutdown()
    again = make_job(1, 1, fn, checkpoint_dir=str(tmp_path))
    report = again.run()
    assert "resumed from checkpoint at step 5 (epoch 0)" in report.events[0]
    with api.active(ScheduledBatches(lambda step: 64 if step < 3 else 128)) as session:
        want = flat_params(fn())
    assert report.state == "finished" and report.step == session.batches == 13 and report.batch_size == 128
    assert relative_error(again.parameters(), want) < TOL
    again.shutdown()
    # the loop's DataLoader lost its max_batch_size: the job cannot resume at 128, and says why
    fixed = load_program(functools.partial(loops.scheduled_mlp, epochs=1))
    with pytest.raises(ProgramError, match=r"checkpoint at step \d+ was taken at global batch 128, .* batch 64"):
        JobController(fixed, make_config(checkpoint_dir=str(tmp_path)), 1, 1).start()


def _sqnorm(model: torch.nn.Module, idx: np.ndarray) -> float:
    x, y = train_set().tensors
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return float(sum((g.double() ** 2).sum() for g in grads))


def test_the_noise_scale_of_a_loop_is_measured_with_several_workers_and_not_with_one(ray_local, monkeypatch):
    fn = functools.partial(loops.scheduled_mlp, epochs=2, max_batch_size=128)
    model = load_program(fn).model  # the initial parameters, from a describe run of its own
    measured: list[int] = []  # the steps whose shards were asked for the gradient's norm
    sync_step = steps.sync_step

    def recording(group, step, *args, **kwargs):
        result = sync_step(group, step, *args, **kwargs)
        if any(info and "grad_sqnorm" in info for info in result.infos):
            measured.append(step)
        return result

    monkeypatch.setattr(steps, "sync_step", recording)
    job = make_job(1, 3, fn, gns_every_steps=10)
    job.run(max_steps=5)  # steps 0..4 with 3 workers: measured at step 0 only
    run_until_applied(job, job.rescale(1, 1))
    report = job.run()  # steps 10, 20, ... with 1 worker: no small batch to compare with
    assert report.state == "finished" and report.step == 44
    [sample] = report.gradient_samples
    # shares of 22, 21, 21 samples: the small batch is the 22 of worker 0 (only it has 22)
    idx = GlobalBatches(0, 1347, 64).take(DataPosition(0, 0), 64)[0]
    assert (sample.batch_small, sample.batch_big) == (22, 64)
    assert sample.sqnorm_small == pytest.approx(_sqnorm(model, idx[:22]), rel=1e-4)
    assert sample.sqnorm_big == pytest.approx(_sqnorm(model, idx), rel=1e-4)
    first, second = report.epoch_reports
    assert first.noise_scale is not None and first.noise_scale == noise_scale([sample])
    assert second.noise_scale is None
    assert measured == [0]  # one worker's share is the whole batch: its shards are not asked for a norm
    job.shutdown()


def test_a_batch_out_of_the_loaders_range_is_refused():
    adaptive = JobController(
        load_program(functools.partial(loops.scheduled_mlp, max_batch_size=128)), make_config(), 1, 1
    )
    for batch in (32, 129, 100.0):
        with pytest.raises(ProgramError, match=r"global batch must be in 64\.\.128"):
            adaptive.set_batch_size(batch)
    fixed = JobController(load_program(loops.scheduled_mlp), make_config(), 1, 1)
    with pytest.raises(ProgramError, match="give elasticps.torch.DataLoader a max_batch_size"):
        fixed.set_batch_size(128)
    for bad, match in (
        ({"max_batch_size": 32}, r"max_batch_size must be an int >= batch_size \(64\), got 32"),
        ({"max_batch_size": 100.5}, "max_batch_size must be an int"),
        ({"max_batch_size": 128, "lr_scaling": "cubic"}, "lr_scaling must be one of"),
        # a global batch holds one epoch at most: the lr rule would scale for samples that are not there
        ({"max_batch_size": 2048}, r"max_batch_size 2048 is more than the dataset's 1347 samples"),
    ):
        with api.active(LocalSession()), pytest.raises(ProgramError, match=match):
            loops.scheduled_mlp(**bad)


@pytest.mark.parametrize(
    ("kwargs", "differs"),
    [
        ({"max_batch_size": 256}, "max_batch_size 256 here, 128 in the describe run"),
        ({"max_batch_size": 128, "lr_scaling": "linear"}, "lr_scaling 'linear' here, 'sqrt' in the describe run"),
        ({"max_batch_size": None}, "max_batch_size None here, 128 in the describe run"),
    ],
)
def test_a_worker_whose_loader_differs_from_the_describe_runs_is_told_what_differs(kwargs, differs):
    # the same function built another DataLoader in a worker (e.g. one read from the environment)
    session = WorkerSession(load_program(functools.partial(loops.scheduled_mlp, max_batch_size=128)), lambda n: None)
    with api.active(session), pytest.raises(ProgramError, match=re.escape(differs)):
        api.DataLoader(train_set(), batch_size=64, **kwargs)


def test_the_managers_describe_step_sees_an_adaptive_loop():
    def described(**args) -> ProgramInfo:  # what the manager's describe task answers, decoded as it decodes it
        data = json.loads(answer(lambda: describe_program("tests.loops:scheduled_mlp", args)))
        return decode(ProgramInfo, data["ok"], "the program's description")

    spec = JobSpec(name="loop", program="tests.loops:scheduled_mlp")
    info = described(max_batch_size=256)
    assert (info.batch_size, info.max_batch_size) == (64, 256)
    assert batch_sizes(spec, info) == (64, 128, 256)
    assert batch_sizes(spec, described()) == ()
