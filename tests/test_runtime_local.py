"""The runtime on a real single-node Ray cluster: exactness, reports, rescale, faults."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal

import numpy as np
import pytest
import ray
import torch

from elasticps import ConfigError, JobFailedError, PlacementError, ProgramError, TrainingProgram
from elasticps.examples import digits
from elasticps.runtime import relative_error, train_single_process
from tests.helpers import counted_digits, gated_mlp, kill_task, make_job, run_until_applied, wait_for

TOL = 1e-5


def test_sync_adam_through_rescales_matches_single_process(ray_local):
    program = digits.program(epochs=50, optimizer="adam")
    job = make_job(1, 1, program)
    job.run(max_steps=4)
    for shape in [(2, 3), (3, 2), (1, 2)]:
        run_until_applied(job, job.rescale(*shape))
        assert (len(job.ps), len(job.workers)) == shape
        job.run(max_steps=3)
    total = job.step
    ref = train_single_process(program, max_steps=total)
    assert relative_error(job.parameters(), ref.params) < TOL

    report = job.report()
    assert [r.to_shape for r in report.rescales] == [(2, 3), (3, 2), (1, 2)]
    assert all(r.ok and 0 <= r.pause_s < 5 for r in report.rescales)
    # the position in the data continued: the same samples as the reference, none twice or skipped
    assert report.samples_seen == ref.samples
    assert (report.epoch, report.cursor) == divmod(ref.samples, 1347)
    assert set(report.placement) == {"ps-0", "worker-0", "worker-1"}
    assert report.windows and report.windows[-1].num_workers == 2
    # one node: every byte stays on it, and pulls + pushes = 2 x 4 bytes x params x worker steps
    assert report.cross_node_bytes == 0
    numel = sum(p.numel() for p in program.build_model().parameters())
    assert sum(report.bytes_between_nodes.values()) > 2 * 4 * numel * total
    job.shutdown()


def test_batch_and_lr_schedule_changes_through_rescales_match_single_process(ray_local, tmp_path):
    # the global batch changes at step boundaries (with a shape change at the same
    # boundary once), the lr follows the square-root rule and a warm-up schedule
    program = dataclasses.replace(
        digits.program(epochs=50, optimizer="adam", max_batch_size=256),
        lr_schedule=lambda step: min(1.0, (step + 1) / 8),
    )
    job = make_job(1, 2, program, checkpoint_dir=str(tmp_path))
    schedule = [64] * 3 + [128] * 3 + [256] * 2 + [96] * 3
    job.run(max_steps=3)
    job.set_batch_size(128)
    run_until_applied(job, job.rescale(2, 3))
    job.run(max_steps=2)
    job.set_batch_size(256)
    job.run(max_steps=2)
    job.set_batch_size(96)
    job.run(max_steps=1)
    job.stop()
    job.run()
    job.shutdown()
    resumed = make_job(2, 3, program, checkpoint_dir=str(tmp_path))  # the checkpoint keeps the batch
    resumed.run(max_steps=2)
    assert resumed.step == len(schedule) and resumed.batch_size == 96
    ref = train_single_process(program, max_steps=len(schedule), batch_schedule=schedule.__getitem__)
    assert relative_error(resumed.parameters(), ref.params) < TOL
    assert resumed.samples_seen == ref.samples  # the last batch is cut at the end of the epoch (1347)
    assert [w.batch_size for w in resumed.report().windows] == [96]
    assert any("global batch 128 -> 256" in e for e in job.report().events)
    resumed.shutdown()
    # without the change of lr the runtime would differ from the reference: the test can fail
    flat = dataclasses.replace(program, lr_scaling="none")
    assert (
        relative_error(
            train_single_process(flat, max_steps=len(schedule), batch_schedule=schedule.__getitem__).params, ref.params
        )
        > 1e-3
    )


def test_batch_changes_are_refused_outside_the_program_limits(ray_local):
    fixed = make_job(1, 1, digits.program(epochs=1))
    with pytest.raises(ProgramError, match="global batch must be in 64..64"):
        fixed.set_batch_size(128)
    adaptive = make_job(1, 1, digits.program(epochs=1, max_batch_size=256), mode="async")
    with pytest.raises(ConfigError, match="sync mode only"):
        adaptive.set_batch_size(128)
    with pytest.raises(ProgramError, match="max_batch_size"):
        digits.program(batch_size=64, max_batch_size=32)


def test_runs_to_the_end_with_epoch_reports(ray_local, tmp_path):
    program = digits.program(epochs=2)
    job = make_job(2, 2, program, checkpoint_dir=str(tmp_path))
    report = job.run()
    assert report.state == "finished"
    assert report.step == 2 * 22 and report.epoch == 2
    assert [e.epoch for e in report.epoch_reports] == [0, 1]
    for e in report.epoch_reports:
        assert 0.0 <= e.metric <= 1.0 and e.samples_per_s > 0 and e.noise_scale is not None
    assert report.epoch_reports[1].metric > 0.5
    times = report.windows[0].mean_step_times
    assert times.compute_s > 0 and times.pull_s > 0 and times.push_s >= 0 and times.wait_s >= 0
    assert report.gradient_samples and report.gradient_samples[0].batch_big == 64
    # every batch after each worker's first was read in the background during the step before
    assert report.prefetched_batches == 2 * (report.step - 1)
    # The last checkpoint is the end of training.
    from elasticps.runtime import CheckpointStore

    assert CheckpointStore(tmp_path).latest().step == report.step
    assert job.final_metric == report.epoch_reports[-1].metric
    job.shutdown()
    # Resumed from that last checkpoint (a manager killed before it saw the end): no epoch runs,
    # and the final metric is still there, computed from the restored parameters.
    again = make_job(1, 1, program, checkpoint_dir=str(tmp_path))
    assert again.run().epoch_reports == []
    assert again.final_metric == pytest.approx(report.epoch_reports[-1].metric, abs=1e-9)
    again.shutdown()


def test_async_mode_trains_and_bounds_staleness(ray_local):
    job = make_job(1, 2, digits.program(epochs=5, lr=0.05), mode="async", max_staleness=0)
    report = job.run()
    assert report.state == "finished" and report.epoch == 5
    # two workers with a staleness bound of 0: one of every pair of overlapping gradients is dropped
    assert any("discarded a gradient of staleness" in e for e in report.events)
    assert report.windows[-1].loss < 0.5 * report.windows[0].loss
    assert report.epoch_reports[-1].metric > 0.7
    job.shutdown()


@ray.remote(num_cpus=6.5)
class _Tenant:
    def ready(self) -> bool:
        return True


def _started_within_10s(program: TrainingProgram, tries: int = 3):
    """A 1x1 job whose tasks may wait 10 s for room. Its own first start may take longer on a loaded machine
    (seen at a load average of 20): tried again then, as the bound is what the test needs, not that start."""
    for attempt in range(tries):
        try:
            return make_job(1, 1, program, placement_timeout_s=10.0)
        except PlacementError:
            if attempt == tries - 1:
                raise


def test_placement_errors_are_clear_and_never_hang(ray_local):
    job = _started_within_10s(digits.program(epochs=50))
    job.run(max_steps=2)
    node = next(iter(job.placement().values()))
    with pytest.raises(PlacementError, match="not an alive Ray node"):
        job.rescale(1, 2, {"worker-1": "f" * 56})
    with pytest.raises(ConfigError, match="does not have"):
        job.rescale(1, 1, {"worker-3": node})
    # Another tenant holds 6.5 of the node's 8 CPUs; the job holds 1 (0.5 per task). Of two more
    # workers (0.5 each) one fits and one does not (Ray picks which): the request fails after 10 s
    # (waited out on purpose; the one that fits has that long to start, ample even on a busy machine)
    # naming exactly that one. worker-0 is pinned too: an unpinned slot 0 would let the running
    # worker fill pinned slot 1, and the new task that cannot start could then be worker-0.
    tenant = _Tenant.remote()
    ray.get(tenant.ready.remote())
    request = job.rescale(1, 3, {"worker-0": node, "worker-1": node, "worker-2": node})
    run_until_applied(job, request)
    with pytest.raises(
        PlacementError,
        match=r"not running within 1\d s \(no room, or too slow to start\): worker-[12] \(needs \{.CPU.: 0.5\} on node \w+\)$",  # noqa: E501
    ):
        job.wait_rescale(request, timeout_s=1)
    ray.kill(tenant)
    assert (len(job.ps), len(job.workers)) == (1, 1)
    assert job.report().target_shape == (1, 1)
    job.run(max_steps=2)  # still training
    job.shutdown()


def test_dead_workers_are_dropped_and_replaced(ray_local):
    program = digits.program(epochs=50)
    job = make_job(1, 3, program)
    job.run(max_steps=3)
    kill_task(job.workers[0].handle)
    os.kill(job.workers[1].pid, signal.SIGKILL)  # a real process death, like os._exit
    job.run(max_steps=1)
    assert len(job.workers) == 1
    wait_for(lambda: (job.run(max_steps=1), len(job.workers) == 3)[1], 120, "replacement workers")
    job.run(max_steps=3)
    report = job.report()
    assert any("worker(s) died" in e for e in report.events)
    assert any(r.reason == "replace" for r in report.rescales)
    # Nothing was lost: the result is still exactly single-process training.
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_dead_ps_restores_from_checkpoint(ray_local, tmp_path):
    program = digits.program(epochs=2)
    job = make_job(2, 2, program, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=7)  # checkpoints at steps 0 and 5
    kill_task(job.ps[1].handle)
    job.run(max_steps=1)
    report = job.report()
    assert any("restored from checkpoint at step 5 (lost 2 steps)" in e for e in report.events)
    final = job.run()
    assert final.state == "finished"
    ref = train_single_process(program)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def _exploding_loss(out, target):
    if out.shape[0] < 30:
        raise RuntimeError("the user's loss blew up")
    return torch.nn.functional.cross_entropy(out, target)


def test_user_code_errors_fail_the_job_clearly(ray_local):
    base = digits.program(epochs=1)
    program = TrainingProgram(**{**base.__dict__, "loss": _exploding_loss, "name": "boom"})
    job = make_job(1, 2, program)
    with pytest.raises(JobFailedError, match="failed in user code: RuntimeError: the user's loss blew up"):
        job.run(max_steps=2)
    assert job.report().state == "failed"
    job.shutdown()


def test_rescale_requests_are_validated(ray_local):
    job = make_job(1, 1)
    with pytest.raises(ConfigError, match="at least 1 PS and 1 worker"):
        job.rescale(0, 2)
    job.shutdown()
    assert np.isfinite(job.report().step)


def test_digits_accuracy_is_the_same_static_or_rescaled(ray_local):
    program = digits.program(epochs=15)
    job = make_job(1, 1, program)
    job.run(max_steps=60)
    run_until_applied(job, job.rescale(2, 3))
    job.run(max_steps=100)
    run_until_applied(job, job.rescale(1, 2))
    report = job.run()
    assert report.state == "finished"
    rescaled = report.epoch_reports[-1].metric

    ref = train_single_process(program)
    model = program.build_model()
    torch.nn.utils.vector_to_parameters(torch.from_numpy(ref.params), model.parameters())
    x, y = program.build_eval_dataset().tensors
    static = digits.accuracy(model(x), y)
    assert rescaled >= 0.95 and static >= 0.95
    assert abs(rescaled - static) <= 0.005
    job.shutdown()


def test_the_demo_rescales_live_and_reaches_the_accuracy(ray_local, capsys):
    from elasticps.demo import single_job

    report = single_job.run(epochs=12)
    assert [tuple(r["to_shape"]) for r in report["rescales"]] == [(2, 3), (1, 2)]
    assert report["state"] == "stopped" and report["epoch"] >= 12
    # the demo's length depends on how fast tasks start, so its last epoch varies: it reaches 0.95
    assert max(e["metric"] for e in report["epoch_reports"]) >= 0.95
    out = capsys.readouterr().out
    assert ">> now 2 PS x 3 workers" in out and ">> now 1 PS x 2 workers" in out


def test_the_trained_model_comes_back_as_a_state_dict_and_an_exported_file(ray_local, tmp_path, capsys):
    from elasticps.cli.main import main
    from elasticps.runtime.evaluate import evaluate
    from elasticps.runtime.flat import flat_params

    program = digits.program(epochs=2)
    job = make_job(1, 2, program, checkpoint_dir=str(tmp_path / "ckpt"))
    report = job.run()
    state = job.state_dict()
    model = program.build_model()
    assert set(state) == set(model.state_dict())
    model.load_state_dict(state)
    assert np.array_equal(flat_params(model), job.parameters())
    assert evaluate(program, flat_params(model)) == pytest.approx(report.epoch_reports[-1].metric)
    job.shutdown()
    # the same from the checkpoints, through the CLI (a job trained with `elasticps train`)
    out = tmp_path / "model.pt"
    args = ["export", "--program", "elasticps.examples.digits:program", "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert main([*args, "--out", str(out)]) == 0
    exported = torch.load(out)
    assert all(torch.equal(exported[k], state[k]) for k in state)
    other = ["export", "--program", "elasticps.examples.digits:cnn_program", "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert main([*other, "--out", str(out)]) != 0
    assert "not of digits-cnn's model (26122 parameters given, the model has 151306)" in capsys.readouterr().err


def test_a_transformer_with_dict_batches_is_exact_through_a_rescale(ray_local):
    from elasticps.examples import transformer

    # SGD: Adam's first steps divide by sqrt(v) ~ |g|, so float rounding in near-zero
    # gradient entries (sums in another order) becomes visible (9e-5 with AdamW here)
    program = transformer.program(epochs=1, samples=512, optimizer="sgd")
    job = make_job(1, 1, program)
    job.run(max_steps=3)
    run_until_applied(job, job.rescale(2, 3))  # 21 samples a worker: the dicts are split like tensors
    job.run(max_steps=3)
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    assert ref.losses[-1] < ref.losses[0]
    job.shutdown()


class NormalizedSGD(torch.optim.Optimizer):
    """p -= lr * g / |g|, the norm per tensor: not elementwise, so it cannot shard exactly."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"] / max(float(p.grad.norm()), 1e-12))


