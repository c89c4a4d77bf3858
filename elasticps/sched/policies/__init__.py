"""Allocation policies behind one protocol: ``decide(jobs, cluster, state)``.

A policy's options are its constructor's keyword arguments, and nothing else:
:func:`make_policy` refuses any other name, listing the valid ones (a typo
must not silently fall back to a default). A new policy adds its class to
:data:`POLICIES` and takes no ``**kwargs``.
"""

from __future__ import annotations

import inspect
from typing import Any

from elasticps.errors import ConfigError
from elasticps.sched.objectives import Objective
from elasticps.sched.policies.base import Policy, PolicyState
from elasticps.sched.policies.elastic import ElasticPolicy
from elasticps.sched.policies.greedy import GreedyPolicy
from elasticps.sched.policies.optimus import OptimusPolicy
from elasticps.sched.policies.pollux import PolluxPolicy
from elasticps.sched.policies.static import StaticPolicy
from elasticps.sched.policies.tiresias import TiresiasPolicy

POLICIES: dict[str, type] = {
    "static": StaticPolicy,
    "greedy": GreedyPolicy,
    "optimus": OptimusPolicy,
    "elastic": ElasticPolicy,
    "pollux": PolluxPolicy,
    "tiresias": TiresiasPolicy,
}


def policy_options(name: str) -> tuple[str, ...]:
    """The options policy ``name`` takes (its constructor's keyword arguments)."""
    if name not in POLICIES:
        raise ConfigError(f"policy must be one of {sorted(POLICIES)}, got {name!r}")
    params = inspect.signature(POLICIES[name]).parameters.values()
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
        raise TypeError(f"policy {name!r} must name its options (no *args or **kwargs)")
    return tuple(p.name for p in params)


def make_policy(name: str, objective: str = "goodput", **options: Any) -> Policy:
    """Policy ``name`` with ``options``; :class:`ConfigError` names an option it
    does not take and lists those it does. ``objective`` is checked for every
    policy and given to those that weigh it."""
    valid = policy_options(name)
    Objective.parse(objective)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        listed = ", ".join(o for o in valid if o != "objective") or "none"
        raise ConfigError(f"policy {name!r} has no option {', '.join(map(repr, unknown))} (its options: {listed})")
    if "objective" in valid:
        options["objective"] = objective
    return POLICIES[name](**options)


def options_for(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The ``settings`` that policy ``name`` takes, for a driver that runs several
    policies with one configuration (the simulator, the demo); a setting that no
    policy takes is a :class:`ConfigError`."""
    known = {o for p in POLICIES for o in policy_options(p)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(
            f"no policy has the option {', '.join(map(repr, unknown))} (options: {', '.join(sorted(known))})"
        )
    valid = policy_options(name)
    return {k: v for k, v in settings.items() if k in valid}


__all__ = [
    "POLICIES",
    "ElasticPolicy",
    "GreedyPolicy",
    "OptimusPolicy",
    "Policy",
    "PolicyState",
    "PolluxPolicy",
    "StaticPolicy",
    "TiresiasPolicy",
    "make_policy",
    "options_for",
    "policy_options",
]
