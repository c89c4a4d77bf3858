"""``elasticps demo`` and ``elasticps bench``: the published experiment and the benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from elasticps.cli.common import POLICIES, nonnegative_int, positive_float, positive_int, write_json
from elasticps.errors import ConfigError
from elasticps.sim.truth import GRID_PATH


def cmd_demo(args: argparse.Namespace) -> int:
    if args.single_job:
        from elasticps.demo import single_job

        report = single_job.run(epochs=args.epochs or 30)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        return 0

    from dataclasses import asdict, replace

    from elasticps.demo import experiment, summary

    setup = experiment.Setup()
    if args.epochs:
        setup = replace(setup, epochs=tuple(args.epochs * k // 3 for k in (3, 4, 5)))
    if args.tenant_s is not None:
        setup = replace(setup, tenant_s=args.tenant_s)
    if args.lr is not None:
        if not args.lr > 0:
            print(f"error: --lr must be above 0, got {args.lr:g}", file=sys.stderr)
            return 2
        setup = replace(setup, lr=args.lr)
    if args.cores_per_cpu is not None:
        if not args.cores_per_cpu > 0:
            print(f"error: --cores-per-cpu must be above 0, got {args.cores_per_cpu:g}", file=sys.stderr)
            return 2
        setup = replace(setup, cores_per_cpu=args.cores_per_cpu)
    policies = _names(args.policies)
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        choices = ", ".join(POLICIES)
        print(f"error: --policies: unknown {unknown or 'none given'}; choose from {choices}", file=sys.stderr)
        return 2
    objectives = _names(args.objectives or "")
    if any(o not in ("goodput", "speed", "efficiency") for o in objectives):
        print(f"error: --objectives takes goodput, speed, efficiency; got {args.objectives}", file=sys.stderr)
        return 2
    if objectives:
        setup = replace(setup, max_batch_size=args.max_batch)
        if args.target is not None:
            if not 0.0 < args.target <= 1.0:
                print(f"error: --target is an accuracy, 0..1, got {args.target:g}", file=sys.stderr)
                return 2
            setup = replace(setup, target_accuracy=args.target)
    if args.repeats < 1:
        print(f"error: --repeats must be at least 1, got {args.repeats}", file=sys.stderr)
        return 2
    if args.from_json:
        return _demo_from_json(args)
    results = experiment.run(setup, policies, objectives=objectives, repeats=args.repeats)
    print()
    _demo_outputs(args, results, asdict(setup), setup.target_accuracy if objectives else None)
    if args.json:
        figures = {
            "setup": asdict(setup),
            "summary": summary.target_summary(results) if objectives else None,
            "results": {p: r.to_dict() for p, r in results.items()},
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
        print(f"figures: {args.json}")
    return 0


def _demo_from_json(args: argparse.Namespace) -> int:
    """``demo --from-json FILE``: the table, the HTML report and ``--plots`` of a saved run."""
    from elasticps.demo import experiment

    try:
        saved = json.loads(Path(args.from_json).read_text())
        results = {k: experiment.ScenarioResult.from_dict(r) for k, r in saved["results"].items()}
        setup = saved["setup"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: --from-json {args.from_json}: not a saved demo run ({exc})", file=sys.stderr)
        return 2
    _demo_outputs(args, results, setup, setup.get("target_accuracy") if saved.get("summary") else None)
    return 0


def _demo_outputs(args: argparse.Namespace, results: dict, setup: dict[str, Any], target: float | None) -> None:
    """What a demo run shows: the table on stdout, the HTML report, and with
    ``--plots`` its figures as PNG files."""
    from elasticps.demo import report, summary

    text = summary.table(results, target)
    print(text)
    plots = Path(args.plots) if args.plots else None
    print(f"report: {report.write_html(results, Path(args.html), text, setup, plots=plots)}")
    if plots is not None:
        print(f"plots: {plots}/")


#: The benchmarks each ``bench`` option is for (``--json``: every one). Given to another, an option
#: is refused, not ignored, even with its default value.
_BENCH_OPTIONS: dict[str, tuple[str, ...]] = {
    "steps": ("placement", "shapes", "peers"),
    "quick": ("runtime", "peers"),
    **dict.fromkeys(
        ("workloads", "workers", "repeats", "resize_systems", "systems", "embedding_rows", "plot"), ("peers",)
    ),
    **dict.fromkeys(("jobs", "nodes", "policy", "joint_trades", "scaling"), ("scheduler",)),
    "rounds": ("scheduler", "manager"),
    **dict.fromkeys(("ended", "active"), ("manager",)),
    **dict.fromkeys(("faults", "seed", "nodes_ray", "kinds"), ("chaos",)),
    **dict.fromkeys(("grid", "probes", "heatmap"), ("explore",)),
    **dict.fromkeys(("model", "batch", "cores_per_task", "grid_limits"), ("shapes",)),
    **dict.fromkeys(("batches", "seeds", "target", "lr"), ("batches",)),
}


def given_bench_options(argv: list[str]) -> set[str]:
    """The ``bench`` options ``argv`` gives, whatever their values (one that
    repeats its default is given too): the command line parsed again with no
    defaults, so only what it names is set."""
    from elasticps.cli.main import build_parser, subcommand

    parser = build_parser()
    for action in subcommand(parser, "bench")._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) & set(_BENCH_OPTIONS)


def cmd_bench(args: argparse.Namespace) -> int:
    given = given_bench_options(args.argv)
    for option, benchmarks in _BENCH_OPTIONS.items():
        if option in given and args.what not in benchmarks:
            flag = "--" + option.replace("_", "-")
            raise ConfigError(f"bench {args.what} does not take {flag} (bench {', '.join(benchmarks)} does)")
    if args.what == "runtime":
        from elasticps.bench import runtime_bench

        write_json(args.json, runtime_bench.run(quick=args.quick))
        return 0
    if args.what == "placement":
        from elasticps.bench import placement_bench

        write_json(args.json, placement_bench.run(steps=args.steps or 20))
        return 0
    if args.what == "scheduler":
        from elasticps.bench import scheduler_bench

        options = {"joint_trades": args.joint_trades} if args.joint_trades is not None else {}
        result = scheduler_bench.run(args.jobs, args.nodes, rounds=args.rounds, policy=args.policy, **options)
        if args.scaling:
            result["scaling"] = scheduler_bench.scaling(args.policy, **options)
        write_json(args.json, result)
        return 0
    if args.what == "manager":
        from elasticps.bench import manager_bench

        write_json(args.json, manager_bench.run(ended=args.ended, active=args.active, rounds=args.rounds))
        return 0
    if args.what == "chaos":
        from elasticps.bench import chaos_bench

        kinds = _names(args.kinds) if args.kinds else chaos_bench.FAULTS
        config = chaos_bench.ChaosConfig(faults=args.faults, seed=args.seed, nodes=args.nodes_ray, kinds=kinds)
        result = chaos_bench.run(config, say=lambda line: print(line, file=sys.stderr, flush=True))
        write_json(args.json, result)
        return 0 if result["invariants_violated"] == 0 else 1
    if args.what == "shapes":
        from elasticps.bench import shapes_bench

        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        shape_args: dict[str, Any] = {}  # what was given: shapes_bench.run's defaults for the rest
        if args.grid_limits is not None:
            grid = _int_list(args.grid_limits)
            if len(grid) != 3 or min(grid) < 1 or grid[2] < 2:
                raise ConfigError(
                    "--grid-limits: three numbers MAX_PS,MAX_WORKERS,MAX_TASKS, each at least 1 and "
                    f"MAX_TASKS at least 2 (one PS and one worker), got {args.grid_limits!r}"
                )
            shape_args.update(zip(("max_ps", "max_workers", "max_tasks"), grid, strict=True))
        for name in ("batch", "cores_per_task", "steps", "model"):
            if getattr(args, name) is not None:
                shape_args[name] = getattr(args, name)
        try:
            result = shapes_bench.run(say=say, **shape_args)
        except ValueError as exc:
            raise ConfigError(f"bench shapes: {exc}") from None
        write_json(args.json, result)
        return 0
    if args.what == "explore":
        from elasticps.bench import explore_bench

        result = explore_bench.run(args.grid, probes=_int_list(args.probes))
        if args.heatmap is not None:
            if not args.heatmap:
                raise ConfigError("--heatmap: the PNG file to draw into")
            from elasticps.bench.grid_plot import heatmap

            runs, _, _ = explore_bench.load_grid(args.grid)
            print(f"heatmap: {heatmap(result, runs, Path(args.heatmap))}", file=sys.stderr)
        write_json(args.json, result)
        return 0
    if args.what == "batches":
        from elasticps.bench import batches_bench

        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        try:
            result = batches_bench.run(
                _int_list(args.batches), seeds=args.seeds, target=args.target, lr=args.lr, say=say
            )
        except ValueError as exc:
            raise ConfigError(f"bench batches: {exc}") from None
        write_json(args.json, result)
        return 0
    if args.what == "peers":
        return _bench_peers(args)
    raise SystemExit(f"unknown benchmark {args.what!r}")


def _bench_peers(args: argparse.Namespace) -> int:
    import dataclasses

    from elasticps.bench.peers import report
    from elasticps.bench.peers import run as peers

    config = peers.QUICK if args.quick else peers.PeersConfig()
    changes: dict[str, Any] = {}
    # given is given, empty or not: '--workloads ""' runs no throughput, '--steps 0' is refused
    if args.workloads is not None:
        changes["workloads"] = _names(args.workloads)
    if args.workers is not None:
        changes["workers"] = tuple(_int_list(args.workers))
    if args.repeats is not None:
        changes["repeats"] = changes["resize_repeats"] = args.repeats
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.resize_systems is not None:
        changes["resize_systems"] = _names(args.resize_systems)
    if args.systems is not None:
        changes["systems"] = _names(args.systems)
    if args.embedding_rows:
        changes["embedding_rows"] = args.embedding_rows
    try:
        config = dataclasses.replace(config, **changes)
    except ValueError as exc:
        raise ConfigError(f"bench peers: {exc}") from None
    result = peers.run(config, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(report.table(result), file=sys.stderr)
    print(f"plot: {report.plot(result, Path(args.plot))}", file=sys.stderr)
    write_json(args.json, result)
    return 0 if result["trained"] else 1


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list's items, stripped, empty ones dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"expected comma-separated integers, got {text!r}") from None


def add_parsers(sub: Any) -> None:
    """demo, bench"""
    demo = sub.add_parser(
        "demo", help="the published experiment: three jobs, another tenant leaves; static vs elastic (~6 min)"
    )
    demo.add_argument("--policies", default="static,elastic", help="comma-separated policies to compare")
    demo.add_argument(
        "--objectives",
        help="instead: run the elastic policy under each of these objectives (goodput,speed,efficiency), "
        "the jobs' batch adaptive up to --max-batch",
    )
    demo.add_argument("--max-batch", type=int, default=512, help="with --objectives: the jobs' largest global batch")
    demo.add_argument(
        "--target", type=float, help="with --objectives: the test accuracy time to target is measured to (default 0.98)"
    )
    demo.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the list this many times, each time starting one further along it; the table adds medians",
    )
    demo.add_argument(
        "--epochs", type=positive_int, help="epochs of the shortest job (others 4/3 and 5/3 of it; default 30)"
    )
    demo.add_argument(
        "--lr", type=float, help="the jobs' SGD learning rate at batch 128 (default 0.05; lower: longer to the target)"
    )
    demo.add_argument(
        "--tenant-s", type=float, help="the other tenant leaves this long after every job ran (default 15)"
    )
    demo.add_argument(
        "--cores-per-cpu",
        type=float,
        help="the real cores each modelled CPU is held to (default 0.0625: the 12-CPU cluster in 0.75 cores)",
    )
    demo.add_argument("--html", default="out/demo/report.html", help="where to write the HTML report")
    demo.add_argument("--json", help="write the figures (and timelines) here")
    demo.add_argument("--plots", help="also write the report's plots as PNG files into this directory")
    demo.add_argument(
        "--from-json",
        help="instead of running: the table, report and --plots from what an earlier run saved with --json",
    )
    demo.add_argument(
        "--single-job", action="store_true", help="instead: one digits job rescaled by hand, 1x1 -> 2x3 -> 1x2"
    )
    demo.set_defaults(func=cmd_demo)
    bench = sub.add_parser("bench", help="run a benchmark and print JSON")
    bench.add_argument(
        "what",
        choices=["runtime", "scheduler", "manager", "placement", "chaos", "shapes", "explore", "batches", "peers"],
        help="runtime: throughput and rescale pauses; scheduler: decision time; manager: a live round's time "
        "with many ended jobs stored; placement: cross-node bytes; "
        "chaos: faults vs invariants; shapes: a real job's speed grid; explore: the probe walk on that grid; "
        "batches: epochs to a target accuracy at each fixed global batch (what a bigger batch costs); "
        "peers: the runtime beside DDP-gloo, a plain Ray PS, Ray Train and torchrun (throughput, resize cost)",
    )
    bench.add_argument(
        "--steps",
        type=positive_int,
        default=None,
        help="placement: steps per job (20); shapes: steps timed per shape (8); peers: steps timed per run (20)",
    )
    bench.add_argument("--quick", action="store_true", help="runtime, peers: a short run (fewer repetitions)")
    bench.add_argument("--workloads", help="peers: comma-separated (dense_mlp_10m,transformer,embedding; '' for none)")
    bench.add_argument("--workers", help="peers: comma-separated worker counts (1,2,4)")
    bench.add_argument("--repeats", type=positive_int, default=None, help="peers: repeats of every measurement (3)")
    bench.add_argument(
        "--resize-systems",
        help="peers: comma-separated (elasticps,elasticps_standby,ray_train,torchrun; also elasticps_import_now, "
        "elasticps with import_at_idle off; '' for none)",
    )
    bench.add_argument(
        "--systems", help="peers: comma-separated throughput systems (elasticps,elasticps_dense,ddp_gloo,plain_ps)"
    )
    bench.add_argument(
        "--embedding-rows", type=positive_int, help="peers: the embedding table's rows (1000000; 16 floats each)"
    )
    bench.add_argument("--plot", default="out/bench-peers.png", help="peers: where to write the plot")
    bench.add_argument("--jobs", type=positive_int, default=1000, help="scheduler: number of jobs (1000)")
    bench.add_argument("--nodes", type=positive_int, default=256, help="scheduler: number of nodes (256)")
    bench.add_argument(
        "--rounds", type=positive_int, default=21, help="scheduler: decisions timed; manager: rounds timed (21)"
    )
    bench.add_argument("--ended", type=nonnegative_int, default=2000, help="manager: ended jobs in the store (2000)")
    bench.add_argument("--active", type=positive_int, default=20, help="manager: active jobs (20)")
    bench.add_argument("--policy", default="elastic", help="scheduler: policy to time (elastic)")
    bench.add_argument(
        "--joint-trades", type=nonnegative_int, metavar="N",
        help="scheduler: the elastic policy's joint search, at most N trades a round (default: the policy's, none)",
    )  # fmt: skip
    bench.add_argument("--scaling", action="store_true", help="scheduler: also time a grid of sizes")
    bench.add_argument("--faults", type=positive_int, default=50, help="chaos: faults to inject (50)")
    bench.add_argument("--seed", type=int, default=0, help="chaos: seed of the fault sequence")
    bench.add_argument("--nodes-ray", type=positive_int, default=3, help="chaos: Ray nodes (raylets) to start here (3)")
    bench.add_argument("--kinds", help="chaos: comma-separated fault kinds (default: all)")
    bench.add_argument(
        "--grid",
        default=str(GRID_PATH),
        help="explore: a measured grid from 'bench shapes' (the one docs/results/bench-shapes.json holds)",
    )
    bench.add_argument(
        "--model", choices=["mlp10m", "transformer2m", "embedding16m"],
        help="shapes: the model whose speed grid to measure (mlp10m)",
    )  # fmt: skip
    bench.add_argument("--batch", type=positive_int, help="shapes: the global batch (256)")
    bench.add_argument(
        "--cores-per-task", type=positive_float, help="shapes: the real cores every task is held to (0.15)"
    )
    bench.add_argument(
        "--grid-limits", metavar="MAX_PS,MAX_WORKERS,MAX_TASKS", help="shapes: the grid's limits (4,8,10)"
    )
    bench.add_argument(
        "--heatmap", metavar="PNG", help="explore: also draw the grid, its best and the walks' choices here"
    )
    bench.add_argument("--probes", default="3,5,8", help="explore: report the choice after this many probes (3,5,8)")
    bench.add_argument("--batches", default="128,256,512", help="batches: the global batches to train at")
    bench.add_argument(
        "--seeds", type=positive_int, default=3, help="batches: seeds (data order and init) per batch (3)"
    )
    bench.add_argument("--target", type=float, default=0.98, help="batches: the held-out accuracy to reach (0.98)")
    bench.add_argument(
        "--lr", type=positive_float, default=0.02, help="batches: learning rate at batch 128, sqrt-scaled (0.02)"
    )
    bench.add_argument(
        "--json", nargs="?", const="", default="", help="also write the JSON to this path (it is always printed)"
    )
    bench.set_defaults(func=cmd_bench)
