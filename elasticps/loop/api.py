"""The calls a user's own loop makes: ``prepare``, ``DataLoader``, ``epochs``,
``report``, ``register``, ``step``.

Each call goes to the session of the process it runs in:

- no session (a plain ``python train.py``): :class:`~elasticps.loop.local.LocalSession`,
  ordinary single-process training in the same data order as the runtime;
- a describe run (:func:`elasticps.loop.local.describe_call`): records what the
  runtime needs and stops the function at its first batch;
- a worker of a job (:class:`~elasticps.loop.worker_session.WorkerSession`):
  ``opt.step()`` is the step boundary through the PS shards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import IterableDataset

from elasticps.errors import ProgramError
from elasticps.program import check_adaptive_range, check_batch_fits


class Session(Protocol):
    def prepare(self, model: Any, opt: Any, inexact: bool) -> tuple[Any, Any]: ...
    def add_loader(self, loader: DataLoader) -> None: ...
    def iterate(self, loader: DataLoader) -> Iterator[Any]: ...
    def epochs(self, n: int) -> Iterator[int]: ...
    def report(self, metrics: dict[str, float]) -> dict[str, Any]: ...
    def register(self, objects: dict[str, Any]) -> None: ...
    def step(self) -> int: ...
    def rng_point(self) -> None: ...


_session: Session | None = None


def current() -> Session:
    global _session
    if _session is None:
        from elasticps.loop.local import LocalSession

        _session = LocalSession()
    return _session


@contextlib.contextmanager
def active(session: Session) -> Iterator[Session]:
    """Route the API's calls to ``session`` while the block runs."""
    global _session
    before, _session = _session, session
    try:
        yield session
    finally:
        _session = before


def rng_point() -> None:
    """A point of the loop's function where a worker's torch generator is put
    where the describe run's was (see :meth:`WorkerSession.rng_point`)."""
    current().rng_point()


def set_session(session: Session | None) -> None:
    """Route this process's calls to ``session`` (a job's worker process)."""
    global _session
    _session = session


