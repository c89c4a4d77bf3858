"""Comparing policies over many seeds of one workload.

A simulated run is chaotic: a learned model's noise changes one decision,
which changes every later one, so one policy's avg JCT on one seed moves by
1-2% with any change to the code (docs/simulator.md). Two policies closer
than that on a seed are a tie; a claim about which is better needs many
seeds. :func:`summarize` turns per-seed results into that claim: each
policy's mean avg JCT, its mean share of the oracle's gain, on how many
seeds it had the lowest avg JCT of the policies other than the oracle, the
mean and worst seed of its avg and p99 JCT, makespan and gap to the lower
bound (:mod:`elasticps.sim.bound`), and the range over seeds of its avg JCT and CPU-hours against the first run's
(how ``--objectives goodput,speed,efficiency`` is judged: each against
goodput).
"""

from __future__ import annotations

import statistics
from typing import Any

from elasticps.sim.config import ORACLES
from elasticps.sim.results import SimResult, gain_captured

#: Metrics summarized by their mean and their worst (largest) seed, where every run has them.
WORST_OF = ("avg_jct_s", "p99_jct_s", "makespan_s", "lower_bound_s", "gap_to_bound")


def summarize(per_seed: dict[int, dict[str, SimResult]]) -> dict[str, dict[str, Any]]:
    """Per policy: ``mean_avg_jct_s``, ``seeds``, ``best_non_oracle`` (seeds
    where its avg JCT was the lowest of the non-oracle policies; a tie counts
    for each), ``mean_cpu_hours``, and where static and the oracle ran,
    ``mean_gain_captured``, ``min_gain_captured``; for each of :data:`WORST_OF`
    the runs have, ``mean_<metric>`` and ``worst_<metric>`` (the largest over
    the seeds). Every run after the first
    also has ``avg_jct_vs_first`` and ``cpu_hours_vs_first``: the relative
    change against the first run of the same seed (-0.2: 20% less), as
    ``{"min", "mean", "max"}`` over the seeds."""
    if not per_seed:
        raise ValueError("no seeds to summarize")
    policies = list(next(iter(per_seed.values())))
    out: dict[str, dict[str, Any]] = {
        name: {"seeds": len(per_seed)} if name in ORACLES else {"seeds": len(per_seed), "best_non_oracle": 0}
        for name in policies
    }
    gains: dict[str, list[float]] = {}
    for results in per_seed.values():
        if list(results) != policies:
            raise ValueError(f"every seed must run the same policies: {list(results)} vs {policies}")
        jct = {name: r.metrics["avg_jct_s"] for name, r in results.items()}
        best = min(v for name, v in jct.items() if name not in ORACLES)
        for name, v in jct.items():
            if name not in ORACLES and v == best:
                out[name]["best_non_oracle"] += 1
        for name, share in gain_captured(results).items():
            gains.setdefault(name, []).append(share)
    first = policies[0]
    for name in policies:
        out[name]["mean_avg_jct_s"] = statistics.fmean(r[name].metrics["avg_jct_s"] for r in per_seed.values())
        for metric in WORST_OF:
            values = [r[name].metrics[metric] for r in per_seed.values() if metric in r[name].metrics]
            if len(values) == len(per_seed):
                out[name][f"mean_{metric}"] = statistics.fmean(values)
                out[name][f"worst_{metric}"] = max(values)
        out[name]["mean_cpu_hours"] = statistics.fmean(r[name].metrics["cpu_hours"] for r in per_seed.values())
        if name != first:
            for metric in ("avg_jct_s", "cpu_hours"):
                changes = [r[name].metrics[metric] / r[first].metrics[metric] - 1.0 for r in per_seed.values()]
                out[name][f"{metric.removesuffix('_s')}_vs_first"] = {
                    "min": min(changes),
                    "mean": statistics.fmean(changes),
                    "max": max(changes),
                }
        if len(gains.get(name, ())) == len(per_seed):
            out[name]["mean_gain_captured"] = statistics.fmean(gains[name])
            out[name]["min_gain_captured"] = min(gains[name])
    return out


def seeds_verdict(summary: dict[str, dict[str, Any]]) -> str:
    """One line: the non-oracle policy with the most seeds of lowest avg JCT (then the
    lower mean), on how many, and its avg JCT against the first run's: mean and worst seed."""
    first = next(iter(summary))
    contenders = [name for name, row in summary.items() if "best_non_oracle" in row]
    best = min(contenders, key=lambda n: (-summary[n]["best_non_oracle"], summary[n]["mean_avg_jct_s"]))
    row = summary[best]
    line = f"{best}: the lowest avg JCT but the oracle's on {row['best_non_oracle']} of {row['seeds']} seeds"
    if best != first:
        change = row["avg_jct_vs_first"]
        line += f"; against {first} {change['mean']:+.0%} on average, {change['max']:+.0%} on its worst seed"
    if "mean_gain_captured" in row:
        line += f"; {row['mean_gain_captured']:.0%} of the oracle's gain (worst seed {row['min_gain_captured']:.0%})"
    return line
