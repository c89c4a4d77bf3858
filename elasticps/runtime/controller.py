"""The job controller: drives steps, applies rescales at step boundaries, recovers.

One controller runs one job. Its loop is the only code that talks to the job's
actors; :meth:`JobController.rescale`, :meth:`report` and :meth:`stop` may be
called from other threads (or, with :func:`elasticps.runtime.remote_job`, from
other processes) and only leave requests or read snapshots.

Per ``sync`` step t with P shards and W workers::

    worker w: params <- ray.get(param refs of step t)      (pull)
              g_w    <- grad(sum of loss over its samples) / M   (compute)
              returns [stats, g_w[shard 0], ..., g_w[shard P-1]]  (push)
    shard j:  p_j    <- opt(p_j, sum_w g_w[shard j])        (update)
              returns p_j, which are the param refs of step t+1

The sum over workers is the global-batch mean gradient whatever W is, and the
optimizers are elementwise, so the update does not depend on (P, W).

The pieces it owns: what shape is asked for and the decisions of changing it
(``membership``), the running tasks and their parameters (``task_group``),
carrying a shape change out (``rescale``), recovery after a failed step and
the checkpoints (``recovery``), the record of windows, events and traffic
(``recorder``). The correctness argument is the order in which this loop calls
them: a change is applied only between two steps (``_boundary``, before a step
reads the task lists), and recovery restores what a step half-applied before
the next one starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch

from elasticps.errors import ConfigError, JobEndedError
from elasticps.program import TrainingProgram, load_program
from elasticps.runtime import tasks, user_loop
from elasticps.runtime.checkpoint import Checkpoint, Layout
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import DataPosition, GlobalBatches, split_evenly
from elasticps.runtime.evaluate import evaluate
from elasticps.runtime.flat import flat_params, load_flat, param_layout
from elasticps.runtime.membership import Requests, Shape, check_shape
from elasticps.runtime.recorder import MAX_WINDOWS, StepRecorder
from elasticps.runtime.recorder import Shape as RecordedShape
from elasticps.runtime.recovery import Checkpoints, Recovery
from elasticps.runtime.reports import EpochReport, JobReport, RescaleRecord, WindowReport
from elasticps.runtime.rescale import JobHooks, Rescaler
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.task_group import TaskGroup

log = logging.getLogger("elasticps.runtime")


def worker_seed(seed: int, step: int, rank: int) -> int:
    """Seed of a worker's torch RNG at a step (dropout masks and the like)."""
    return (seed * 1_000_003 + step * 7919 + rank) % (2**63)


