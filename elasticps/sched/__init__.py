"""The scheduler core: pure code (no Ray, no clock, no I/O) shared by the live
manager and the simulator. Records in :mod:`.types`, speed models in
:mod:`.speed` (a fleet prior's pooled curve in :mod:`.pooling`), loss curves
in :mod:`.loss`, goodput in :mod:`.goodput`, objectives in :mod:`.objectives`,
policies in :mod:`.policies`."""

from elasticps.sched.goodput import statistical_efficiency
from elasticps.sched.loss import LossCurve
from elasticps.sched.objectives import Objective
from elasticps.sched.policies import POLICIES, Policy, PolicyState, make_policy
from elasticps.sched.speed import Observation, SpeedModel
from elasticps.sched.types import ClusterView, Decision, JobView, NodeView, Resources

__all__ = [
    "POLICIES",
    "ClusterView",
    "Decision",
    "JobView",
    "LossCurve",
    "NodeView",
    "Objective",
    "Observation",
    "Policy",
    "PolicyState",
    "Resources",
    "SpeedModel",
    "make_policy",
    "statistical_efficiency",
]
