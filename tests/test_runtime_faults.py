"""A task killed at the moments of a job's life between its steps, on a real Ray
cluster: while the job starts, just after a rescale's switch (before the
boundary's checkpoint reads the shards), before an epoch's evaluation, while
a checkpoint reads the shards, and (sync and async) while a rescale is
switched in. Each is recovered as a failed step is, and the job's parameters
stay those of single-process training."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch

from elasticps import JobFailedError, PlacementError
from elasticps.examples import digits
from elasticps.runtime import (
    CheckpointStore,
    EpochReport,
    JobController,
    TaskResources,
    WindowReport,
    recovery,
    relative_error,
    steps,
    tasks,
    train_single_process,
    user_loop,
)
from elasticps.runtime.bounded_get import waited_on
from elasticps.runtime.recovery import MAX_READ_TRIES, MAX_START_FAILURES, MAX_STEP_TIMEOUTS
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.task_group import TaskGroup
from tests.helpers import SMALL_TASKS, kill_before, kill_task, make_config, make_job, run_until_applied, wait_for

TOL = 1e-5
SMALL = SMALL_TASKS["ps_resources"]


def kill_after(monkeypatch, owner, method: str, victim, once: bool = True) -> None:
    """Kill the task ``victim()`` names right after ``owner.method`` returns
    (``once``: the first call only)."""
    original = getattr(owner, method)

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        if once:
            monkeypatch.setattr(owner, method, original)
        kill_task(victim())
        return out

    monkeypatch.setattr(owner, method, wrapped)


def test_a_ps_killed_just_after_a_switch_is_restored_from_the_switch_state(ray_local, tmp_path, monkeypatch):
    # 1x1 -> 2x1 at step 5, whose boundary also checkpoints: the switch gathered the
    # state at step 5; the kept PS dies before the checkpoint reads the shards
    program = digits.program(epochs=50, optimizer="adam")
    job = make_job(1, 1, program, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=5)  # a checkpoint at step 0 only: the next boundary writes one
    rid = job.rescale(2, 1)
    assert job.prepare()
    kill_after(monkeypatch, job._rescale, "at_boundary", lambda: job.ps[0].handle)
    job.run(max_steps=1)
    events = job.report().events
    want = "1 PS shard(s) died; the PS restored from the state gathered at step 5 (no steps lost)"
    assert any(want in e for e in events), events
    assert job.report().state == "running" and job.step == 6
    assert (len(job.ps), len(job.workers)) == (2, 1) and job.report().rescales[-1].request_id == rid
    job.run(max_steps=2)
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


@pytest.mark.slow
def test_a_ps_killed_before_an_evaluation_or_the_final_checkpoint_goes_back_to_a_checkpoint(
    ray_local, tmp_path, monkeypatch
):
    # digits has 22 steps an epoch; checkpoints every 5 steps and at epoch 0's end. The PS
    # dies at step 22 before epoch 0's evaluation reads it: back to step 20, and epoch 0
    # ends again. Then it dies before the final checkpoint (step 44): back to step 42, and
    # epoch 1 ends again. Each epoch is reported once, and told to on_epoch once.
    program = digits.program(epochs=2)
    told: list[EpochReport] = []
    config = make_config(checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job = JobController(program, config, 1, 1, on_epoch=told.append)
    kill_before(monkeypatch, job, "_evaluate", lambda params: job.ps[0].handle)
    job.run(max_steps=43)
    assert any(
        "1 PS shard(s) died; restored from checkpoint at step 20 (lost 2 steps)" in e for e in job.report().events
    )
    kill_before(monkeypatch, job, "checkpoint", lambda: job.ps[0].handle)
    report = job.run()
    assert any("1 PS shard(s) died; restored from checkpoint at step 42 (lost 2 steps)" in e for e in report.events)
    assert report.state == "finished" and report.step == 44
    assert [(e.epoch, e.step) for e in report.epoch_reports] == [(0, 22), (1, 44)]
    assert [(e.epoch, e.step) for e in told] == [(0, 22), (1, 44)]  # epoch 1 ended twice, told once
    assert all(e.samples_per_s > 0 for e in report.epoch_reports)  # timed from their starts, not first ends
    assert CheckpointStore(tmp_path).latest().step == 44
    ref = train_single_process(program)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_an_evaluation_whose_ps_keeps_dying_fails_the_job_though_each_death_sends_it_back(
    ray_local, tmp_path, monkeypatch
):
    # epoch 0 ends at step 22, the newest checkpoint is step 20's: each death while epoch 0's
    # evaluation reads the shards sends the job back to step 20, and the evaluation comes
    # again two steps later. Its tries count across those returns.
    job = make_job(1, 1, digits.program(epochs=2), checkpoint_dir=str(tmp_path), checkpoint_every_steps=10)
    kills: list[int] = []

    def victim(params):
        if len(kills) == MAX_READ_TRIES:  # the test's bound, so that it fails rather than loops
            raise AssertionError(f"epoch 0's evaluation tried a {len(kills) + 1}th time")
        kills.append(job.step)
        return job.ps[0].handle

    kill_before(monkeypatch, job, "_evaluate", victim, once=False)
    with pytest.raises(JobFailedError, match=f"epoch 0's evaluation failed {MAX_READ_TRIES} times"):
        job.run()
    assert kills == [22] * MAX_READ_TRIES
    events = job.report().events
    assert sum("restored from checkpoint at step 20 (lost 2 steps)" in e for e in events) == MAX_READ_TRIES - 1
    job.shutdown()


def test_a_ps_lost_while_a_rescale_to_fewer_shards_waits_is_restored_at_the_asked_count(
    ray_local, tmp_path, monkeypatch
):
    # 2 PS x 1 worker; a rescale to 1 x 1 asked; a shard dies before the boundary that would switch
    # it in: the restore starts the one shard asked, not two (on a cluster that lost the node of the
    # dead shard there may be no room for two), and the job trains on as one process would.
    program = digits.program(epochs=50)
    job = make_job(2, 1, program, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=5)
    started: list[tuple[str, int]] = []
    launch = job._rescale.launch

    def counted(shape, request_id, reason, strict, **kw):
        started.append((reason, shape.num_ps))
        return launch(shape, request_id, reason, strict, **kw)

    monkeypatch.setattr(job._rescale, "launch", counted)
    job.rescale(1, 1)
    kill_before(monkeypatch, job._rescale, "at_boundary", lambda *args: job.ps[1].handle)
    job.run(max_steps=3)
    assert ("restore", 1) in started and ("restore", 2) not in started, started
    assert any("1 PS shard(s) died" in e for e in job.report().events), job.report().events
    assert (len(job.ps), len(job.workers)) == (1, 1) and job.report().state == "running"
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def test_a_ps_lost_where_its_room_was_taken_is_restored_at_as_many_shards_as_fit_now(ray_local, tmp_path):
    # 2 PS (1 CPU each) x 1 worker; a shard dies and another tenant takes its room (as when a node
    # is lost on a full cluster): the restore starts the one shard there is room for, at once, not
    # two of which one waits out placement_timeout_s and fails the job; it trains on as one process would.
    from ray.util import placement_group, remove_placement_group

    program = digits.program(epochs=50)
    job = make_job(
        2,
        1,
        program,
        checkpoint_dir=str(tmp_path),
        checkpoint_every_steps=5,
        placement_timeout_s=10.0,
        ps_resources=TaskResources(cpu=1.0),
    )
    job.run(max_steps=5)
    free_cpu = lambda: sum(per.get("CPU", 0.0) for per in tasks.free_now().values())  # noqa: E731
    before = free_cpu()
    kill_task(job.ps[1].handle)
    wait_for(lambda: free_cpu() >= before + 1.0 - 1e-6, 30, "the dead shard's CPU to be free")
    tenant = placement_group([{"CPU": free_cpu() - 0.5}])  # leaves 0.5 CPU: no room for a shard
    try:
        ray.get(tenant.ready(), timeout=30)
        job.run(max_steps=3)
        events = job.report().events
        assert any("room for 1 of 2 shards now, starting 1" in e for e in events), events
        assert (len(job.ps), len(job.workers)) == (1, 1) and job.report().state == "running"
        ref = train_single_process(program, max_steps=job.step)
        assert relative_error(job.parameters(), ref.params) < TOL
    finally:
        job.shutdown()
        remove_placement_group(tenant)


def test_a_ps_killed_just_before_on_a_full_cluster_is_restored_at_as_many_shards_as_there_were(ray_local, tmp_path):
    # The cluster full (another tenant holds every CPU the job does not), a shard killed and the job
    # steps at once: Ray's view frees the dead shard's CPU some 100 ms later, and the restore reads it
    # again until it does, rather than restoring one shard for good.
    from ray.util import placement_group, remove_placement_group

    program = digits.program(epochs=50)
    job = make_job(
        2, 1, program, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5, ps_resources=TaskResources(cpu=1.0)
    )
    job.run(max_steps=5)
    free_cpu = sum(per.get("CPU", 0.0) for per in tasks.free_now().values())
    tenant = placement_group([{"CPU": free_cpu}])
    try:
        ray.get(tenant.ready(), timeout=30)
        ray.kill(job.ps[1].handle)
        job.run(max_steps=3)
        assert (len(job.ps), len(job.workers)) == (2, 1), job.report().events
        assert not any("room for" in e for e in job.report().events), job.report().events
    finally:
        job.shutdown()
        remove_placement_group(tenant)


def test_a_window_open_when_a_ps_dies_is_closed_before_the_job_goes_back(ray_local, tmp_path, monkeypatch):
    # A window holds steps run in a row at one shape. The PS dies before step 7, the job goes
    # back to step 5's checkpoint: the open window is told with steps 0-6, the redone steps
    # 5-9 start another (it went on counting them from step 0: steps 0-11, 12 of them).
    told: list[WindowReport] = []
    config = make_config(checkpoint_dir=str(tmp_path), checkpoint_every_steps=5, report_interval_s=600.0)
    job = JobController(digits.program(epochs=50), config, 1, 1, on_window=told.append)
    original = steps.sync_step

    def sync_step(group, step, *args):
        if step == 7:
            monkeypatch.setattr(steps, "sync_step", original)
            kill_task(group.ps[0].handle)
        return original(group, step, *args)

    monkeypatch.setattr(steps, "sync_step", sync_step)
    report = job.run(max_steps=10)
    assert any("restored from checkpoint at step 5 (lost 2 steps)" in e for e in report.events), report.events
    assert [(w.first_step, w.last_step, w.steps) for w in told] == [(0, 6, 7), (5, 9, 5)]
    assert report.windows == told
    job.shutdown()


@pytest.mark.parametrize("moment", ["before it runs", "during the install"])
def test_a_task_killed_as_the_job_starts_starts_the_job_again(ray_local, monkeypatch, moment):
    program = digits.program(epochs=50, optimizer="adam")
    job = make_job(1, 1, program)
    if moment == "before it runs":
        kill_before(monkeypatch, tasks, "wait_ready", lambda pending, timeout_s, names: pending[0].handle)
    else:  # the PS: the install sets its state
        kill_before(monkeypatch, job._rescale, "install", lambda pending, started, state: started[0].handle)
    job.run(max_steps=3)
    report = job.report()
    assert any("a task died while the job started" in e for e in report.events), report.events
    assert report.state == "running" and (len(job.ps), len(job.workers)) == (1, 1)
    ref = train_single_process(program, max_steps=3)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


def _model_that_fails_in_a_task():
    if ray.get_runtime_context().get_actor_id() is not None:
        raise ValueError("no data on this node")
    return digits.mlp()


def test_a_task_whose_constructor_fails_at_start_fails_the_job_at_once(ray_local):
    # the program's own error in every worker: starting again would only repeat it
    program = dataclasses.replace(digits.program(), model=_model_that_fails_in_a_task)
    job = make_job(1, 1, program)
    with pytest.raises(PlacementError, match="no data on this node"):
        job.run(max_steps=1)
    assert not any("starting its tasks again" in e for e in job.report().events)
    job.shutdown()


@pytest.mark.slow
def test_a_job_whose_tasks_keep_dying_at_start_fails_with_the_reason(ray_local, monkeypatch):
    job = make_job(1, 1)
    kill_before(monkeypatch, job._rescale, "install", lambda pending, started, state: started[0].handle, once=False)
    with pytest.raises(JobFailedError, match=f"a task died while the job started, {MAX_START_FAILURES} times"):
        job.run(max_steps=1)
    assert job.report().state == "failed"
    job.shutdown()


@pytest.mark.slow
def test_a_checkpoint_whose_ps_keeps_dying_fails_the_job_with_the_reason(ray_local, tmp_path, monkeypatch):
    # every read of the shards for a checkpoint finds a PS dead: each is restored from the
    # state installed at step 0, then the job fails, naming what it tried
    job = make_job(1, 1, checkpoint_dir=str(tmp_path))
    kill_before(monkeypatch, job, "checkpoint", lambda: job.ps[0].handle, once=False)
    with pytest.raises(JobFailedError, match=f"the checkpoint at step 0 failed {MAX_READ_TRIES} times"):
        job.run(max_steps=1)
    events = job.report().events
    assert sum("the PS restored from the state gathered at step 0" in e for e in events) == MAX_READ_TRIES - 1
    job.shutdown()


@ray.remote(num_cpus=0)
class _Shard:
    """A PS shard that hands over its state and parameters, or (``hung``) never answers."""

    def __init__(self, hung: bool) -> None:
        self.hung = hung

    def _answer(self, value):
        while self.hung:  # a shard stuck in its own code (a hung node, a deadlock): Ray waits on it for ever
            time.sleep(0.05)
        return value

    def get_state(self):
        return self._answer(ShardState(np.zeros(2, np.float32)))

    def params(self):
        return self._answer(np.zeros(2, np.float32))

    def snapshot(self, *args):  # a user loop's worker whose code never comes back to its next batch
        return self._answer({"state": None, "reports": []})


def test_a_ps_shard_that_never_answers_fails_the_read_in_time_naming_it(ray_local):
    """Reading the shards waits at most the group's timeout (the job's placement_timeout_s); the error
    names the shard that did not answer, and is a Ray error, which the job recovers from as from a death."""
    shards = [_Shard.remote(False), _Shard.remote(True)]
    ray.get([h.__ray_ready__.remote() for h in shards], timeout=60)  # both run: only the hung one is late
    group = TaskGroup(threading.RLock(), timeout_s=0.5)
    group.ps = [tasks.Task("ps", h, "node", 0) for h in shards]
    try:
        for read, what in ((lambda: group.gather_state(3), "state"), (group.parameters, "parameters")):
            with pytest.raises(
                ray.exceptions.GetTimeoutError, match=rf"PS shard\(s\) ps-1 did not hand over their {what} within 0.5 s"
            ):
                read()
        assert issubclass(ray.exceptions.GetTimeoutError, ray.exceptions.RayError)
    finally:
        for h in shards:
            ray.kill(h)


def test_a_loop_whose_state_never_comes_fails_the_snapshot_in_time_and_is_stopped(ray_local):
    """A user loop's snapshot waits at most step_timeout_s: the worker is taken for hung (stopped,
    so that the recovery finds it dead) and the error names it."""
    hung = _Shard.remote(True)
    ray.get(hung.__ray_ready__.remote(), timeout=60)
    with pytest.raises(
        ray.exceptions.GetTimeoutError,
        match=r"worker-0 did not hand over its loop's state at step 7 within 0.5 s \(step_timeout_s\); taken for hung",
    ):
        user_loop.snapshot(tasks.Task("worker", hung, "node", 0), [], [], 7, 1, timeout_s=0.5)
    with pytest.raises(ray.exceptions.RayActorError):  # stopped
        ray.get(hung.__ray_ready__.remote(), timeout=30)


def test_a_task_waiting_on_a_hung_one_gives_up_in_time_and_stays_free(ray_local):
    """A real PS shard waiting for a gradient, and a real worker for parameters, that never come
    (a hung task's) fail the call within their wait_s (the job's step_timeout_s), and answer again."""
    hung = _Shard.remote(True)
    never = hung.params.remote()
    program = digits.program()
    ps = tasks.launch("ps", program, SMALL, 1, None, wait_s=0.5)
    worker = tasks.launch("worker", program, SMALL, 1, None, wait_s=0.5)
    try:
        ray.get([ps.ready_ref, worker.ready_ref], timeout=180)  # two process starts, on a busy machine too
        came = ray.put({})  # a part that came: only the late one is named
        calls = [
            (ps.handle.apply.remote(3, [never], False), r"the workers' gradients of step 3 did not come within 0.5 s"),
            (
                ps.handle.apply.remote(4, [], False, True, None, [came, never]),
                r"the shards' norms of step 4 \(of ps-1\) did not come within 0.5 s",
            ),
            (
                worker.handle.step.remote(3, np.arange(4), [came, never], [(0, 1), (1, 2)], 4, 0),
                r"the shards' parameters \(of ps-1\) did not come within 0.5 s",
            ),
        ]
        for ref, message in calls:
            with pytest.raises(ray.exceptions.RayTaskError, match=message):
                ray.get(ref, timeout=60)
        assert ray.get([ps.handle.ping.remote(), worker.handle.ping.remote()], timeout=10)  # free again
    finally:
        for h in (hung, ps.handle, worker.handle):
            ray.kill(h)


@ray.remote
class _StepWorker:
    """A worker whose step hands in its statistics and one gradient slice per shard at once,
    or (``hang``) never."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang

    def step(self, step, part, param_refs, bounds, denominator, seed, measure, same_node, *args, **kwargs):
        if self.hang:
            time.sleep(3600)
        return {"samples": len(part)}, *[np.zeros(1)] * len(same_node)


