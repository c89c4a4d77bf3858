"""What a submit learns of a program, found in a process of the job's own.

Runs on the job's side (a Ray task with the job's ``runtime_env``), never in
the manager: it imports the user's module and calls the factory, then tries
the program on one sample (build the model, one forward and backward pass,
the loss and the metric), so a program that cannot train is refused at submit
with its own error, instead of being accepted and failing once it has a
cluster. One sample keeps it cheap; the caller bounds its time.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import numpy as np
import torch

from elasticps.errors import ProgramError
from elasticps.manager.wire import plain
from elasticps.program import TrainingProgram, check_batch_fits, load_program
from elasticps.runtime.data import fetch_batch, forward


def describe_program(program: str, args: dict[str, Any]) -> dict[str, Any]:
    """The program's :class:`ProgramInfo` fields, as plain data, once it has trained on one sample."""
    forget_own_modules(program)
    p = load_program(program, args)
    # the program's own figures cross to the manager: they must be built-in values, not look-alikes
    info = plain(
        {"name": p.name, "batch_size": p.batch_size, "epochs": p.epochs, "max_batch_size": p.max_batch_size},
        "program",
    )
    dataset = p.build_dataset()
    info["samples_per_epoch"] = len(dataset)
    check_batch_fits(p.batch_size, p.max_batch_size, len(dataset))
    info["own_loop"] = not isinstance(p, TrainingProgram)
    if info["own_loop"]:  # its describe run reached its first batch
        return info
    try:
        try_one_sample(p, dataset)
    except ProgramError:
        raise
    except Exception as exc:  # the user's code raised: their error, named (its traceback comes along)
        raise ProgramError(f"{p.name}: training on one sample failed: {type(exc).__name__}: {exc}") from exc
    return info


def try_one_sample(p: TrainingProgram, dataset: Any) -> None:
    """Build the model, run one forward and backward pass on the dataset's first
    sample, make the optimizer, and compute the metric on one held-out sample.
    Raises what the program raises, or a ProgramError naming what is wrong."""
    model = p.build_model()
    model.train()
    x, y = fetch_batch(dataset, np.arange(1))
    loss = p.loss(forward(model, x), y)
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise ProgramError(f"loss must return a one-element tensor (the mean loss), got {_what(loss)}")
    loss.backward()
    p.make_optimizer([param for param in model.parameters() if param.requires_grad])
    if p.metric is not None:
        eval_data = p.build_eval_dataset()
        x, y = fetch_batch(eval_data, np.arange(1))
        with torch.no_grad():
            model.eval()
            float(p.metric(forward(model, x), y))


def _what(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def forget_own_modules(program: str) -> None:
    """Ray runs the descriptions in processes it reuses, which keep what they
    imported: a program fixed and submitted again would be described as it was.
    The program's own package, if it is read from files of the user's (not
    installed, not elasticps), is imported afresh; what it imports stays (torch)."""
    top = program.partition(":")[0].split(".")[0]
    if top == "elasticps":
        return
    names = [n for n in sys.modules if n == top or n.startswith(top + ".")]
    files = [getattr(sys.modules[n], "__file__", None) or "" for n in names]
    if any(part in f for f in files for part in ("site-packages", "dist-packages")):
        return  # installed: it changes by an install, which a new process sees
    for name in names:
        del sys.modules[name]
    importlib.invalidate_caches()
