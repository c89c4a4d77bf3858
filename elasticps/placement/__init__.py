"""Placement: which node runs each PS and worker task. Pure code, shared by the
live manager and the simulator."""

from elasticps.placement.core import (
    PLACERS,
    JobPlacement,
    PlacementResult,
    cross_node_bytes_per_step,
    cross_share,
    fewest_nodes,
    make_placer,
    place,
    room_left,
    spans_on,
    with_own_room,
)

__all__ = [
    "PLACERS",
    "JobPlacement",
    "PlacementResult",
    "cross_node_bytes_per_step",
    "cross_share",
    "fewest_nodes",
    "make_placer",
    "place",
    "room_left",
    "spans_on",
    "with_own_room",
]
