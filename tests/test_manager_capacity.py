"""What counts as a change of capacity worth a scheduling round."""

from __future__ import annotations

from elasticps.manager.capacity import capacity_change, capacity_signature
from elasticps.sched import ClusterView, NodeView, Resources


def _view(*nodes: tuple[str, float, float]) -> dict[str, tuple[float, float]]:
    return capacity_signature(ClusterView(tuple(NodeView(n, Resources(cpu=c), Resources(cpu=o)) for n, c, o in nodes)))


def test_nothing_to_compare_or_nothing_changed_is_no_event():
    a = _view(("n1", 4, 2), ("n2", 4, 0))
    assert capacity_change(None, a) == ""
    assert capacity_change(a, _view(("n1", 4, 2.1), ("n2", 4, 0))) == ""  # below the threshold


def test_tenants_freeing_or_taking_room_and_nodes_coming_and_going_are_named():
    before = _view(("n1", 4, 2), ("n2", 4, 0))
    assert capacity_change(before, _view(("n1", 4, 0), ("n2", 4, 0))) == "other tenants freed 2 CPU on node n1"
    assert capacity_change(before, _view(("n1", 4, 2), ("n2", 4, 3))) == "other tenants took 3 CPU on node n2"
    joined = capacity_change(before, _view(("n1", 4, 2), ("n2", 4, 0), ("n3", 8, 0)))
    assert joined == "node n3 joined (8 CPU)"
    assert capacity_change(before, _view(("n2", 4, 0))) == "node n1 left"
    assert capacity_change(before, _view(("n1", 6, 2), ("n2", 4, 0))) == "node n1 now has 6 CPU (was 4)"
