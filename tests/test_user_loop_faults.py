"""A user's own loop through faults: a worker and a PS killed mid-epoch, and a
job started again on its checkpoints (what a manager restart does), on a real
Ray cluster; the parameters and the loop's reports against the same loop run
in one process."""

from __future__ import annotations

import functools
import os
import signal

import pytest

from elasticps.examples import digits_loop
from elasticps.loop import api
from elasticps.loop.local import LocalSession
from elasticps.runtime import relative_error, user_loop
from elasticps.runtime.flat import flat_params
from tests import loops
from tests.helpers import kill_before, kill_task, make_job

TOL = 1e-5


def reference(fn, **kwargs):
    with api.active(LocalSession()) as session:
        model = fn(**kwargs)
    return flat_params(model), session.reports


def assert_the_scheduled_mlp_of_one_process(job, report) -> None:
    """``job`` (``loops.scheduled_mlp``) finished with one process's parameters and the
    per-step scheduler's lr of every report."""
    assert report.state == "finished" and report.step == 44
    params, want = reference(loops.scheduled_mlp)
    assert relative_error(job.parameters(), params) < TOL
    assert [(m.step, m.values["lr"]) for m in report.metrics] == [(r["step"], r["metrics"]["lr"]) for r in want]


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_the_job_goes_on_exactly(ray_local):
    kwargs = {"epochs": 2, "optimizer": "sgd", "lr": 0.05, "log_interval": 0}
    job = make_job(1, 3, functools.partial(digits_loop.main, **kwargs))
    job.run(max_steps=5)  # mid-epoch 0 (22 steps an epoch)
    os.kill(job.workers[1].pid, signal.SIGKILL)
    report = job.run()
    assert report.state == "finished" and report.step == 44 and len(job.workers) == 2
    assert any("1 worker(s) died; continuing with 2" in e for e in report.events)
    params, want = reference(digits_loop.main, **kwargs)
    assert relative_error(job.parameters(), params) < TOL
    assert [m.values["accuracy"] for m in report.metrics] == [r["metrics"]["accuracy"] for r in want]
    job.shutdown()


@pytest.mark.slow
def test_a_ps_killed_mid_epoch_is_restored_with_the_loops_registered_state(ray_local, tmp_path):
    job = make_job(
        2, 2, loops.scheduled_mlp, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5, placement_timeout_s=240
    )
    job.run(max_steps=8)  # checkpoints at steps 0 and 5; the loops' per-step scheduler is at step 8
    kill_task(job.ps[1].handle)
    report = job.run()
    assert any("restored from checkpoint at step 5 (lost 3 steps)" in e for e in report.events)
    assert report.state == "finished" and report.step == 44
    params, want = reference(loops.scheduled_mlp)
    # exact only if every loop went back to step 5's scheduler: the lr moves every step
    assert relative_error(job.parameters(), params) < TOL
    assert [(m.step, m.epoch, m.values["lr"]) for m in report.metrics] == [
        (r["step"], r["epoch"], r["metrics"]["lr"]) for r in want
    ]
    job.shutdown()


@pytest.mark.slow
def test_every_worker_lost_mid_epoch_goes_back_to_a_checkpoint_with_the_loops_state(ray_local, tmp_path):
    # the loop's scheduler moves the lr every step; its state was last taken at step 5's checkpoint.
    # A new loop on step 8's parameters with step 5's scheduler would train on, silently off.
    job = make_job(1, 1, loops.scheduled_mlp, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=8)
    os.kill(job.workers[0].pid, signal.SIGKILL)
    report = job.run()
    assert any("1 worker(s) died; none left" in e for e in report.events), report.events
    assert any("restored from checkpoint at step 5 (lost 3 steps)" in e for e in report.events), report.events
    assert_the_scheduled_mlp_of_one_process(job, report)
    job.shutdown()


@pytest.mark.slow
def test_a_loop_whose_only_worker_dies_at_the_same_step_every_time_fails_not_goes_back_for_ever(ray_local, tmp_path):
    from elasticps.errors import JobFailedError
    from elasticps.runtime.recovery import MAX_STEP_FAILURES

    job = make_job(1, 1, functools.partial(loops.dies_at, 6), checkpoint_dir=str(tmp_path), checkpoint_every_steps=4)
    with pytest.raises(JobFailedError, match=f"every worker was lost at step 6 {MAX_STEP_FAILURES} times"):
        job.run()
    backs = [e for e in job.report().events if "restored from checkpoint at step 4" in e]
    assert len(backs) == MAX_STEP_FAILURES - 1, job.report().events  # the steps redone each time, then given up
    job.shutdown()


@pytest.mark.slow
def test_a_rule_broken_after_the_first_steps_is_the_programs_error_not_worth_a_restart(ray_local):
    from elasticps.errors import ElasticPSError
    from elasticps.manager.ray_runtime import failed_before_first_step

    job = make_job(1, 1, functools.partial(loops.breaks_out_at, 5))
    with pytest.raises(ElasticPSError) as failed:
        job.run()
    assert job.step >= 5 and "ended before epoch 0 did" in str(failed.value.__cause__ or failed.value)
    assert failed_before_first_step(failed.value, job.started_step, job.step)  # the manager fails it at once
    job.shutdown()


