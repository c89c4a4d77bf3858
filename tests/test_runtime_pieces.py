"""The runtime's pieces without Ray: requests, shape changes, recovery, checkpoints,
the data position, the task lists (with fake tasks)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from ray import exceptions as ray_errors

from elasticps.errors import ConfigError, JobFailedError, PlacementError, UserCodeError
from elasticps.runtime import tasks
from elasticps.runtime.bounded_get import TakenForHung
from elasticps.runtime.checkpoint import Checkpoint, Checkpoints
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import DataPosition, GlobalBatches
from elasticps.runtime.membership import (
    PendingChange,
    Requests,
    Shape,
    SuspectNodes,
    check_shape,
    release_plan,
    rescale_outcome,
    wanted,
)
from elasticps.runtime.progress import Progress
from elasticps.runtime.recovery import MAX_STEP_TIMEOUTS, Recovery
from elasticps.runtime.recovery_plan import RecoveryPlan, plan_recovery
from elasticps.runtime.reports import RescaleRecord
from elasticps.runtime.rescale import MAX_SWITCH_FAILURES, JobHooks, Rescaler, SwitchFailed
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.task_group import TaskGroup

CPU = {"CPU": 1.0}


def _requests(num_ps: int = 1, num_workers: int = 2) -> Requests:
    return Requests(Shape(num_ps, num_workers), threading.RLock())


def _record(request_id: int, ok: bool = True, error: str | None = None) -> RescaleRecord:
    return RescaleRecord(request_id, (1, 1), (2, 2), 5, 0.1, 0.2, ok, error)


# ------------------------------------------------------------------ requests
def test_a_new_request_is_launched_and_replaces_the_target():
    req = _requests()
    rid = req.ask(Shape(2, 3))
    decision = req.next_launch(None, running_workers=2, replace_dead_workers=True)
    assert (decision.request_id, decision.reason, decision.cancel) == (rid, "request", False)
    assert decision.shape == Shape(2, 3)


def test_nothing_is_launched_when_the_newest_request_is_applied_and_no_worker_is_missing():
    req = _requests()
    rid = req.ask(Shape(2, 3))
    req.mark_applied(rid)
    decision = req.next_launch(None, running_workers=3, replace_dead_workers=True)
    assert decision.reason is None and not decision.cancel


def test_a_newer_request_cancels_the_pending_one_and_launches_itself():
    req = _requests()
    first = req.ask(Shape(2, 3))
    second = req.ask(Shape(1, 4))
    decision = req.next_launch(first, running_workers=2, replace_dead_workers=False)
    assert decision.cancel and decision.reason == "request" and decision.request_id == second


def test_the_pending_request_itself_is_neither_cancelled_nor_launched_again():
    req = _requests()
    rid = req.ask(Shape(2, 3))
    decision = req.next_launch(rid, running_workers=0, replace_dead_workers=True)
    assert not decision.cancel and decision.reason is None


@pytest.mark.parametrize(("replace", "running", "reason"), [(True, 1, "replace"), (False, 1, None), (True, 2, None)])
def test_dead_workers_are_replaced_only_when_asked_and_missing(replace, running, reason):
    # the target has 2 workers; none was asked since the start
    req = _requests(1, 2)
    assert req.next_launch(None, running_workers=running, replace_dead_workers=replace).reason == reason


def test_a_failed_newest_request_makes_the_current_shape_the_target():
    req = _requests(1, 2)
    rid = req.ask(Shape(4, 4))
    req.mark_failed(rid, Shape(1, 2, {"ps-0": "n1"}))
    assert req.target == Shape(1, 2, {"ps-0": "n1"}) and req.applied == rid
    assert req.next_launch(None, running_workers=2, replace_dead_workers=True).reason is None


def test_a_failed_older_request_leaves_a_newer_target_alone():
    req = _requests(1, 2)
    old = req.ask(Shape(4, 4))
    req.ask(Shape(2, 2))
    req.mark_failed(old, Shape(1, 2))
    assert req.target == Shape(2, 2)
    assert req.unlaunched(None)  # the newer one still waits for its tasks


def test_a_batch_request_is_taken_once():
    req = _requests()
    assert not req.batch_asked() and req.take_batch() is None
    req.ask_batch(64)
    req.ask_batch(128)  # the newer one wins
    assert req.batch_asked()
    assert req.take_batch() == 128 and req.take_batch() is None


def test_rescale_outcome():
    assert rescale_outcome(2, [_record(1), _record(2)], applied=2, ended=False).request_id == 2
    assert rescale_outcome(3, [_record(1)], applied=1, ended=False) is None  # still to come
    with pytest.raises(PlacementError, match="no room"):
        rescale_outcome(2, [_record(2, ok=False, error="no room")], applied=2, ended=False)
    with pytest.raises(ConfigError, match="superseded"):
        rescale_outcome(2, [_record(1)], applied=3, ended=False)
    with pytest.raises(ConfigError, match="job ended"):
        rescale_outcome(2, [], applied=1, ended=True)


def test_check_shape_names_the_pins_the_shape_lacks():
    check_shape(2, 1, {"ps-1": "a", "worker-0": "b"})
    with pytest.raises(ConfigError, match=r"\['worker-1'\]"):
        check_shape(2, 1, {"worker-1": "a"})
    with pytest.raises(ConfigError, match="at least 1 PS"):
        check_shape(0, 1, {})


# -------------------------------------------------------------- placement
def test_pins_to_gone_or_suspect_nodes_count_as_anywhere():
    shape = Shape(1, 3, {"worker-0": "a", "worker-1": "gone", "worker-2": "sick", "ps-0": "a"})
    suspects = SuspectNodes(hold_s=60.0)
    suspects.mark(["sick"], now=100.0)
    alive = {"a", "sick"}
    assert wanted("worker", shape, alive, lambda n: suspects.suspect(n, 130.0)) == ["a", None, None]
    # 60 s later the node is trusted again
    assert wanted("worker", shape, alive, lambda n: suspects.suspect(n, 161.0)) == ["a", None, "sick"]
    assert wanted("ps", shape, alive, lambda n: False) == ["a"]


def test_a_shape_that_moves_a_task_onto_a_full_node_releases_first():
    asked: list[list[tuple[str, dict[str, float]]]] = []

    def full(new):
        asked.append(new)
        return False

    plan = release_plan(
        {"ps": ["a", "a"], "worker": ["a", "b"]},  # 2 PS on a, workers on a and b
        {"ps": [None, "b"], "worker": ["a"]},  # 2x1: ps-1 moves to b, worker-1 goes
        {"ps": CPU, "worker": CPU},
        full,
    )
    # ps-0 keeps PS 0; ps-1 needs a new task on b; worker-0 keeps worker 0; PS 1 and worker 1 drop
    assert plan is not None and plan.keep_ps == {0: 0} and plan.keep_workers == {0: 0} and plan.drops == 2
    assert asked == [[("b", CPU)]]


def test_no_release_when_the_new_tasks_fit_or_nothing_drops():
    shapes = ({"ps": ["a", "a"], "worker": ["a", "b"]}, {"ps": [None, "b"], "worker": ["a"]})
    assert release_plan(*shapes, {"ps": CPU, "worker": CPU}, lambda new: True) is None
    # a pure growth drops nothing: the room is never asked about
    asked = []
    grow = release_plan(
        {"ps": ["a"], "worker": ["a"]},
        {"ps": [None], "worker": [None, "b"]},
        {"ps": CPU, "worker": CPU},
        lambda new: asked.append(new) or False,
    )
    assert grow is None and asked == []


def test_no_release_when_it_would_leave_no_worker():
    # every running worker is replaced by one elsewhere: switching to the kept ones would leave none
    plan = release_plan(
        {"ps": ["a"], "worker": ["a"]}, {"ps": [None], "worker": ["b"]}, {"ps": CPU, "worker": CPU}, lambda new: False
    )
    assert plan is None


def test_a_pending_change_is_stale_once_a_task_it_keeps_is_gone():
    kept_ps, kept_worker, other = object(), object(), object()
    pending = PendingChange(1, Shape(1, 2), {}, {1: "w"}, 0.0, "request", {0: kept_ps}, {0: kept_worker})
    assert not pending.stale([kept_ps, kept_worker, other])
    assert pending.stale([kept_ps, other])  # the kept worker died
    assert pending.stale([other, kept_worker])  # the PS were replaced by a restore


def test_a_pending_change_is_applied_once_running_and_given_up_after_the_timeout():
    pending = PendingChange(3, Shape(2, 2), {1: "p"}, {0: "w0", 1: "w1"}, launched_at=10.0, reason="request")
    assert pending.names() == ["ps-1", "worker-0", "worker-1"]
    assert pending.starting() == ["p", "w0", "w1"]
    assert pending.verdict(True, now=1000.0, timeout_s=60.0) == "apply"
    assert pending.verdict(False, now=69.0, timeout_s=60.0) is None
    assert pending.verdict(False, now=71.0, timeout_s=60.0) == "give_up"


# --------------------------------------------------------------- recovery
@pytest.mark.parametrize(
    ("dead_ps", "dead_workers", "workers", "torn", "replace", "expected"),
    [
        # a worker died before its gradient was in: drop it, redo the step, nothing restored
        (0, 1, 3, False, True, RecoveryPlan(None, user_code=False, no_workers=False, replace=False)),
        # a worker's gradient was lost after some shards applied the step: restore the shards
        (0, 1, 3, True, True, RecoveryPlan("torn", user_code=False, no_workers=False, replace=False)),
        # a shard died (with or without a torn update): restore onto new shards
        (1, 0, 3, True, True, RecoveryPlan("lost", user_code=False, no_workers=False, replace=False)),
        (2, 1, 3, False, True, RecoveryPlan("lost", user_code=False, no_workers=False, replace=False)),
        # nothing died: the program's code failed, torn or not
        (0, 0, 3, True, True, RecoveryPlan(None, user_code=True, no_workers=False, replace=False)),
        # every worker died: start new ones, or fail if that is off
        (0, 2, 2, False, True, RecoveryPlan(None, user_code=False, no_workers=True, replace=True)),
        (0, 2, 2, False, False, RecoveryPlan(None, user_code=False, no_workers=True, replace=False)),
    ],
)
def test_recovery_plan(dead_ps, dead_workers, workers, torn, replace, expected):
    assert plan_recovery(dead_ps, dead_workers, workers, torn, replace) == expected


def _checkpoint(step: int, **kw) -> Checkpoint:
    fields = {"seed": 0, "optimizer": "sgd", "layout": [("w", [2])], **kw}
    return Checkpoint(step, DataPosition(0, step), ShardState(np.zeros(2, np.float32)), samples_seen=step, **fields)


def test_checkpoints_are_due_every_n_steps_after_the_last(tmp_path):
    ckpts = Checkpoints(JobConfig(checkpoint_dir=str(tmp_path), checkpoint_every_steps=5), lambda text: None)
    assert ckpts.latest() is None and ckpts.due(5)  # none written yet: due
    ckpts.save(_checkpoint(3))
    assert not ckpts.due(7) and ckpts.due(8)
    assert ckpts.latest().step == 3
    never = Checkpoints(JobConfig(checkpoint_dir=str(tmp_path), checkpoint_every_steps=0), lambda text: None)
    assert not never.due(1000)  # 0: only at the end of epochs and of the job
    assert not Checkpoints(JobConfig(checkpoint_every_steps=5), lambda text: None).due(1000)  # nowhere to write


def test_a_checkpoint_of_another_program_or_model_is_refused(tmp_path):
    ckpts = Checkpoints(JobConfig(checkpoint_dir=str(tmp_path)), lambda text: None)
    program = SimpleNamespace(seed=0, optimizer_name="sgd")
    ckpts.check(_checkpoint(1), program, [("w", [2])])
    with pytest.raises(ConfigError, match="seed 1 / sgd"):
        ckpts.check(_checkpoint(1, seed=1), program, [("w", [2])])
    with pytest.raises(UserCodeError, match="does not match the model"):
        ckpts.check(_checkpoint(1), program, [("w", [3])])


# --------------------------------------------------------------- progress
def _progress(num_samples: int = 10, batch: int = 4, epochs: int = 2) -> Progress:
    program = SimpleNamespace(batch_size=batch, epochs=epochs, lr_at=lambda step, m: 0.1 * m / 4)
    p = Progress(program, threading.RLock())
    p.batches = GlobalBatches(seed=0, num_samples=num_samples, batch_size=batch, shuffle=False)
    return p


def test_sync_batches_walk_the_epoch_and_report_its_end():
    p = _progress(num_samples=10, batch=4, epochs=2)
    assert p.samples_per_epoch() == 10 and p.remaining_samples() == 20
    ended = []
    for _ in range(3):  # 4 + 4 + 2 samples: the third step ends epoch 0
        idx, nxt, upcoming = p.next_batch()
        p.step += 1
        ended.append(p.advance(len(idx), nxt))
    assert ended == [None, None, 0]
    assert p.position == DataPosition(1, 0) and p.samples_seen == 10 and p.remaining_samples() == 10
    idx, nxt, upcoming = p.next_batch()
    assert list(idx) == [0, 1, 2, 3] and list(upcoming) == [4, 5, 6, 7]


def test_an_epoch_undone_by_a_restore_is_timed_again_from_its_own_start():
    """A restore to step 2 undoes epoch 0, which ended at step 3 (10 samples in
    10 s): when it ends again, its report counts from epoch 0's start (10
    samples in 25 s), not from its first end (no samples in 15 s)."""
    p = _progress(num_samples=10, batch=4, epochs=2)
    p.start_epoch_clock(100.0)

    def steps(n: int) -> int | None:
        ended = None
        for _ in range(n):
            idx, nxt, _ = p.next_batch()
            p.step += 1
            ended = p.advance(len(idx), nxt)
        return ended

    assert steps(3) == 0
    first = p.end_epoch(0, 110.0, None, None, None, {}, (1, 1))
    p.start_epoch_clock(110.0)
    assert (first.samples_per_s, first.elapsed_s) == (1.0, 10.0)
    p.resume(Checkpoint(2, DataPosition(0, 8), ShardState(np.zeros(2, np.float32)), 0, "sgd", samples_seen=8))
    assert p.epochs == [] and p.samples_seen == 8
    assert steps(1) == 0
    again = p.end_epoch(0, 125.0, None, None, None, {}, (1, 1))
    assert (again.samples_per_s, again.elapsed_s) == (10 / 25, 25.0)
    assert [e.epoch for e in p.epochs] == [0]


def test_no_batch_is_read_ahead_past_the_last_epoch():
    p = _progress(num_samples=10, batch=4, epochs=1)
    p.position = DataPosition(0, 8)
    idx, nxt, upcoming = p.next_batch()
    assert list(idx) == [8, 9] and nxt == DataPosition(1, 0) and upcoming is None
    p.advance(len(idx), nxt)
    assert p.done and p.remaining_samples() == 0


def test_async_hand_out_moves_the_position_and_count_the_step():
    p = _progress(num_samples=10, batch=4)
    assert list(p.hand_out(3)) == [0, 1, 2] and list(p.hand_out(3)) == [3, 4, 5]
    assert p.position == DataPosition(0, 6) and p.step == 0  # handed out, not yet trained
    p.count(3)
    assert (p.step, p.samples_seen) == (1, 3)


def test_the_lr_follows_the_global_batch():
    p = _progress(batch=4)
    assert p.lr() == pytest.approx(0.1)
    p.batch_size = 8
    assert p.lr() == pytest.approx(0.2)


def test_an_epoch_report_times_the_epoch_from_its_clock():
    p = _progress()
    p.samples_seen = 100
    p.start_epoch_clock(now=10.0)
    p.step, p.samples_seen = 7, 400
    report = p.end_epoch(0, now=13.0, loss=0.5, noise_scale=None, metric=0.9, metrics={}, shape=(2, 3))
    # 300 samples in 3 s
    assert report.samples_per_s == pytest.approx(100.0) and report.elapsed_s == pytest.approx(3.0)
    assert (report.step, report.num_ps, report.num_workers, report.batch_size) == (7, 2, 3, 4)
    assert p.epochs == [report]


def test_resume_goes_back_to_the_checkpoint():
    p = _progress()
    p.step, p.position, p.samples_seen = 9, DataPosition(1, 4), 30
    p.resume(_checkpoint(3))
    assert (p.step, p.position, p.samples_seen) == (3, DataPosition(0, 3), 3)


# ------------------------------------------------------------- task group
@dataclass
class _Handle:
    name: str


def _task(kind: str, name: str, node: str) -> tasks.Task:
    return tasks.Task(kind, _Handle(name), node, pid=0)  # type: ignore[arg-type]


def test_an_install_fills_slots_tells_joiners_first_and_retires_what_it_drops(monkeypatch):
    retired: list[list[str]] = []
    monkeypatch.setattr(tasks, "retire", lambda handles: retired.append([h.name for h in handles]))

    def names(g: TaskGroup) -> list[str]:
        return [t.handle.name for t in g.ps + g.workers]

    seen: list[tuple[list[str], list[str]]] = []  # (the joiners, the tasks running when told)
    group = TaskGroup(threading.RLock(), on_join=lambda ws: seen.append(([w.handle.name for w in ws], names(group))))
    p0, w0, w1 = _task("ps", "p0", "a"), _task("worker", "w0", "a"), _task("worker", "w1", "b")
    group.install(Shape(1, 2), {0: p0}, {0: w0, 1: w1}, None, step=0)
    assert names(group) == ["p0", "w0", "w1"] and seen == [(["w0", "w1"], [])]
    # 1x2 -> 1x2 with worker-1 replaced: only the new worker joins, before the switch; w1 retires
    w2 = _task("worker", "w2", "c")
    group.install(Shape(1, 2), {}, {1: w2}, None, step=5)
    assert seen[-1] == (["w2"], ["p0", "w0", "w1"])
    assert names(group) == ["p0", "w0", "w2"] and retired[-1] == ["w1"]
    assert group.placement() == {"ps-0": "a", "worker-0": "a", "worker-1": "c"}
    assert group.nodes_used == {"a", "b", "c"}
    # a shrink to 1x1 starts nothing and drops the last worker
    group.install(Shape(1, 1), {}, {}, None, step=6)
    assert names(group) == ["p0", "w0"] and retired[-1] == ["w2"] and len(seen) == 2


def test_removing_dead_tasks_kills_them_and_closes_the_gap(monkeypatch):
    killed: list[str] = []
    monkeypatch.setattr(tasks, "retire", lambda handles: None)
    monkeypatch.setattr(tasks, "kill", lambda handle: killed.append(handle.name))
    group = TaskGroup(threading.RLock())
    ws = [_task("worker", f"w{i}", "a") for i in range(3)]
    group.install(Shape(1, 3), {0: _task("ps", "p0", "a")}, dict(enumerate(ws)), None, step=0)
    group.remove([ws[1]])
    assert killed == ["w1"] and [w.handle.name for w in group.workers] == ["w0", "w2"]
    assert group.placement() == {"ps-0": "a", "worker-0": "a", "worker-1": "a"}
    assert not group.shards_change(list(group.ps)) and group.shards_change([])


# ------------------------------------------- recovery with fake tasks and a rescale pending
class _Actor:
    """A fake PS or worker actor: ``handle.method.remote(*args)`` returns a call
    that the fake ``ray.get`` makes; a dead one raises as Ray's does."""

    def __init__(self, name: str, params: list[float] | None = None) -> None:
        self.name, self.dead, self.calls = name, False, []
        self.state = ShardState(np.array(params or [], np.float32))
        self.version = -1

    def __getattr__(self, method: str) -> SimpleNamespace:
        return SimpleNamespace(remote=lambda *args, **kw: lambda: self._call(method, args))

    def _call(self, method: str, args: tuple) -> object:
        if self.dead:
            raise ray_errors.RayActorError()
        self.calls.append(method)
        if method == "set_state":
            self.state, self.version = args[0], args[1]
        return self.state