def test_an_inexact_optimizer_runs_per_shard_only_when_asked(ray_local):
    base = digits.program(epochs=50)
    with pytest.raises(ProgramError, match="set inexact_optimizer=True"):
        dataclasses.replace(base, optimizer=NormalizedSGD, optimizer_kwargs={})
    program = dataclasses.replace(base, optimizer=NormalizedSGD, optimizer_kwargs={}, lr=0.5, inexact_optimizer=True)
    job = make_job(2, 2, program)
    report = job.run(max_steps=30)
    assert report.windows[-1].loss < 0.8 * report.windows[0].loss  # it trains ...
    ref = train_single_process(program, max_steps=30)
    assert relative_error(job.parameters(), ref.params) > 1e-3  # ... but not as one process would: norms per shard
    job.shutdown()


@pytest.mark.parametrize("share, picklable", [(True, True), (False, True), (True, False)])
def test_new_workers_take_the_controllers_dataset_unless_it_cannot_be_shared(ray_local, tmp_path, share, picklable):
    program = dataclasses.replace(
        digits.program(epochs=50), dataset=functools.partial(counted_digits, str(tmp_path), picklable)
    )
    job = make_job(1, 1, program, share_dataset=share)
    job.run(max_steps=2)
    run_until_applied(job, job.rescale(1, 3))
    job.run(max_steps=2)
    builds = len(os.listdir(tmp_path))
    shared = share and picklable
    assert builds == (1 if shared else 1 + 3)  # the controller's, and one per worker unless shared
    cannot = [e for e in job.report().events if "cannot be shared" in e]
    assert len(cannot) == (1 if share and not picklable else 0)
    ref = train_single_process(digits.program(epochs=50), max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_the_job_trains_on_while_a_grows_new_worker_is_still_starting(ray_local, tmp_path, monkeypatch):
    # the new worker's constructor waits for a file to go: the steps meanwhile run at the old shape,
    # and the switch comes at the first boundary after it runs (a launch starts tasks, never waits for them)
    gate = tmp_path / "gate"
    program = dataclasses.replace(digits.program(epochs=50), model=functools.partial(gated_mlp, str(gate)))
    job = make_job(1, 1, program)
    job.run(max_steps=2)
    gate.touch()
    request = job.rescale(1, 2)
    calls = []  # (refs, timeout) of every wait and get of the loop meanwhile

    def recorded(real, timeout_of):
        def call(refs, *args, **kwargs):
            calls.append((list(refs) if isinstance(refs, list) else [refs], timeout_of(kwargs)))
            return real(refs, *args, **kwargs)

        return call

    monkeypatch.setattr(ray, "wait", recorded(ray.wait, lambda kwargs: kwargs.get("timeout")))
    monkeypatch.setattr(ray, "get", recorded(ray.get, lambda kwargs: kwargs.get("timeout")))
    job.run(max_steps=4)
    monkeypatch.undo()
    assert job.step == 6 and len(job.workers) == 1 and not job.report().rescales
    [joiner] = job._rescale.pending.starting()
    looks = [timeout for refs, timeout in calls if joiner.ready_ref in refs]
    assert looks and all(t == 0 for t in looks)  # the loop looked whether it runs at every boundary, never waited
    gate.unlink()
    run_until_applied(job, request)
    assert len(job.workers) == 2 and job.report().rescales[-1].at_step == 6
    ref = train_single_process(digits.program(epochs=50), max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()
