"""Shared fixtures: one real Ray cluster per test module, always shut down."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# Property tests: the same examples on every run by default (a CI run must not
# fail on a case no one changed code for); HYPOTHESIS_PROFILE=explore searches
# afresh with many more examples (run it after touching a policy).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


@pytest.fixture(scope="module")
def ray_local():
    """An embedded single-node Ray cluster with 8 logical CPUs."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=8, include_dashboard=False, logging_level="ERROR")
    yield ray
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
