"""The state of PS shards, and how it is cut and glued when shards change.

A shard owns ``params[lo:hi]`` of the flat vector and the optimizer state of
that slice. Every supported optimizer is elementwise, so its per-element state
(momentum, Adam moments) is cut like the parameters and its scalar state
(Adam's step count) is the same on every shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ShardState:
    """Parameters and optimizer state of one contiguous slice (or of all of it)."""

    params: np.ndarray
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    def slice(self, lo: int, hi: int) -> ShardState:
        return ShardState(
            params=self.params[lo:hi].copy(),
            vectors={k: v[lo:hi].copy() for k, v in self.vectors.items()},
            scalars=dict(self.scalars),
        )

    @property
    def numel(self) -> int:
        return int(self.params.shape[0])


def concat_shards(shards: list[ShardState]) -> ShardState:
    """Glue shard states, in order, into the state of the whole vector."""
    if not shards:
        raise ValueError("no shards to concatenate")
    keys = set(shards[0].vectors)
    for s in shards[1:]:
        if set(s.vectors) != keys:
            raise ValueError("shards disagree on optimizer state keys")
        if s.scalars != shards[0].scalars:
            raise ValueError(f"shards disagree on scalar optimizer state: {s.scalars} vs {shards[0].scalars}")
    return ShardState(
        params=np.concatenate([s.params for s in shards]),
        vectors={k: np.concatenate([s.vectors[k] for s in shards]) for k in sorted(keys)},
        scalars=dict(shards[0].scalars),
    )


def split_state(state: ShardState, bounds: list[tuple[int, int]]) -> list[ShardState]:
    if bounds[-1][1] != state.numel:
        raise ValueError(f"bounds cover {bounds[-1][1]} elements, state has {state.numel}")
    return [state.slice(lo, hi) for lo, hi in bounds]
