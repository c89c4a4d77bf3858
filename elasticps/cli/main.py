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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticps", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the demo (a digits job rescaled live)")
    demo.add_argument("--epochs", type=int, default=30)
    demo.add_argument("--json", help="write the final job report here")
    demo.set_defaults(func=cmd_demo)

    bench = sub.add_parser("bench", help="run a benchmark and print JSON")
    bench.add_argument("what", choices=["runtime", "scheduler"])
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
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
