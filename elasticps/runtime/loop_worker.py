"""A worker that runs the user's own training loop (see :mod:`elasticps.loop`).

It answers the controller's :meth:`step` exactly as :class:`~elasticps.runtime.worker.Worker`
does (statistics, then a gradient slice per PS shard), so the controller's step
protocol, membership, rescale and recovery are the same for both; only who
computes the gradient differs: here the user's code, in a thread of this actor,
between the DataLoader handing out this worker's share of the batch and the
prepared optimizer's ``step()``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any

import numpy as np
import ray
import torch

from elasticps.errors import ProgramError, TrainingFunctionError, broke_a_rule, loop_error_text
from elasticps.loop.api import set_session
from elasticps.loop.program import LoopProgram
from elasticps.loop.worker_session import RELEASE, ParamsMessage, Released, StepMessage, WorkerSession
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S
from elasticps.runtime.shm import OwnedVector, available
from elasticps.runtime.worker_base import WorkerBase

#: Concurrent calls a loop worker serves: a step blocks while the user's code
#: runs, and pings, snapshots and releases must still get through.
MAX_CONCURRENCY = 4
_ENDED = object()


def _install_clip_hook(session: WorkerSession) -> None:
    """``torch.nn.utils.clip_grad_norm_`` over the prepared model's parameters is
    recorded, not applied here: the PS shards clip the global gradient by its
    global norm. It returns this worker's local norm (of its unweighted share)."""
    original = torch.nn.utils.clip_grad_norm_

    def clip_grad_norm_(
        parameters: Any,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
        foreach: bool | None = None,
    ) -> torch.Tensor:
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        if not session.clips(params, float(max_norm), float(norm_type)):
            return original(params, max_norm, norm_type, error_if_nonfinite, foreach)
        grads = [p.grad.reshape(-1) for p in params if p.grad is not None]
        return torch.linalg.vector_norm(torch.cat(grads), float(norm_type)) if grads else torch.tensor(0.0)

    torch.nn.utils.clip_grad_norm_ = clip_grad_norm_  # type: ignore[assignment]
    torch.nn.utils.clip_grad.clip_grad_norm_ = clip_grad_norm_  # type: ignore[assignment]


