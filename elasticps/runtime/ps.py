"""A parameter-server shard: a slice of the flat parameters and its optimizer."""

from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np
import ray
import torch

from elasticps.loop.rows import DenseSlice, Tables, read_rows, sum_pushes
from elasticps.program import TrainingProgram
from elasticps.runtime.bounded_get import get_within
from elasticps.runtime.config import DEFAULT_STEP_TIMEOUT_S
from elasticps.runtime.cpu_limit import CpuLimit
from elasticps.runtime.membership import task_name
from elasticps.runtime.shard_state import ShardState
from elasticps.runtime.shm import Attachments, OwnedVector, ShmRef, available


class PSShard:
    """Holds ``params[lo:hi]`` and applies the optimizer to it.

    :meth:`apply` receives gradient slices, sums them in the order given and
    takes one optimizer step. In ``sync`` mode they are every worker's slice for
    one step (each scaled by 1/M, so the sum is the global-batch mean gradient);
    in ``async`` mode, one worker's slice (scaled by 1/its batch), applied at once.

    The slice is one tensor, or (a user loop whose optimizer has several param
    groups) one tensor per group segment, each a view of the slice, so that
    each segment is updated with its group's hyperparameters.

    A model with PS-held embedding tables (``program.tables``) pulls and
    pushes only its dense part and the rows a batch touches
    (:mod:`elasticps.loop.rows`); the shard still updates its whole range.

    ``wait_s``: how long it waits for the gradients of a step and the other
    shards' norms (the job's ``step_timeout_s``): a shard waiting on a hung
    worker gives up rather than hang with it.
    """

    def __init__(
        self,
        program: TrainingProgram,
        threads: int = 1,
        shared_memory: bool = True,
        cpu_limit: float | None = None,
        wait_s: float = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        torch.set_num_threads(max(1, threads))
        self.wait_s = wait_s
        self.program = program
        self.cpu_limit = CpuLimit(cpu_limit)
        self.shared_memory = shared_memory and available()
        self._param_shm: OwnedVector | None = None
        self._old_shm: list[OwnedVector] = []
        self._attached = Attachments()
        self.data = torch.zeros(0)
        self.opt, self.segments = program.shard_optimizer(self.data, 0)
        self.version = 0
        self.lo = 0  # where the slice starts in the flat vector
        self.tables: Tables | None = getattr(program, "tables", None)
        self._summed: tuple[int, np.ndarray, float] = (-1, np.zeros(0, np.float32), 0.0)
        self._sum_out = np.zeros(0, np.float32)  # the buffer the workers' gradients are summed into, reused
        self._handle: Any = None  # this actor's handle, given with the pulls when the model has PS-held tables

    # -- lifecycle ------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": _pid()}

    def set_state(self, state: ShardState, version: int, lo: int = 0) -> np.ndarray:
        """Load the state of the slice that starts at element ``lo``; returns the
        parameters (for the first pulls)."""
        if self.shared_memory:
            # A new segment per shape; the previous one may still be mapped by readers of the last step.
            for old in self._old_shm:
                old.close()
            self._old_shm = [self._param_shm] if self._param_shm is not None else []
            self._param_shm = OwnedVector("param", state.numel)
            self._param_shm.array[:] = state.params
            data = torch.from_numpy(self._param_shm.array)
        else:
            data = torch.from_numpy(np.array(state.params, dtype=np.float32))
        self.data, self.lo = data, lo
        self.opt, self.segments = self.program.shard_optimizer(data, lo)
        if state.vectors or state.scalars:
            sd = self.opt.state_dict()
            sd["state"] = {}
            offset = 0
            for i, p in enumerate(self.segments):
                n = p.numel()
                inner: dict[str, Any] = {
                    k: torch.from_numpy(np.array(v[offset : offset + n])) for k, v in state.vectors.items()
                }
                inner.update({k: torch.tensor(v, dtype=torch.float32) for k, v in state.scalars.items()})
                sd["state"][i] = inner
                offset += n
            self.opt.load_state_dict(sd)
        self.version = version
        return self._pulled() if self.tables else self.data.numpy()

    def get_state(self) -> ShardState:
        """Parameters and optimizer state of the slice: per-element state glued
        over the segments, scalar state (a step count) from the first one."""
        parts: dict[str, list[np.ndarray]] = {}
        scalars: dict[str, float] = {}
        for p in self.segments:
            for key, value in self.opt.state.get(p, {}).items():
                if isinstance(value, torch.Tensor) and value.numel() == p.numel() and value.dim() == 1:
                    parts.setdefault(key, []).append(value.detach().numpy())
                else:
                    scalars.setdefault(key, float(value))
        vectors = {k: np.concatenate(v) for k, v in parts.items()}
        return ShardState(self.data.numpy().copy(), vectors, scalars)

    def params(self) -> np.ndarray:
        return self.data.numpy()

    @ray.method(concurrency_group="rows")
    def read_rows(self, table: int, ids: np.ndarray, step: int) -> np.ndarray:
        """Rows ``ids`` of PS-held table ``table`` at the parameters of ``step`` as
        this shard holds them (zeros where another shard holds a row's rest). It
        runs in its own concurrency group: a worker's forward reads rows while this
        step's update waits for the gradients, which that forward precedes; rows of
        another step than the shard's (a read the step protocol should not let
        through) are refused, not mixed into a batch."""
        assert self.tables is not None
        if step != self.version:
            raise RuntimeError(
                f"rows of step {step}'s parameters were asked of a shard at step {self.version}'s: "
                "the step that read them cannot stand"
            )
        return read_rows(self.data.numpy(), self.lo, self.tables.tables[table], ids)

    def _pulled(self) -> DenseSlice:
        assert self.tables is not None
        if self._handle is None:
            self._handle = ray.get_runtime_context().current_actor
        return DenseSlice(self.tables.compact(self.data.numpy(), self.lo), self._handle)

    def ping(self) -> int:
        return self.version

    def close(self) -> None:
        """Unlink this shard's shared memory (before the actor is killed)."""
        for vec in [*self._old_shm, self._param_shm]:
            if vec is not None:
                vec.close()
        self._old_shm, self._param_shm = [], None

    # -- training ---------------------------------------------------------------
    def reduce(
        self,
        step: int,
        grads: list[ray.ObjectRef],
        lr: dict[str, Any] | None = None,
        senders: list[str] | None = None,
    ) -> dict[str, float]:
        """Sum the workers' gradient slices for ``step`` and keep the sum for
        :meth:`apply`; returns what every shard needs to clip by the norm of the
        whole gradient: this slice's part of the norm that the user loop's
        statistics ``lr`` ask for (``clip``), nothing when it does not clip.
        ``senders``: as :meth:`apply`'s."""
        total, received_at = self._sum(step, grads, senders)
        self._summed = (step, total, received_at)
        clip = lr.get("clip") if isinstance(lr, dict) else None
        return {} if clip is None else norm_part(total, clip[1])

    def _sum(self, step: int, grads: list[ray.ObjectRef], senders: list[str] | None) -> tuple[np.ndarray, float]:
        pushed = get_within(grads, self.wait_s, f"the workers' gradients of step {step}", senders)
        received_at = time.time()
        if self.tables:
            with self.cpu_limit.held():
                lo = self.lo
                return sum_pushes(self.tables, pushed, self._attached.resolve, lo, lo + self.data.numel()), received_at
        arrays = [self._attached.resolve(g) for g in pushed]
        with self.cpu_limit.held():
            total = arrays[0] if len(arrays) == 1 else np.add(arrays[0], arrays[1], out=self._sum_buffer(arrays[0]))
            for g in arrays[2:]:
                total += g
        return total, received_at

    def _sum_buffer(self, like: np.ndarray) -> np.ndarray:
        """Where to sum a step's gradients: a fresh 40 MB array every step costs about as
        much in page faults as the sum itself. A step's sum is used up (by :meth:`apply`)
        before the next step's :meth:`reduce` or :meth:`apply` sums into it again."""
        if self._sum_out.shape != like.shape:
            self._sum_out = np.empty(like.shape, dtype=np.float32)
        return self._sum_out

    def apply(
        self,
        step: int,
        grads: list[ray.ObjectRef],
        measure: bool,
        copy_out: bool = True,
        lr: float | dict[str, Any] | None = None,
        norms: list[dict[str, float]] | None = None,
        lr_factor: float = 1.0,
        senders: list[str] | None = None,
    ) -> tuple[dict[str, float], np.ndarray | ShmRef | DenseSlice]:
        """Sum the workers' gradient slices for ``step`` (in the order given) and update.

        ``grads`` are object refs to arrays (copies from other nodes) or to
        :class:`ShmRef` (read in place). The shard waits for them itself, so the controller can
        submit the update together with the workers' steps. Returns timings
        (with ``measure``, the squared norm of the summed gradient, for the
        noise scale) and the new parameters for the next pulls: a copy, or with
        ``copy_out=False`` a :class:`ShmRef` to them for same-node workers.
        ``lr``: this step's learning rate (schedule and batch scaling applied),
        or a user loop's worker statistics, whose ``groups`` are the
        hyperparameters of each param group of the user's optimizer at this
        step (an LR scheduler's lr among them) and ``clip`` its global-norm
        clipping. ``norms``: every shard's :meth:`reduce` of this step (then
        ``grads`` is empty: the sum was kept by :meth:`reduce`); without them a
        loop's clipping is by this shard's own norm, the whole gradient's when
        it is the job's only shard (the controller then skips the reduce call).
        ``lr_factor``: a loop's adaptive-batch factor on each group's lr (this
        shard's copy of the hyperparameters only; the user's optimizer keeps its
        own). The measured norm is the gradient's before any clipping.
        ``senders``: the worker each of ``grads`` comes from (``worker-2``: a
        worker with no samples sends none, so a gradient's place in the list is
        not its worker's), named if its gradient does not come in time.
        """
        if norms is not None:
            shards = [task_name("ps", j) for j in range(len(norms))]
            norms = get_within(list(norms), self.wait_s, f"the shards' norms of step {step}", shards)  # their reduce's
            summed_step, total, received_at = self._summed
            assert summed_step == step, f"reduce of step {summed_step}, apply of step {step}"
        else:
            total, received_at = self._sum(step, grads, senders)
        info = {"received_at": received_at}
        if measure:
            info["grad_sqnorm"] = float(np.dot(total, total))
        t1 = time.perf_counter()
        clip = lr.get("clip") if isinstance(lr, dict) else None
        if clip is not None:  # into the reused buffer: no fresh 40 MB each step
            norms = norms if norms is not None else [norm_part(total, clip[1])]
            total = np.multiply(total, np.float32(clip_coefficient(clip, norms)), out=self._sum_buffer(total))
        with self.cpu_limit.held():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # non-writable array: the grad is only read
                grad = torch.from_numpy(total)
            offset = 0
            for p in self.segments:
                p.grad = grad[offset : offset + p.numel()]
                offset += p.numel()
            if isinstance(lr, dict):
                for group in self.opt.param_groups:
                    group.update(lr["groups"][group["user_group"]])
                    if lr_factor != 1.0:
                        group["lr"] = group["lr"] * lr_factor
            elif lr is not None:
                for group in self.opt.param_groups:
                    group["lr"] = lr
            self.opt.step()
            for p in self.segments:
                p.grad = None
        self.version = step + 1  # the step whose parameters these are
        info["update_s"] = time.perf_counter() - t1
        if self.tables:
            return info, self._pulled()
        if not copy_out and self._param_shm is not None:
            return info, self._param_shm.ref()
        return info, self.data.numpy()


def norm_part(total: np.ndarray, norm_type: float) -> dict[str, float]:
    """A slice's part of the whole gradient's ``norm_type`` norm: its largest
    magnitude (inf-norm) or its squared 2-norm. Neither makes a temporary array
    (``np.abs`` of a 40 MB slice costs more in page faults than the reading)."""
    if norm_type == float("inf"):
        return {"max": max(float(total.max()), -float(total.min())) if len(total) else 0.0}
    return {"sq": float(np.dot(total, total))}


def clip_coefficient(clip: tuple[float, float], norms: list[dict[str, float]]) -> float:
    """``torch.nn.utils.clip_grad_norm_``'s factor for the whole gradient, from
    each shard's part: min(1, max_norm / (norm + 1e-6))."""
    max_norm, norm_type = clip
    norm = max(n["max"] for n in norms) if norm_type == float("inf") else sum(n["sq"] for n in norms) ** 0.5
    return min(1.0, max_norm / (norm + 1e-6))


def _pid() -> int:
    import os

    return os.getpid()
