"""The script torchrun runs in every worker: DDP on gloo that resumes from its checkpoint.

As torchrun's elastic docs ask of a script: at every (re)start it loads the
latest checkpoint, since a membership change restarts every worker. Rank 0
writes a checkpoint every ``--checkpoint-every`` steps (atomically) and a line
``time step world_size loss`` per step to ``DIR/steps.txt``.

``python -m torch.distributed.run --nnodes=1:2 --nproc-per-node=2 ... -m elasticps.bench.peers.torchrun_train``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from elasticps.bench.peers.resize import log_step
from elasticps.bench.peers.workloads import DataParallelStep, Workload


def _workload(text: str) -> Workload:
    return Workload(**json.loads(text))


def parser() -> argparse.ArgumentParser:
    """The command line :func:`elasticps.bench.peers.torchrun.train_args` writes."""
    out = argparse.ArgumentParser(description=__doc__)
    out.add_argument("--workload", required=True, type=_workload, help="the Workload's fields, as JSON")
    out.add_argument("--dir", required=True, help="checkpoint and step log directory")
    out.add_argument("--threads", type=int, default=1)
    out.add_argument("--checkpoint-every", type=int, default=16)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    program = args.workload.program()
    stepper = DataParallelStep(program, program.build_dataset())
    model = DistributedDataParallel(program.build_model())
    opt = program.make_optimizer(list(model.parameters()))
    directory = Path(args.dir)
    step = resume(directory / "ckpt.pt", model.module, opt)
    log = (directory / "steps.txt").open("a") if rank == 0 else None
    while True:
        loss = stepper.train(model, opt, step, rank, world)
        step += 1
        if log is not None:
            log_step(log, step - 1, world, loss)
            if step % args.checkpoint_every == 0:
                save(directory / "ckpt.pt", model.module, opt, step)


def resume(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
