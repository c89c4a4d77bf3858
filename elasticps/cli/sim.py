"""``elasticps sim``: policies on a modelled cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from elasticps.cli.common import OBJECTIVE_HELP, PLACEMENT_HELP, THRESHOLD_HELP


def cmd_sim(args: argparse.Namespace) -> int:
    from elasticps.sim import gain_captured

    for flag, share in (("--gpu-jobs", args.gpu_jobs), ("--adaptive-jobs", args.adaptive_jobs)):
        if not 0.0 <= share <= 1.0:
            raise SystemExit(f"error: {flag} is a share of the jobs, 0..1, got {share:g}")
    if args.compare and args.objectives:
        raise SystemExit("error: --compare (policies) and --objectives: one at a time")
    if args.objectives:  # one policy under each objective, the table keyed by objective
        runs = [(args.policy, o.strip()) for o in args.objectives.split(",")]
        bad = [o for _, o in runs if o not in ("goodput", "speed", "efficiency")]
        if bad:
            raise SystemExit(f"error: --objectives takes goodput, speed, efficiency; got {', '.join(bad)}")
    else:
        runs = [(p, args.objective) for p in (args.compare.split(",") if args.compare else [args.policy])]
    if args.seeds is not None:
        if args.plot:
            raise SystemExit("error: --plot draws one run's plots: not with --seeds")
        return _sim_seeds(args, runs)
    results = _sim_runs(args, runs, args.seed)
    if args.plot:
        from elasticps.sim.plots import write_plots

        for path in write_plots(results, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    for name, share in gain_captured(results).items():
        results[name].metrics["gain_captured"] = round(share, 4)
    if len(results) > 1:
        _print_table(results)
        data = {name: r.to_dict() for name, r in results.items()}
    else:
        data = next(iter(results.values())).to_dict()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    if len(results) == 1 and not args.json:
        print(json.dumps(data, indent=2, default=str))
    return 0


def _sim_runs(args: argparse.Namespace, runs: list[tuple[str, str]], seed: int) -> dict:
    """Each (policy, objective) of ``runs`` simulated on the workload of ``seed``."""
    from elasticps.sim import SimConfig, load_workload, simulate, synthetic_workload

    if args.workload:
        workload = load_workload(args.workload)
    else:
        workload = synthetic_workload(args.jobs, seed=seed, gpu_share=args.gpu_jobs, adaptive_share=args.adaptive_jobs)
    results = {}
    for policy, objective in runs:
        config = SimConfig(
            nodes=args.nodes,
            node_cpu=args.node_cpu,
            node_gpu=args.node_gpu,
            interval_s=args.interval_s,
            rescale_pause_s=args.rescale_pause_s,
            policy=policy,
            objective=objective,
            **({} if args.efficiency_threshold is None else {"efficiency_threshold": args.efficiency_threshold}),
            placement=args.placement,
            fleet_prior=not args.no_fleet_prior,
            job_speed_spread=args.job_spread,
            seed=seed,
        )
        name = objective if args.objectives else policy
        label = name if args.seeds is None else f"{name} (seed {seed})"
        results[name] = simulate(workload, config, None if args.quiet else _progress_printer(label))
        if not args.quiet and sys.stderr.isatty():
            print(file=sys.stderr)
    return results


def _sim_seeds(args: argparse.Namespace, runs: list[tuple[str, str]]) -> int:
    """``--seeds N``: the same comparison on seeds --seed .. --seed + N - 1; a
    table of each seed's avg JCT, then each policy's mean, wins and gain."""
    from elasticps.sim.seeds import summarize

    if args.seeds < 1:
        raise SystemExit(f"error: --seeds is a count of seeds, at least 1, got {args.seeds}")
    if args.workload:
        raise SystemExit("error: --seeds varies the synthetic workload's seed: not with --workload")
    per_seed = {}
    for seed in range(args.seed, args.seed + args.seeds):
        per_seed[seed] = _sim_runs(args, runs, seed)
    names = list(per_seed[args.seed])
    print(f"{'seed':>6s} " + " ".join(f"{n:>12s}" for n in names) + "   (avg JCT, s)")
    for seed, results in per_seed.items():
        print(f"{seed:6d} " + " ".join(f"{results[n].metrics['avg_jct_s']:12.0f}" for n in names))
    summary = summarize(per_seed)
    vs = f"vs {names[0]}"
    print(
        f"\n{'policy':10s} {'mean avg JCT':>14s} {'best non-oracle':>16s} {'gain captured':>22s} "
        f"{'mean CPU-hours':>15s} {'avg JCT ' + vs:>20s} {'CPU-hours ' + vs:>22s}"
    )
    for name, row in summary.items():
        wins = f"{row['best_non_oracle']} of {row['seeds']}" if "best_non_oracle" in row else "-"
        gain = "-"
        if "mean_gain_captured" in row:
            gain = f"{row['mean_gain_captured']:.0%} (min {row['min_gain_captured']:.0%})"
        jct_vs, cpu_vs = (_change_range(row.get(k)) for k in ("avg_jct_vs_first", "cpu_hours_vs_first"))
        print(
            f"{name:10s} {row['mean_avg_jct_s']:14.0f} {wins:>16s} {gain:>22s} "
            f"{row['mean_cpu_hours']:15.0f} {jct_vs:>20s} {cpu_vs:>22s}"
        )
    if all("mean_gap_to_bound" in row for row in summary.values()):
        _print_worst(summary)
    if args.json:
        data = {
            "summary": summary,
            "per_seed": {seed: {n: r.to_dict() for n, r in results.items()} for seed, results in per_seed.items()},
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0


def _print_worst(summary: dict) -> None:
    """Each policy's mean and worst seed of avg and p99 JCT, makespan and gap to the lower bound."""
    print(f"\n{'policy':10s} " + " ".join(f"{c:>22s}" for c in ("avg JCT", "p99 JCT", "makespan", "gap to bound")))
    for name, row in summary.items():
        cells = [
            f"{row['mean_' + m]:.0f} (worst {row['worst_' + m]:.0f})" for m in ("avg_jct_s", "p99_jct_s", "makespan_s")
        ]
        cells.append(f"{row['mean_gap_to_bound']:.1%} (worst {row['worst_gap_to_bound']:.1%})")
        print(f"{name:10s} " + " ".join(f"{c:>22s}" for c in cells))
    bound = next(iter(summary.values()))
    print(f"lower bound (s): mean {bound['mean_lower_bound_s']:.0f}, largest {bound['worst_lower_bound_s']:.0f}")