def _starting(t: tasks.Task) -> SimpleNamespace:
    """A started task of a pending change (it runs: ``to_task`` gives ``t``; not a standby)."""
    return SimpleNamespace(handle=t.handle, task=t, reservation=None)


def _fake_job(tmp_path, monkeypatch, ps: dict[str, list[float]], workers: list[str], restore_ps: list[str]):
    """A job at step 4 on fake tasks: ``ps`` {name: its shard's parameters},
    ``workers``; a restore of the PS starts ``restore_ps``. ``.t[name]``: each
    task, ``.killed``: the names of the tasks killed, ``.rewound``: the steps
    of the checkpoints the job went back to."""
    from elasticps.runtime import task_group

    killed: list[str] = []

    def kill(handle: _Actor) -> None:
        killed.append(handle.name)
        handle.dead = True

    monkeypatch.setattr(task_group, "ray", SimpleNamespace(get=lambda refs, timeout=None: [r() for r in refs]))
    monkeypatch.setattr(tasks, "is_alive", lambda handle, timeout_s: not handle.dead)
    monkeypatch.setattr(tasks, "kill", kill)
    monkeypatch.setattr(tasks, "retire", lambda handles: None)
    monkeypatch.setattr(tasks, "all_ready", lambda pending: True)
    monkeypatch.setattr(tasks, "to_task", lambda p: p.task)
    monkeypatch.setattr(tasks, "wait_ready", lambda pending, timeout_s, names: [p.task for p in pending])
    monkeypatch.setattr(tasks, "free_now", lambda: {"n0": {"CPU": 64.0}})  # room for any restore
    t = {name: tasks.Task("ps", _Actor(name, params), "n", 0) for name, params in ps.items()}  # type: ignore[arg-type]
    t.update({name: tasks.Task("worker", _Actor(name), "n", 0) for name in workers})  # type: ignore[arg-type]
    t.update({name: tasks.Task("ps", _Actor(name), "n", 0) for name in restore_ps})  # type: ignore[arg-type]
    config = JobConfig(checkpoint_dir=str(tmp_path))
    lock = threading.RLock()
    group = TaskGroup(lock)
    shape = Shape(len(ps), len(workers))
    group.install(shape, {i: t[n] for i, n in enumerate(ps)}, {i: t[n] for i, n in enumerate(workers)}, None, 0)
    requests = Requests(shape, lock)
    events: list[str] = []
    hooks = JobHooks(events.append, lambda: None, lambda: 4)
    rescaler = Rescaler(None, config, group, requests, hooks)
    new_ps = {i: _starting(t[n]) for i, n in enumerate(restore_ps)}
    monkeypatch.setattr(
        rescaler,
        "launch",
        lambda shape, request_id, reason, strict: PendingChange(request_id, shape, new_ps, {}, 0.0, reason),
    )
    checkpoints = Checkpoints(config, events.append)
    rewound: list[int] = []
    recovery = Recovery(rescaler, checkpoints, hooks, lambda ckpt: rewound.append(ckpt.step))
    return SimpleNamespace(
        t=t,
        group=group,
        requests=requests,
        events=events,
        rescaler=rescaler,
        checkpoints=checkpoints,
        recovery=recovery,
        killed=killed,
        rewound=rewound,
    )


