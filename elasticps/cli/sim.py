"""``elasticps sim``: policies on a modelled cluster."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from elasticps.cli.common import (
    OBJECTIVE_HELP,
    PLACEMENT_HELP,
    THRESHOLD_HELP,
    DefaultsHelp,
    nonnegative_float,
    nonnegative_int,
    output_dir,
    output_file,
    positive_float,
    positive_int,
    share_of_jobs,
)

#: What --policy and --compare take: every policy of elasticps.sched.policies, and the oracle.
SIM_POLICIES = ("static", "greedy", "optimus", "elastic", "pollux", "tiresias", "oracle", "kind-oracle")
OBJECTIVES = ("goodput", "speed", "efficiency")
DEFAULT_POLICY, DEFAULT_JOBS = "elastic", 300
#: What --truth takes: elasticps.sim.truth.TRUTHS (a test keeps them equal; the simulator loads only when a run starts).
TRUTHS = ("optimus", "grid", "mixed")
#: What --workload-shape takes: elasticps.sim.workload.synthetic_workload, elasticps.sim.traces.trace_workload.
WORKLOAD_SHAPES = ("synthetic", "trace")

WORKLOAD_HELP = """\
workload files (--workload): CSV with a header row, or JSONL (one object a line); a row's fields
(only id, arrival_s, kind and samples are required; the others take the defaults shown):
  id                 the job's name
  arrival_s          when it is submitted, seconds from the start
  kind               its model kind (below): how its speed depends on its shape
  samples            its total work, in samples at the kind's batch
  min_ps, max_ps     PS limits (1, 8; an all-reduce kind: 0, 0)
  min_workers, max_workers    worker limits (1, 16)
  static_ps, static_workers   the shape the user asked for, what static runs (2, 4; all-reduce: 0, 4)
  ps_cpu, worker_cpu          CPUs a task (2, 4)
  ps_memory_gb, worker_memory_gb   memory a task (4, 8)
  worker_gpu         GPUs a worker (0; an all-reduce kind needs > 0)
  max_batch          > the kind's batch: the batch may adapt up to it (0: fixed; PS kinds only)
  noise_scale        gradient noise scale at the start, growing 10x by the end (0: unknown)
model kinds (elasticps/sched/synthetic.py; batch, parameters):
  resnet-like        batch 128, 45M parameters
  vgg-like           batch 128, 500M parameters (the most PS traffic)
  transformer-like   batch 64, 250M parameters
  mlp-small          batch 256, 10M parameters
  resnet50-allreduce batch 256, 100M parameters, GPU all-reduce (no PS)
