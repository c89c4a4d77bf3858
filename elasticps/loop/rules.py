"""The rules of a loop's step that a job's worker needs kept, written once.

A job's worker (:class:`~elasticps.loop.worker_session.WorkerSession`) and one
process (:class:`~elasticps.loop.local.LocalSession`) both check them, with the
same :class:`ProgramError`, so that a loop run alone is told what a job would
tell it. Each function raises, or says nothing; where the parameters are kept
differs (a worker's flat buffer, a copy in one process), so the comparison
comes in as ``changed``.
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from typing import Any, Protocol

import torch

from elasticps.errors import ProgramError

CHECKED_STEPS = 3  # checks, on a loop's first steps, that only the prepared optimizer changed the parameters


class StepOwner(Protocol):
    def optimizer_step(self, closure: Callable[[], Any] | None) -> Any: ...


def _elastic_step(opt: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> Any:
    """The prepared optimizer's ``step()`` (a method of the optimizer, so an LR
    scheduler may wrap it as it wraps any optimizer's)."""
    opt._opt_called = True  # type: ignore[attr-defined]  # what torch's LR schedulers check
    return opt._elasticps_session.optimizer_step(closure)  # type: ignore[attr-defined]


def route_step(opt: torch.optim.Optimizer, owner: StepOwner) -> None:
    """Make ``opt.step(closure)`` call ``owner.optimizer_step(closure)``. An LR
    scheduler made before ``prepare()`` wrapped the step: the new one is marked
    as that scheduler marks its wrapper, so it finds the step it wrapped still
    watched and says nothing of it being overridden; else the step is a method,
    as a scheduler made after ``prepare()`` wraps it."""
    opt._elasticps_session = owner  # type: ignore[attr-defined]
    if hasattr(opt.step, "_wrapped_by_lr_sched"):

        def step(closure: Callable[[], Any] | None = None) -> Any:
            return _elastic_step(opt, closure)

        step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        opt.step = step  # type: ignore[method-assign]
    else:
        opt.step = types.MethodType(_elastic_step, opt)  # type: ignore[method-assign]


def prepared_twice() -> ProgramError:
    return ProgramError("prepare() was called twice: a job trains one model with one optimizer")


def norm_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's BatchNorm layers (checked at every step: :func:`check_step`)."""
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def check_step(closure: Callable[[], Any] | None, batch_open: bool, norms: list[torch.nn.Module]) -> None:
    """At the prepared optimizer's ``step()``: ``batch_open``, a batch was handed
    out and not stepped yet; ``norms``, the model's BatchNorm layers."""
    if closure is not None:
        raise ProgramError("optimizer.step(closure) (LBFGS-style re-evaluation) is not supported in a job")
    if not batch_open:
        raise ProgramError(
            "optimizer.step() was called twice for one batch, or outside the loop over the DataLoader: "
            "one prepared optimizer steps once per batch (a second optimizer is not supported)"
        )
    if any(m.training for m in norms):
        raise ProgramError(
            "BatchNorm in training mode normalises each worker's share of the batch by the share's "
            "statistics, so sync training would not be the one-process training: use GroupNorm or "
            "LayerNorm, or keep the BatchNorm layers in eval mode"
        )


def check_stepped(stepped: bool, check_params: Callable[..., None]) -> None:
    """As the loop asks for the next batch: the last one ended with the prepared
    optimizer's step. If not, changed parameters say how (another optimizer's
    step, one made after ``prepare()``, or by hand): ``check_params(lead=...)``."""
    if stepped:
        return
    check_params(lead="the prepared optimizer did not step(), yet the parameters changed")
    raise ProgramError(
        "the loop asked for the next batch before the prepared optimizer's step(): every batch "
        "must end with optimizer.step() (parameters changed by hand, e.g. through p.data, are "
        "not trained: the PS holds them)"
    )


def epoch_cut_short(epoch: int) -> ProgramError:
    """The loop went on to the next epoch before the DataLoader's loop over ``epoch`` ended."""
    return ProgramError(
        f"the loop over the DataLoader ended before epoch {epoch} did: every epoch of "
        "elasticps.torch.epochs(n) must iterate the DataLoader to its end"
    )


class ParamsWatch:
    """On a loop's first ``CHECKED_STEPS`` checks: the parameters are still the
    ones the prepared optimizer left (a worker: those it pulled)."""

    def __init__(self) -> None:
        self.checks_left = CHECKED_STEPS

    def check(self, changed: Callable[[], bool] | None, where: str = "", lead: str = "") -> None:
        """A ProgramError if ``changed()``, led by ``lead``, else by the parameters
        changed ``where``; ``changed`` None: nothing to compare with yet."""
        if self.checks_left <= 0 or changed is None:
            return
        self.checks_left -= 1
        if changed():
            lead = lead or f"parameters changed {where} other than by the prepared optimizer"
            raise ProgramError(
                f"{lead} (a second optimizer, "
                "one made after prepare() included, or p.data changed by hand): the PS shards hold the "
                "parameters, so such a change would be lost; step the optimizer prepare() returned, and "
                "change parameters only through it"
            )


