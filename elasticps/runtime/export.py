"""A trained model out of a job's checkpoints: ``elasticps export``."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from elasticps.errors import ConfigError
from elasticps.program import TrainingProgram
from elasticps.runtime.checkpoint import CheckpointStore
from elasticps.runtime.flat import load_flat

log = logging.getLogger("elasticps.runtime")


def export_checkpoint(program: TrainingProgram, checkpoint_dir: str | Path, out: str | Path) -> dict[str, int]:
    """Write the ``state_dict()`` of ``program``'s model with the parameters of
    the newest checkpoint in ``checkpoint_dir`` that reads back whole and fits
    the model to ``out`` (``torch.save``; load with
    ``model.load_state_dict(torch.load(out))``). Nothing in ``checkpoint_dir``
    is changed. Returns the checkpoint's step and epoch."""
    directory = Path(checkpoint_dir)
    if not directory.is_dir():
        raise ConfigError(f"no checkpoints: {directory} is not a directory")
    store = CheckpointStore(directory)
    passed_over: list[str] = []
    for path, ckpt in store.intact():
        try:
            model = load_flat(program.build_model(), ckpt.state.params)
            break
        except ValueError as exc:
            passed_over.append(f"{path.name} is not of {program.name}'s model ({exc})")
    else:
        why = "; ".join(store.skipped + passed_over)
        raise ConfigError(f"no usable checkpoint in {directory}" + (f": {why}" if why else ""))
    for line in store.skipped + passed_over:
        log.warning("export: %s; an older checkpoint is used", line)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return {"step": ckpt.step, "epoch": ckpt.position.epoch, "parameters": int(ckpt.state.params.size)}
