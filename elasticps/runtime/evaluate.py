"""A program's metric (e.g. accuracy) for a flat parameter vector."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from elasticps.program import TrainingProgram
from elasticps.runtime.data import fetch_batch, forward
from elasticps.runtime.flat import load_flat

EVAL_BATCH = 1024


def evaluate(
    program: TrainingProgram, params: np.ndarray, model: nn.Module | None = None, data: Any = None
) -> float | None:
    """The sample-weighted mean of ``program.metric`` over its eval dataset,
    with ``params`` loaded into ``model`` (built if not given; so is ``data``)."""
    if program.metric is None:
        return None
    model = model if model is not None else program.build_model()
    data = data if data is not None else program.build_eval_dataset()
    load_flat(model, params)
    with torch.no_grad():
        model.eval()
        total, weighted = 0, 0.0
        for lo in range(0, len(data), EVAL_BATCH):
            idx = np.arange(lo, min(lo + EVAL_BATCH, len(data)))
            x, y = fetch_batch(data, idx)
            weighted += float(program.metric(forward(model, x), y)) * len(idx)
            total += len(idx)
    return weighted / total


class Evaluator:
    """A program's metric for the job's parameters, with its eval model and
    data built once (at the first evaluation)."""

    def __init__(self, program: TrainingProgram) -> None:
        self.program = program
        self._model: nn.Module | None = None
        self._data: Any = None

    def __call__(self, params: Callable[[], np.ndarray]) -> float | None:
        """The metric of ``params()`` (not called if the program has no metric)."""
        if self.program.metric is None:
            return None
        if self._model is None:
            self._model = self.program.build_model()
            self._data = self.program.build_eval_dataset()
        return evaluate(self.program, params(), self._model, self._data)