@ray.remote
class _NormShard:
    """A shard whose sum of the gradients (``reduce``) hangs if ``hang``; its update waits for every
    shard's norm, as a real shard's does."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    def reduce(self, step, grads, lr, senders):
        if self.hang:
            time.sleep(3600)
        return {}

    def apply(self, step, grads, measure, copy_out, lr, norms, lr_factor=1.0, senders=None):
        ray.get(list(norms))
        return {}, np.zeros(1)

    def ping(self):
        return "alive"


def test_a_shard_hung_in_its_sum_is_stopped_alone_and_the_others_fail_on_its_norm(ray_local):
    """A user loop's step with two shards: each sums the gradients, then updates once every shard's
    norm came. ps-1 hangs in its sum: it alone is taken for hung and named; ps-0, waiting for that
    norm, fails on it within the grace and is not stopped (nor named) for being late too."""
    worker, shards = _StepWorker.remote(), [_NormShard.remote(False), _NormShard.remote(True)]
    try:
        ray.get([h.__ray_ready__.remote() for h in (worker, *shards)], timeout=180)  # three process starts
        group = SimpleNamespace(
            ps=[tasks.Task("ps", h, "n", 0) for h in shards], workers=[tasks.Task("worker", worker, "n", 0)]
        )
        group.param_refs, group.bounds = [], []
        t0 = time.monotonic()
        result = steps.sync_step(group, 3, np.arange(2), None, 1.0, 0, False, (0, {}), steps.Waits(2.0, 30.0))
        # no worker failed: the sums had the step's 2 s, not the 30 s grace for failing on a lost gradient
        assert time.monotonic() - t0 < 30.0
        assert result.applied == 0 and len(result.done) == 1 and result.stats_error is None
        assert isinstance(result.apply_error, ray.exceptions.GetTimeoutError)
        want = "ps-1 did not sum the gradients of step 3 within 2 s (step_timeout_s); taken for hung"
        assert str(result.apply_error) == want and waited_on(result.apply_error) == ("ps-1",)
        assert ray.get(shards[0].ping.remote(), timeout=10) == "alive"  # ps-0 was not stopped
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(shards[1].__ray_ready__.remote(), timeout=30)
    finally:
        for h in (worker, *shards):
            ray.kill(h)


def test_a_shards_wait_for_a_gradient_that_runs_out_names_the_worker(ray_local):
    """A real shard waits for the step's gradients at most its wait_s (0.5 s here), less than the
    step's time: its error names the worker whose gradient did not come (worker-1; worker-2, with
    no samples, sent none), for the job to take that worker for hung; so does the controller's own
    wait, which killed it (a recovery takes it for dead without a ping the kill may not yet stop)."""
    workers = [_StepWorker.remote(), _StepWorker.remote(hang=True), _StepWorker.remote()]
    ps = tasks.launch("ps", digits.program(), SMALL, 1, None, wait_s=0.5)
    try:
        ray.get([ps.ready_ref, *[w.__ray_ready__.remote() for w in workers]], timeout=180)
        group = SimpleNamespace(
            ps=[tasks.Task("ps", ps.handle, "n", 0)], workers=[tasks.Task("worker", w, "n", 0) for w in workers]
        )
        group.param_refs, group.bounds = [], []
        result = steps.sync_step(group, 3, np.arange(2), None, 0.1, 0, False, None, steps.Waits(2.0, 10.0))
        assert result.applied == 0 and [w.handle for w, _ in result.done] == workers[:1]
        assert str(result.stats_error).startswith("worker-1 did not hand in its gradient of step 3 within 2 s")
        assert waited_on(result.stats_error) == ("worker-1",)  # killed by the controller's wait: dead, unasked
        assert "the workers' gradients of step 3 (of worker-1) did not come within 0.5 s" in str(result.apply_error)
        assert waited_on(result.apply_error) == ("worker-1",)
    finally:
        for h in (ps.handle, *workers):
            ray.kill(h)


class _HangIn:
    """A loss that hangs (for an hour: the test stops the worker) in the process whose pid is in
    ``flag``, or in every process if it says ``any``."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def wait(self) -> None:
        flag = Path(self.flag)
        if flag.is_file() and flag.read_text() in (str(os.getpid()), "any"):
            time.sleep(3600)

    def __call__(self, out, target):
        self.wait()
        return torch.nn.functional.cross_entropy(out, target)


