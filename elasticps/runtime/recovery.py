"""After a failed step: doing what :func:`~elasticps.runtime.recovery_plan.plan_recovery`
says to (:class:`Recovery`).

What a failed step may have left, and what restores it:

- a worker died before its gradient was in: no shard updated, the step is
  redone by the workers left (the data position did not move);
- a worker died after its gradient was in: the step stands, the dead worker
  is dropped;
- an update failed part-way (a worker's gradient was lost after some shards
  applied the step): the shards disagree on the step, so every shard is
  restored from the newest checkpoint, and with it the step, the data
  position and a user loop's state;
- a PS shard died: the same restore, onto new shards (as many as there
  were, or fewer where a rescale to fewer was asked and not applied yet,
  or where the alive nodes have room for fewer now);
- no task died: the program's own code failed (:class:`UserCodeError`);
- a task did not answer within ``step_timeout_s``, or another task's own
  wait on it ran out (the error names it): it is stopped (taken for hung),
  and the step is recovered from as from its death; the same step
  running out of time ``MAX_STEP_TIMEOUTS`` times in a row fails the job;
- the same step failing ``MAX_STEP_FAILURES`` times in a row, whatever the
  cause, fails the job: a program that ends its own process on that step's
  data (``os._exit``, a crash in native code, running out of memory) would
  otherwise be replaced, and die, for ever.

A restore takes the shards' whole state at the job's step if the group still
holds it (gathered by a switch or a checkpoint, or installed, at this step and
no step applied since: :meth:`TaskGroup.state_at`): then no step is lost.
After a failed step a user's loops, which ran part of it, go back to their
registered state at that step as well; where it was not taken (a switch
gathers the shards only), the restore takes the checkpoint instead.

A task may die between two steps as well, while the job reads the shards (a
checkpoint, an evaluation) or starts: :meth:`Recovery.between_steps` recovers
as after a failed step and reads again, and :meth:`Recovery.start` starts the
job's tasks again; each fails the job with the last cause after
``MAX_READ_TRIES`` / ``MAX_START_FAILURES`` tries (a read's tries go on
across the returns to a checkpoint it caused).

A task may also die while a shape change is switched in at a boundary (the
running shards' state gathered, re-cut and installed on the new PS list):
:meth:`Recovery.recover_switch` stops the change's new tasks and recovers the
running ones the same way, except that once the switch had gathered the
state, the shards are restored from it (the state at this step: no step is
lost). A new PS that dies after the running shards took their new cut leaves
them torn though none of them died. The change is then started again against
the tasks there are, and its request fails after ``MAX_SWITCH_FAILURES``.

A shape change whose new tasks were starting keeps running tasks by
identity; if the recovery removed one of them, the change is cancelled and
its request started again at the next boundary (switching to it would bring
the dead task back, and a killed PS fails the switch).

The caller (the job's step) says which of the first cases it was by
``ps_inconsistent``; the liveness of the tasks says the rest. A restore
happens between two steps like any shape change, so the next step reads whole
shards only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import ray

from elasticps.errors import JobFailedError, PlacementError, TrainingFunctionError, UserCodeError, error_text
from elasticps.runtime import tasks
from elasticps.runtime.bounded_get import hung_in, waited_on
from elasticps.runtime.checkpoint import Checkpoint, Checkpoints
from elasticps.runtime.membership import Shape, task_name
from elasticps.runtime.recovery_plan import plan_recovery
from elasticps.runtime.rescale import JobHooks, Rescaler, SwitchFailed
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.slots import shards_that_fit

MAX_READ_TRIES = 3  # a read of the shards between two steps fails the job after this many tries
MAX_START_FAILURES = 3  # a job whose tasks die this often while it starts fails
MAX_STEP_TIMEOUTS = 3  # a step whose tasks are taken for hung this many times in a row fails the job
MAX_STEP_FAILURES = 5  # a step that fails this many times in a row (tasks dead or hung) fails the job
ROOM_SETTLE_S = 2.0  # how long a restore reads Ray's view again for the room a dead shard left

T = TypeVar("T")


class Recovery:
    """Restores the tasks of ``rescaler``'s job after a failed step (new ones
    start through it). ``rewind(ckpt)``: set the job's step, data position and
    loop state back to ``ckpt``'s (before the shards get its state).
    ``loops_back(step)``: a user's loops, which ran part of a failed step, go
    back to their registered state at ``step`` (False: it is not known, and
    the shards are not restored from the state at ``step`` either)."""

    def __init__(
        self,
        rescaler: Rescaler,
        checkpoints: Checkpoints,
        hooks: JobHooks,
        rewind: Callable[[Checkpoint], None],
        loops_back: Callable[[int], bool] = lambda step: True,
    ) -> None:
        self.rescaler = rescaler
        self.config, self.group, self.requests = rescaler.config, rescaler.group, rescaler.requests
        self.checkpoints = checkpoints
        self._event, self._flush, self._step = hooks.event, hooks.flush_window, hooks.step
        self._rewind = rewind
        self._loops_back = loops_back
        self._read_tries: dict[str, int] = {}  # failed tries of a read between steps not yet done, by its name
        self._in_a_row = (-1, 0, 0)  # the last step that failed, how many times in a row, how many ran out of time
        self._stale_losses: dict[int, tuple[int, int]] = {}  # by step: every worker lost there, and of those timeouts

    def stood(self) -> None:
        """A step stood (every shard applied it): the steps that failed or ran
        out of time before it are no longer in a row with the next that does."""
        self._in_a_row = (-1, 0, 0)

    def recover(self, exc: BaseException, ps_inconsistent: bool = False, hung: tuple[str, ...] = ()) -> None:
        """After a failed step: drop dead workers, restore lost PS, or give up.

        ``ps_inconsistent``: the failure hit the update, so some shards may have
        applied the step and others not; the PS are restored from the checkpoint.
        ``hung``: tasks the step's other error took for hung (``exc``'s are read from it).
        A step that ran out of time (its late tasks were stopped) is recovered
        from as a death, but fails the job the ``MAX_STEP_TIMEOUTS``-th time in
        a row (no step stood between: :meth:`stood`): tasks that hang at the same step each time (a user loop's
        deadlock) would otherwise be replaced, and hang, for ever.
        """
        torn = "an update failed part-way (a worker's gradient was lost)"
        step = self._step()
        late = isinstance(exc, ray.exceptions.GetTimeoutError)  # the controller's wait, or a task's own
        if late:  # the tasks it names were stopped (or are, by _recover): say why they died
            self._event(error_text(getattr(exc, "cause", None) or exc))
        _, times, timeouts = self._in_a_row if self._in_a_row[0] == step else (step, 0, 0)
        self._in_a_row = (step, times + 1, timeouts + late)
        if late and timeouts + 1 >= MAX_STEP_TIMEOUTS:
            raise JobFailedError(
                f"step {step} ran out of time {MAX_STEP_TIMEOUTS} times in a row (the last: {error_text(exc)}); "
                "raise step_timeout_s if its steps are that slow"
            ) from exc
        if times + 1 >= MAX_STEP_FAILURES:
            raise JobFailedError(
                f"step {step} failed {MAX_STEP_FAILURES} times in a row (the last: {error_text(exc)}); "
                "does the program end its own process on this step's data (os._exit, a crash in native code, "
                "out of memory)?"
            ) from exc
        state = self.group.state_at(step)
        if state is not None and not self._loops_back(step):  # the loops cannot redo the step from there
            state = None
        self._recover(exc, ps_inconsistent, torn, f"step {step}", state=state, hung=hung)

    def recover_switch(self, failed: SwitchFailed) -> None:
        """After a shape change failed while it was switched in at a boundary:
        stop its new tasks, recover the running ones as after a failed step
        (the shards from the state it gathered if it got that far), then start
        the change again against the tasks there are (or fail its request)."""
        shape = failed.shape
        self._event(
            f"the rescale to {shape.num_ps}x{shape.num_workers} failed while it was switched in: {failed.cause_text}"
        )
        timeout = self.config.liveness_timeout_s
        dead_starting = sum(not tasks.is_alive(p.handle, timeout) for p in failed.starting)
        for p in failed.starting:
            tasks.stop(p)
        try:
            self._recover(
                failed.cause,
                failed.state is not None,
                "a task died while the shards were re-cut",
                f"the rescale at step {self._step()}",
                state=failed.state if failed.state is not None else self.group.state_at(self._step()),
                dead_starting=dead_starting,
            )
        except Exception as exc:
            self.rescaler.switch_failed(failed, f"the job failed while it was switched in: {type(exc).__name__}: {exc}")
            raise
        self.rescaler.switch_failed(failed, None)

    def between_steps(self, read: Callable[[], T], what: str) -> tuple[T | None, bool]:
        """``read()`` (a checkpoint, an evaluation: it reads the tasks between
        two steps); a task that died meanwhile is recovered as after a failed
        step, and the read tried again. ``what`` names it for events and errors,
        and counts its tries: a read that sent the job back to a checkpoint comes
        again once the steps are redone, and its tries go on from where they were
        (a PS that dies at every read would otherwise redo the same steps for ever).

        Returns ``(read's value, True)``, or ``(None, False)`` if the recovery
        went back to a checkpoint: the job is at an earlier step, so what the
        caller read for is undone with it."""
        step = self._step()
        while True:
            try:
                value = read()
            except ray.exceptions.RayError as exc:
                tries = self._read_tries.get(what, 0) + 1
                self._read_tries[what] = tries
                if tries >= MAX_READ_TRIES:
                    raise JobFailedError(f"{what} failed {tries} times (the last: {error_text(exc)})") from exc
                self._event(f"{what} failed ({error_text(exc)}); recovering")
                self._recover(exc, False, "", what, state=self.group.state_at(step))
                if self._step() != step:
                    return None, False
            else:
                self._read_tries.pop(what, None)
                return value, True

    def start(self, shape: Shape, request_id: int, state: ShardState) -> None:
        """The job's first install: start ``shape``'s tasks and give the shards
        ``state``. If a task dies meanwhile (before it runs or during the
        install), every task is stopped and started again, up to
        ``MAX_START_FAILURES`` times; no room, or an error of the program's
        own code, fails at once."""
        for attempt in range(1, MAX_START_FAILURES + 1):
            pending = self.rescaler.launch(shape, request_id, reason="start", strict=True)
            started: list[tasks.Task] = []
            try:
                started = tasks.wait_ready(pending.starting(), self.config.placement_timeout_s, pending.names())
                self.rescaler.install(pending, started, state)
                return
            except (ray.exceptions.RayError, PlacementError) as exc:
                died = self._died_starting(exc, started)  # before the kill below, which would make every task dead
                for p in pending.starting():
                    tasks.stop(p)
                if not died:
                    raise
                self.group.nodes_used.update(t.node_id for t in started)  # swept at shutdown
                if attempt == MAX_START_FAILURES:
                    raise JobFailedError(
                        f"a task died while the job started, {attempt} times (the last: {error_text(exc)})"
                    ) from exc
                self._event(f"a task died while the job started ({error_text(exc)}); starting its tasks again")
        raise AssertionError("unreachable")

    def _died_starting(self, exc: BaseException, started: list[tasks.Task]) -> bool:
        """Whether ``exc`` of a start means a task died (not: no room, or the
        program's code failed in a task, which a new start would repeat)."""
        if isinstance(exc, PlacementError):  # before the tasks ran: a death, unless their constructor failed
            cause = exc.__cause__
            return isinstance(cause, ray.exceptions.RayActorError) and not cause.actor_init_failed
        timeout = self.config.liveness_timeout_s
        return any(not tasks.is_alive(t.handle, timeout) for t in started)

    def _recover(
        self,
        exc: BaseException,
        ps_inconsistent: bool,
        torn_why: str,
        during: str,
        state: ShardState | None = None,
        dead_starting: int = 0,
        hung: tuple[str, ...] = (),
    ) -> None:
        self._flush()  # the open window's steps ran in a row at the shape there was: the redone ones start a new one
        group = self.group
        ran_out = waited_on(exc) is not None or bool(hung)  # a wait ran out (a task's own or the controller's)
        hung = tuple(dict.fromkeys((*hung_in(exc), *hung)))  # on these
        stopped = {id(t) for t in group.stop(hung)}  # taken for hung: dead, whatever a ping says just after the kill
        timeout = self.config.liveness_timeout_s
        dead_ps = [t for t in group.ps if id(t) in stopped or not tasks.is_alive(t.handle, timeout)]
        dead_workers = [t for t in group.workers if id(t) in stopped or not tasks.is_alive(t.handle, timeout)]
        # a task's own code may hang on any node: only the nodes of tasks that died are suspect
        died = [t.node_id for t in dead_ps + dead_workers if id(t) not in stopped]
        self.rescaler.suspects.mark(died, time.monotonic())
        plan = plan_recovery(
            len(dead_ps),
            len(dead_workers),
            len(group.workers),
            ps_inconsistent,
            self.config.replace_dead_workers,
            dead_starting,
            state is not None,
        )
        # A user's loops all gone, their registered state (a scheduler, a counter) last taken at an earlier step:
        # new loops would go on from the parameters of this step with the state of that one. Back to a checkpoint,
        # where the two were written together (a program's own steps keep no state in its workers: never stale).
        stale = plan.no_workers and not self._loops_back(self._step())
        if stale:
            self._count_stale_loss(exc, ran_out)
        source = state if plan.from_state and not stale else None
        if plan.restore == "torn":
            self._restore_ps(torn_why, source)
        if plan.user_code and not ran_out:  # nothing died and no wait ran out: the program's code failed
            cause = getattr(exc, "cause", None) or exc
            what = cause if isinstance(cause, TrainingFunctionError) else f"{type(cause).__name__}: {cause}"
            raise UserCodeError(f"{during} failed in user code: {what}") from exc
        if dead_workers:
            left = len(group.workers) - len(dead_workers)
            self._event(f"{len(dead_workers)} worker(s) died; " + (f"continuing with {left}" if left else "none left"))
            group.remove(dead_workers)
        if plan.restore == "lost":
            self._restore_ps(f"{len(dead_ps)} PS shard(s) died", source)
        elif stale and plan.restore is None:
            self._restore_ps("every worker died, their loops' registered state not taken at this step", None)
        if plan.no_workers:
            if not plan.replace:
                raise JobFailedError("every worker died and replace_dead_workers is off") from exc
            self._replace_workers()
        self.rescaler.drop_stale()  # a shape change that was starting may keep tasks just removed

    def _count_stale_loss(self, exc: BaseException, ran_out: bool) -> None:
        """Every worker lost at this step, which sends the job back to a checkpoint:
        the steps redone from there stand, so :meth:`recover`'s count of failures
        in a row starts again each time. Counted here by the step instead: a loop
        whose workers die (or hang) at the same step every time fails the job as
        that count would have, not goes back for ever."""
        step = self._step()
        times, timeouts = self._stale_losses.get(step, (0, 0))
        times, timeouts = times + 1, timeouts + ran_out
        self._stale_losses[step] = (times, timeouts)
        if times >= MAX_STEP_FAILURES or timeouts >= MAX_STEP_TIMEOUTS:
            raise JobFailedError(
                f"every worker was lost at step {step} {times} times, each time sent back to a checkpoint (the "
                f"last: {error_text(exc)}); does the loop end its own process or hang on this step's data?"
            ) from exc

    def _replace_workers(self) -> None:
        pending = self.rescaler.launch(self.requests.target, self.requests.applied, "replace", strict=False)
        names = [task_name("worker", i) for i in pending.new_workers]
        started = tasks.wait_ready(list(pending.new_workers.values()), self.config.placement_timeout_s, names)
        for p in pending.new_ps.values():
            tasks.stop(p)
        self.group.install(Shape(len(self.group.ps), len(started)), {}, dict(enumerate(started)), None, self._step())
        self._event(f"replaced all workers ({len(started)})")

    def _restore_ps(self, why: str, state: ShardState | None) -> None:
        """New shards with ``state`` (the whole state at this step), else with
        the newest checkpoint's, and the job goes back to its step. ``why``:
        what happened, for the event and errors."""
        ckpt = None
        if state is None:
            if self.checkpoints.store is None:
                raise JobFailedError(f"{why} and no checkpoint_dir is configured")
            ckpt = self.checkpoints.latest()
            if ckpt is None:
                raise JobFailedError(f"{why} before the first checkpoint")
        group = self.group
        # every shard is started again: where a rescale to fewer asked and was not applied yet, start those;
        # and no more than there is room for now (a cluster that lost a node may have none for as many as
        # there were: they would wait out placement_timeout_s and the job would fail)
        wanted = min(len(group.ps), max(1, self.requests.target.num_ps))
        group.remove(list(group.ps))
        placement = {k: v for k, v in self.requests.target.placement.items() if k.startswith("ps-")}
        room = self._ps_room(wanted, placement)
        num_ps = max(1, min(wanted, room))
        if room < wanted:
            why = f"{why}; room for {room} of {wanted} shards now, starting {num_ps}"
        pending = self.rescaler.launch(
            Shape(num_ps, len(group.workers), placement), self.requests.applied, "restore", strict=False
        )
        for p in pending.new_workers.values():
            tasks.stop(p)
        names = [task_name("ps", i) for i in pending.new_ps]
        started = tasks.wait_ready(list(pending.new_ps.values()), self.config.placement_timeout_s, names)
        shape = Shape(num_ps, len(group.workers))
        if ckpt is None:
            step = self._step()
            group.install(shape, dict(enumerate(started)), {}, state, step)
            self._event(f"{why}; the PS restored from the state gathered at step {step} (no steps lost)")
            return
        lost = self._step() - ckpt.step
        self._rewind(ckpt)
        group.install(shape, dict(enumerate(started)), {}, ckpt.state, ckpt.step)
        self._event(f"{why}; restored from checkpoint at step {ckpt.step} (lost {lost} steps)")

    def _ps_room(self, wanted: int, placement: dict[str, str]) -> int:
        """How many of ``wanted`` PS shards (pinned by ``placement``) fit on the
        alive nodes now. Ray's view frees a dead or just stopped task's share
        some 100 ms later: read again for up to ``ROOM_SETTLE_S`` while short."""
        need = self.config.ps_resources.as_ray_resources()
        pins = {i: placement[task_name("ps", i)] for i in range(wanted) if task_name("ps", i) in placement}
        deadline = time.monotonic() + ROOM_SETTLE_S
        while True:
            room = shards_that_fit(wanted, need, pins, tasks.free_now())
            if room >= wanted or time.monotonic() >= deadline:
                return room
            time.sleep(0.05)
