"""What a simulation answers (:class:`SimResult`: its metrics, each job's
completion time, the utilization and allocations over time), and the share
of the oracle's gain over static a policy captured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from elasticps.sim.config import ORACLE


@dataclass
class SimResult:
    config: dict[str, Any]
    metrics: dict[str, Any]
    jct_s: list[float]
    utilization: list[tuple[float, float]]
    allocations: dict[str, list[tuple[float, int, int]]]

    def to_dict(self, with_series: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"config": self.config, **self.metrics}
        if with_series:
            out.update(jct_s=self.jct_s, utilization=self.utilization, allocations=self.allocations)
        return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def gain_captured(results: dict[str, SimResult]) -> dict[str, float]:
    """Per policy, (static - policy) / (static - oracle) of the average JCT: the
    share of the gain over static that knowing every speed gives, captured
    (needs ``static`` and ``oracle`` among the results)."""
    if "static" not in results or ORACLE not in results:
        return {}
    static, best = results["static"].metrics["avg_jct_s"], results[ORACLE].metrics["avg_jct_s"]
    if static - best <= 0:
        return {}
    return {name: (static - r.metrics["avg_jct_s"]) / (static - best) for name, r in results.items()}
