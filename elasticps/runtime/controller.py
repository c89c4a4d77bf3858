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

Why one long module: the step, the shape change at a boundary and the recovery
after a lost task read and replace the same task lists, parameter references and
data position, in an order that is the correctness argument (a change is applied
only between two steps; recovery restores what a step half-applied). What stands
apart is elsewhere: the record of windows, events and traffic (``recorder``), the
tasks and their placement (``tasks``, ``slots``), checkpoints, data order, a user
loop's protocol (``user_loop``). Cutting the rest into classes is still to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import torch

from elasticps.errors import ConfigError, JobEndedError, JobFailedError, PlacementError, UserCodeError
from elasticps.program import TrainingProgram, load_program
from elasticps.runtime import tasks, user_loop
from elasticps.runtime.checkpoint import Checkpoint, CheckpointStore, Layout, layout_mismatch
from elasticps.runtime.config import JobConfig
from elasticps.runtime.data import DataPosition, GlobalBatches, split_evenly
from elasticps.runtime.evaluate import evaluate
from elasticps.runtime.flat import flat_params, load_flat, param_layout, shard_bounds
from elasticps.runtime.recorder import MAX_WINDOWS, StepRecorder
from elasticps.runtime.recorder import Shape as RecordedShape
from elasticps.runtime.reports import EpochReport, JobReport, RescaleRecord, WindowReport
from elasticps.runtime.shard_state import ShardState, concat_shards
from elasticps.runtime.slots import fits_now, match_slots

log = logging.getLogger("elasticps.runtime")

SUSPECT_NODE_S = 60.0  # Ray notices a dead raylet within ~30 s; until then do not pin to it


@dataclass(frozen=True)
class Shape:
    """A requested job shape: counts and optional pins ``{task name: node id}``."""

    num_ps: int
    num_workers: int
    placement: dict[str, str] = field(default_factory=dict)


@dataclass
class _PendingChange:
    request_id: int
    shape: Shape
    new_ps: dict[int, tasks.PendingTask]
    new_workers: dict[int, tasks.PendingTask]
    launched_at: float
    reason: str
    kept_ps: dict[int, tasks.Task] = field(default_factory=dict)  # slot -> running task that fills it
    kept_workers: dict[int, tasks.Task] = field(default_factory=dict)