def _change_range(change: dict | None) -> str:
    """A relative change over seeds, as "min .. max": "-31% .. -23%"."""
    if change is None:
        return "-"
    return f"{change['min']:+.0%} .. {change['max']:+.0%}"


def _progress_printer(policy: str):
    """Progress on stderr: one line rewritten in place on a terminal; else a
    line at each tenth of the jobs done (logs stay readable)."""
    tty = sys.stderr.isatty()
    shown = [-1]

    def progress(t: float, done: int, total: int) -> None:
        line = f"{policy}: t={t / 3600:6.1f} h, {done}/{total} jobs done"
        if tty:
            print(f"\r{line}", end="", file=sys.stderr, flush=True)
        elif (tenth := done * 10 // max(1, total)) > shown[0]:
            shown[0] = tenth
            print(line, file=sys.stderr, flush=True)

    return progress


def _print_table(results: dict) -> None:
    cols = ["avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "mean_utilization", "cpu_hours", "rescales"]
    if any(r.metrics.get("batch_changes") for r in results.values()):
        cols.append("batch_changes")
    if any("gain_captured" in r.metrics for r in results.values()):
        cols.append("gain_captured")  # (static - policy) / (static - oracle), avg JCT
    cols += ["lower_bound_s", "gap_to_bound"]  # elasticps.sim.bound; avg JCT / bound - 1
    print(f"{'policy':10s} " + " ".join(f"{c:>16s}" for c in cols))
    for name, r in results.items():
        print(f"{name:10s} " + " ".join(f"{r.metrics.get(c, float('nan')):16.4g}" for c in cols))


def add_parsers(sub: Any) -> None:
    """sim"""
    sim = sub.add_parser("sim", help="simulate policies on a modelled cluster")
    sim.add_argument("--workload", help="a .csv or .jsonl workload (default: synthetic)")
    sim.add_argument("--jobs", type=int, default=300, help="synthetic workload: number of jobs")
    sim.add_argument("--nodes", type=int, default=32, help="nodes of the modelled cluster")
    sim.add_argument("--node-cpu", type=float, default=32.0, help="CPUs per node")
    sim.add_argument("--node-gpu", type=float, default=0.0, help="GPUs per node")
    sim.add_argument(
        "--gpu-jobs",
        type=float,
        default=0.0,
        help="synthetic workload: share of all-reduce GPU jobs (needs --node-gpu)",
    )
    sim.add_argument(
        "--adaptive-jobs",
        type=float,
        default=0.0,
        help="synthetic workload: share of PS jobs with an adaptive batch (up to 8x) and a growing noise scale",
    )
    sim.add_argument("--interval-s", type=float, default=300.0, help="scheduling interval")
    sim.add_argument(
        "--rescale-pause-s", type=float, default=30.0, help="seconds a job makes no progress after a start or rescale"
    )
    sim.add_argument(
        "--policy", default="elastic",
        choices=["static", "greedy", "optimus", "elastic", "pollux", "tiresias", "oracle"],
        help="oracle: elastic's decisions knowing every job's true speed (the bound to measure against)",
    )  # fmt: skip
    sim.add_argument("--objective", default="goodput", choices=["goodput", "speed", "efficiency"], help=OBJECTIVE_HELP)
    sim.add_argument("--efficiency-threshold", type=float, help=THRESHOLD_HELP)
    sim.add_argument(
        "--placement", default="locality", choices=["locality", "spread", "pack", "optimus"], help=PLACEMENT_HELP
    )
    sim.add_argument("--seed", type=int, default=0, help="seeds the workload, other tenants and noise")
    sim.add_argument(
        "--seeds",
        type=int,
        help="run the comparison on this many seeds from --seed on, and report each policy's mean avg JCT, "
        "its share of the oracle's gain, on how many seeds it was the best non-oracle policy, and its "
        "avg JCT and CPU-hours against the first run's (with --objectives: against the first objective)",
    )
    sim.add_argument(
        "--no-fleet-prior",
        action="store_true",
        help="judge a new job by its own observations only, not by earlier jobs of the same kind",
    )
    sim.add_argument(
        "--job-spread",
        type=float,
        default=0.0,
        help="jobs of one kind differ: each job's true speed is its kind's x a lognormal factor of this sigma "
        "(e.g. 0.2); 0: every job of a kind runs alike",
    )
    sim.add_argument("--compare", help="comma-separated policies to run on the same workload, e.g. static,elastic")
    sim.add_argument(
        "--objectives", help="comma-separated objectives to run --policy under on the same workload, e.g. goodput,speed"
    )
    sim.add_argument("--plot", help="write PNG plots into this directory")
    sim.add_argument("--json", help="write the results here")
    sim.add_argument("--quiet", action="store_true", help="no progress lines")
    sim.set_defaults(func=cmd_sim)
