"""Faults through the jobs themselves: a corrupted checkpoint, a cancel racing a
start, and doomed jobs (hostile figures, a user's error at step 0) submitted
among the normal ones, each of which must fail alone and say why."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from elasticps.bench.chaos import programs

if TYPE_CHECKING:
    from elasticps.bench.chaos_bench import Chaos

HOSTILE = {  # program -> what its failed job's event must name
    "huge_figures": "within 2**53",
    "pickled_answers": "which the manager does not read",
}


def corrupt_checkpoint(chaos: Chaos) -> str | None:
    """Overwrite 64 bytes in the middle of a job's newest checkpoint (bit rot;
    the CRC of the archive catches it)."""
    workdir = chaos.server.workdir
    ckpts = sorted(workdir.glob("jobs.d/*/checkpoints/ckpt-*.npz"), key=lambda p: p.stat().st_mtime)
    if not ckpts:
        return None
    path = ckpts[-1]
    try:
        with open(path, "r+b") as f:
            f.seek(max(0, path.stat().st_size // 2 - 32))
            f.write(chaos.rng.randbytes(64))
            f.flush()
            os.fsync(f.fileno())
    except OSError:  # pruned meanwhile, or the disk is full
        return None
    return str(path.relative_to(workdir))


def cancel_race(chaos: Chaos) -> str | None:
    """Submit a job and cancel it 0-2 s later, while it is starting."""
    name = chaos.submit("race")
    if name is None:
        return None
    time.sleep(chaos.rng.uniform(0.0, 2.0))
    r = chaos.server.request("DELETE", f"/jobs/{name}")
    if r.status_code == 200 and r.json()["state"] == "cancelled":
        chaos.ledger.cancelled.add(name)
    return name


def hostile_figures(chaos: Chaos) -> str | None:
    """A job whose processes turn hostile once it runs: figures that overflow,
    or answers that are pickles which run code when read."""
    factory = chaos.rng.choice(sorted(HOSTILE))
    args = {"markers": str(chaos.markers)} if factory == "pickled_answers" else {}
    name = chaos.submit_doomed("hostile", f"{programs.__name__}:{factory}", args, HOSTILE[factory])
    return None if name is None else f"{name} ({factory})"


def step0_error(chaos: Chaos) -> str | None:
    """A job whose model raises on its first batch: a user's error at step 0."""
    return chaos.submit_doomed("step0", f"{programs.__name__}:fails_at_first_step", {}, programs.STEP0_ERROR)
