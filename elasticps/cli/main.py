"""``elasticps``: demo, bench, train."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any


def _write_json(path: str | None, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


def cmd_demo(args: argparse.Namespace) -> int:
    from elasticps import runtime_demo

    report = runtime_demo.run(epochs=args.epochs)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "runtime":
        from elasticps.bench import runtime_bench

        _write_json(args.json, runtime_bench.run(quick=args.quick))
        return 0
    if args.what == "placement":
        from elasticps.bench import placement_bench

        _write_json(args.json, placement_bench.run(steps=args.steps))
        return 0
    if args.what == "scheduler":
        from elasticps.bench import scheduler_bench

        result = scheduler_bench.run(args.jobs, args.nodes, rounds=args.rounds, policy=args.policy)
        if args.scaling:
            result["scaling"] = scheduler_bench.scaling(args.policy)
        _write_json(args.json, result)
        return 0
    raise SystemExit(f"unknown benchmark {args.what!r}")


def cmd_train(args: argparse.Namespace) -> int:
    from elasticps import JobConfig, JobController, load_program
    from elasticps.raycluster import ensure_ray

    ensure_ray(args.ray_address, num_cpus=args.num_cpus)
    program = load_program(args.program)
    config = JobConfig(mode=args.mode, checkpoint_dir=args.checkpoint_dir, report_interval_s=args.report_interval_s)
    job = JobController(
        program,
        config,
        args.ps,
        args.workers,
        on_window=lambda w: print(
            f"step {w.last_step} P={w.num_ps} W={w.num_workers} {w.samples_per_s:.0f} samples/s loss {w.loss:.4f}",
            flush=True,
        ),
        on_epoch=lambda e: print(f"epoch {e.epoch} done at step {e.step} metric {e.metric}", flush=True),
    )
    try:
        job.start()
        for line in job.report().events:
            print(line, flush=True)
        print(f"running {args.ps} PS x {args.workers} workers: {job.placement()}", flush=True)
        report = job.run(max_steps=args.max_steps)
    finally:
        job.shutdown()
    print(f"{report.state} at step {report.step}", flush=True)
    return 0 if report.state in ("finished", "stopped", "running") else 1


def cmd_sim(args: argparse.Namespace) -> int:
    from elasticps.sim import SimConfig, load_workload, simulate, synthetic_workload

    workload = load_workload(args.workload) if args.workload else synthetic_workload(args.jobs, seed=args.seed)
    policies = args.compare.split(",") if args.compare else [args.policy]
    results = {}
    for policy in policies:
        config = SimConfig(
            nodes=args.nodes,
            node_cpu=args.node_cpu,
            interval_s=args.interval_s,
            rescale_pause_s=args.rescale_pause_s,
            policy=policy,
            objective=args.objective,
            placement=args.placement,
            seed=args.seed,
        )

        def progress(t: float, done: int, total: int, policy: str = policy) -> None:
            if not args.quiet:
                print(f"\r{policy}: t={t / 3600:6.1f} h, {done}/{total} jobs done", end="", file=sys.stderr, flush=True)

        results[policy] = simulate(workload, config, progress)
        if not args.quiet:
            print(file=sys.stderr)
    if args.plot:
        from elasticps.sim.plots import write_plots

        for path in write_plots(results, args.plot):
            print(f"wrote {path}", file=sys.stderr)
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


def _print_table(results: dict) -> None:
    cols = ["avg_jct_s", "p50_jct_s", "p99_jct_s", "makespan_s", "mean_utilization", "cross_node_bytes", "rescales"]
    print(f"{'policy':10s} " + " ".join(f"{c:>16s}" for c in cols))
    for name, r in results.items():
        print(f"{name:10s} " + " ".join(f"{r.metrics[c]:16.4g}" for c in cols))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticps", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the demo (a digits job rescaled live)")
    demo.add_argument("--epochs", type=int, default=30)
    demo.add_argument("--json", help="write the final job report here")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="run a benchmark and print JSON")
    bench.add_argument("what", choices=["runtime", "scheduler", "placement"])
    bench.add_argument("--steps", type=int, default=20, help="placement: steps per job")
    bench.add_argument("--quick", action="store_true", help="runtime: fewer repetitions")
    bench.add_argument("--jobs", type=int, default=1000, help="scheduler: number of jobs")
    bench.add_argument("--nodes", type=int, default=256, help="scheduler: number of nodes")
    bench.add_argument("--rounds", type=int, default=21, help="scheduler: decisions timed")
    bench.add_argument("--policy", default="elastic", help="scheduler: policy to time")
    bench.add_argument("--scaling", action="store_true", help="scheduler: also time a grid of sizes")
    bench.add_argument("--json", help="also write the JSON here")
    bench.set_defaults(func=cmd_bench)

    train = sub.add_parser("train", help="train one program at a fixed shape (resumes from --checkpoint-dir)")
    train.add_argument("program", help="package.module:attr naming a TrainingProgram (or a factory of one)")
    train.add_argument("--ps", type=int, default=1)
    train.add_argument("--workers", type=int, default=1)
    train.add_argument("--mode", choices=["sync", "async"], default="sync")
    train.add_argument("--checkpoint-dir")
    train.add_argument("--max-steps", type=int)
    train.add_argument("--report-interval-s", type=float, default=5.0)
    train.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    train.add_argument("--num-cpus", type=int, help="logical CPUs of the embedded local Ray cluster")
    train.set_defaults(func=cmd_train)
    sim = sub.add_parser("sim", help="simulate policies on a modelled cluster")
    sim.add_argument("--workload", help="a .csv or .jsonl workload (default: synthetic)")
    sim.add_argument("--jobs", type=int, default=300, help="synthetic workload: number of jobs")
    sim.add_argument("--nodes", type=int, default=32)
    sim.add_argument("--node-cpu", type=float, default=32.0)
    sim.add_argument("--interval-s", type=float, default=300.0, help="scheduling interval")
    sim.add_argument("--rescale-pause-s", type=float, default=30.0)
    sim.add_argument("--policy", default="elastic", choices=["static", "greedy", "optimus", "elastic"])
    sim.add_argument("--objective", default="goodput", choices=["goodput", "speed", "efficiency"])
    sim.add_argument("--placement", default="locality", choices=["locality", "spread", "pack", "optimus"])
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--compare", help="comma-separated policies to run on the same workload, e.g. static,elastic")
    sim.add_argument("--plot", help="write PNG plots into this directory")
    sim.add_argument("--json", help="write the results here")
    sim.add_argument("--quiet", action="store_true")
    sim.set_defaults(func=cmd_sim)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