def test_a_restore_of_the_ps_cancels_a_pending_rescale_that_keeps_the_old_shards(tmp_path, monkeypatch):
    """A rescale 2x1 -> 2x2 is starting its new worker (it keeps both running
    PS) when PS 1 dies: the restore replaces both PS, so the pending change
    must not switch back to the killed ones; its request is launched again."""
    job = _fake_job(tmp_path, monkeypatch, {"p0": [1, 2], "p1": [3, 4]}, ["w0"], ["q0", "q1"])
    t = job.t
    t["w1"] = tasks.Task("worker", _Actor("w1"), "n", 0)  # type: ignore[arg-type]
    rid = job.requests.ask(Shape(2, 2))
    job.rescaler.pending = PendingChange(
        rid, Shape(2, 2), {}, {1: _starting(t["w1"])}, 0.0, "request", {0: t["p0"], 1: t["p1"]}
    )
    job.checkpoints.save(_checkpoint(2))
    t["p1"].handle.dead = True
    job.recovery.recover(RuntimeError("lost"))

    assert [p.handle.name for p in job.group.ps] == ["q0", "q1"] and {"p0", "p1"} <= set(job.killed)
    assert job.rescaler.pending is None and "w1" in job.killed  # its new worker is stopped too
    assert job.requests.unlaunched(None)  # the next boundary starts the request again, on the new shards


