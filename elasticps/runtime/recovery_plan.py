"""What to do after a failed step or switch, from what died
(:func:`plan_recovery`): pure, so that every case is tested without Ray.
:class:`~elasticps.runtime.recovery.Recovery` carries the plan out
(:mod:`elasticps.runtime.recovery`'s opening comment lists the cases and what
restores each)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class RecoveryPlan:
    """``restore``: ``torn`` (shards disagree, none died) or ``lost`` (a shard
    died): restore the PS, ``from_state`` (the whole state gathered at this
    step: nothing lost) or else from the newest checkpoint. ``user_code``: no
    task died. ``no_workers``: every worker died, then ``replace`` them or fail."""

    restore: Literal["torn", "lost"] | None
    user_code: bool
    no_workers: bool
    replace: bool
    from_state: bool = False


def plan_recovery(
    dead_ps: int,
    dead_workers: int,
    workers: int,
    ps_inconsistent: bool,
    replace_dead_workers: bool,
    dead_starting: int = 0,
    have_state: bool = False,
) -> RecoveryPlan:
    """What to do after a failed step or switch with ``dead_ps`` PS and
    ``dead_workers`` of ``workers`` workers dead, and ``dead_starting`` of the
    new tasks of a shape change that was switched in. ``have_state``: the
    shards' whole state was gathered at this step before the failure."""
    restore: Literal["torn", "lost"] | None = None
    if dead_ps:
        restore = "lost"
    elif ps_inconsistent and (dead_workers or dead_starting):
        restore = "torn"
    no_workers = dead_workers == workers
    user_code = not dead_ps and not dead_workers and not dead_starting
    replace = no_workers and replace_dead_workers
    return RecoveryPlan(restore, user_code, no_workers, replace, from_state=restore is not None and have_state)
