"""Allocation policies behind one protocol: ``decide(jobs, cluster, state)``."""

from __future__ import annotations

from elasticps.errors import ConfigError
from elasticps.sched.policies.base import Policy, PolicyState
from elasticps.sched.policies.elastic import ElasticPolicy
from elasticps.sched.policies.greedy import GreedyPolicy
from elasticps.sched.policies.optimus import OptimusPolicy
from elasticps.sched.policies.static import StaticPolicy

POLICIES: dict[str, type] = {
    "static": StaticPolicy,
    "greedy": GreedyPolicy,
    "optimus": OptimusPolicy,
    "elastic": ElasticPolicy,
}


def make_policy(name: str, **kwargs) -> Policy:
    if name not in POLICIES:
        raise ConfigError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    return POLICIES[name](**kwargs)


__all__ = [
    "POLICIES",
    "ElasticPolicy",
    "GreedyPolicy",
    "OptimusPolicy",
    "Policy",
    "PolicyState",
    "StaticPolicy",
    "make_policy",
]