@contextlib.contextmanager
def _hanging(job: JobController, task: tasks.Task, flag: Path, more: int):
    """``task`` hangs (its pid in ``flag``) while ``job`` runs ``more`` steps in a thread,
    which must end; yields the job's report then, and stops the task and the job after."""
    flag.write_text(str(task.pid))
    try:
        thread = job.run_in_thread(max_steps=more)
        thread.join(120)
        assert not thread.is_alive(), "the job still waits on the hung task"
        yield job.report()
    finally:
        tasks.kill(task.handle)
        job.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_worker_hung_in_a_step_is_taken_for_dead_and_the_job_goes_on(ray_local, tmp_path, mode):
    """A step waits at most step_timeout_s: the worker that did not hand its gradient in is
    stopped, named in an event, and the job recovers as from its death (sync: the step is redone
    by the other worker, so the parameters stay single-process training's)."""
    flag = tmp_path / "hang"
    program = dataclasses.replace(digits.program(epochs=50), loss=_HangIn(str(flag)))
    job = make_job(1, 2, program, mode=mode, step_timeout_s=5.0)
    job.run(max_steps=2)
    hung = job.workers[1]
    with _hanging(job, hung, flag, more=3) as report:
        assert report.state == "running", report.error
        step = "its gradient of step 2" if mode == "sync" else "a step"
        want = f"worker-1 did not hand in {step} within 5 s (step_timeout_s); taken for hung"
        assert any(want in e for e in report.events), report.events
        assert any("1 worker(s) died; continuing with 1" in e for e in report.events), report.events
        assert [w.pid for w in job.workers] != [hung.pid] and len(job.workers) == 1 and job.step >= 5
        if mode == "sync":
            ref = train_single_process(program, max_steps=job.step)
            assert job.step == 5 and relative_error(job.parameters(), ref.params) < TOL