@pytest.mark.slow
def test_a_job_started_again_on_its_checkpoints_resumes_the_loop_mid_epoch(ray_local, tmp_path):
    first = make_job(1, 2, loops.scheduled_mlp, checkpoint_dir=str(tmp_path), checkpoint_every_steps=10)
    first.run(max_steps=35)  # epoch 1 (22 steps an epoch), checkpointed at 0, 10, 20, 22, 32
    first.shutdown()
    again = make_job(1, 1, loops.scheduled_mlp, checkpoint_dir=str(tmp_path))
    report = again.run()
    assert "resumed from checkpoint at step 32 (epoch 1)" in report.events[0]
    assert report.state == "finished" and report.step == 44
    params, want = reference(loops.scheduled_mlp)
    assert relative_error(again.parameters(), params) < TOL  # the scheduler came back at step 32
    # the resumed loop ran epoch 1 only, from its 11th batch, and reported it as in one process
    assert [(m.step, m.epoch, m.values) for m in report.metrics] == [
        (r["step"], r["epoch"], r["metrics"]) for r in want[1:]
    ]
    again.shutdown()


@pytest.mark.slow
def test_a_worker_killed_while_a_checkpoint_reads_the_loops_state_leaves_the_checkpoint_whole(
    ray_local, tmp_path, monkeypatch
):
    # worker-0 dies as the checkpoint at step 10 asks its loop for the registered state: the
    # checkpoint is taken again from another worker. A PS killed after step 11 then sends
    # every loop back to that checkpoint: its per-step scheduler must be step 10's
    job = make_job(1, 3, loops.scheduled_mlp, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=6)  # checkpoints at steps 0 and 5
    kill_before(monkeypatch, job._loop, "snapshot", lambda group, step, next_epoch: group.workers[0].handle)
    job.run(max_steps=6)
    assert any("the checkpoint at step 10 failed" in e for e in job.report().events)
    kill_task(job.ps[0].handle)
    report = job.run()
    assert any("restored from checkpoint at step 10 (lost 2 steps)" in e for e in report.events), report.events
    assert_the_scheduled_mlp_of_one_process(job, report)
    job.shutdown()


@pytest.mark.parametrize("moment", ["an epoch ends", "the loops end"])
def test_a_worker_killed_as_an_epoch_or_the_loops_end_leaves_the_job_exact(ray_local, monkeypatch, moment):
    # batch 256: 6 steps an epoch. worker-0 dies as epoch 0's end asks its loop for the
    # registered state (after the loop's test pass): it is asked of worker-1 instead; or as
    # the loops get the final parameters for their last part: worker-1's ends the same way
    fn = functools.partial(loops.scheduled_mlp, batch_size=256)
    job = make_job(1, 2, fn)
    job.start()  # its install asks for the loops' state too, before any worker runs
    if moment == "an epoch ends":
        kill_before(monkeypatch, job._loop, "snapshot", lambda group, step, next_epoch: group.workers[0].handle)
    else:
        kill_before(monkeypatch, user_loop, "finish", lambda workers, param_refs, bounds, step: workers[0].handle)
    report = job.run()
    if moment == "an epoch ends":
        assert any("the loops' end of epoch 0 failed" in e for e in report.events), report.events
    assert report.state == "finished" and report.step == 12
    params, want = reference(fn)
    assert relative_error(job.parameters(), params) < TOL
    assert [(m.step, m.epoch, m.values) for m in report.metrics] == [
        (r["step"], r["epoch"], r["metrics"]) for r in want
    ]
    job.shutdown()


@pytest.mark.slow
def test_a_worker_lost_after_its_gradient_was_in_at_an_epochs_end_is_dropped_not_blamed_on_the_code(
    ray_local, monkeypatch
):
    # step 5 ends epoch 0 (batch 256: 6 steps an epoch); every shard applies it, then worker-0
    # is killed and its statistics are lost (a fault one machine cannot give on its own: the
    # step's results come back together). The step stands and worker-0 is dropped, once: the
    # epoch's end must not find it dead first and leave the lost statistics to look like the
    # loop's own error
    from dataclasses import replace

    from ray.exceptions import ActorDiedError

    from elasticps.runtime import steps

    fn = functools.partial(loops.scheduled_mlp, batch_size=256)
    job = make_job(1, 3, fn)
    original = steps.sync_step

    def sync_step(group, step, *args):
        result = original(group, step, *args)
        if step != 5:
            return result
        monkeypatch.setattr(steps, "sync_step", original)
        kill_task(result.done[0][0].handle)
        return replace(result, done=result.done[1:], stats_error=ActorDiedError())

    monkeypatch.setattr(steps, "sync_step", sync_step)
    report = job.run()
    assert report.state == "finished" and report.step == 12 and len(job.workers) == 2, report.events
    assert sum("1 worker(s) died; continuing with 2" in e for e in report.events) == 1, report.events
    params, _ = reference(fn)
    assert relative_error(job.parameters(), params) < TOL
    job.shutdown()


@pytest.mark.slow
def test_a_ps_killed_in_the_step_after_a_checkpoint_sends_the_loops_back_with_the_shards(
    ray_local, tmp_path, monkeypatch
):
    # the checkpoint at step 10 gathered the shards, so the PS killed as step 10 starts is
    # restored from that state, no step lost; but every loop ran part of step 10 (its
    # per-step scheduler stepped): the loops go back to their state at step 10 too
    from elasticps.runtime import steps

    job = make_job(1, 2, loops.scheduled_mlp, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=10)  # checkpoints at steps 0 and 5; the boundary before step 10 writes one
    kill_before(monkeypatch, steps, "sync_step", lambda group, *args: group.ps[0].handle)
    report = job.run()
    assert any("the PS restored from the state gathered at step 10 (no steps lost)" in e for e in report.events)
    assert_the_scheduled_mlp_of_one_process(job, report)
    job.shutdown()
