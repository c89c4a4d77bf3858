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
_kept: dict[str, bool] = {"local": False}  # the embedded cluster of the last module was left running for the next


def _next_module_wants(request: pytest.FixtureRequest, fixture: str) -> bool:
    """Whether the module that runs right after this one uses ``fixture``."""
    items = request.session.items
    here = [i for i, item in enumerate(items) if item.module is request.module]
    after = items[here[-1] + 1] if here and here[-1] + 1 < len(items) else None
    return after is not None and fixture in after.fixturenames


def _idle(ray, timeout_s: float = 5.0) -> bool:
    """Every CPU of the kept cluster free again (the last module's tasks are gone; Ray frees them asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0.0) == LOCAL_CPUS:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module", autouse=True)
def _no_kept_cluster_elsewhere(request):
    """A kept cluster is shut down before any module that does not take it over
    (the next one's tests may all have been skipped), and at the end."""
    uses = any("ray_local" in item.fixturenames for item in request.session.items if item.module is request.module)
    if _kept["local"] and not uses:
        _shutdown_kept()
    yield
    if _kept["local"] and not _next_module_wants(request, "ray_local"):
        _shutdown_kept()


def _shutdown_kept() -> None:
    import ray

    _kept["local"] = False
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(request):
    """An embedded single-node Ray cluster with 8 logical CPUs. A start costs
    seconds, so when the next module uses one too the cluster is kept for it,
    and it takes it over if every CPU is free again (else starts afresh)."""
    import ray

    if not (_kept["local"] and ray.is_initialized() and _idle(ray)):
        if ray.is_initialized():
            ray.shutdown()
        ray.init(address="local", num_cpus=LOCAL_CPUS, include_dashboard=False, logging_level="ERROR")
    _kept["local"] = False
    yield ray
    if _next_module_wants(request, "ray_local"):
        _kept["local"] = True
    else:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster():
    """A real multi-raylet Ray cluster on this machine: a head and three workers nodes."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=4) for _ in range(3)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="ERROR")
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()