class JobController:
    """Runs one training job on Ray with a changeable number of PS and workers."""

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
        self._loop = user_loop.is_loop(self.program)  # the user's own loop runs in the workers
        if self._loop and self.config.mode != "sync":
            raise ConfigError(f"{self.program.name}: a user's own loop trains in sync mode only")
        check_shape(num_ps, num_workers, placement or {})
        self._lock = threading.RLock()
        self._requests = Requests(Shape(num_ps, num_workers, dict(placement or {})), self._lock)
        self._stop = threading.Event()
        self._on_epoch = on_epoch

        self._group = TaskGroup(self._lock, on_join=self._loop_join if self._loop else None)
        self._numel = 0
        self._layout: Layout = []  # the model's parameters, names and shapes (known at start)
        self.step = 0
        self.position = DataPosition(0, 0)
        self.samples_seen = 0
        self.batch_size = self.program.batch_size  # the global batch M now
        self.state = "created"
        self.error: str | None = None
        self.final_metric: float | None = None  # the metric of the final parameters, once finished
        self.started_step: int | None = None  # the step this run started from, once its tasks run

        self._batches: GlobalBatches | None = None
        self._eval_model: torch.nn.Module | None = None
        self._eval_data: Any = None
        self._record = StepRecorder(self.program.name, self.config.report_interval_s, self._lock, on_window)
        hooks = JobHooks(self._event, self._flush_window, lambda: self.step)
        self._rescale = Rescaler(self.program, self.config, self._group, self._requests, hooks)
        self._checkpoints = Checkpoints(self.config, self._event)
        self._recovery = Recovery(self._rescale, self._checkpoints, hooks, self._rewind)
        self._epochs: list[EpochReport] = []
        self._metrics: list[user_loop.MetricReport] = []  # what a user's loop reported
        self._joiners: dict[int, bytes | None] = {}  # id(worker handle) -> registered state for its first step
        self._user_state: bytes | None = None  # a user loop's registered state, as last snapshotted
        self._user_state_at = -1  # the step it was snapshotted at
        self._finished_loops = False  # the user loops ran to their end
        self._epoch_start = (0.0, 0)

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
        (:meth:`TrainingProgram.lr_at`). Only programs with ``max_batch_size``
        may change it, and only in ``sync`` mode."""
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
            return JobReport(
                name=self.program.name,
                state=self.state,
                mode=self.config.mode,
                step=self.step,
                epoch=self.position.epoch,
                cursor=self.position.cursor,
                epochs=self.program.epochs,
                samples_seen=self.samples_seen,
                num_ps=len(self.ps),
                num_workers=len(self.workers),
                target_shape=(self._requests.target.num_ps, self._requests.target.num_workers),
                placement=self.placement(),
                windows=list(self._record.windows),
                epoch_reports=list(self._epochs),
                rescales=list(self._rescale.records),
                events=list(self._record.events),
                events_total=self._record.events_total,
                gradient_samples=list(self._record.gradient_samples[-200:]),
                bytes_between_nodes=dict(self._record.bytes),
                cross_node_bytes=self._record.cross_node_bytes(),
                error=self.error,
                batch_size=self.batch_size,
                prefetched_batches=self._record.prefetched,
                metrics=list(self._metrics),
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

    def samples_per_epoch(self) -> int | None:
        """Training samples in one epoch (None until :meth:`start` has read the dataset)."""
        return None if self._batches is None else self._batches.num_samples

    def remaining_samples(self) -> int | None:
        """Samples left to train (None until :meth:`start` has read the dataset)."""
        if self._batches is None:
            return None
        n = self._batches.num_samples
        return max(0, (self.program.epochs - self.position.epoch) * n - self.position.cursor)

    def starting(self) -> dict[str, str]:
        """Tasks of a pending rescale that have been started on a pinned node but
        are not in use yet: ``{task name: node id}`` (they already hold resources)."""
        return self._rescale.starting()

    @property
    def done(self) -> bool:
        return self.position.epoch >= self.program.epochs

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
        dataset = self.program.build_dataset()
        self._batches = GlobalBatches(
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
            self.step, self.position, self.samples_seen = ckpt.step, ckpt.position, ckpt.samples_seen
            self._user_state, self._user_state_at = ckpt.user_state, ckpt.step
            if ckpt.batch_size is not None and not self._requests.batch_asked():
                self.batch_size = self.program.check_batch(ckpt.batch_size)
            self._event(f"resumed from checkpoint at step {ckpt.step} (epoch {ckpt.position.epoch})")
        else:
            state = ShardState(flat_params(model))
        self._numel = state.numel
        shape, request_id = self._requests.latest()
        pending = self._rescale.launch(shape, request_id, reason="start", strict=True)
        started = tasks.wait_ready(pending.starting(), self.config.placement_timeout_s, pending.names())
        self._rescale.install(pending, started, state)
        self._requests.mark_applied(request_id)
        self._epoch_start = (time.monotonic(), self.samples_seen)
        self.started_step = self.step
        self.state = "running"
        if self._checkpoints.store and ckpt is None:
            self.checkpoint()

    def run(self, max_steps: int | None = None) -> JobReport:
        """Train until the job is done, ``max_steps`` more steps ran, or :meth:`stop`."""
        try:
            self.start()
            first = self.step
            while not self.done and not self._stop.is_set():
                if max_steps is not None and self.step - first >= max_steps:
                    break
                self._boundary()
                if self.config.mode == "sync":
                    self._sync_step()
                else:
                    budget = None if max_steps is None else first + max_steps - self.step
                    self._async_segment(budget)
            self._flush_window()
            if self.done and self._loop and not self._finished_loops:
                self._finish_loops()
            if self.done or self._stop.is_set():
                if self.done:  # resumed from a checkpoint taken at the very end, no epoch ran here
                    last = self._epochs[-1] if self._epochs else None
                    self.final_metric = last.metric if last and last.step == self.step else self._evaluate()
                self.state = "finished" if self.done else "stopped"
                if self._checkpoints.store:
                    self.checkpoint()
        except Exception as exc:
            self.state = "failed"
            self.error = f"{type(exc).__name__}: {exc}"
            self._event(f"failed: {self.error}")
            raise
        return self.report()

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

    def shutdown(self) -> None:
        """Stop every task of the job (parameters live on in the checkpoints)."""
        self._group.retire_all()
        if self._rescale.pending:
            self._rescale.cancel_pending()
        self._group.sweep()
        self._rescale.dataset_ref = None  # freed from the object store

    def checkpoint(self) -> None:
        if not self._checkpoints.store:
            raise ConfigError("no checkpoint_dir configured")
        state = self._group.gather_state()
        self._snapshot_user_state()
        self._checkpoints.save(
            Checkpoint(
                self.step,
                self.position,
                state,
                self.program.seed,
                self.program.optimizer_name,
                self.samples_seen,
                self.batch_size,
                self._user_state,
                layout=self._layout,
            )
        )

    # ------------------------------------------------------------ sync step
    def _sync_step(self) -> None:
        """One bulk-synchronous step. Updates are submitted with the worker calls;
        each shard waits for the gradients itself, so a step costs the controller
        one round trip. A shard applies a step whole or not at all."""
        assert self._batches is not None
        idx, next_pos = self._batches.take(self.position, self.batch_size)
        lr = self.program.lr_at(self.step, self.batch_size)
        # what each worker most likely reads next (same shape and batch): read while this step runs
        upcoming = self._batches.take(next_pos, self.batch_size)[0] if next_pos.epoch < self.program.epochs else None
        nexts = split_evenly(upcoming, len(self.workers)) if upcoming is not None else [None] * len(self.workers)
        measure = self._measure_gns() and not self._loop
        t0 = time.perf_counter()
        calls = []
        for rank, (w, part, nxt) in enumerate(
            zip(self.workers, split_evenly(idx, len(self.workers)), nexts, strict=True)
        ):
            extra = {}
            if self._loop:  # every worker's loop takes part in every step, if only with a padding sample
                state = self._joiners.get(id(w.handle))
                extra = {"epoch": self.position.epoch, "pad": len(part) == 0, "user_state": state}
                part = part if len(part) else idx[:1]
            if len(part) == 0:
                continue
            refs = w.handle.step.options(num_returns=len(self.ps) + 1).remote(
                self.step,
                part,
                self._group.param_refs,
                self._group.bounds,
                len(idx),
                worker_seed(self.program.seed, self.step, rank),
                measure,
                [ps.node_id == w.node_id for ps in self.ps],
                nxt,
                **extra,
            )
            calls.append((w, refs))
        if self._loop:  # the lr and other hyperparameters of the user's optimizer: from the first worker
            lr = calls[0][1][0]
        grads = [[refs[j + 1] for _, refs in calls] for j in range(len(self.ps))]
        norms = None
        if self._loop and len(self.ps) > 1:  # shards sum first and share their norms: a loop may clip globally
            norms = [ps.handle.reduce.remote(self.step, g, lr) for ps, g in zip(self.ps, grads, strict=True)]
            grads = [[] for _ in self.ps]
        applies = [
            ps.handle.apply.options(num_returns=2).remote(
                self.step,
                grads[j],
                measure,
                any(w.node_id != ps.node_id for w in self.workers),
                lr,
                *([norms] if norms is not None else []),
            )
            for j, ps in enumerate(self.ps)
        ]
        stats, stats_error = _get_each([refs[0] for _, refs in calls])
        infos, apply_error = _get_each([a[0] for a in applies])
        applied = sum(i is not None for i in infos)
        if applied < len(applies):
            # No shard updated: redo the step. Some did: the PS state is torn.
            self._recovery.recover(stats_error or apply_error, ps_inconsistent=applied > 0)  # type: ignore[arg-type]
            return
        self._group.param_refs = [a[1] for a in applies]
        done = [(w, s) for (w, _), s in zip(calls, stats, strict=True) if s is not None]
        if self._loop:
            self._joiners = {}
            self._add_metrics(user_loop.step_metrics([s for _, s in done]))
        wall = time.perf_counter() - t0
        self._account([s for _, s in done], infos, [w for w, _ in done], wall, len(idx), big_batch=len(idx))  # type: ignore[misc]
        self.step += 1
        self._advance(len(idx), next_pos)
        if stats_error is not None:  # a worker died after its gradient was in: the step stands
            self._recovery.recover(stats_error)

    def _finish_loops(self) -> None:
        metrics, self._user_state = user_loop.finish(
            self.workers, self._group.param_refs, self._group.bounds, self.step
        )
        self._add_metrics(metrics)
        self._finished_loops = True

    def _snapshot_user_state(self) -> None:
        """A user loop's registered state now, from its first worker (kept as is
        once the loops ended; taken once per step: a loop waits at the boundary
        after its snapshot, so its state cannot change before the next step)."""
        if self._loop and self.workers and not self._finished_loops and self._user_state_at != self.step:
            self._user_state_at = self.step
            next_epoch = None if self.done else self.position.epoch
            self._user_state, metrics = user_loop.snapshot(
                self.workers[0], self._group.param_refs, self._group.bounds, self.step, next_epoch
            )
            self._add_metrics(metrics)

    def _add_metrics(self, records: list[user_loop.MetricReport]) -> None:
        with self._lock:
            self._metrics.extend(user_loop.new_reports(self._metrics, records))
            del self._metrics[:-MAX_WINDOWS]

    def _measure_gns(self) -> bool:
        every = self.config.gns_every_steps
        return every > 0 and self.step % every == 0

    # ----------------------------------------------------------- async steps
    def _async_segment(self, budget: int | None) -> None:
        """Run async steps for one report interval (or to the epoch's end), then drain.

        Each worker always has one step in flight. When one returns, its
        gradient is applied at once (unless staler than ``max_staleness``) and
        it gets the next samples with the newest parameters. The data position
        moves as samples are handed out; after a failure, samples that were in
        flight are not revisited (async training is not exact anyway).
        """
        assert self._batches is not None
        batches = self._batches
        local = max(1, self.batch_size // len(self.workers))
        in_flight: dict[Any, tuple[int, tasks.Task, list[Any], int, float]] = {}
        epoch = self.position.epoch
        segment_end = time.monotonic() + self.config.report_interval_s
        handed_out = 0

        def dispatch(rank: int, w: tasks.Task) -> None:
            nonlocal handed_out
            idx, nxt = batches.take(self.position, local)
            refs = w.handle.step.options(num_returns=len(self.ps) + 1).remote(
                self.step,
                idx,
                self._group.param_refs,
                self._group.bounds,
                len(idx),
                worker_seed(self.program.seed, self.step, rank),
            )
            in_flight[refs[0]] = (rank, w, refs, self.step, time.perf_counter())
            handed_out += 1
            with self._lock:
                self.position = nxt

        def more() -> bool:
            return (
                self.position.epoch == epoch
                and time.monotonic() < segment_end
                and not self._stop.is_set()
                and (budget is None or handed_out < budget)
                and not self._rescale.pending_ready()
            )

        for rank, w in enumerate(self.workers):
            if more():
                dispatch(rank, w)
        while in_flight:
            [done], _ = ray.wait(list(in_flight), num_returns=1)
            rank, w, refs, version, t0 = in_flight.pop(done)
            try:
                stats = ray.get(done)
            except ray.exceptions.RayError as exc:
                self._drain(in_flight)
                self._recovery.recover(exc)
                return
            staleness = self.step - version
            if self.config.max_staleness is not None and staleness > self.config.max_staleness:
                self._event(f"discarded a gradient of staleness {staleness} from worker-{rank}")
            else:
                try:
                    applies = [
                        ps.handle.apply.options(num_returns=2).remote(
                            self.step, [refs[j + 1]], False, True, self.program.lr_at(self.step, self.batch_size)
                        )
                        for j, ps in enumerate(self.ps)
                    ]
                    infos = ray.get([a[0] for a in applies])
                except ray.exceptions.RayError as exc:
                    self._drain(in_flight)
                    self._recovery.recover(exc, ps_inconsistent=True)
                    return
                self._group.param_refs = [a[1] for a in applies]
                self._account([stats], infos, [w], time.perf_counter() - t0, stats["samples"], big_batch=0)
                self.step += 1
                with self._lock:
                    self.samples_seen += stats["samples"]
            if more():
                dispatch(rank, w)
        if self.position.epoch > epoch:
            self._end_epoch(epoch)

    def _drain(self, in_flight: dict[Any, Any]) -> None:
        """Let in-flight steps finish (or fail) so that no one writes behind our back."""
        if in_flight:
            ray.wait(list(in_flight), num_returns=len(in_flight), timeout=self.config.liveness_timeout_s)
        in_flight.clear()

    # ---------------------------------------------------------- bookkeeping
    def _advance(self, samples: int, next_pos: DataPosition) -> None:
        epoch = self.position.epoch
        with self._lock:
            self.samples_seen += samples
            self.position = next_pos
        if next_pos.epoch > epoch:
            self._end_epoch(epoch)

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
            self.step, stats, infos, ps_nodes, worker_nodes, wall_s, samples, big_batch, self._recorded_shape()
        )

    def _recorded_shape(self) -> RecordedShape:
        return RecordedShape(len(self.ps), len(self.workers), self.batch_size)

    def _flush_window(self) -> None:
        self._record.flush(self._recorded_shape())

    def _end_epoch(self, epoch: int) -> None:
        self._flush_window()
        t0, s0 = self._epoch_start
        now = time.monotonic()
        elapsed = max(1e-9, now - t0)
        loss, gns = self._record.end_epoch()
        metric, values = self._evaluate(), {}
        if self._loop:  # the loop's code after the epoch (its test pass, report) runs now; its report is the metric
            self._finish_loops() if self.done else self._snapshot_user_state()
            metric, values = user_loop.epoch_metrics(self._metrics, epoch)
        report = EpochReport(
            epoch=epoch,
            step=self.step,
            samples_per_s=(self.samples_seen - s0) / elapsed,
            elapsed_s=elapsed,
            loss=loss,
            metric=metric,
            noise_scale=gns,
            num_ps=len(self.ps),
            num_workers=len(self.workers),
            batch_size=self.batch_size,
            metrics=values,
        )
        with self._lock:
            self._epochs.append(report)
        self._epoch_start = (time.monotonic(), self.samples_seen)
        metric = "" if report.metric is None else f", metric {report.metric:.4f}"
        log.info("%s epoch %d done: %.0f samples/s%s", self.program.name, epoch, report.samples_per_s, metric)
        if self._on_epoch:
            self._on_epoch(report)
        if self._checkpoints.store and not self.done:
            self.checkpoint()

    def _evaluate(self) -> float | None:
        if self.program.metric is None:
            return None
        if self._eval_model is None:
            self._eval_model = self.program.build_model()
            self._eval_data = self.program.build_eval_dataset()
        return evaluate(self.program, self.parameters(), self._eval_model, self._eval_data)

    def _event(self, text: str) -> None:
        self._record.event(self.step, text)

    # ------------------------------------------------------- shape changes
    def _boundary(self) -> None:
        """At a step boundary: change the batch, start, apply or fail pending shape
        changes; checkpoint."""
        batch = self._requests.take_batch()
        if batch is not None and batch != self.batch_size:
            self._flush_window()  # a window's steps share one batch
            self._event(
                f"global batch {self.batch_size} -> {batch} (lr {self.program.lr_at(self.step, batch):.4g}, "
                f"{self.program.lr_scaling} scaling)"
            )
            self.batch_size = batch
        self._rescale.at_boundary()
        if self._checkpoints.due(self.step):
            self.checkpoint()

    def prepare(self, timeout_s: float | None = None) -> bool:
        """Start the tasks of the newest rescale request and wait (at most
        ``timeout_s``) until they run, without training meanwhile. The switch
        itself happens at the next step boundary. For callers that drive
        :meth:`run` themselves; returns whether everything is running."""
        return self._rescale.prepare(timeout_s)

    def _loop_join(self, joining: list[tasks.Task]) -> None:
        """Workers that join a user's loop start with the registered state of a loop already there."""
        self._snapshot_user_state()
        self._joiners.update({id(w.handle): self._user_state for w in joining})

    def _rewind(self, ckpt: Checkpoint) -> None:
        """Go back to ``ckpt``'s step, data position and loop state (a restore of the PS)."""
        with self._lock:
            self.step, self.position, self.samples_seen = ckpt.step, ckpt.position, ckpt.samples_seen
        if self._loop:  # the loops go back to the checkpoint's step with its registered state
            self._user_state, self._user_state_at = ckpt.user_state, ckpt.step
            self._joiners = {id(w.handle): ckpt.user_state for w in self.workers}


def _get_each(refs: list[Any]) -> tuple[list[Any], ray.exceptions.RayError | None]:
    """Every value that arrived (None for the failed ones) and the first error."""
    values: list[Any] = []
    first: ray.exceptions.RayError | None = None
    for ref in refs:
        try:
            values.append(ray.get(ref))
        except ray.exceptions.RayError as exc:
            values.append(None)
            first = first or exc
    return values, first