#: Autograd nodes a loss passes through unchanged on its way to ``backward()``:
#: a cast (autocast's), a copy, a sum of losses (each one looked at).
_THROUGH = {"ToCopyBackward0", "CloneBackward0", "AddBackward0"}
_SUM = 2  # the ``_saved_reduction`` of a loss node reduced by 'sum' (torch's Reduction enum; 0 none, 1 mean)
#: The torch functions behind the loss nodes a user is likeliest to meet (else the node's own name).
_LOSSES = {
    "NllLoss": "cross_entropy or nll_loss",
    "MseLoss": "mse_loss",
    "BinaryCrossEntropyWithLogits": "binary_cross_entropy_with_logits",
    "BinaryCrossEntropy": "binary_cross_entropy",
    "SmoothL1Loss": "smooth_l1_loss",
    "HuberLoss": "huber_loss",
}


def _loss_name(node: Any) -> str:
    name = type(node).__name__.removesuffix("Backward0")
    return _LOSSES.get(name, name)


def summed_over_batch(node: Any, depth: int = 0) -> str | None:
    """How the loss whose autograd node is ``node`` sums over its batch, if it
    visibly does: a torch loss with ``reduction='sum'``, or one with
    ``reduction='none'`` then ``.sum()``. None where it does not, or where the
    graph does not tell (a sum scaled or divided afterwards, say by the batch's
    size, is taken for what the loop means)."""
    if node is None or depth > 8:
        return None
    name = type(node).__name__
    if getattr(node, "_saved_reduction", None) == _SUM:
        return f"{_loss_name(node)} with reduction='sum'"
    children = [child for child, _ in node.next_functions if child is not None]
    if name == "SumBackward0" and children and getattr(children[0], "_saved_reduction", None) == 0:
        return f"{_loss_name(children[0])} with reduction='none', then .sum()"
    if name in _THROUGH:
        return next((found for c in children if (found := summed_over_batch(c, depth + 1))), None)
    return None


class LossWatch:
    """On a loop's first ``CHECKED_STEPS`` calls of ``backward()`` (from the
    thread that started the watch): the loss is not a sum over the batch. A
    job's workers each compute the loss of their share of the batch and their
    gradients are weighed as means (b_w / M), so a summed loss would train at
    a learning rate that changes with the number of workers. With ``note``
    (a job's worker), every scalar that thread calls ``backward()`` on is
    also handed to it (the loss, for the job's reports), for as long as the
    watch is on.

    Watching wraps ``torch.autograd.backward`` (what ``Tensor.backward`` calls)
    while any watch is on; the wrapper only reads the loss's value and autograd node."""

    def __init__(self, note: Callable[[float], None] | None = None) -> None:
        self.checks_left = CHECKED_STEPS
        self.note = note
        self.thread: int | None = None

    def start(self) -> None:
        self.thread = threading.get_ident()
        with _lock:
            if self not in _watches:
                _watches.append(self)
            if not _unwrapped:  # wrapped once, however many watches
                _wrap_backward()

    def stop(self) -> None:
        with _lock:
            if self in _watches:
                _watches.remove(self)
            if not _watches:
                _unwrap_backward()

    def see(self, tensors: Any) -> None:
        if self.thread != threading.get_ident():
            return
        losses = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors or ())
        if self.note is not None:
            for loss in losses:
                if isinstance(loss, torch.Tensor) and loss.numel() == 1:
                    self.note(float(loss.detach()))
        if self.checks_left <= 0:
            return
        self.checks_left -= 1
        if self.checks_left <= 0 and self.note is None:
            self.stop()
        for loss in losses:
            how = summed_over_batch(getattr(loss, "grad_fn", None))
            if how is not None:
                raise ProgramError(
                    f"the loss is a sum over the batch ({how}): split among workers, it would train at a "
                    "learning rate that changes with their number; use reduction='mean' (torch's default) "
                    "or divide the sum by the batch's size"
                )


_lock = threading.Lock()
_watches: list[LossWatch] = []
_unwrapped: list[Callable[..., Any]] = []  # torch.autograd.backward while it is wrapped


def _wrap_backward() -> None:
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        for watch in list(_watches):
            watch.see(tensors)
        return original(tensors, *args, **kwargs)

    _unwrapped.append(original)
    torch.autograd.backward = backward


def _unwrap_backward() -> None:
    if _unwrapped:
        torch.autograd.backward = _unwrapped.pop()
