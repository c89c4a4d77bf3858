"""A trained model out of a job's checkpoints: ``elasticps export``."""

from __future__ import annotations

from pathlib import Path

import torch

from elasticps.errors import ConfigError
from elasticps.program import TrainingProgram
from elasticps.runtime.checkpoint import CheckpointStore
from elasticps.runtime.flat import load_flat


def export_checkpoint(program: TrainingProgram, checkpoint_dir: str | Path, out: str | Path) -> dict[str, int]:
    """Write the ``state_dict()`` of ``program``'s model with the parameters of
    the newest readable checkpoint in ``checkpoint_dir`` to ``out``
    (``torch.save``; load with ``model.load_state_dict(torch.load(out))``).
    Returns the checkpoint's step and epoch."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise ConfigError(f"no checkpoints: {directory} is not a directory")
    ckpt = CheckpointStore(directory).latest()
    if ckpt is None:
        raise ConfigError(f"no readable checkpoint in {directory}")
    try:
        model = load_flat(program.build_model(), ckpt.state.params)
    except ValueError as exc:
        raise ConfigError(f"the checkpoint in {directory} is not of {program.name}'s model: {exc}") from None
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return {"step": ckpt.step, "epoch": ckpt.position.epoch, "parameters": int(ckpt.state.params.size)}