trace CSVs (--trace): a header row, then submit_time_s, duration_s (at the size asked) and num_gpus
(the workers asked), optionally id and kind; docs/simulator.md ("Trace-shaped workloads").
docs/simulator.md has the speed model and the figures measured with it."""


def _names(valid: tuple[str, ...], what: str, plural: str, single: bool = False):
    """An argparse type: comma-separated names, each one of ``valid`` (a typo is
    refused at once, listing them, with the closest name); ``single``: exactly
    one name, returned as it is."""
    import difflib

    def parse(text: str) -> list[str] | str:
        names = [n.strip() for n in text.split(",") if n.strip()]
        for name in names:
            if name not in valid:
                close = difflib.get_close_matches(name, valid, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise argparse.ArgumentTypeError(f"no {what} {name!r}: {hint}({plural}: {', '.join(valid)})")
        if not names:
            raise argparse.ArgumentTypeError(f"give one or more {plural}, comma-separated ({', '.join(valid)})")
        if len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(f"a {what} named twice in {text!r}")
        if single and len(names) > 1:
            raise argparse.ArgumentTypeError(f"one {what} at a time, got {text!r} ({plural}: {', '.join(valid)})")
        return names[0] if single else names

    return parse


def _check(args: argparse.Namespace) -> None:
    """What argparse cannot see alone, before anything runs: a ConfigError (exit 2) naming it."""
    from elasticps.errors import ConfigError

    if args.compare and args.objectives:
        raise ConfigError("--compare (policies) and --objectives: one at a time")
    if args.compare and args.policy:
        raise ConfigError("--policy and --compare: --compare names every policy to run")
    if args.jobs is not None and (args.workload or args.trace):
        raise ConfigError("--jobs sizes a generated workload: not with --workload or --trace (their rows are the jobs)")
    if args.efficiency_threshold is not None and "efficiency" not in (args.objectives or [args.objective]):
        raise ConfigError("--efficiency-threshold is for the efficiency objective: give --objective efficiency")
    args.policy = args.policy or DEFAULT_POLICY
    args.jobs = args.jobs or DEFAULT_JOBS
    if args.seeds is not None and (args.plot or args.workload or args.trace):
        raise ConfigError("--seeds varies the generated workload's seed: not with --plot or --workload (or --trace)")
    if args.workload and args.trace:
        raise ConfigError("--workload and --trace: one workload at a time")
    if (args.workload or args.trace) and args.workload_shape != "synthetic":
        raise ConfigError("--workload-shape shapes a generated workload: not with --workload or --trace")
    if args.interarrival_s is not None and (args.workload or args.trace):
        raise ConfigError("--interarrival-s shapes a generated workload: not with --workload or --trace")
    if args.adaptive_jobs and (args.trace or args.workload or args.workload_shape == "trace"):
        raise ConfigError("--adaptive-jobs applies to the synthetic workload only")
    from elasticps.sim.config import ORACLE

    _check_policy_options(args)
    if args.gaps and (ORACLE not in (args.compare or []) or args.seeds is not None):
        raise ConfigError("--gaps compares with the oracle on one seed: give --compare ...,oracle, not --seeds")
    if args.json:  # nowhere to write: refused before the runs, not after them
        output_file(args.json, "--json")
    if args.plot:
        output_dir(args.plot, "--plot")
    if args.gpu_jobs and not args.node_gpu:
        raise ConfigError("--gpu-jobs makes GPU jobs: give the nodes GPUs too (--node-gpu N)")
    if args.trace:
        from elasticps.sim.traces import load_trace_csv

        if not Path(args.trace).is_file():
            raise ConfigError(f"--trace {args.trace}: no such file")
        load_trace_csv(args.trace)  # a bad row is a ConfigError naming its row and column
    if args.workload:
        from elasticps.sim import load_workload

        if not Path(args.workload).is_file():
            raise ConfigError(f"--workload {args.workload}: no such file")
        if not load_workload(args.workload):  # a bad row is a ConfigError naming it
            raise ConfigError(f"--workload {args.workload}: no jobs in it")


def _check_policy_options(args: argparse.Namespace) -> None:
    """An option given for policies none of which runs (``--joint-trades`` with
    ``static`` alone) is refused: it would be read as having been taken."""
    from elasticps.errors import ConfigError
    from elasticps.sched.policies import POLICIES, policy_options
    from elasticps.sim.config import ORACLES

    names = args.compare or [args.policy]
    taken = {o for n in names for o in policy_options("elastic" if n in ORACLES else n)}
    given = {
        "--joint-trades": ("joint_trades", args.joint_trades),
        "--efficiency-threshold": ("efficiency_threshold", args.efficiency_threshold),
        "--objectives": ("objective", args.objectives),
        "--objective": ("objective", args.objective != "goodput"),
    }
    for flag, (option, value) in given.items():
        if value and option not in taken:
            oracles = sorted(ORACLES) if option in policy_options("elastic") else []
            takers = ", ".join([*(p for p in POLICIES if option in policy_options(p)), *oracles])
            raise ConfigError(f"{flag}: no policy run here ({', '.join(names)}) takes it (those that do: {takers})")


def cmd_sim(args: argparse.Namespace) -> int:
    from elasticps.sim import gain_captured

    _check(args)
    if args.objectives:  # one policy under each objective, the table keyed by objective
        runs = [(args.policy, o) for o in args.objectives]
    else:
        runs = [(p, args.objective) for p in (args.compare or [args.policy])]
    if args.seeds is not None:
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
    if args.gaps:
        from elasticps.sim.gaps import format_gaps, gaps_by_group

        data["gaps_to_oracle"] = gaps_by_group(_workload(args, args.seed), results)
        print(format_gaps(data["gaps_to_oracle"], list(results)))  # the oracle's row: where the best shapes lie
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2, default=str) + "\n")
    if len(results) == 1 and not args.json:
        print(json.dumps(data, indent=2, default=str))
    if len(results) > 1:
        print(verdict({name: r.metrics["avg_jct_s"] for name, r in results.items()}))
    return 0


def verdict(avg_jct_s: dict[str, float]) -> str:
    """One line: each run's avg JCT against the baseline's (static where it ran, else
    the first): ``elastic vs static: -36% avg JCT``."""
    base = "static" if "static" in avg_jct_s else next(iter(avg_jct_s))
    parts = [
        f"{name} vs {base}: {value / avg_jct_s[base] - 1:+.0%} avg JCT"
        for name, value in avg_jct_s.items()
        if name != base and avg_jct_s[base] > 0
    ]
    return "; ".join(parts)


def _workload(args: argparse.Namespace, seed: int) -> list:
    """The run's workload: the file or trace given, else generated from ``seed``."""
    from elasticps.sim import load_workload, synthetic_workload
    from elasticps.sim.traces import load_trace_csv, trace_workload

    if args.workload:
        return load_workload(args.workload)
    if args.trace:
        return load_trace_csv(args.trace, seed=seed)
    generate = trace_workload if args.workload_shape == "trace" else synthetic_workload
    kw = {} if args.interarrival_s is None else {"mean_interarrival_s": args.interarrival_s}
    if args.adaptive_jobs:
        kw["adaptive_share"] = args.adaptive_jobs
    return generate(args.jobs, seed=seed, gpu_share=args.gpu_jobs, **kw)


