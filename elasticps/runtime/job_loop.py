"""The job's loop: what the job controller does between two steps (a new
batch, a shape change, a checkpoint), in a step (sync, or a segment of async
steps), at the end of an epoch, and to account each; and the hooks of a
user's own loop; :meth:`JobLoop.run` orders them. :class:`JobLoop` is the
base of :class:`~elasticps.runtime.controller.JobController`, whose
``__init__`` makes the pieces it uses.

The correctness argument is the order in which :meth:`JobLoop.run` calls
the pieces. A change is applied only between two steps: ``_boundary`` changes
the batch and the shape (``Rescaler.at_boundary`` re-cuts the shards' state
over the new PS before the next step reads it), and no step is in flight then
(a sync step waits for its updates; an async segment drains first). Recovery
restores what a step half-applied before the next one starts: a step that no
shard applied is redone, one that every shard applied stands, and shards torn
between the two are restored, with the step and data position, from the
newest checkpoint (``recovery``). A task that dies while a shape change is
switched in is recovered from the same way, the shards from the state the
switch gathered at this boundary if it got that far; the change then starts
again against the tasks there are. So is one that dies while the job starts,
or between two steps while a checkpoint, an evaluation or the end of a
loop's epoch reads the tasks: those reads go through
``Recovery.between_steps``, and a read that sent the job back to a
checkpoint is dropped with the step it was for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from elasticps.errors import JobFailedError
from elasticps.program import TrainingProgram
from elasticps.runtime import steps, tasks, user_loop
from elasticps.runtime.checkpoint import Checkpoint, Checkpoints
from elasticps.runtime.config import JobConfig, TaskResources
from elasticps.runtime.evaluate import Evaluator
from elasticps.runtime.membership import Requests
from elasticps.runtime.progress import Progress
from elasticps.runtime.recorder import Shape as RecordedShape
from elasticps.runtime.recorder import StepRecorder
from elasticps.runtime.recovery import Recovery
from elasticps.runtime.reports import EpochReport, JobReport
from elasticps.runtime.rescale import Rescaler, SwitchFailed
from elasticps.runtime.standby import StandbyPool
from elasticps.runtime.task_group import TaskGroup

log = logging.getLogger("elasticps.runtime")


class JobLoop:
    """The loop of one job; the pieces and the state it reads are the controller's."""

    program: TrainingProgram
    config: JobConfig
    state: str
    final_metric: float | None
    _stop: threading.Event
    _on_epoch: Callable[[EpochReport], None] | None
    _epochs_told: int
    _loop: user_loop.LoopState | None
    _requests: Requests
    _progress: Progress
    _group: TaskGroup
    _record: StepRecorder
    _rescale: Rescaler
    _checkpoints: Checkpoints
    _recovery: Recovery
    _evaluate: Evaluator
    _standby: StandbyPool | None
    # of the controller's API: the running tasks, the step, the parameters, start, a checkpoint and the report
    ps: list[tasks.Task]
    workers: list[tasks.Task]
    step: int
    parameters: Callable[[], np.ndarray]
    start: Callable[[], None]
    checkpoint: Callable[[], None]
    report: Callable[[], JobReport]

    # ---------------------------------------------------------- the loop
    def run(self, max_steps: int | None = None) -> JobReport:
        """Train until the job is done, ``max_steps`` more steps ran, or :meth:`stop`."""
        p = self._progress
        try:
            self.start()
            first = p.step
            ended = False
            while not ended:  # a task that dies as the run ends may send the job back to a checkpoint
                while not p.done and not self._stop.is_set():
                    if max_steps is not None and p.step - first >= max_steps:
                        break
                    self._boundary()
                    if self.config.mode == "sync":
                        self._sync_step()
                    else:
                        budget = None if max_steps is None else first + max_steps - p.step
                        self._async_segment(budget)
                self._flush_window()
                ended = self._end_run()
        except Exception as exc:
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            self._event(f"failed: {self.error}")
            self._rescale.drop_unapplied(self.state)  # e.g. its tasks were lost, and with them the job
            raise
        if self.state in ("finished", "stopped"):
            self._rescale.drop_unapplied(self.state)
        return self.report()

    def _fill_standbys(self) -> None:
        """Start standby workers up to ``standby_workers``, counting those that
        train as workers or are taken for a change: the job's start fills the
        pool, and a standby lost later (it died, or a failed change stopped it)
        is started again. A grow's standbys come back at the shrink, not here."""
        if self._standby is None:
            return
        taken = sum(w.reservation is not None for w in self._group.workers)
        pending = self._rescale.pending
        if pending is not None:
            taken += sum(p.reservation is not None for p in pending.new_workers.values())
        idle = TaskResources(cpu=0.0, cpu_limit=self.config.worker_resources.cpu_limit)  # nothing Ray counts
        start = self._rescale.start_task
        n = self._standby.fill(lambda: start("worker", idle, None, "standby", while_training=True), taken)
        if n:
            self._event(f"starting {n} standby worker(s)")

    def _end_run(self) -> bool:
        """The end of a run: the final metric and checkpoint of a finished or
        stopped job. False: a task died and the job went back to a checkpoint."""
        p = self._progress
        if p.done and self._loop and not self._loop.finished:
            self._loop.finish(self._group, p.step)
        if not (p.done or self._stop.is_set()):
            return True
        if p.done:  # resumed from a checkpoint taken at the very end, no epoch ran here
            last = p.epochs[-1] if p.epochs else None
            metric, read = (last.metric, True) if last and last.step == p.step else self._evaluated("the final")
            if not read:
                return False
            self.final_metric = metric
        if self._checkpoints.store and not self._checkpoint_now():
            if self._loop and self._loop.finished:  # the loops ran to their end: they cannot redo steps
                raise JobFailedError(f"a PS shard died after the loops ended; run the job again (from step {p.step})")
            return False
        self.state = "finished" if p.done else "stopped"
        return True

    # ----------------------------------------------------- between steps
    def _boundary(self) -> None:
        """Between two steps: change the batch, start, apply or fail pending shape
        changes; checkpoint."""
        p = self._progress
        batch = self._requests.take_batch()
        if batch is not None and batch != p.batch_size:
            self._flush_window()  # a window's steps share one batch
            self._event(f"global batch {p.batch_size} -> {batch} ({self.program.lr_text(p.step, batch)})")
            p.batch_size = batch
        try:
            self._rescale.at_boundary()
        except SwitchFailed as failed:  # a task died while a shape change was switched in
            self._recovery.recover_switch(failed)
        self._fill_standbys()
        if self._checkpoints.due(p.step):
            self._checkpoint_now()

    def _checkpoint_now(self) -> bool:
        """A checkpoint between two steps, taken again if a task dies meanwhile
        (:meth:`Recovery.between_steps`). False: the job went back to a checkpoint instead."""
        return self._recovery.between_steps(self.checkpoint, f"the checkpoint at step {self.step}")[1]

    def _evaluated(self, which: str) -> tuple[float | None, bool]:
        """The metric of the parameters now, read again if a task dies meanwhile
        (:meth:`Recovery.between_steps`). False: the job went back to a checkpoint instead."""
        return self._recovery.between_steps(lambda: self._evaluate(self.parameters), f"{which} evaluation")

    # ------------------------------------------------------------- steps
    def _sync_step(self) -> None:
        """One sync step (:func:`steps.sync_step`), then account it or recover."""
        p = self._progress
        idx, next_pos, upcoming = p.next_batch()
        loop = (p.position.epoch, self._loop.joiners) if self._loop else None
        measure = self._measure_gns()
        t0 = time.perf_counter()
        result = steps.sync_step(
            self._group, p.step, idx, upcoming, p.lr(), self.program.seed, measure, loop, steps.Waits.of(self.config)
        )
        if not result.complete:
            # No shard updated: redo the step. Some did: the PS state is torn.
            error = result.stats_error or result.apply_error
            self._recovery.recover(error, ps_inconsistent=result.applied > 0, hung=result.hung)  # type: ignore[arg-type]
            return
        self._group.stepped(result.param_refs)
        self._recovery.stood()
        stats = [s for _, s in result.done]
        if self._loop:
            self._loop.stepped(stats)
        wall = time.perf_counter() - t0
        self._account(stats, result.infos, [w for w, _ in result.done], wall, len(idx), big_batch=len(idx))  # type: ignore[arg-type]
        p.step += 1
        ended = p.advance(len(idx), next_pos)
        if result.stats_error is not None:  # a worker died after its gradient was in: the step stands
            # dropped before the epoch's end reads the tasks (which would drop it first, and leave
            # this error with no dead task: the program's own code's, by the rule of a recovery)
            stood = p.step
            self._recovery.recover(result.stats_error)
            if p.step != stood:  # a PS had died too: back to a checkpoint, whose epoch end comes again
                return
        if ended is not None:
            self._end_epoch(ended)

    def _async_segment(self, budget: int | None) -> None:
        """Async steps (:func:`steps.async_segment`) for one report interval, to
        the epoch's end, ``budget`` steps or a shape change, whichever first."""
        p = self._progress
        local = max(1, p.batch_size // len(self.workers))
        epoch = p.position.epoch
        segment_end = time.monotonic() + self.config.report_interval_s
        handed_out = 0

        def hand_out() -> np.ndarray:
            nonlocal handed_out
            handed_out += 1
            return p.hand_out(local)

        def keep_going() -> bool:
            return (
                p.position.epoch == epoch
                and time.monotonic() < segment_end
                and not self._stop.is_set()
                and (budget is None or handed_out < budget)
                and not self._rescale.pending_ready()
            )

        def applied(stats: dict[str, Any], infos: list[dict[str, float]], w: tasks.Task, wall_s: float) -> None:
            self._recovery.stood()
            self._account([stats], infos, [w], wall_s, stats["samples"], big_batch=0)
            p.count(stats["samples"])

        def discarded(rank: int, staleness: int) -> None:
            self._event(f"discarded a gradient of staleness {staleness} from worker-{rank}")

        failure = steps.async_segment(
            self._group,
            self.program.seed,
            lambda: p.step,
            hand_out,
            keep_going,
            p.lr,
            self.config.max_staleness,
            steps.Waits.of(self.config),
            applied,
            discarded,
        )
        if failure is not None:
            self._recovery.recover(failure.error, ps_inconsistent=failure.ps_inconsistent)
        elif p.position.epoch > epoch:
            self._end_epoch(epoch)

    def _measure_gns(self) -> bool:
        """Whether this step samples the gradient noise scale (every ``gns_every_steps``).
        Never for a user's loop on one worker: its share is the whole batch, so
        there is no small batch to compare with and the shards' norm would be thrown away."""
        every = self.config.gns_every_steps
        if self._loop and len(self._group.workers) < 2:
            return False
        return every > 0 and self._progress.step % every == 0

    # ------------------------------------------------------- bookkeeping
    def _account(
        self,
        stats: list[dict[str, Any]],
        infos: list[dict[str, float]],
        workers: list[tasks.Task],
        wall_s: float,
        samples: int,
        big_batch: int,
    ) -> None:
        ps_nodes = [t.node_id for t in self.ps]
        worker_nodes = [w.node_id for w in workers]
        self._record.account(
            self._progress.step,
            stats,
            infos,
            ps_nodes,
            worker_nodes,
            wall_s,
            samples,
            big_batch,
            self._recorded_shape(),
        )

    def _recorded_shape(self) -> RecordedShape:
        return RecordedShape(len(self.ps), len(self.workers), self._progress.batch_size)

    def _flush_window(self) -> None:
        self._record.flush(self._recorded_shape())

    def _end_epoch(self, epoch: int) -> None:
        p = self._progress
        self._flush_window()
        now = time.monotonic()  # the epoch's time leaves its evaluation out
        if self._loop:  # the loop's code after the epoch (its test pass, report) runs now; its report is the metric
            loop = self._loop
            read = self._recovery.between_steps(
                lambda: loop.finish(self._group, p.step) if p.done else self._snapshot_user_state(),
                f"the loops' end of epoch {epoch}",
            )[1]
            metric, values = user_loop.epoch_metrics(loop.metrics, epoch)
        else:
            (metric, read), values = self._evaluated(f"epoch {epoch}'s"), {}
        if not read:
            return  # the job went back to a checkpoint: this epoch ends again once its steps are redone
        loss, gns = self._record.end_epoch()
        report = p.end_epoch(epoch, now, loss, gns, metric, values, self._group.counts())
        p.start_epoch_clock(time.monotonic())
        metric_text = "" if report.metric is None else f", metric {report.metric:.4f}"
        log.info("%s epoch %d done: %.0f samples/s%s", self.program.name, epoch, report.samples_per_s, metric_text)
        if self._on_epoch and epoch > self._epochs_told:
            self._epochs_told = epoch
            self._on_epoch(report)
        if self._checkpoints.store and not p.done:
            self._checkpoint_now()

    def _event(self, text: str) -> None:
        self._record.event(self._progress.step, text)

    # --------------------------------------------------------- user loop
    def _snapshot_user_state(self) -> None:
        if self._loop:
            p = self._progress
            self._loop.snapshot(self._group, p.step, None if p.done else p.position.epoch)

    def _loop_join(self, joining: list[tasks.Task]) -> None:
        """Workers that join a user's loop start with the registered state of a loop already there."""
        assert self._loop is not None
        self._snapshot_user_state()
        self._loop.join(joining)

    def _loops_back(self, step: int) -> bool:
        """The loops go back to their registered state at ``step`` before they
        redo it (they ran part of it); False: that state was not taken."""
        if not self._loop:
            return True
        if self._loop.state_at != step:
            return False
        self._loop.resume(self._loop.state, step, self.workers)
        return True

    def _rewind(self, ckpt: Checkpoint) -> None:
        """Go back to ``ckpt``'s step, data position and loop state (a restore of the PS)."""
        self._progress.resume(ckpt)
        if self._loop:  # the loops go back to the checkpoint's step with its registered state
            self._loop.resume(ckpt.user_state, ckpt.step, self.workers)