class _HangingSGD(torch.optim.SGD):
    """SGD whose step hangs as :class:`_HangIn`'s loss does: in a PS shard's update."""

    def __init__(self, params, lr, flag: str) -> None:
        super().__init__(params, lr=lr)
        self.hang = _HangIn(flag)

    def step(self, closure=None):
        self.hang.wait()
        return super().step(closure)


@pytest.mark.slow
def test_a_ps_hung_in_its_update_is_taken_for_dead_and_restored(ray_local, tmp_path):
    """The shards' updates are waited for at most step_timeout_s: the hung shard is stopped,
    named, and the job restores the PS from its checkpoint as when one dies, exactly."""
    flag = tmp_path / "hang"
    program = dataclasses.replace(
        digits.program(epochs=50),
        optimizer=_HangingSGD,
        optimizer_kwargs={"flag": str(flag)},
        inexact_optimizer=True,  # SGD's update is elementwise all the same
    )
    job = make_job(2, 1, program, checkpoint_dir=str(tmp_path / "ckpt"), step_timeout_s=5.0)
    job.run(max_steps=3)
    hung = job.ps[1]
    with _hanging(job, hung, flag, more=3) as report:
        events = report.events
        assert any("ps-1 did not apply step 3 within 5 s (step_timeout_s); taken for hung" in e for e in events), events
        assert any("1 PS shard(s) died; restored from checkpoint at step 0 (lost 3 steps)" in e for e in events), events
        assert job.report().state == "running" and job.step == 6 and hung.pid not in [t.pid for t in job.ps]
        ref = train_single_process(program, max_steps=job.step)
        assert relative_error(job.parameters(), ref.params) < TOL