# -------------------------------------------- a task dies while a shape change is switched in
@pytest.mark.parametrize(
    ("dead_ps", "dead_workers", "dead_starting", "gathered", "expected"),
    [
        # an old PS died before the gather: the shards are lost, back to the checkpoint
        (1, 0, 0, False, RecoveryPlan("lost", user_code=False, no_workers=False, replace=False)),
        # an old PS died during the install: the state gathered at this step is whole
        (1, 0, 0, True, RecoveryPlan("lost", user_code=False, no_workers=False, replace=False, from_state=True)),
        # a new PS died during the install: the old shards may be re-cut, torn, though none of them died
        (0, 0, 1, True, RecoveryPlan("torn", user_code=False, no_workers=False, replace=False, from_state=True)),
        # a new task died before anything was gathered: nothing to restore, the change starts again
        (0, 0, 1, False, RecoveryPlan(None, user_code=False, no_workers=False, replace=False)),
        # nothing died: the program's code failed (its optimizer, building a shard)
        (0, 0, 0, True, RecoveryPlan(None, user_code=True, no_workers=False, replace=False)),
    ],
)
def test_recovery_plan_after_a_failed_switch(dead_ps, dead_workers, dead_starting, gathered, expected):
    got = plan_recovery(dead_ps, dead_workers, 2, gathered, True, dead_starting=dead_starting, have_state=gathered)
    assert got == expected


