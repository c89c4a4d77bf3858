"""Programs of the chaos benchmark's doomed jobs: each passes the manager's
checks at submit (its description and one sample run in a task of the job's
own) and turns hostile or fails only once the job runs. They run in the job's
Ray processes only; the manager must fail each job alone, with its cause.

- :func:`huge_figures`: in the job's processes its epochs are ``10**400``, so the
  figures its driver reports (samples left) overflow what the manager takes;
- :func:`pickled_answers`: its driver answers the manager with a pickled object
  whose unpickling runs code (it leaves a marker file named by the PID of the
  process that ran it);
- :func:`fails_at_first_step`: its model raises on the first real batch (one
  sample passes, as at submit; a batch of more does not): a user's error at step 0.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch import nn

from elasticps.examples import digits
from elasticps.program import TrainingProgram

#: What the step-0 error says (the failed job's event must carry it).
STEP0_ERROR = "this model takes one sample at a time"


def _in_job_actor() -> bool:
    """True in the job's driver, PS and workers (Ray actors); False in the describe task."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None


def huge_figures(epochs: int = 12, seed: int = 0) -> TrainingProgram:
    p = digits.program(epochs=epochs, seed=seed)
    return dataclasses.replace(p, epochs=10**400) if _in_job_actor() else p


class _Marker(int):
    """An int whose unpickling writes a marker file named by the unpickling process's PID."""

    markers = ""

    def __reduce__(self):  # type: ignore[override]
        code = f"import os; open(os.path.join({self.markers!r}, str(os.getpid())), 'w').close()"
        return (exec, (code,))


def pickled_answers(markers: str, epochs: int = 12, seed: int = 0) -> TrainingProgram:
    if _in_job_actor():
        from ray._private.serialization import SerializationContext

        _Marker.markers = markers
        own = SerializationContext.serialize  # the process is the program's: it can send Ray anything
        SerializationContext.serialize = lambda self, v: own(self, _Marker(1) if isinstance(v, bytes) else v)
    os.makedirs(markers, exist_ok=True)
    return digits.program(epochs=epochs, seed=seed)


class OneAtATime(nn.Module):
    """The digits MLP, with a user's error that one sample does not show."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = digits.mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            raise ValueError(f"{STEP0_ERROR}, got a batch of {x.shape[0]}")
        return self.mlp(x)


def fails_at_first_step(epochs: int = 12, seed: int = 0) -> TrainingProgram:
    return dataclasses.replace(digits.program(epochs=epochs, seed=seed), model=OneAtATime)
