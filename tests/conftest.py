"""Shared fixtures: one real Ray cluster per test module, always shut down."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import settings

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Property tests: the same examples on every run by default (a CI run must not
# fail on a case no one changed code for); HYPOTHESIS_PROFILE=explore searches
# afresh with many more examples (run it after touching a policy).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


LOCAL_CPUS = 8
CLUSTER_NODES, CLUSTER_NODE_CPUS, CLUSTER_HEAD_CPUS = 3, 4, 1
SHARED = ("ray_cluster", "ray_local")  # the clusters a module may share with the next
# a cluster of the last module left running for the next: its fixture's name -> what the fixture yields
_kept: dict[str, object] = {}


def pytest_collection_modifyitems(session, config, items):
    """Modules on the same shared cluster run one after another, so that one
    start serves them all (a start costs seconds): first the modules on neither,
    then those on ``ray_cluster``, then those on ``ray_local``, each group in the
    order pytest collected it (a stable sort: a module's tests stay together and in order)."""
    rank: dict[object, int] = {}
    for item in items:
        mine = max((1 + SHARED.index(f) for f in getattr(item, "fixturenames", ()) if f in SHARED), default=0)
        rank[item.module] = max(rank.get(item.module, 0), mine)
    items.sort(key=lambda item: rank[item.module])


def _module_uses(items, module, fixture: str) -> bool:
    return any(fixture in item.fixturenames for item in items if item.module is module)


def _next_module_wants(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether the module that runs right after this one uses ``fixture``."""
    items = request.session.items
    here = [i for i, item in enumerate(items) if item.module is request.module]
    after = items[here[-1] + 1] if here and here[-1] + 1 < len(items) else None
    return after is not None and _module_uses(items, after.module, fixture)


def _idle(ray, cpus: float, timeout_s: float = 5.0) -> bool:
    """Every CPU of the kept cluster free again (the last module's tasks are gone; Ray frees them asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) == cpus:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module", autouse=True)
def _no_kept_cluster_elsewhere(request):
    """A kept cluster is shut down before any module that does not take it over
    (the next one's tests may all have been skipped), and at the end."""
    for fixture in list(_kept):
        if not _module_uses(request.session.items, request.module, fixture):
            _shutdown_kept(fixture)
    yield
    for fixture in list(_kept):
        if not _next_module_wants(request, fixture):
            _shutdown_kept(fixture)


def _shutdown_kept(fixture: str) -> None:
    import ray

    kept = _kept.pop(fixture)
    ray.shutdown()
    _stop(fixture, kept)


def _stop(fixture: str, kept) -> None:
    """What else ends a kept cluster after ``ray.shutdown()``: the multi-raylet one's processes."""
    if fixture == "ray_cluster":
        kept[0].shutdown()


def _shared(request, fixture: str, cpus: float, start, usable=lambda kept: True):
    """The body of a module's cluster fixture: take over the cluster the last
    module kept under ``fixture`` if ``usable`` and every one of its ``cpus`` is
    free again, else ``start()`` one afresh; keep it for the next module when
    that one uses ``fixture`` too, else shut it down."""
    import ray

    kept = _kept.pop(fixture, None)
    if not (kept and ray.is_initialized() and usable(kept) and _idle(ray, cpus)):
        if ray.is_initialized():
            ray.shutdown()
        if kept:
            _stop(fixture, kept)
        kept = start()
    yield kept
    if _next_module_wants(request, fixture):
        _kept[fixture] = kept
    else:
        ray.shutdown()
        _stop(fixture, kept)


@pytest.fixture(scope="module")
def ray_local(request):
    """An embedded single-node Ray cluster with 8 logical CPUs. A start costs
    seconds, so when the next module uses one too the cluster is kept for it,
    and it takes it over if every CPU is free again (else starts afresh)."""
    yield from _shared(request, "ray_local", LOCAL_CPUS, _start_local)


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A real multi-raylet Ray cluster on this machine: a head and three workers nodes.
    Kept for the next module when it uses one too, and taken over there if every
    node is still alive (a module may remove one) and every CPU is free again."""
    cpus = CLUSTER_HEAD_CPUS + CLUSTER_NODES * CLUSTER_NODE_CPUS
    yield from _shared(request, "ray_cluster", cpus, _start_cluster, usable=lambda kept: _all_alive(kept[1]))


def _start_local():
    import ray

    ray.init(address="local", num_cpus=LOCAL_CPUS, include_dashboard=False, logging_level="ERROR")
    return ray


def _start_cluster():
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": CLUSTER_HEAD_CPUS, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=CLUSTER_NODE_CPUS) for _ in range(CLUSTER_NODES)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    return cluster, nodes


def _all_alive(nodes) -> bool:
    import ray

    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    return all(node.node_id in alive for node in nodes)