def test_step_timeouts_fail_the_job_in_a_row_only_not_across_a_step_that_stood(tmp_path, monkeypatch):
    """Step 4 runs out of time twice (its late worker stopped each time), is redone and stands; a
    restore that goes back to an earlier checkpoint brings step 4 again, which runs out of time:
    the first time in a row, not the third. The job fails at the third in a row."""
    workers = [f"w{i}" for i in range(2 * MAX_STEP_TIMEOUTS)]
    job = _fake_job(tmp_path, monkeypatch, {"p0": [1, 2]}, workers, [])
    late = iter(workers)

    def time_out() -> None:
        name = next(late)
        job.t[name].handle.dead = True  # stopped as taken for hung
        job.recovery.recover(ray_errors.GetTimeoutError(f"{name} did not hand in its gradient; taken for hung"))

    for _ in range(MAX_STEP_TIMEOUTS - 1):
        time_out()
    job.recovery.stood()
    for _ in range(MAX_STEP_TIMEOUTS - 1):
        time_out()
    with pytest.raises(JobFailedError, match=f"step 4 ran out of time {MAX_STEP_TIMEOUTS} times in a row"):
        time_out()
    assert [w.handle.name for w in job.group.workers] == workers[-2:]  # the job failed before it dropped the last


def test_tasks_a_wait_took_for_hung_are_dropped_unasked_though_their_kill_has_not_landed(tmp_path, monkeypatch):
    """Ray carries a kill out asynchronously: a task the controller's wait killed may still answer
    a ping just after. Recovery drops the tasks the step's errors name (the controller's
    TakenForHung, and through ``hung`` the step's other error's) without asking them, and marks
    no node suspect for them (a hang says nothing of its node); a task that died does."""
    job = _fake_job(tmp_path, monkeypatch, {"p0": [1, 2]}, ["w0", "w1", "w2", "w3"], [])
    monkeypatch.setattr(tasks, "kill", lambda handle: job.killed.append(handle.name))  # not carried out yet
    job.recovery.recover(TakenForHung("worker-1 did not hand in its gradient; taken for hung", ("worker-1",)))
    assert [w.handle.name for w in job.group.workers] == ["w0", "w2", "w3"] and "w1" in job.killed
    assert not job.rescaler.suspects.suspect("n", time.monotonic())
    job.recovery.stood()
    job.t["w0"].handle.dead = True
    job.recovery.recover(ray_errors.RayActorError(), hung=("worker-2",))  # w3 is worker-2 now
    assert [w.handle.name for w in job.group.workers] == ["w2"]
    assert job.rescaler.suspects.suspect("n", time.monotonic())  # w0 died there