def task_name(kind: str, index: int) -> str:
    return f"{kind}-{index}"


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
        self._check_shape(num_ps, num_workers, placement or {})
        self._lock = threading.RLock()
        self._target = Shape(num_ps, num_workers, dict(placement or {}))
        self._request_id = 0
        self._applied_request = 0
        self._stop = threading.Event()
        self._on_epoch = on_epoch
        self._store = CheckpointStore(self.config.checkpoint_dir) if self.config.checkpoint_dir else None

        self.ps: list[tasks.Task] = []
        self.workers: list[tasks.Task] = []
        self._pending: _PendingChange | None = None
        self._param_refs: list[Any] = []
        self._bounds: list[tuple[int, int]] = []
        self._numel = 0
        self._layout: Layout = []  # the model's parameters, names and shapes (known at start)
        self.step = 0
        self.position = DataPosition(0, 0)
        self.samples_seen = 0
        self.batch_size = self.program.batch_size  # the global batch M now
        self._batch_request: int | None = None
        self.state = "created"
        self.error: str | None = None
        self.final_metric: float | None = None  # the metric of the final parameters, once finished
        self.started_step: int | None = None  # the step this run started from, once its tasks run

        self._batches: GlobalBatches | None = None
        self._dataset_ref: Any = None  # the training set in the object store, for new workers (None: they build it)
        self._eval_model: torch.nn.Module | None = None
        self._eval_data: Any = None
        self._record = StepRecorder(self.program.name, self.config.report_interval_s, self._lock, on_window)
        self._epochs: list[EpochReport] = []
        self._rescales: list[RescaleRecord] = []
        self._metrics: list[user_loop.MetricReport] = []  # what a user's loop reported
        self._joiners: dict[int, bytes | None] = {}  # id(worker handle) -> registered state for its first step
        self._user_state: bytes | None = None  # a user loop's registered state, as last snapshotted
        self._user_state_at = -1  # the step it was snapshotted at
        self._finished_loops = False  # the user loops ran to their end
        self._epoch_start = (0.0, 0)
        self._last_ckpt_step = -1
        self._nodes_used: set[str] = set()  # where the job's tasks ran: swept at shutdown
        # Nodes where tasks died, and when: not pinned to for SUSPECT_NODE_S.
        self._suspect_nodes: dict[str, float] = {}

    # ------------------------------------------------------------------ API
    def rescale(self, num_ps: int, num_workers: int, placement: dict[str, str] | None = None) -> int:
        """Ask for a new shape; it takes effect at a step boundary once its tasks run.

        Returns a request id for :meth:`wait_rescale`. A newer request replaces
        one not yet applied. Pins to unknown or too-small nodes fail at once.
        """
        placement = dict(placement or {})
        self._check_shape(num_ps, num_workers, placement)
        if self.state in ("finished", "failed"):
            raise JobEndedError(f"job {self.program.name} has {self.state}; it cannot be rescaled")
        if placement:
            nodes = tasks.alive_nodes()
            for name, node in placement.items():
                res = self.config.ps_resources if name.startswith("ps-") else self.config.worker_resources
                tasks.check_fits(name, node, res, nodes)
        with self._lock:
            self._request_id += 1
            self._target = Shape(num_ps, num_workers, placement)
            return self._request_id

    def set_batch_size(self, batch: int) -> None:
        """Ask for global batch ``batch``: the next step after a step boundary
        trains at it, with the learning rate the program's rule gives
        (:meth:`TrainingProgram.lr_at`). Only programs with ``max_batch_size``
        may change it, and only in ``sync`` mode."""
        self.program.check_batch(batch)
        if batch != self.program.batch_size and self.config.mode != "sync":
            raise ConfigError(f"job {self.program.name}: the global batch adapts in sync mode only")
        with self._lock:
            self._batch_request = batch

    def wait_rescale(self, request_id: int, timeout_s: float = 120.0) -> RescaleRecord:
        """Block until request ``request_id`` is applied; raise if it failed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                for rec in self._rescales:
                    if rec.request_id == request_id:
                        if not rec.ok:
                            raise PlacementError(rec.error or "rescale failed")
                        return rec
                if self._applied_request > request_id or self.state in ("failed", "finished", "stopped"):
                    raise ConfigError(f"rescale request {request_id} was superseded or the job ended")
            time.sleep(0.02)
        raise TimeoutError(f"rescale request {request_id} not applied within {timeout_s:g} s")

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
                target_shape=(self._target.num_ps, self._target.num_workers),
                placement=self.placement(),
                windows=list(self._record.windows),
                epoch_reports=list(self._epochs),
                rescales=list(self._rescales),
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
        out = {task_name("ps", i): t.node_id for i, t in enumerate(self.ps)}
        out.update({task_name("worker", i): t.node_id for i, t in enumerate(self.workers)})
        return out

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
        pending = self._pending
        if pending is None:
            return {}
        out = {task_name("ps", i): p.wanted_node for i, p in pending.new_ps.items() if p.wanted_node}
        out.update({task_name("worker", i): p.wanted_node for i, p in pending.new_workers.items() if p.wanted_node})
        return out  # type: ignore[return-value]

    @property
    def done(self) -> bool:
        return self.position.epoch >= self.program.epochs

    def parameters(self) -> np.ndarray:
        """A copy of the current flat parameters, gathered from the PS shards."""
        return np.concatenate(ray.get([t.handle.params.remote() for t in self.ps]))

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
            self._dataset_ref, why = tasks.share_dataset(dataset)
            if why is not None:
                self._event(f"the dataset cannot be shared ({why}): each worker builds its own")
        model = self.program.build_model()
        self._layout = param_layout(model)
        ckpt = self._latest_checkpoint()
        if ckpt is not None:
            self._check_checkpoint(ckpt)
            state = ckpt.state
            self.step, self.position, self.samples_seen = ckpt.step, ckpt.position, ckpt.samples_seen
            self._user_state, self._user_state_at = ckpt.user_state, ckpt.step
            if ckpt.batch_size is not None and self._batch_request is None:
                self.batch_size = self.program.check_batch(ckpt.batch_size)
            self._event(f"resumed from checkpoint at step {ckpt.step} (epoch {ckpt.position.epoch})")
        else:
            state = ShardState(flat_params(model))
        self._numel = state.numel
        with self._lock:
            shape, request_id = self._target, self._request_id
        pending = self._launch(shape, request_id, reason="start", strict=True)
        names = [task_name("ps", i) for i in pending.new_ps] + [task_name("worker", i) for i in pending.new_workers]
        started = tasks.wait_ready(
            list(pending.new_ps.values()) + list(pending.new_workers.values()),
            self.config.placement_timeout_s,
            names,
        )
        self._install(pending, started, state)
        self._applied_request = request_id
        self._epoch_start = (time.monotonic(), self.samples_seen)
        self.started_step = self.step
        self.state = "running"
        if self._store and ckpt is None:
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
                if self._store:
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
        tasks.retire([t.handle for t in self.ps + self.workers])
        if self._pending:
            self._cancel_pending()
        self._nodes_used.update(t.node_id for t in self.ps + self.workers)
        tasks.sweep_nodes(self._nodes_used)
        self.ps, self.workers, self._param_refs = [], [], []
        self._dataset_ref = None  # freed from the object store

    def _latest_checkpoint(self) -> Checkpoint | None:
        """The newest intact checkpoint; damaged newer ones become events."""
        if not self._store:
            return None
        seen = len(self._store.skipped)
        ckpt = self._store.latest()
        for message in self._store.skipped[seen:]:
            self._event(f"checkpoint {message}")
        return ckpt

    def checkpoint(self) -> None:
        if not self._store:
            raise ConfigError("no checkpoint_dir configured")
        state = self._gather_state()
        self._snapshot_user_state()
        self._store.save(
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
        self._last_ckpt_step = self.step

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
                self._param_refs,
                self._bounds,
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
            self._recover(stats_error or apply_error, ps_inconsistent=applied > 0)  # type: ignore[arg-type]
            return
        self._param_refs = [a[1] for a in applies]
        done = [(w, s) for (w, _), s in zip(calls, stats, strict=True) if s is not None]
        if self._loop:
            self._joiners = {}
            self._add_metrics(user_loop.step_metrics([s for _, s in done]))
        wall = time.perf_counter() - t0
        self._account([s for _, s in done], infos, [w for w, _ in done], wall, len(idx), big_batch=len(idx))  # type: ignore[misc]
        self.step += 1
        self._advance(len(idx), next_pos)
        if stats_error is not None:  # a worker died after its gradient was in: the step stands
            self._recover(stats_error)

    def _finish_loops(self) -> None:
        metrics, self._user_state = user_loop.finish(self.workers, self._param_refs, self._bounds, self.step)
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
                self.workers[0], self._param_refs, self._bounds, self.step, next_epoch
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
                self._param_refs,
                self._bounds,
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
                and not self._pending_ready()
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
                self._recover(exc)
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
                    self._recover(exc, ps_inconsistent=True)
                    return
                self._param_refs = [a[1] for a in applies]
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
        if self._store and not self.done:
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
        with self._lock:
            batch, self._batch_request = self._batch_request, None
        if batch is not None and batch != self.batch_size:
            self._flush_window()  # a window's steps share one batch
            self._event(
                f"global batch {self.batch_size} -> {batch} (lr {self.program.lr_at(self.step, batch):.4g}, "
                f"{self.program.lr_scaling} scaling)"
            )
            self.batch_size = batch
        self._launch_pending()
        pending = self._pending
        if pending is not None:
            started = [*pending.new_ps.values(), *pending.new_workers.values()]
            if tasks.all_ready(started):
                self._pending = None
                self._apply_change(pending, [tasks.to_task(p) for p in started])
            elif time.monotonic() - pending.launched_at > self.config.placement_timeout_s:
                self._pending = None
                names = [task_name("ps", i) for i in pending.new_ps] + [
                    task_name("worker", i) for i in pending.new_workers
                ]
                waited = time.monotonic() - pending.launched_at
                error = tasks.give_up(started, names, waited)
                self._fail_request(pending.request_id, pending.shape, str(error), waited)
        every = self.config.checkpoint_every_steps
        if self._store and every and self.step - self._last_ckpt_step >= every:
            self.checkpoint()

    def _launch_pending(self) -> None:
        """Start the tasks of the newest request (or of replacements) if not started yet."""
        with self._lock:
            shape, request_id = self._target, self._request_id
        if self._pending is not None and self._pending.request_id != request_id:
            self._cancel_pending()
        if self._pending is None and (request_id > self._applied_request or self._below_target(shape)):
            reason = "request" if request_id > self._applied_request else "replace"
            try:
                self._release_first(shape)
                self._pending = self._launch(shape, request_id, reason=reason, strict=False)
            except PlacementError as exc:
                self._fail_request(request_id, shape, str(exc), 0.0)

    def _release_first(self, shape: Shape) -> None:
        """Break before make where make-before-break cannot work: if ``shape``
        drops running tasks and needs new ones, and the new ones have no room on
        their nodes now, switch to the tasks it keeps first (their room is then
        free for the new ones; the full shape follows once they run). Without
        this, a shape that trades a worker for a PS, or moves tasks, on a full
        cluster waits for room that only its own old tasks hold, and fails."""
        nodes = tasks.alive_nodes() if shape.placement else {}
        keep, new = {}, []
        for kind, have in (("ps", self.ps), ("worker", self.workers)):
            want = self._wanted(kind, shape, nodes)
            keep[kind] = match_slots([t.node_id for t in have], want)
            res = (self.config.ps_resources if kind == "ps" else self.config.worker_resources).as_ray_resources()
            new += [(node, res) for i, node in enumerate(want) if i not in keep[kind] and node is not None]
        drops = len(self.ps) + len(self.workers) - len(keep["ps"]) - len(keep["worker"])
        if not drops or not new or not keep["ps"] or not keep["worker"] or fits_now(new, tasks.free_now()):
            return
        ps = [self.ps[j] for _, j in sorted(keep["ps"].items())]
        workers = [self.workers[j] for _, j in sorted(keep["worker"].items())]
        self._flush_window()
        t0 = time.perf_counter()
        before = (len(self.ps), len(self.workers))
        state = self._gather_state() if self._shards_change(ps) else None
        self._install_tasks(Shape(len(ps), len(workers)), dict(enumerate(ps)), dict(enumerate(workers)), state)
        pause = time.perf_counter() - t0
        with self._lock:
            self._rescales.append(
                RescaleRecord(0, before, (len(ps), len(workers)), self.step, pause, 0.0, True, reason="release")
            )
        self._event(
            f"released {drops} task(s) ahead of the rescale to {shape.num_ps}x{shape.num_workers}: "
            f"{before[0]}x{before[1]} -> {len(ps)}x{len(workers)} until its new tasks run (no room for them yet)"
        )

    def _shards_change(self, ps: list[Any]) -> bool:
        """Whether ``ps`` (the PS of a new shape, slot by slot) is not the running
        PS list as it is: new, fewer, more or reordered shards, cut again."""
        return [id(t) for t in ps] != [id(t) for t in self.ps]

    def _wanted(self, kind: str, shape: Shape, nodes: dict[str, dict[str, float]]) -> list[str | None]:
        """The node each ``kind`` slot of ``shape`` is pinned to (None: anywhere; a gone or suspect node
        counts as anywhere)."""
        count = shape.num_ps if kind == "ps" else shape.num_workers
        want = [shape.placement.get(task_name(kind, i)) for i in range(count)]
        return [n if n is not None and n in nodes and not self._suspect(n) else None for n in want]

    def prepare(self, timeout_s: float | None = None) -> bool:
        """Start the tasks of the newest rescale request and wait (at most
        ``timeout_s``) until they run, without training meanwhile. The switch
        itself happens at the next step boundary. For callers that drive
        :meth:`run` themselves; returns whether everything is running."""
        self._launch_pending()
        if self._pending is None:
            return True
        started = [p.ready_ref for p in (*self._pending.new_ps.values(), *self._pending.new_workers.values())]
        timeout = self.config.placement_timeout_s if timeout_s is None else timeout_s
        _, not_ready = ray.wait(started, num_returns=len(started), timeout=timeout)
        return not not_ready

    def _pending_ready(self) -> bool:
        with self._lock:
            newer = self._request_id > self._applied_request and self._pending is None
        if newer:
            return True
        if self._pending is None:
            return False
        return tasks.all_ready([*self._pending.new_ps.values(), *self._pending.new_workers.values()])

    def _below_target(self, shape: Shape) -> bool:
        """After failures: fewer workers than the target, and replacing them is on."""
        return self.config.replace_dead_workers and len(self.workers) < shape.num_workers

    def _launch(self, shape: Shape, request_id: int, reason: str, strict: bool) -> _PendingChange:
        """Start the tasks that ``shape`` needs beyond the running ones it keeps
        (:func:`match_slots`: a running task on the node a slot wants fills it)."""
        nodes = tasks.alive_nodes() if shape.placement else {}
        new: dict[str, dict[int, tasks.PendingTask]] = {"ps": {}, "worker": {}}
        kept: dict[str, dict[int, tasks.Task]] = {"ps": {}, "worker": {}}
        current = {"ps": self.ps, "worker": self.workers}
        resources = {"ps": self.config.ps_resources, "worker": self.config.worker_resources}
        threads = {"ps": self.config.ps_threads, "worker": self.config.worker_threads}
        try:
            for kind in ("ps", "worker"):
                count = shape.num_ps if kind == "ps" else shape.num_workers
                asked = [shape.placement.get(task_name(kind, i)) for i in range(count)]
                want = self._wanted(kind, shape, nodes)
                for i, (pin, node) in enumerate(zip(asked, want, strict=True)):
                    if pin is not None and node is None:
                        if strict:
                            tasks.check_fits(task_name(kind, i), pin, resources[kind], nodes)
                        self._event(f"{task_name(kind, i)}: pinned node {pin} is gone; letting Ray place it")
                have = current[kind]
                match = match_slots([t.node_id for t in have], want)
                kept[kind] = {i: have[j] for i, j in match.items()}
                for i, node in enumerate(want):
                    if i in match:
                        continue
                    if node is not None:
                        tasks.check_fits(task_name(kind, i), node, resources[kind], nodes)
                    new[kind][i] = tasks.launch(
                        kind,  # type: ignore[arg-type]
                        self.program,
                        resources[kind],
                        threads[kind],
                        node,
                        shared_memory=self.config.mode == "sync" and self.config.shared_memory,
                        dataset=self._dataset_ref,
                        name=task_name(kind, i),
                    )
        except PlacementError:
            for p in [*new["ps"].values(), *new["worker"].values()]:
                tasks.kill(p.handle)
            raise
        return _PendingChange(
            request_id, shape, new["ps"], new["worker"], time.monotonic(), reason, kept["ps"], kept["worker"]
        )

    def _suspect(self, node: str) -> bool:
        """A node where tasks died recently: its raylet may be dead before Ray says so."""
        since = self._suspect_nodes.get(node)
        return since is not None and time.monotonic() - since < SUSPECT_NODE_S

    def _cancel_pending(self) -> None:
        assert self._pending is not None
        for p in [*self._pending.new_ps.values(), *self._pending.new_workers.values()]:
            tasks.kill(p.handle)
        self._pending = None

    def _fail_request(self, request_id: int, shape: Shape, error: str, launch_s: float) -> None:
        with self._lock:
            current = (len(self.ps), len(self.workers))
            self._rescales.append(
                RescaleRecord(
                    request_id, current, (shape.num_ps, shape.num_workers), self.step, 0.0, launch_s, False, error
                )
            )
            self._applied_request = max(self._applied_request, request_id)
            if self._request_id == request_id:
                self._target = Shape(*current, self.placement())
        self._event(f"rescale to {shape.num_ps}x{shape.num_workers} failed: {error}")

    def _apply_change(self, pending: _PendingChange, started: list[tasks.Task]) -> None:
        """Switch to the new shape. The pause is the time spent here."""
        self._flush_window()  # a window measures one shape: the steps before the switch are the old one's
        t0 = time.perf_counter()
        before = (len(self.ps), len(self.workers))
        slots = [pending.kept_ps.get(i) for i in range(pending.shape.num_ps)]  # None: a new PS
        state = self._gather_state() if self._shards_change(slots) else None
        self._install(pending, started, state)
        pause = time.perf_counter() - t0
        record = RescaleRecord(
            request_id=pending.request_id,
            from_shape=before,
            to_shape=(len(self.ps), len(self.workers)),
            at_step=self.step,
            pause_s=pause,
            launch_s=time.monotonic() - pending.launched_at,
            ok=True,
            reason=pending.reason,
            new_tasks=len(started),
        )
        with self._lock:
            self._rescales.append(record)
            self._applied_request = max(self._applied_request, pending.request_id)
        self._event(
            f"rescaled {before[0]}x{before[1]} -> {record.to_shape[0]}x{record.to_shape[1]}"
            f" (pause {pause * 1000:.0f} ms)"
        )

    def _install(self, pending: _PendingChange, started: list[tasks.Task], state: ShardState | None) -> None:
        """Make ``pending.shape`` current with ``started`` (its new PS, then its new workers)."""
        n_ps = len(pending.new_ps)
        self._install_tasks(
            pending.shape,
            {**pending.kept_ps, **dict(zip(pending.new_ps, started[:n_ps], strict=True))},
            {**pending.kept_workers, **dict(zip(pending.new_workers, started[n_ps:], strict=True))},
            state,
        )

    def _install_tasks(
        self,
        shape: Shape,
        new_ps: dict[int, tasks.Task],
        new_workers: dict[int, tasks.Task],
        state: ShardState | None,
    ) -> None:
        """Make ``shape`` current; if ``state`` is given, (re)shard it over the PS."""
        ps = [new_ps.get(i) or self.ps[i] for i in range(shape.num_ps)]
        workers = [new_workers.get(i) or self.workers[i] for i in range(shape.num_workers)]
        joining = [w for w in workers if all(w.handle is not t.handle for t in self.workers)]
        if self._loop and joining:  # they start with the registered state of a loop already there
            self._snapshot_user_state()
            self._joiners.update({id(w.handle): self._user_state for w in joining})
        if state is not None:
            bounds = shard_bounds(state.numel, len(ps))
            refs = [
                t.handle.set_state.remote(state.slice(lo, hi), self.step, lo)
                for t, (lo, hi) in zip(ps, bounds, strict=True)
            ]
            ray.get(refs)
            self._param_refs, self._bounds = refs, bounds
        keep = {id(t.handle) for t in ps + workers}
        tasks.retire([t.handle for t in self.ps + self.workers if id(t.handle) not in keep])
        self._nodes_used.update(t.node_id for t in ps + workers)
        with self._lock:
            self.ps, self.workers = ps, workers

    def _gather_state(self) -> ShardState:
        return concat_shards(ray.get([t.handle.get_state.remote() for t in self.ps]))

    # -------------------------------------------------------------- failures
    def _recover(self, exc: BaseException, ps_inconsistent: bool = False) -> None:
        """After a failed step: drop dead workers, restore lost PS, or give up.

        ``ps_inconsistent``: the failure hit the update, so some shards may have
        applied the step and others not; the PS are restored from the checkpoint.
        """
        timeout = self.config.liveness_timeout_s
        dead_ps = [t for t in self.ps if not tasks.is_alive(t.handle, timeout)]
        dead_workers = [t for t in self.workers if not tasks.is_alive(t.handle, timeout)]
        self._suspect_nodes.update({t.node_id: time.monotonic() for t in dead_ps + dead_workers})
        if ps_inconsistent and not dead_ps and dead_workers:
            self._event("an update failed part-way (a worker's gradient was lost)")
            self._restore_ps([])
        if not dead_ps and not dead_workers:
            cause = getattr(exc, "cause", None) or exc
            raise UserCodeError(f"step {self.step} failed in user code: {type(cause).__name__}: {cause}") from exc
        if dead_workers:
            self._event(f"{len(dead_workers)} worker(s) died; continuing with {len(self.workers) - len(dead_workers)}")
            for t in dead_workers:
                tasks.kill(t.handle)
            with self._lock:
                self.workers = [t for t in self.workers if t not in dead_workers]
        if dead_ps:
            self._restore_ps(dead_ps)
        if not self.workers:
            if not self.config.replace_dead_workers:
                raise JobFailedError("every worker died and replace_dead_workers is off") from exc
            with self._lock:
                shape = self._target
            pending = self._launch(shape, self._applied_request, reason="replace", strict=False)
            names = [task_name("worker", i) for i in pending.new_workers]
            started = tasks.wait_ready(list(pending.new_workers.values()), self.config.placement_timeout_s, names)
            for p in pending.new_ps.values():
                tasks.kill(p.handle)
            self._install_tasks(Shape(len(self.ps), len(started)), {}, dict(enumerate(started)), None)
            self._event(f"replaced all workers ({len(started)})")

    def _restore_ps(self, dead: list[tasks.Task]) -> None:
        if self._store is None:
            raise JobFailedError("a PS shard died and no checkpoint_dir is configured")
        ckpt = self._latest_checkpoint()
        if ckpt is None:
            raise JobFailedError("a PS shard died before the first checkpoint")
        for t in self.ps:
            tasks.kill(t.handle)
        lost = self.step - ckpt.step
        num_ps = len(self.ps)
        with self._lock:
            self.ps = []
            placement = {k: v for k, v in self._target.placement.items() if k.startswith("ps-")}
        pending = self._launch(
            Shape(num_ps, len(self.workers), placement), self._applied_request, "restore", strict=False
        )
        for p in pending.new_workers.values():
            tasks.kill(p.handle)
        names = [task_name("ps", i) for i in pending.new_ps]
        started = tasks.wait_ready(list(pending.new_ps.values()), self.config.placement_timeout_s, names)
        with self._lock:
            self.step, self.position, self.samples_seen = ckpt.step, ckpt.position, ckpt.samples_seen
        self._install_tasks(Shape(num_ps, len(self.workers)), dict(enumerate(started)), {}, ckpt.state)
        if self._loop:  # the loops go back to the checkpoint's step with its registered state
            self._user_state, self._user_state_at = ckpt.user_state, ckpt.step
            self._joiners = {id(w.handle): ckpt.user_state for w in self.workers}
        self._event(f"{len(dead)} PS shard(s) died; restored from checkpoint at step {ckpt.step} (lost {lost} steps)")

    # ------------------------------------------------------------ validation
    def _check_shape(self, num_ps: int, num_workers: int, placement: dict[str, str]) -> None:
        if num_ps < 1 or num_workers < 1:
            raise ConfigError(f"a job needs at least 1 PS and 1 worker, got {num_ps}x{num_workers}")
        valid = {task_name("ps", i) for i in range(num_ps)} | {task_name("worker", i) for i in range(num_workers)}
        unknown = sorted(set(placement) - valid)
        if unknown:
            raise ConfigError(f"placement names tasks that the shape {num_ps}x{num_workers} does not have: {unknown}")

    def _check_checkpoint(self, ckpt: Checkpoint) -> None:
        if ckpt.seed != self.program.seed or ckpt.optimizer != self.program.optimizer_name:
            raise ConfigError(
                f"checkpoint in {self.config.checkpoint_dir} is for seed {ckpt.seed} / {ckpt.optimizer}, "
                f"the program has seed {self.program.seed} / {self.program.optimizer_name}"
            )
        why = layout_mismatch(ckpt, self._layout)
        if why:  # the program's code changed since the checkpoint was written
            raise UserCodeError(f"checkpoint {ckpt.file} does not match the model: {why}")


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
