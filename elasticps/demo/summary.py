"""The published experiment's figures: each job's time and epochs to a target
accuracy, a policy's medians over repeated runs, and the table ``elasticps
demo`` prints (:mod:`elasticps.demo.experiment` runs the scenarios)."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

from elasticps.tables import format_table

if TYPE_CHECKING:
    from elasticps.demo.experiment import ScenarioResult


def time_to_target(epochs: list, target: float, started_s: float) -> float | None:
    """Seconds from submission until the end of the first epoch whose metric
    reached ``target`` (None if none did): start-up, then epoch times."""
    t = started_s
    for e in epochs:
        t += e.elapsed_s
        if e.metric is not None and e.metric >= target:
            return round(t, 2)
    return None


def epochs_to_target(epochs: list, target: float) -> int | None:
    """How many epochs until the metric first reached ``target`` (None: never):
    the statistical side of time to target, free of how fast the machine was."""
    return next((i for i, e in enumerate(epochs, 1) if e.metric is not None and e.metric >= target), None)


def base_name(key: str) -> str:
    """The policy or objective a result key names (``goodput #2`` -> ``goodput``)."""
    return key.split(" #")[0]


def target_summary(results: dict[str, ScenarioResult]) -> dict[str, dict[str, float | int | None]]:
    """Per policy or objective, over its runs: the median of the jobs' mean time
    to target from submission, the same from each job's first step (start-up
    left out: on this machine it varies by ~10 s from run to run, whatever the
    policy), the median mean epochs to target, and how many runs reached it;
    over all its runs, the median CPU-seconds its jobs held (``cpu_s``: each
    job's mean CPUs x its time) and the median of the jobs' mean final accuracy."""
    out: dict[str, dict[str, float | int | None]] = {}
    for name in dict.fromkeys(base_name(k) for k in results):
        runs = [r for k, r in results.items() if base_name(k) == name]
        reached = [r for r in runs if all(j.get("time_to_target_s") is not None for j in r.jobs.values())]

        def med(field: str, rs: list[ScenarioResult] = reached) -> float | None:
            means = [statistics.fmean(j[field] for j in r.jobs.values()) for r in rs]
            return round(statistics.median(means), 2) if means else None

        out[name] = {
            "runs": len(runs),
            "reached": len(reached),
            "to_target_s": med("time_to_target_s"),
            "trained_to_target_s": med("trained_to_target_s"),
            "epochs_to_target": med("epochs_to_target"),
            "makespan_s": round(statistics.median(r.makespan_s for r in runs), 2),
            "cpu_s": round(
                statistics.median(sum(j["mean_cpus"] * j["total_s"] for j in r.jobs.values()) for r in runs), 1
            ),
            "final_accuracy": round(
                statistics.median(statistics.fmean(j["final_accuracy"] for j in r.jobs.values()) for r in runs), 4
            ),
        }
    return out


def table(results: dict[str, ScenarioResult], target: float | None = None) -> str:
    """Per job and policy: epoch time, total time, final accuracy, mean utilization;
    with ``target``, also the batches trained at and the time to that accuracy."""
    header = ["job", "policy", "shapes (PSxW)", "epoch s", "total s", "accuracy", "mean CPUs", "utilization"]
    adaptive = target is not None
    if adaptive:
        header += ["batches", "to target s", "trained s", "epochs to target"]
    rows = []
    names = sorted({n for r in results.values() for n in r.jobs})
    for name in names:
        for policy, r in results.items():
            j = r.jobs[name]
            rows.append(
                [
                    name,
                    policy,
                    ",".join(f"{p}x{w}" for p, w in j["shapes"]),
                    f"{j['mean_epoch_s']:.2f}",
                    f"{j['total_s']:.1f}",
                    f"{j['final_accuracy']:.4f}",
                    f"{j['mean_cpus']:.2f}",
                    f"{j['mean_utilization']:.0%}",
                ]
                + (
                    [
                        ",".join(map(str, j.get("batches", []))),
                        _secs(j.get("time_to_target_s")),
                        _secs(j.get("trained_to_target_s")),
                        str(j.get("epochs_to_target") or "never"),
                    ]
                    if adaptive
                    else []
                )
            )
    lines = [format_table(rows, header), ""]
    if adaptive:
        lines.append(f"to target s: from submission to the end of the first epoch at accuracy >= {target:g}")
        lines.append("trained s: the same from the job's first step (its start-up left out; rescale pauses count)")
        lines += ["", *summary_lines(results), ""]
    for policy, r in results.items():
        lines.append(
            f"{policy}: makespan {r.makespan_s:.1f} s, jobs held {r.mean_job_cpu_share:.0%} of the cluster's "
            f"{r.cluster_cpus:g} CPUs on average"
        )
    return "\n".join(lines)


def summary_lines(results: dict[str, ScenarioResult]) -> list[str]:
    """One line per policy or objective: :func:`target_summary` in words."""
    return [
        f"{name}: over {s['runs']} run(s), {s['reached']} with every job at the target; medians of the "
        f"jobs' means: to target {_secs(s['to_target_s'])} s, trained {_secs(s['trained_to_target_s'])} s, "
        f"epochs {s['epochs_to_target'] if s['epochs_to_target'] is not None else 'never'}; "
        f"CPU-seconds held {s['cpu_s']:.0f}, final accuracy {s['final_accuracy']:.4f}"
        for name, s in target_summary(results).items()
    ]


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"