@pytest.fixture
def switch_job(tmp_path, monkeypatch):
    """A 1x2 job at step 4 on fake tasks, with a rescale to 2x2 whose new PS
    q1 runs: the next boundary re-cuts the state [1, 2, 3, 4] over p0 and q1;
    a restore of the PS starts r0."""
    job = _fake_job(tmp_path, monkeypatch, {"p0": [1, 2, 3, 4]}, ["w0", "w1"], ["r0"])
    t = job.t
    t["q1"] = tasks.Task("ps", _Actor("q1"), "n", 0)  # type: ignore[arg-type]
    job.rid = job.requests.ask(Shape(2, 2))
    job.rescaler.pending = PendingChange(
        job.rid, Shape(2, 2), {1: _starting(t["q1"])}, {}, 0.0, "request", {0: t["p0"]}, {0: t["w0"], 1: t["w1"]}
    )
    job.p0, job.q1, job.r0, job.w1 = (t[n].handle for n in ("p0", "q1", "r0", "w1"))
    return job


def test_a_new_ps_dead_at_the_switch_restores_the_torn_shards_from_the_gathered_state(switch_job):
    """The running PS takes its half of the re-cut state, the new one is dead:
    the old shard is torn though no task the job used died. The whole state
    gathered at step 4 goes onto a new shard; nothing goes back to a checkpoint
    (there is none) and the request is started again."""
    job = switch_job
    job.q1.dead = True
    with pytest.raises(SwitchFailed) as failed:
        job.rescaler.at_boundary()
    assert job.p0.calls == ["get_state", "set_state"] and list(job.p0.state.params) == [1, 2]  # torn
    job.recovery.recover_switch(failed.value)

    assert [t.handle for t in job.group.ps] == [job.r0] and "p0" in job.killed and "q1" in job.killed
    assert list(job.r0.state.params) == [1, 2, 3, 4] and job.r0.version == 4 and job.rewound == []
    assert any("the PS restored from the state gathered at step 4 (no steps lost)" in e for e in job.events)
    assert not any("shard(s) died" in e for e in job.events), job.events
    assert job.rescaler.pending is None and job.requests.unlaunched(None) and job.rescaler.records == []