def prepare(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, inexact_optimizer: bool = False
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Put ``model``'s parameters and ``optimizer``'s state on the PS shards.

    Returns the same two objects: the model trains as before, and
    ``optimizer.step()`` becomes the step boundary: this worker's gradient goes
    to the PS shards, which apply ``optimizer``'s own update (its class, and each
    param group's hyperparameters as they are at that step: an LR scheduler
    works), and the model comes back with the new parameters. The loss must be
    the mean over the batch (``reduction='mean'``, torch's default): each
    worker's gradient is weighted by its share of the global batch.
    ``inexact_optimizer``: allow a non-elementwise optimizer (see TrainingProgram).
    """
    return current().prepare(model, optimizer, inexact_optimizer)


_OWN_PROCESS = "a worker reads its share of each batch in its own process (drop it; a job's workers are processes)"
_OWN_ORDER = "the job orders and splits the data between its workers itself (shuffle= and seed= set the order)"
#: torch's defaults of those options, which ask for what this loader does anyway (accepted; the others' is None).
TORCH_DEFAULTS = {
    "num_workers": 0,
    "persistent_workers": False,
    "timeout": 0,
    "pin_memory": False,
    "pin_memory_device": "",
}
#: Options of torch's DataLoader this one does not take, and why (a ported loop meets them first).
TORCH_ONLY_OPTIONS = {
    "num_workers": _OWN_PROCESS,
    "prefetch_factor": _OWN_PROCESS,
    "persistent_workers": _OWN_PROCESS,
    "worker_init_fn": _OWN_PROCESS,
    "multiprocessing_context": _OWN_PROCESS,
    "timeout": _OWN_PROCESS,
    "pin_memory": "batches are not pinned (drop it)",
    "pin_memory_device": "batches are not pinned (drop it)",
    "sampler": _OWN_ORDER,
    "batch_sampler": _OWN_ORDER,
    "generator": _OWN_ORDER,
}


class DataLoader:
    """The training set in global batches, split among the workers.

    ``batch_size`` is the GLOBAL batch: each worker gets its contiguous share
    of every batch. The order of epoch e is a permutation drawn from
    ``(seed, e)`` (``shuffle=False``: the dataset's order), so the position in
    the data is one number whatever the number of workers. The dataset must be
    map-style (``len`` and indexing); ``collate_fn`` batches samples as torch's
    DataLoader does (``default_collate``; a TensorDataset is indexed at once).

    ``max_batch_size``: the global batch is adaptive, from ``batch_size`` up to
    it (at most the dataset's length, one epoch): in a job the scheduler (or
    ``JobController.set_batch_size``) may change it at a step boundary, and the
    loader then yields this worker's share of the new global batch. ``lr_scaling`` (one of ``sqrt``, ``linear``,
    ``none``): at global batch M the PS shards apply every lr of the prepared
    optimizer, as the loop's scheduler has it, times (M / batch_size) ** k
    (k = 0.5, 1, 0); the optimizer's own lr is left as the loop set it. Run in
    one process, the loop trains at ``batch_size``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = False,
        *,
        seed: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        max_batch_size: int | None = None,
        lr_scaling: str = "sqrt",
        **torch_options: Any,
    ) -> None:
        for key, value in torch_options.items():  # torch's DataLoader takes them: said why not here
            if key not in TORCH_ONLY_OPTIONS:
                raise TypeError(f"DataLoader() got an unexpected keyword argument {key!r}")
            if value != TORCH_DEFAULTS.get(key):  # torch's own default asks for nothing this loader lacks
                raise ProgramError(f"elasticps.torch.DataLoader has no {key}: {TORCH_ONLY_OPTIONS[key]}")
        map_style = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
        if isinstance(dataset, IterableDataset) or not map_style:
            raise ProgramError(
                f"elasticps.torch.DataLoader needs a map-style dataset (len() and indexing), got "
                f"{type(dataset).__name__}: an iterable-style stream has no position to resume from or to "
                "split between workers; index your data (e.g. a list of files and a __getitem__)"
            )
        if drop_last:
            raise ProgramError("elasticps.torch.DataLoader keeps the last, shorter batch: drop_last is not supported")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise ProgramError(f"batch_size must be an int >= 1 (the global batch), got {batch_size!r}")
        if len(dataset) == 0:
            raise ProgramError("the DataLoader's dataset is empty")
        check_adaptive_range(batch_size, max_batch_size, lr_scaling)
        check_batch_fits(batch_size, max_batch_size, len(dataset))
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.collate_fn = collate_fn
        self.max_batch_size = max_batch_size
        self.lr_scaling = lr_scaling
        current().add_loader(self)

    def __len__(self) -> int:
        """Global batches of ``batch_size`` per epoch, whatever the global batch
        now (an epoch at a larger batch has fewer steps: a per-step scheduler
        sized by ``len(loader)`` runs through its schedule in more epochs)."""
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        return current().iterate(self)

    def fetch(self, indices: np.ndarray) -> Any:
        """The samples ``indices``, batched (as a ``TrainingProgram``'s worker reads them)."""
        from elasticps.runtime.data import read_samples  # the runtime (and Ray) once a batch is read

        return read_samples(self.dataset, indices, self.collate_fn)


def epochs(n: int) -> Iterator[int]:
    """The epochs still to train, out of ``n``: ``range(n)`` in one process; in a
    job, from the epoch the job is at (a worker that joins, or a job resumed
    from a checkpoint, starts there)."""
    if not (isinstance(n, int) and n >= 1):
        raise ProgramError(f"epochs(n) needs an int n >= 1, got {n!r}")
    return current().epochs(n)


def report(**metrics: float) -> dict[str, Any]:
    """Report metrics (e.g. ``accuracy=0.97, test_loss=0.1``) of the current
    step to the job: they go to the job's report, the manager and the
    dashboard. The last report of an epoch is that epoch's, and its FIRST value
    the job's metric. Every worker may call it; the job keeps one report per
    step. Returns the record."""
    bad = {k: v for k, v in metrics.items() if not isinstance(v, (int, float)) or isinstance(v, bool)}
    if bad:
        raise ProgramError(f"report() takes numbers, got {bad}")
    return current().report({k: float(v) for k, v in metrics.items()})


def register(**objects: Any) -> None:
    """Objects with ``state_dict()``/``load_state_dict()`` (an LR scheduler, an
    EMA, a counter holder) that belong to the training state: they are
    checkpointed with the parameters, restored on resume, and given to a
    worker that joins. Call it before the loop over ``epochs``."""
    for name, obj in objects.items():
        if not (callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
            raise ProgramError(f"register({name}=...) needs an object with state_dict() and load_state_dict()")
    current().register(objects)


def step() -> int:
    """The global step the next ``optimizer.step()`` completes (0 at the start):
    the same on every worker, through rescales and restarts."""
    return current().step()
