"""Placement: which node runs each PS and worker task. Pure code, shared by the
live manager and the simulator."""

from elasticps.placement.place import PlacementResult, make_placer, place
from elasticps.placement.placers import PLACERS
from elasticps.placement.room import fewest_nodes, room_left, shared_spans, spans_on, with_own_room
from elasticps.placement.traffic import JobPlacement, cross_node_bytes_per_step, cross_share

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
    "shared_spans",
    "spans_on",
    "with_own_room",
]