def test_an_old_ps_dead_at_the_switch_restores_from_the_checkpoint(switch_job):
    job = switch_job
    job.checkpoints.save(_checkpoint(2))
    job.p0.dead = True
    with pytest.raises(SwitchFailed) as failed:
        job.rescaler.at_boundary()
    assert failed.value.state is None  # the gather failed
    job.recovery.recover_switch(failed.value)
    assert [t.handle for t in job.group.ps] == [job.r0] and job.rewound == [2] and job.r0.version == 2
    assert any("1 PS shard(s) died; restored from checkpoint at step 2 (lost 2 steps)" in e for e in job.events)
    assert "q1" in job.killed and job.requests.unlaunched(None)


def test_a_rescale_whose_switch_keeps_failing_fails_with_the_reason(switch_job):
    job = switch_job
    for _ in range(MAX_SWITCH_FAILURES):
        assert job.requests.unlaunched(None) and not job.rescaler.records
        failed = SwitchFailed(job.rid, Shape(2, 2), [], None, ray_errors.RayActorError())
        job.rescaler.switch_failed(failed, None)
    [record] = job.rescaler.records
    assert record.request_id == job.rid and not record.ok
    assert f"a task died while it was switched in, {MAX_SWITCH_FAILURES} times" in record.error
    assert not job.requests.unlaunched(None) and job.requests.target.num_workers == 2