def _sim_runs(args: argparse.Namespace, runs: list[tuple[str, str]], seed: int) -> dict:
    """Each (policy, objective) of ``runs`` simulated on the workload of ``seed``."""
    from elasticps.sim import SimConfig, simulate

    workload = _workload(args, seed)
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
            joint_trades=args.joint_trades,
            placement=args.placement,
            fleet_prior=not args.no_fleet_prior,
            job_speed_spread=args.job_spread,
            seed=seed,
            truth=args.truth,
            truth_grid=args.truth_grid or "",
            event_rounds=not args.tick_rounds_only,
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
    from elasticps.sim.seeds import seeds_verdict, summarize

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
    if len(summary) > 1:
        print(seeds_verdict(summary))
    if args.json:
        data = {
            "summary": summary,
            "per_seed": {seed: {n: r.to_dict() for n, r in results.items()} for seed, results in per_seed.items()},
        }
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
    sim = sub.add_parser(
        "sim", help="simulate policies on a modelled cluster", formatter_class=DefaultsHelp, epilog=WORKLOAD_HELP
    )
    sim.add_argument("--workload", help="a .csv or .jsonl workload (below; default: synthetic)")
    sim.add_argument("--trace", help="a trace CSV: submit_time_s, duration_s, num_gpus[, id, kind] (docs/simulator.md)")
    sim.add_argument(
        "--workload-shape", default="synthetic", choices=WORKLOAD_SHAPES,
        help="the generated workload: synthetic (Poisson arrivals 30 s apart, ~1 h jobs) or trace (a daily "
        "cycle, bursts, heavy-tailed durations and 1-16 GPU sizes as production GPU traces show, 300 s apart; "
        "elasticps/sim/traces.py)",
    )  # fmt: skip
    sim.add_argument("--jobs", type=positive_int, help=f"generated workload: number of jobs (default: {DEFAULT_JOBS})")
    sim.add_argument(
        "--interarrival-s", type=positive_float,
        help="generated workload: mean seconds between submissions (default: 30 synthetic, 300 trace)",
    )  # fmt: skip
    sim.add_argument("--nodes", type=positive_int, default=32, help="nodes of the modelled cluster")
    sim.add_argument("--node-cpu", type=positive_float, default=32.0, help="CPUs per node")
    sim.add_argument("--node-gpu", type=nonnegative_float, default=0.0, help="GPUs per node")
    sim.add_argument(
        "--gpu-jobs", type=share_of_jobs, default=0.0,
        help="generated workload: share of all-reduce GPU jobs, 0..1 (needs --node-gpu)",
    )  # fmt: skip
    sim.add_argument(
        "--adaptive-jobs", type=share_of_jobs, default=0.0,
        help="synthetic workload: share of PS jobs with an adaptive batch (up to 8x) and a growing noise scale, 0..1",
    )  # fmt: skip
    sim.add_argument("--interval-s", type=positive_float, default=300.0, help="scheduling interval, seconds")
    sim.add_argument(
        "--rescale-pause-s", type=nonnegative_float, default=30.0,
        help="seconds a job makes no progress after a start or rescale",
    )  # fmt: skip
    sim.add_argument(
        "--policy", choices=SIM_POLICIES,
        help="the policy to run (default: elastic), or --compare several; oracle: elastic's decisions "
        "knowing every job's true speed (the bound to measure against)",
    )  # fmt: skip
    sim.add_argument("--objective", default="goodput", choices=OBJECTIVES, help=OBJECTIVE_HELP)
    sim.add_argument("--efficiency-threshold", type=positive_float, help=THRESHOLD_HELP)
    sim.add_argument(
        "--joint-trades", type=nonnegative_int, default=0, metavar="N",
        help="elastic, oracle: after the greedy growth, at most N trades of tasks between jobs where one gains "
        "more than the other loses (elasticps/sched/joint.py; 0, the default: none)",
    )  # fmt: skip
    sim.add_argument(
        "--placement", default="locality", choices=["locality", "spread", "pack", "optimus"], help=PLACEMENT_HELP
    )
    sim.add_argument("--seed", type=int, default=0, help="seeds the workload, other tenants and noise")
    sim.add_argument(
        "--seeds",
        type=positive_int,
        help="run the comparison on this many seeds from --seed on, and report each policy's mean avg JCT, "
        "its share of the oracle's gain, on how many seeds it was the best non-oracle policy, and its "
        "avg JCT and CPU-hours against the first run's (with --objectives: against the first objective)",
    )
    sim.add_argument(
        "--tick-rounds-only", action="store_true",
        help="rounds only every --interval-s and when tenants change: no round that starts waiting jobs when "
        "a job arrives or ends (the live manager runs one; elasticps/sched/rounds.py). Figures measured before "
        "those rounds were made so",
    )  # fmt: skip
    sim.add_argument(
        "--no-fleet-prior",
        action="store_true",
        help="judge a new job by its own observations only, not by earlier jobs of the same kind",
    )
    sim.add_argument(
        "--job-spread",
        type=nonnegative_float,
        default=0.0,
        help="jobs of one kind differ: each job's true speed is its kind's x a lognormal factor of this sigma "
        "(e.g. 0.2); 0: every job of a kind runs alike",
    )
    sim.add_argument(
        "--truth", default="optimus", type=_names(TRUTHS, "truth", "truths", single=True),
        help="the ground truth of PS jobs' speeds: optimus (the form the speed model fits), grid (every job "
        "follows the measured bench-shapes grid) or mixed (each job draws saturating PS bandwidth, straggling "
        "PS and workers, or the grid); grid and mixed report with the measured 14%% noise (elasticps/sim/truth.py)",
    )  # fmt: skip
    sim.add_argument(
        "--truth-grid", metavar="FILE",
        help="with --truth grid or mixed: the speeds to follow, a JSON written by 'elasticps bench shapes' "
        "(default: the project's own, docs/results/bench-shapes.json)",
    )  # fmt: skip
    sim.add_argument(
        "--compare", type=_names(SIM_POLICIES, "policy", "policies"),
        help=f"comma-separated policies to run on the same workload, e.g. static,elastic ({', '.join(SIM_POLICIES)}); "
        "ends with each one's avg JCT against static's (else the first's)",
    )  # fmt: skip
    sim.add_argument(
        "--objectives", type=_names(OBJECTIVES, "objective", "objectives"),
        help="comma-separated objectives to run --policy under on the same workload, e.g. goodput,speed",
    )  # fmt: skip
    sim.add_argument(
        "--gaps", action="store_true",
        help="with the oracle in --compare: each policy's seconds of avg JCT behind it per truth surface and model "
        "kind, and the shapes each ran those jobs at (also in --json as gaps_to_oracle)",
    )  # fmt: skip
    sim.add_argument("--plot", help="write PNG plots into this directory")
    sim.add_argument("--json", help="write the results here")
    sim.add_argument("--quiet", action="store_true", help="no progress lines")
    sim.set_defaults(func=cmd_sim)
