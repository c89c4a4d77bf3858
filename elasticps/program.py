"""The training-program interface: what a user hands to elasticps.

A program is plain data plus factories. Each worker process builds its own
model and dataset from the factories, so they must be importable or picklable
(cloudpickle handles closures and lambdas defined in ``__main__``).

Split invariance: in ``sync`` mode the update at step t is the same for any
number of PS shards and workers. That holds when the model's output for a sample
does not depend on the other samples of the batch (no BatchNorm in training
mode) and the forward pass is deterministic (no dropout), and when ``loss``
returns the *mean* over the samples it is given.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from elasticps.errors import ProgramError

#: Optimizers whose update is elementwise, so sharding the flat parameter vector
#: across PS tasks gives exactly the single-process update.
ELEMENTWISE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
}

#: Optimizers with a fused CPU kernel in torch, used unless the program asks otherwise.
FUSED_OPTIMIZERS = frozenset({"sgd", "adam", "adamw", "adagrad"})

#: How the learning rate follows the global batch M when it changes from the
#: program's ``batch_size`` M0: lr x (M/M0)^k, k = 0.5 (square-root scaling, the
#: safe default for adaptive optimizers), 1 (linear scaling, SGD's classic rule)
#: or 0 (unchanged).
LR_SCALING = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}


def check_batch_range(name: str, base: int, top: int | None, batch: int) -> int:
    """``batch`` if it is in ``base..top`` (``top`` None: ``base`` only), else a ProgramError."""
    top = top or base
    if not (isinstance(batch, int) and base <= batch <= top):
        raise ProgramError(f"{name}: global batch must be in {base}..{top}, got {batch!r}")
    return batch


def check_adaptive_range(base: int, top: int | None, lr_scaling: str) -> None:
    """A ProgramError unless ``top`` (None: fixed batch) is an int >= ``base``
    and ``lr_scaling`` is one of :data:`LR_SCALING`."""
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and top >= base):
        raise ProgramError(f"max_batch_size must be an int >= batch_size ({base}), got {top!r}")
    if lr_scaling not in LR_SCALING:
        raise ProgramError(f"lr_scaling must be one of {sorted(LR_SCALING)}, got {lr_scaling!r}")


def check_batch_fits(base: int, top: int | None, num_samples: int) -> None:
    """A ProgramError if the adaptive batch may grow past the dataset: a global
    batch holds one epoch at most, so a larger M would train on fewer samples
    than it says, with the lr scaled for samples that are not there."""
    if top is not None and top > max(base, num_samples):
        raise ProgramError(
            f"max_batch_size {top} is more than the dataset's {num_samples} samples: a global batch holds "
            "one epoch at most (the lr rule would scale for samples that are not there)"
        )


def lr_factor(batch: int, base: int, lr_scaling: str) -> float:
    """What the learning rate is multiplied by at global batch ``batch``: (batch/base)^k."""
    return (batch / base) ** LR_SCALING[lr_scaling]


Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Metric = Callable[[torch.Tensor, torch.Tensor], float]


@dataclass(frozen=True)
class TrainingProgram:
    """A PyTorch training job for the elastic PS runtime.

    Attributes:
        name: short name shown in reports.
        model: zero-argument factory returning a fresh ``torch.nn.Module``.
            Called after ``torch.manual_seed(seed)``, so the initial parameters
            are reproducible.
        dataset: an indexable dataset (``len`` and ``__getitem__`` returning
            ``(input, target)``), or a zero-argument factory returning one.
            ``torch.utils.data.TensorDataset`` is indexed in one vectorised call;
            other samples are batched by ``default_collate``, so ``input`` may be
            a tuple (passed to the model as positional arguments) or a dict
            (keyword arguments) of tensors.
        loss: ``loss(output, target)`` returning the mean loss of the samples.
        eval_dataset: optional held-out dataset (or factory) for ``metric``.
        metric: optional ``metric(output, target) -> float`` (e.g. accuracy),
            averaged over ``eval_dataset`` at the end of every epoch.
        optimizer: one of :data:`ELEMENTWISE_OPTIMIZERS`, or (with
            ``inexact_optimizer``) any ``torch.optim.Optimizer`` class.
        optimizer_kwargs: extra arguments (e.g. ``{"momentum": 0.9}``).
        inexact_optimizer: allow an optimizer whose update is not elementwise
            (LARS, LAMB, Shampoo, ...). Each PS shard runs it on its slice of
            the flat parameter vector as one tensor, so norms or statistics
            it takes per tensor are taken over the shard instead: the update
            differs from single-process training and depends on the number
            of PS. Its state must be tensors of the slice's size or scalars.
        lr: learning rate (at ``batch_size``, step 0).
        batch_size: the global batch size M, split across the workers; the
            initial one when ``max_batch_size`` is set.
        max_batch_size: if set (> ``batch_size``, at most the dataset's length;
            ``sync`` mode), the batch is
            adaptive: the scheduler may raise M up to this at a step boundary,
            when the job's measured gradient noise scale says larger batches
            still make progress per sample (see :mod:`elasticps.sched.goodput`).
        lr_scaling: how the learning rate follows M: one of :data:`LR_SCALING`.
        lr_schedule: optional ``lr_schedule(step) -> float``, a multiplier of
            ``lr`` at each step (warm-up, decay). The learning rate of step t at
            batch M is ``lr * lr_schedule(t) * (M / batch_size) ** k``; exact in
            ``sync`` mode for any shape and any schedule of M.
        epochs: passes over ``dataset``.
        seed: seeds the initial parameters and the data order.
    """

    name: str
    model: Callable[[], torch.nn.Module]
    dataset: Any
    loss: Loss
    lr: float
    batch_size: int
    epochs: int
    optimizer: str | type[torch.optim.Optimizer] = "sgd"
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    eval_dataset: Any = None
    metric: Metric | None = None
    seed: int = 0
    max_batch_size: int | None = None
    lr_scaling: str = "sqrt"
    lr_schedule: Callable[[int], float] | None = None
    inexact_optimizer: bool = False

    def __post_init__(self) -> None:
        custom = isinstance(self.optimizer, type) and issubclass(self.optimizer, torch.optim.Optimizer)
        if custom and not self.inexact_optimizer:
            raise ProgramError(
                f"optimizer {self.optimizer_name} is not one of {sorted(ELEMENTWISE_OPTIMIZERS)}, whose updates "
                "shard exactly; set inexact_optimizer=True to run it per PS shard (see TrainingProgram)"
            )
        if not custom and self.optimizer not in ELEMENTWISE_OPTIMIZERS:
            raise ProgramError(
                f"optimizer {self.optimizer!r} is not supported; choose one of "
                f"{sorted(ELEMENTWISE_OPTIMIZERS)} (elementwise optimizers shard exactly), "
                "or pass a torch.optim.Optimizer class with inexact_optimizer=True"
            )
        if not callable(self.model):
            raise ProgramError("model must be a zero-argument factory returning a torch.nn.Module")
        if not callable(self.loss):
            raise ProgramError("loss must be callable as loss(output, target)")
        if self.batch_size < 1:
            raise ProgramError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.epochs < 1:
            raise ProgramError(f"epochs must be >= 1, got {self.epochs}")
        if not self.lr > 0:
            raise ProgramError(f"lr must be > 0, got {self.lr}")
        check_adaptive_range(self.batch_size, self.max_batch_size, self.lr_scaling)
        if self.lr_schedule is not None and not callable(self.lr_schedule):
            raise ProgramError("lr_schedule must be callable as lr_schedule(step) -> float")
        if (self.metric is None) != (self.eval_dataset is None):
            raise ProgramError("metric and eval_dataset must be given together")

    @property
    def optimizer_name(self) -> str:
        """``sgd``, ``adam``, ... or a custom class's ``module.QualName``."""
        opt = self.optimizer
        return opt if isinstance(opt, str) else f"{opt.__module__}.{opt.__qualname__}"

    def check_batch(self, batch: int) -> int:
        """``batch`` if this program may train at it, else a ProgramError."""
        return check_batch_range(self.name, self.batch_size, self.max_batch_size, batch)

    def lr_at(self, step: int, batch: int) -> float:
        """The learning rate of ``step`` at global batch ``batch``."""
        lr = self.lr * lr_factor(batch, self.batch_size, self.lr_scaling)
        if self.lr_schedule is not None:
            factor = float(self.lr_schedule(step))
            if not (factor >= 0 and factor < float("inf")):
                raise ProgramError(f"{self.name}: lr_schedule({step}) returned {factor!r}, not a finite value >= 0")
            lr *= factor
        return lr

    def lr_text(self, step: int, batch: int) -> str:
        """The learning rate of ``step`` at ``batch``, for the job's events."""
        return f"lr {self.lr_at(step, batch):.4g}, {self.lr_scaling} scaling"

    def build_model(self) -> torch.nn.Module:
        """The model with the program's reproducible initial parameters."""
        torch.manual_seed(self.seed)
        model = self.model()
        if not isinstance(model, torch.nn.Module):
            raise ProgramError(f"model factory returned {type(model).__name__}, not a torch.nn.Module")
        return model

    def build_dataset(self) -> Any:
        return _materialize(self.dataset, "dataset")

    def build_eval_dataset(self) -> Any:
        return None if self.eval_dataset is None else _materialize(self.eval_dataset, "eval_dataset")

    def make_optimizer(self, params: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The program's optimizer over ``params``; the fused kernel where torch has one
        (the same elementwise update, several times faster on a CPU)."""
        cls = self.optimizer if isinstance(self.optimizer, type) else ELEMENTWISE_OPTIMIZERS[self.optimizer]
        kwargs = dict(self.optimizer_kwargs)
        if isinstance(self.optimizer, str) and self.optimizer in FUSED_OPTIMIZERS and "foreach" not in kwargs:
            kwargs.setdefault("fused", True)
        try:
            return cls(params, lr=self.lr, **kwargs)
        except TypeError as exc:
            raise ProgramError(f"bad optimizer_kwargs for {self.optimizer_name}: {exc}") from exc

    def shard_optimizer(self, data: torch.Tensor, lo: int) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
        """A PS shard's optimizer over ``data`` (its slice, starting at element
        ``lo`` of the flat vector, one tensor), and the parameter it updates."""
        param = torch.nn.Parameter(data)
        return self.make_optimizer([param]), [param]


def _materialize(obj: Any, what: str) -> Any:
    data = obj() if callable(obj) and not hasattr(obj, "__getitem__") else obj
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
        raise ProgramError(f"{what} must support len() and indexing, got {type(data).__name__}")
    if len(data) == 0:
        raise ProgramError(f"{what} is empty")
    return data


def check_program_ref(ref: str) -> tuple[str, str]:
    """``(module, attr)`` of ``"package.module:attr"``; a ProgramError unless every
    part is a public name (a name starting with ``_`` is no program factory)."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ProgramError(f"program reference {ref!r} must look like 'package.module:attr'")
    if any(part.startswith("_") for part in [*module_name.split("."), attr]):
        raise ProgramError(f"program reference {ref!r} names a private part (starting with '_'): name a factory")
    return module_name, attr