@pytest.mark.slow
def test_a_step_that_hangs_every_time_fails_the_job_with_the_reason(ray_local, tmp_path):
    """A loss that hangs at step 2 in every worker (the user's deadlock): its worker is stopped and
    replaced, the replacement hangs too; the third time the job fails, saying why."""
    flag = tmp_path / "hang"
    program = dataclasses.replace(digits.program(epochs=50), loss=_HangIn(str(flag)))
    job = make_job(1, 1, program, step_timeout_s=3.0)
    job.run(max_steps=2)
    flag.write_text("any")
    try:
        job.run_in_thread().join(180)  # it would replace and hang for ever
        assert job.state == "failed", job.report().events
        assert f"JobFailedError: step 2 ran out of time {MAX_STEP_TIMEOUTS} times in a row" in job.error
        events = job.report().events
        late = "step 2: TakenForHung: worker-0 did not hand in its gradient of step 2 within 3 s"
        assert sum(e.startswith(late) for e in events) == MAX_STEP_TIMEOUTS, events
        assert sum("replaced all workers (1)" in e for e in events) == MAX_STEP_TIMEOUTS - 1, events
    finally:
        job.shutdown()


class _ExitIn:
    """A loss that ends its own process (as a crash in native code or the OOM killer would) once ``flag`` exists."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __call__(self, out, target):
        if Path(self.flag).is_file():
            os._exit(1)
        return torch.nn.functional.cross_entropy(out, target)


def test_a_step_whose_worker_dies_every_time_fails_the_job_with_the_reason(ray_local, tmp_path, monkeypatch):
    """A loss that kills its process at step 2 in every worker: the dead worker is replaced, the replacement
    dies too; after MAX_STEP_FAILURES deaths at that step the job fails, saying why (it would replace for ever).
    The cap set to 3 here to keep the test short."""
    monkeypatch.setattr(recovery, "MAX_STEP_FAILURES", 3)
    flag = tmp_path / "exit"
    program = dataclasses.replace(digits.program(epochs=50), loss=_ExitIn(str(flag)))
    job = make_job(1, 1, program)
    job.run(max_steps=2)
    flag.write_text("any")
    try:
        job.run_in_thread().join(180)
        assert job.state == "failed", job.report().events
        assert "JobFailedError: step 2 failed 3 times in a row" in job.error, job.error
        assert "end its own process" in job.error
        events = job.report().events
        assert sum("replaced all workers (1)" in e for e in events) == 2, events
        assert job.report().step == 2
    finally:
        job.shutdown()


# ------------------------------------------------ a task killed while a rescale is switched in
# The same in both modes. With one worker an async job is sequential SGD (every
# gradient fresh), so its parameters too are single-process training's: nothing
# may be lost or redone.


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "grown"), [("sync", (3, 2)), ("async", (3, 1))])
def test_a_ps_killed_while_a_rescale_is_switched_in_is_restored_and_the_rescale_applied(
    ray_local, tmp_path, mode, grown
):
    program = digits.program(epochs=50, optimizer="adam")
    job = make_job(2, 1, program, mode=mode, checkpoint_dir=str(tmp_path), checkpoint_every_steps=5)
    job.run(max_steps=7)  # sync: checkpoints at steps 0 and 5 (async: where its segments end)
    rid = job.rescale(*grown)
    assert job.prepare()  # its new tasks run: the next boundary gathers the shards' state to re-cut it
    kill_task(job.ps[1].handle)
    job.run(max_steps=1)  # the gather fails at the boundary: restored from the checkpoint, then one step
    events = job.report().events
    want = "1 PS shard(s) died; restored from checkpoint at step " + ("5 (lost 2 steps)" if mode == "sync" else "")
    assert any(want in e for e in events), events
    assert (len(job.ps), len(job.workers)) == (2, 1)
    run_until_applied(job, rid)  # the request is started again against the new shards
    assert (len(job.ps), len(job.workers)) == grown
    job.run(max_steps=3)
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    assert [(r.request_id, r.ok, r.to_shape) for r in job.report().rescales] == [(rid, True, grown)]
    job.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_new_ps_killed_after_it_ran_leaves_the_job_exact_without_a_checkpoint(ray_local, mode):
    # 1x1 -> 2x1: the running PS gets half of the state, the new one dies before taking
    # its half; the shards are torn but no task the job was using died
    program = digits.program(epochs=50, optimizer="adam")
    job = make_job(1, 1, program, mode=mode)
    job.run(max_steps=4)
    rid = job.rescale(2, 1)
    assert job.prepare()
    kill_task(job._rescale.pending.new_ps[1].handle)
    job.run(max_steps=1)
    events = job.report().events
    assert any("restored from the state gathered at step 4 (no steps lost)" in e for e in events), events
    assert job.step == 5 and (len(job.ps), len(job.workers)) == (1, 1)
    run_until_applied(job, rid)
    assert (len(job.ps), len(job.workers)) == (2, 1)
    job.run(max_steps=2)
    ref = train_single_process(program, max_steps=job.step)
    assert relative_error(job.parameters(), ref.params) < TOL
    job.shutdown()


@pytest.mark.slow  # 11 s
def test_a_rescale_asked_before_the_job_lost_its_worker_ends_with_an_event_saying_it_was_dropped(ray_local):
    """A probe asked (1x1 -> 1x2), then the only worker killed before it is applied, with nothing to replace it:
    the job fails, and its log says the rescale was dropped, one line after the failure's."""
    job = make_job(1, 1, digits.program(epochs=50), replace_dead_workers=False)
    try:
        job.run(max_steps=2)
        job.rescale(1, 2)
        kill_task(job.workers[0].handle)
        job.run_in_thread().join(120)
        events = job.report().events
        assert job.state == "failed", events
        assert "every worker died and replace_dead_workers is off" in job.error, job.error
        assert events[-1].endswith("the rescale to 1x2 was dropped: the job failed first"), events
        assert "failed: JobFailedError" in events[-2], events
    finally:
        job.shutdown()