def test_a_torn_update_says_what_happened_when_it_restores(switch_job):
    """A worker's gradient was lost after some shards applied step 4: the
    event names the torn update, not "0 PS shard(s) died"; the pending
    rescale kept that worker, so it is started again."""
    job = switch_job
    job.checkpoints.save(_checkpoint(2))
    job.w1.dead = True
    job.recovery.recover(ray_errors.RayActorError(), ps_inconsistent=True)
    assert job.rewound == [2] and [t.handle for t in job.group.ps] == [job.r0] and len(job.group.workers) == 1
    want = "an update failed part-way (a worker's gradient was lost); restored from checkpoint at step 2 (lost 2 steps)"
    assert want in job.events and not any("shard(s) died" in e for e in job.events), job.events
    assert job.rescaler.pending is None and "q1" in job.killed


def test_a_ps_dead_before_any_step_applied_is_restored_from_the_state_gathered_at_this_step(tmp_path, monkeypatch):
    """A gather at step 4 (a switch's, a checkpoint's) is the shards' whole state
    until a step applies: a PS that dies meanwhile is restored from it, no step
    lost; once a step applied, the restore goes back to the checkpoint."""
    job = _fake_job(tmp_path, monkeypatch, {"p0": [1, 2]}, ["w0"], ["r0"])
    group, r0 = job.group, job.t["r0"].handle
    assert group.state_at(4) is None  # installed without a state
    group.gather_state(4)
    assert list(group.state_at(4).params) == [1, 2] and group.state_at(5) is None
    job.t["p0"].handle.dead = True
    job.recovery.recover(RuntimeError("lost"))
    assert [t.handle for t in group.ps] == [r0] and list(r0.state.params) == [1, 2] and r0.version == 4
    assert job.rewound == [] and any("gathered at step 4 (no steps lost)" in e for e in job.events)
    group.stepped(["refs of step 5"])  # a step applied: the state of step 4 is stale
    assert group.state_at(4) is None and group.param_refs == ["refs of step 5"]


@pytest.mark.parametrize("value", [0.0, -5.0, math.inf, math.nan])
def test_a_step_timeout_is_refused_unless_positive_and_finite(value):
    with pytest.raises(ConfigError, match="step_timeout_s must be > 0 and finite"):
        JobConfig(step_timeout_s=value)