def load_program(ref: Any, args: Mapping[str, Any] | None = None) -> Any:
    """Resolve ``"package.module:attr"`` to a program.

    ``attr`` may be a :class:`TrainingProgram`, a callable returning one, or a
    training function that uses :mod:`elasticps.torch` (a user's own loop),
    called with the keyword arguments ``args`` (none by default). The callable
    is called once under a describe session: a factory returns its program; a
    loop is stopped at its first batch and described as a
    :class:`~elasticps.loop.program.LoopProgram` (what it prepared, its
    DataLoader and ``epochs(n)``). A program or LoopProgram passes through.
    Anything else named by ``ref`` (a class, a builtin, a private name) is
    refused before it is called, and the result is checked before anything
    uses it.
    """
    from elasticps.loop.local import describe_call
    from elasticps.loop.program import LoopProgram

    if isinstance(ref, LoopProgram):
        return ref
    if callable(ref) and not isinstance(ref, (str, TrainingProgram)):  # a training function itself
        name = f"{getattr(ref, '__module__', '?')}:{getattr(ref, '__qualname__', type(ref).__name__)}"
        return _call(name, ref, args, describe_call)
    if isinstance(ref, TrainingProgram):
        if args:
            raise ProgramError("arguments were given for a program that is not a factory")
        return ref
    module_name, attr = check_program_ref(ref)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProgramError(f"cannot import module {module_name!r} for program {ref!r}: {exc}") from exc
    except Exception as exc:  # the module's own code raised while it was imported: the user's error, named
        raise ProgramError(f"importing module {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise ProgramError(f"module {module_name!r} has no attribute {attr!r}") from exc
    if not (isinstance(obj, TrainingProgram) or inspect.isfunction(obj)):
        raise ProgramError(
            f"{ref!r} is a {type(obj).__name__}, not a TrainingProgram or a function "
            "(returning one, or a training loop that uses elasticps.torch)"
        )
    if inspect.isfunction(obj):
        return _call(ref, obj, args, describe_call)
    if args:
        raise ProgramError(f"{ref!r} is not a factory, so it takes no arguments (got {dict(args)})")
    if not isinstance(obj, TrainingProgram):
        raise ProgramError(f"{ref!r} is a {type(obj).__name__}, not a TrainingProgram")
    return obj


_SCALARS = (bool, int, float, str)  # what a spec's or the CLI's arguments can be


def _takes(hint: Any, value: Any) -> bool | None:
    """Whether ``value`` fits the annotation ``hint`` (None: a hint not checked here)."""
    import types
    import typing

    if value is None:  # null: for `x: int = None` too, however loosely typed
        return None
    if hint is str:  # YAML reads `run: 2014` or `mode: on` as a number or a boolean: a string was meant
        return isinstance(value, _SCALARS)
    if hint is bool:
        return isinstance(value, bool) or value in (0, 1)
    if isinstance(value, bool):  # an int, to Python: not to someone who wrote `epochs: int`
        return False
    if hint is float and isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
        try:
            float(value)
        except ValueError:
            return False
        return True
    if hint in _SCALARS:
        return isinstance(value, hint) or (hint is float and isinstance(value, int))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        fits = [_takes(h, value) for h in typing.get_args(hint) if h is not type(None)]
        return None if None in fits else any(fits)
    return None


def _check_arg_types(ref: str, fn: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """An argument of the wrong type for the scalar annotation of its parameter
    (``epochs=abc`` for ``epochs: int``) is refused naming the argument, before the
    factory runs and fails somewhere inside on it."""
    import typing

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # annotations that do not resolve are not ours to judge
        return
    for name, value in args.items():
        if name in hints and _takes(hints[name], value) is False:
            want = getattr(hints[name], "__name__", None) or str(hints[name])
            raise ProgramError(f"argument {name}={value!r}: {ref!r} takes {name} as {want}, got {type(value).__name__}")


def _call(ref: str, fn: Callable[..., Any], args: Mapping[str, Any] | None, describe: Callable[..., Any]) -> Any:
    """A factory's program, or a training loop's description."""
    from elasticps.loop.program import LoopProgram

    try:  # arguments that do not fit its signature are the caller's mistake; a TypeError inside it is its own
        inspect.signature(fn).bind(**dict(args or {}))
    except TypeError as exc:
        raise ProgramError(f"cannot call {ref!r} with arguments {dict(args or {})}: {exc}") from exc
    except ValueError:  # no signature to check it against
        pass
    _check_arg_types(ref, fn, args or {})
    try:
        obj = describe(ref, fn, dict(args or {}))
    except ProgramError:
        raise
    except Exception as exc:  # the user's factory raised: their error, named, not ours
        raise ProgramError(f"{ref!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(obj, (TrainingProgram, LoopProgram)):
        raise ProgramError(
            f"{ref!r} is a {type(obj).__name__}, not a TrainingProgram (what it returned; a training "
            "loop calls elasticps.torch.prepare, DataLoader and epochs instead)"
        )
    return obj
