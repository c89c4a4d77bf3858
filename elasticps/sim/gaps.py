"""Where a policy's average JCT falls behind the oracle's, job by job.

Under a truth of several surfaces (``--truth mixed``) the share of the
oracle's gain is one number over jobs that follow different surfaces and
kinds. This splits it: per (truth surface, model kind), how many seconds of
the run's average JCT each policy loses to the oracle on those jobs (their
JCT differences summed, over every job of the run, so the groups add up to
the whole gap), and the shapes each policy ran them at (shares of job-time).

Pure code over finished runs: a job's JCT is read from its allocation
history, whose last entry is its end.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from typing import Any

from elasticps.sim.results import ORACLE, SimResult
from elasticps.sim.truth import GRID_PATH, make_truth
from elasticps.sim.workload import KINDS, WorkloadJob

#: Shapes listed per group and policy, the most job-time first.
TOP_SHAPES = 3


def gaps_by_group(workload: list[WorkloadJob], results: dict[str, SimResult]) -> list[dict[str, Any]]:
    """One row per (surface, kind): ``jobs``, and per policy ``behind_oracle_s``
    (its share of the run's avg JCT gap to the oracle; the oracle's own: 0) and
    ``shapes`` ([p, w, share of the group's job-time]). Needs the oracle among
    ``results``, all runs of ``workload`` under one truth and seed."""
    if ORACLE not in results:
        raise ValueError("the gaps to the oracle need the oracle's run")
    config = results[ORACLE].config
    truth = make_truth(config["truth"], config["seed"], config["truth_grid"] or GRID_PATH)
    groups: dict[tuple[str, str], list[WorkloadJob]] = defaultdict(list)
    for job in workload:
        groups[(truth.surface(job.id, KINDS[job.kind]), job.kind)].append(job)
    jct = {name: _jcts(r, workload) for name, r in results.items()}
    rows = []
    for (surface, kind), jobs in sorted(groups.items()):
        row: dict[str, Any] = {"surface": surface, "kind": kind, "jobs": len(jobs)}
        for name, r in results.items():
            behind = sum(jct[name][j.id] - jct[ORACLE][j.id] for j in jobs) / len(workload)
            row[name] = {"behind_oracle_s": round(behind, 1), "shapes": _shapes(r, jobs)}
        rows.append(row)
    return rows


def _jcts(result: SimResult, workload: list[WorkloadJob]) -> dict[str, float]:
    ends = {job: history[-1][0] for job, history in result.allocations.items() if history}
    return {j.id: ends[j.id] - j.arrival_s for j in workload}


def _shapes(result: SimResult, jobs: list[WorkloadJob]) -> list[list[float]]:
    held: Counter[tuple[int, int]] = Counter()
    for job in jobs:
        history = result.allocations[job.id]
        for (start, p, w), (end, _, _) in itertools.pairwise(history):
            if p or w:
                held[(p, w)] += end - start
    total = sum(held.values()) or 1.0
    return [[p, w, round(t / total, 2)] for (p, w), t in held.most_common(TOP_SHAPES)]


def format_gaps(rows: list[dict[str, Any]], policies: list[str]) -> str:
    """The rows as a table: per group, each policy's seconds behind the oracle and its main shapes."""
    from elasticps.tables import format_table

    cells = []
    for row in rows:
        for name in policies:
            shapes = ", ".join(f"{p}x{w} {share:.0%}" for p, w, share in row[name]["shapes"])
            cells.append(
                [row["surface"], row["kind"], row["jobs"], name, f"{row[name]['behind_oracle_s']:.1f}", shapes]
            )
    return format_table(cells, ["surface", "kind", "jobs", "policy", "s behind oracle", "job-time at"])
