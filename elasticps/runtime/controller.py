"""The job controller: drives steps, applies rescales at step boundaries, recovers.

One controller runs one job. Its loop is the only code that talks to the job's
actors; :meth:`JobController.rescale`, :meth:`report` and :meth:`stop` may be
called from other threads (or, with :func:`elasticps.runtime.remote_job`, from
other processes) and only leave requests or read snapshots.

The controller coordinates pieces that each do one thing:

- ``membership``: the shape asked for and the decisions of changing it (pure);
- ``task_group``: the running PS and workers, and the parameters of the next step;
- ``rescale``: carrying a shape change out (start, switch to, release tasks);
- ``steps``: the PS step protocol (a sync step, a segment of async steps);
- ``progress``: the step, data position, samples and epochs;
- ``recovery``: what to do after a failed step, and the checkpoints;
- ``recorder``: the windows, events and traffic; ``user_loop``: a user's own loop.

This module is the job's API; the loop that orders the pieces, and the
argument for that order, is its base class :class:`~elasticps.runtime.job_loop.JobLoop`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from elasticps.errors import ConfigError, JobEndedError
from elasticps.program import TrainingProgram, check_batch_fits, load_program
from elasticps.runtime import tasks, user_loop
from elasticps.runtime.checkpoint import Checkpoint, Checkpoints, Layout
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import DataPosition, GlobalBatches
from elasticps.runtime.evaluate import Evaluator
from elasticps.runtime.flat import flat_params, load_flat, param_layout
from elasticps.runtime.job_loop import JobLoop
from elasticps.runtime.membership import Requests, Shape, check_shape
from elasticps.runtime.progress import Progress
from elasticps.runtime.recorder import MAX_WINDOWS, StepRecorder
from elasticps.runtime.recovery import Recovery
from elasticps.runtime.reports import EpochReport, JobReport, RescaleRecord, WindowReport
from elasticps.runtime.rescale import JobHooks, Rescaler, SwitchFailed
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.standby import StandbyPool, release_orphans
from elasticps.runtime.task_group import TaskGroup

log = logging.getLogger("elasticps.runtime")


class JobController(JobLoop):
    """Runs one training job on Ray with a changeable number of PS and workers.

    ``on_window(report)``: called with each progress window: steps run in a
    row at one shape, timed from the start of the first to the end of the
    last. A failed step closes the open window (its time and the recovery's
    are in none); steps that a restore redoes are told again in later
    windows, whose step ranges then overlap earlier ones: they were trained,
    and timed, again. ``on_epoch(report)``:
    called once for each epoch this controller trains to its end, with that
    epoch's :class:`EpochReport`, from the job's loop thread. An epoch that a
    restore undoes (the job went back to a checkpoint taken before it ended)
    is trained again but not reported again: the callback saw it already, and
    in sync mode the redone epoch ends at the same parameters. The redone
    epoch's report (its timing) replaces the first in
    :attr:`JobReport.epoch_reports`.
    """

    def __init__(
        self,
        program: TrainingProgram | str,
        config: JobConfig | None = None,
        num_ps: int = 1,
        num_workers: int = 1,
        placement: dict[str, str] | None = None,
        on_window: Callable[[WindowReport], None] | None = None,
        on_epoch: Callable[[EpochReport], None] | None = None,
    ) -> None:
        self.program = load_program(program)
        self.config = config or JobConfig()
        if user_loop.is_loop(self.program) and self.config.mode != "sync":
            raise ConfigError(f"{self.program.name}: a user's own loop trains in sync mode only")
        if user_loop.is_loop(self.program) and self.config.standby_workers:
            raise ConfigError(f"{self.program.name}: standby_workers needs a TrainingProgram, not a user's own loop")
        check_shape(num_ps, num_workers, placement or {})
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._on_epoch = on_epoch
        self._epochs_told = -1  # the last epoch given to on_epoch: a redone epoch is not told again
        self.state = "created"
        self.error: str | None = None
        self.final_metric: float | None = None  # the metric of the final parameters, once finished
        self.started_step: int | None = None  # the step this run started from, once its tasks run
        self._layout: Layout = []  # the model's parameters, names and shapes (known at start)

        # the user's own loop runs in the workers: what the controller keeps of it
        loop = user_loop.is_loop(self.program)
        self._loop = user_loop.LoopState(self._lock, MAX_WINDOWS, self.config.step_timeout_s) if loop else None
        self._requests = Requests(Shape(num_ps, num_workers, dict(placement or {})), self._lock)
        self._progress = Progress(self.program, self._lock)
        size = self.config.standby_workers
        self._standby = StandbyPool(size, self.config.liveness_timeout_s) if size else None
        self._group = TaskGroup(
            self._lock,
            on_join=self._loop_join if self._loop else None,
            timeout_s=self.config.placement_timeout_s,
            park=self._standby.park if self._standby is not None else None,
        )
        self._record = StepRecorder(self.program.name, self.config.report_interval_s, self._lock, on_window)
        hooks = JobHooks(self._event, self._flush_window, lambda: self._progress.step)
        self._rescale = Rescaler(self.program, self.config, self._group, self._requests, hooks)
        self._rescale.standby = self._standby
        self._checkpoints = Checkpoints(self.config, self._event)
        self._recovery = Recovery(self._rescale, self._checkpoints, hooks, self._rewind, self._loops_back)
        self._evaluate = Evaluator(self.program)

    # ------------------------------------------------------------------ API
    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str] | None = None) -> int:
        """Ask for a new shape; it takes effect at a step boundary once its tasks run.

        Returns a request id for :meth:`wait_rescale`. A newer request replaces
        one not yet applied. Pins to unknown or too-small nodes fail at once.
        """
        placement = dict(placement or {})
        check_shape(num_ps, num_workers, placement)
        if self.state in ("finished", "failed"):
            raise JobEndedError(f"job {self.program.name} has {self.state}; it cannot be rescaled")
        return self._rescale.request(Shape(num_ps, num_workers, placement))

    def set_batch_size(self, batch: int) -> None:
        """Ask for global batch ``batch``: the next step after a step boundary
        trains at it, with the learning rate the program's rule gives
        (:meth:`TrainingProgram.lr_at`; a loop's: its optimizer's lr times
        :meth:`LoopProgram.lr_at`). Only programs (and loops' DataLoaders) with
        ``max_batch_size`` may change it, and only in ``sync`` mode."""
        self.program.check_batch(batch)
        if batch != self.program.batch_size and self.config.mode != "sync":
            raise ConfigError(f"job {self.program.name}: the global batch adapts in sync mode only")
        self._requests.ask_batch(batch)

    def wait_rescale(self, request_id: int, timeout_s: float = 120.0) -> RescaleRecord:
        """Block until request ``request_id`` is applied; raise if it failed."""
        return self._rescale.wait(request_id, timeout_s, lambda: self.state in ("failed", "finished", "stopped"))

    def stop(self) -> None:
        """Leave the loop at the next step boundary (a checkpoint is written)."""
        self._stop.set()

    def report(self) -> JobReport:
        with self._lock:
            p, target = self._progress, self._requests.target
            return JobReport(
                name=self.program.name,
                state=self.state,
                mode=self.config.mode,
                step=p.step,
                epoch=p.position.epoch,
                cursor=p.position.cursor,
                epochs=self.program.epochs,
                samples_seen=p.samples_seen,
                num_ps=len(self.ps),
                num_workers=len(self.workers),
                target_shape=(target.num_ps, target.num_workers),
                placement=self.placement(),
                windows=list(self._record.windows),
                epoch_reports=list(p.epochs),
                rescales=list(self._rescale.records),
                events=list(self._record.events),
                events_total=self._record.events_total,
                gradient_samples=list(self._record.gradient_samples[-200:]),
                bytes_between_nodes=dict(self._record.bytes),
                cross_node_bytes=self._record.cross_node_bytes(),
                error=self.error,
                batch_size=p.batch_size,
                prefetched_batches=self._record.prefetched,
                metrics=list(self._loop.metrics) if self._loop else [],
            )

    def placement(self) -> dict[str, str]:
        """Where every task runs: ``{"ps-0": node id, "worker-0": node id, ...}``."""
        return self._group.placement()

    @property
    def ps(self) -> list[tasks.Task]:
        """The running PS shards, in slot order."""
        return self._group.ps

    @property
    def workers(self) -> list[tasks.Task]:
        """The running workers, in slot order."""
        return self._group.workers

    @property
    def step(self) -> int:
        """Steps done."""
        return self._progress.step

    @property
    def position(self) -> DataPosition:
        """The data position of the next step."""
        return self._progress.position

    @property
    def samples_seen(self) -> int:
        return self._progress.samples_seen

    @property
    def batch_size(self) -> int:
        """The global batch M now."""
        return self._progress.batch_size

    @property
    def done(self) -> bool:
        return self._progress.done

    def samples_per_epoch(self) -> int | None:
        """Training samples in one epoch (None until :meth:`start` has read the dataset)."""
        return self._progress.samples_per_epoch()

    def remaining_samples(self) -> int | None:
        """Samples left to train (None until :meth:`start` has read the dataset)."""
        return self._progress.remaining_samples()

    def starting(self) -> dict[str, str]:
        """Tasks of a pending rescale that have been started on a pinned node but
        are not in use yet: ``{task name: node id}`` (they already hold resources)."""
        return self._rescale.starting()

    def standbys(self) -> list[tasks.Task]:
        """The standby workers that run now, waiting for a grow (see ``JobConfig.standby_workers``)."""
        return self._standby.idle() if self._standby is not None else []

    def prepare(self, timeout_s: float | None = None) -> bool:
        """Start the tasks of the newest rescale request and wait (at most
        ``timeout_s``) until they run, without training meanwhile. The switch
        itself happens at the next step boundary. For callers that drive
        :meth:`run` themselves; returns whether everything is running."""
        try:
            return self._rescale.prepare(timeout_s)
        except SwitchFailed as failed:  # tasks released ahead of it: one died meanwhile
            self._recovery.recover_switch(failed)
            return False

    def parameters(self) -> np.ndarray:
        """A copy of the current flat parameters, gathered from the PS shards."""
        return self._group.parameters()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained model's ``state_dict()`` (the program's model with the
        current parameters; buffers as the model builds them)."""
        return load_flat(self.program.build_model(), self.parameters()).state_dict()

    # ------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the tasks and load the latest checkpoint, or the initial model."""
        if self.state != "created":
            return
        p = self._progress
        dataset = self.program.build_dataset()
        check_batch_fits(self.program.batch_size, self.program.max_batch_size, len(dataset))
        p.batches = GlobalBatches(
            self.program.seed, len(dataset), self.program.batch_size, getattr(self.program, "shuffle", True)
        )
        if self.config.share_dataset and not self._loop:
            self._rescale.dataset_ref, why = tasks.share_dataset(dataset)
            if why is not None:
                self._event(f"the dataset cannot be shared ({why}): each worker builds its own")
        model = self.program.build_model()
        self._layout = param_layout(model)
        ckpt = self._checkpoints.latest()
        if ckpt is not None:
            self._checkpoints.check(ckpt, self.program, self._layout)
            state = ckpt.state
            p.resume(ckpt)
            if self._loop:
                self._loop.resume(ckpt.user_state, ckpt.step, [])
            if ckpt.batch_size is not None and not self._requests.batch_asked():
                p.batch_size = self._checkpoints.batch_of(ckpt, self.program)
            self._event(f"resumed from checkpoint at step {ckpt.step} (epoch {ckpt.position.epoch})")
        else:
            state = ShardState(flat_params(model))
        shape, request_id = self._requests.latest()
        self._recovery.start(shape, request_id, state)
        self._requests.mark_applied(request_id)
        p.start_epoch_clock(time.monotonic())
        self.started_step = p.step
        self.state = "running"
        if self._checkpoints.store and ckpt is None:
            self._checkpoint_now()
        self._fill_standbys()  # started in the background: the first steps do not wait for them

    def run_in_thread(self, max_steps: int | None = None) -> threading.Thread:
        """Run :meth:`run` in a daemon thread; the caller may rescale and report meanwhile.

        An exception ends the thread and is kept in ``self.error`` (state ``failed``).
        """

        def target() -> None:
            try:
                self.run(max_steps)
            except Exception:
                log.exception("job %s failed", self.program.name)

        thread = threading.Thread(target=target, name=f"elasticps-{self.program.name}", daemon=True)
        thread.start()
        return thread

    def flush_output(self) -> None:
        """Wait (a few seconds at most) until what every task printed so far is in the job's output."""
        with self._group.lock:
            handles = [t.handle for t in self._group.ps + self._group.workers]
        tasks.flush_output(handles)

    def shutdown(self) -> None:
        """Stop every task of the job (parameters live on in the checkpoints)."""
        self._group.retire_all()
        if self._rescale.pending:
            self._rescale.cancel_pending()
        if self._standby is not None:
            self._standby.close()
            self._group.nodes_used |= self._standby.nodes_used
        self._group.sweep()
        self._rescale.dataset_ref = None  # freed from the object store
        if self._standby is not None and self._standby.owner is not None:
            # last: a reservation made while the loop thread raced this shutdown (taken, not yet installed)
            release_orphans(self._standby.owner)

    def checkpoint(self) -> None:
        if not self._checkpoints.store:
            raise ConfigError("no checkpoint_dir configured")
        p = self._progress
        state = self._group.gather_state(p.step)
        self._snapshot_user_state()
        self._checkpoints.save(
            Checkpoint(
                p.step,
                p.position,
                state,
                self.program.seed,
                self.program.optimizer_name,
                p.samples_seen,
                p.batch_size,
                self._loop.state if self._loop else None,
                layout=self._layout,
            )
        )