class LoopWorker(WorkerBase):
    def __init__(
        self,
        program: LoopProgram,
        threads: int = 1,
        shared_memory: bool = True,
        cpu_limit: float | None = None,
        dataset: Any = None,
        wait_s: float = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        super().__init__(threads, cpu_limit, wait_s)
        self.program = program
        self._shared = shared_memory and available()
        self.session = WorkerSession(program, self._grad_buffer, wait_s=wait_s)
        set_session(self.session)
        _install_clip_hook(self.session)
        self._done = threading.Event()
        self.error: str | None = None
        self.rule_broken = False  # the error is a ProgramError (TrainingFunctionError)
        self._thread = threading.Thread(target=self._run, name="user-loop", daemon=True)
        self._thread.start()

    def _grad_buffer(self, numel: int) -> np.ndarray | None:
        if not self._shared:
            return None
        self._grad_shm = OwnedVector("grad", numel)
        return self._grad_shm.array

    def _run(self) -> None:
        try:
            self.program.fn(**self.program.args)
        except Released:
            pass
        except BaseException as exc:  # the user's error: kept, and given to the step waiting for it
            self.error = loop_error_text(exc)
            self.rule_broken = broke_a_rule(exc)  # a ProgramError the loop wrapped in its own error too
            self.session.outbox.put(TrainingFunctionError(self.error, self.rule_broken))
            self.session.snapshots.put(TrainingFunctionError(self.error, self.rule_broken))
        finally:
            self._done.set()
            self.session.prepared.set()
            self.session.outbox.put(_ENDED)
            self.session.snapshots.put(_ENDED)

    # -- lifecycle ----------------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        """Once the user's function has prepared its model (or failed before)."""
        self.session.prepared.wait()
        if self.error is not None:
            raise TrainingFunctionError(
                f"the training function failed before its first step:\n{self.error}", self.rule_broken
            )
        if self.session.flat is None:
            raise ProgramError("the training function returned without calling elasticps.torch.prepare")
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def close(self) -> None:
        """Leave the job: the loop ends quietly at its next wait; shared memory is unlinked."""
        self.session.inbox.put(RELEASE)
        super().close()

    # -- the step protocol ----------------------------------------------------------------
    def step(
        self,
        step: int,
        indices: np.ndarray,
        param_refs: list[ray.ObjectRef],
        bounds: list[tuple[int, int]],
        denominator: int,
        seed: int,
        measure: bool = False,
        same_node: list[bool] | None = None,
        prefetch: np.ndarray | None = None,
        epoch: int = 0,
        pad: bool = False,
        user_state: bytes | None = None,
    ) -> tuple[Any, ...]:
        """This worker's gradient of step ``step``: ``indices`` are its share of the
        global batch of ``denominator`` samples (``pad``: a stand-in sample
        weighted 0, the batch being smaller than the workers). With ``measure``,
        the squared norm of its share's mean gradient (before the share's
        weight) is the small-batch half of a noise-scale sample; a worker that
        holds the whole batch has none."""
        loader = self.session.loader
        batch, prefetched = self._samples(indices, prefetch, None if loader is None else loader.fetch)
        t0 = time.perf_counter()
        parts = self._pull(param_refs)
        t1 = time.perf_counter()
        scale = 0.0 if pad else len(indices) / denominator
        self.session.inbox.put(StepMessage(step, epoch, parts, bounds, indices, batch, scale, user_state))
        with self.cpu_limit.held():
            out = self._await(self.session.outbox)
        t2 = time.perf_counter()
        assert self.session.flat is not None
        small = len(indices) if measure and scale > 0 and len(indices) < denominator else 0
        sqnorm = float("nan")
        if small:
            grads = self.session.flat.grads
            rows_sq = sum(float(np.dot(g.ravel(), g.ravel())) for _, _, g in self.session.row_grads)
            sqnorm = (float(torch.dot(grads, grads)) + rows_sq) / scale**2
        grads, rows = self.session.flat.grads_numpy(), self.session.rows
        if rows is None:
            slices = self._handoff(grads, bounds, same_node)
        else:  # the dense gradient, and the rows of the PS-held tables that the batch read
            self._raise_lost()
            dense = self._handoff(grads, rows.tables.dense_bounds(bounds), same_node)
            slices = rows.pushes(dense, self.session.row_grads, bounds)
        stats = {
            **out,
            "step": step,
            "samples": 0 if pad else len(indices),
            "pull_s": t1 - t0,
            "compute_s": t2 - t1,
            "batch_half": small,
            "sqnorm_half": sqnorm,
            "sqnorm_local": float("nan"),
            **self._transfer_stats(parts, slices, prefetched),
        }
        if rows is not None:  # the rows read come from the shards too
            stats["pull_bytes"] = [a + b for a, b in zip(stats["pull_bytes"], rows.read_bytes, strict=True)]
        return (stats, *slices)

    def snapshot(
        self, param_refs: list[ray.ObjectRef], bounds: list[tuple[int, int]], step: int, next_epoch: int | None
    ) -> dict[str, Any]:
        """Give the loop the parameters of ``step`` without a batch; return its
        registered state (and reports) as they are when it next waits for a batch."""
        parts = self._pull(param_refs)
        self.session.inbox.put(ParamsMessage(step, parts, bounds, next_epoch, snapshot=True))
        out = self._await(self.session.snapshots)
        self._raise_lost()
        return out

    def finish(
        self, param_refs: list[ray.ObjectRef], bounds: list[tuple[int, int]], step: int, timeout_s: float
    ) -> dict[str, Any]:
        """Training is over: give the loop the final parameters and let it end
        (its last evaluation and reports run now). Returns its last reports."""
        parts = self._pull(param_refs)
        self.session.inbox.put(ParamsMessage(step, parts, bounds, None))
        ended = self._done.wait(timeout_s)
        if self.error is not None:
            raise TrainingFunctionError(
                f"the training function failed after its last step:\n{self.error}", self.rule_broken
            )
        self._raise_lost()
        return {"reports": self.session.take_reports(), "ended": ended, "state": self.session.snapshot()}

    def held_bytes(self) -> int:
        """What this worker holds of the model (see :meth:`WorkerSession.held_bytes`)."""
        return self.session.held_bytes()

    def _raise_lost(self) -> None:
        """A PS-held table's shard could not be read since the last call: what the
        loop computed since is not to be used (the shard died; the job recovers)."""
        lost = self.session.rows.take_lost() if self.session.rows else None
        if lost is not None:
            raise lost

    def _await(self, box: queue.Queue) -> Any:
        out = box.get()
        if isinstance(out, TrainingFunctionError):
            raise out
        if out is _ENDED:
            raise ProgramError(
                f"the training function returned at step {self.session.steps} before the job's end "
                f"(epoch {self.session.epoch} of {self.program.epochs}): let `for epoch in "
                "elasticps.torch.epochs(n)` run out"
            )
        return out
