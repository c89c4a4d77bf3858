"""``elasticps``: demo, bench, train."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from elasticps.manager.workdir import DEFAULT_WORKDIR
from elasticps.tables import format_table

POLICIES = ("static", "greedy", "optimus", "elastic")


def _write_json(path: str | None, data: Any) -> None:
    text = json.dumps(data, indent=2, default=str)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.single_job:
        from elasticps.demo import single_job

        report = single_job.run(epochs=args.epochs or 30)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        return 0

    from dataclasses import asdict, replace

    from elasticps.demo import experiment

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
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        choices = ", ".join(POLICIES)
        print(f"error: --policies: unknown {unknown or 'none given'}; choose from {choices}", file=sys.stderr)
        return 2
    objectives = tuple(o.strip() for o in (args.objectives or "").split(",") if o.strip())
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
            "summary": experiment.target_summary(results) if objectives else None,
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
    from elasticps.demo import experiment, report

    text = experiment.table(results, target)
    print(text)
    plots = Path(args.plots) if args.plots else None
    print(f"report: {report.write_html(results, Path(args.html), text, setup, plots=plots)}")
    if plots is not None:
        print(f"plots: {plots}/")


def cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "runtime":
        from elasticps.bench import runtime_bench

        _write_json(args.json, runtime_bench.run(quick=args.quick))
        return 0
    if args.what == "placement":
        from elasticps.bench import placement_bench

        _write_json(args.json, placement_bench.run(steps=args.steps or 20))
        return 0
    if args.what == "scheduler":
        from elasticps.bench import scheduler_bench

        result = scheduler_bench.run(args.jobs, args.nodes, rounds=args.rounds, policy=args.policy)
        if args.scaling:
            result["scaling"] = scheduler_bench.scaling(args.policy)
        _write_json(args.json, result)
        return 0
    if args.what == "manager":
        from elasticps.bench import manager_bench

        _write_json(args.json, manager_bench.run(ended=args.ended, active=args.active, rounds=args.rounds))
        return 0
    if args.what == "chaos":
        from elasticps.bench import chaos_bench

        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip()) if args.kinds else chaos_bench.FAULTS
        config = chaos_bench.ChaosConfig(faults=args.faults, seed=args.seed, nodes=args.nodes_ray, kinds=kinds)
        result = chaos_bench.run(config, say=lambda line: print(line, file=sys.stderr, flush=True))
        _write_json(args.json, result)
        return 0 if result["invariants_violated"] == 0 else 1
    if args.what == "shapes":
        from elasticps.bench import shapes_bench

        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        _write_json(args.json, shapes_bench.run(steps=args.steps or 8, say=say))
        return 0
    if args.what == "explore":
        from elasticps.bench import explore_bench

        _write_json(args.json, explore_bench.run(args.grid, probes=_int_list(args.probes)))
        return 0
    if args.what == "batches":
        from elasticps.bench import batches_bench

        say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        try:
            result = batches_bench.run(
                _int_list(args.batches), seeds=args.seeds, target=args.target, lr=args.lr, say=say
            )
        except ValueError as exc:
            raise SystemExit(f"error: bench batches: {exc}") from None
        _write_json(args.json, result)
        return 0
    raise SystemExit(f"unknown benchmark {args.what!r}")


def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated integers, got {text!r}") from None


def cmd_export(args: argparse.Namespace) -> int:
    from elasticps.cli.export import export_job

    code_paths: list[str] = []
    if args.program:  # a job trained with `elasticps train`
        if not args.checkpoint_dir or args.name:
            raise SystemExit("error: export --program needs --checkpoint-dir and no job name")
        program, program_args, directory = args.program, {}, Path(args.checkpoint_dir)
    else:  # a job of the manager whose workdir this is
        from elasticps.manager.store import Store

        if not args.name:
            raise SystemExit("error: export: give a job name (or --program and --checkpoint-dir)")
        workdir = Path(args.workdir)
        if not (workdir / "manager.db").exists():
            raise SystemExit(f"error: no manager database in {workdir} (--workdir)")
        store = Store(workdir / "manager.db")
        try:
            spec = store.get_job(args.name).spec
        except KeyError:
            raise SystemExit(f"error: no job {args.name!r} in {workdir}") from None
        finally:
            store.close()
        if spec.runtime_env and spec.runtime_env.working_dir and Path(spec.runtime_env.working_dir).is_dir():
            code_paths.append(spec.runtime_env.working_dir)  # shipped code: imported from where it was shipped
        from elasticps.manager.workdir import job_dir

        program, program_args = spec.program, dict(spec.args)
        directory = job_dir(workdir, args.name) / "checkpoints"
    # the job's code runs in a child process; only tensors come back (elasticps.cli.export)
    info = export_job(program, program_args, directory, Path(args.out), code_paths)
    print(
        f"wrote {args.out}: {info['name']}, step {info['step']}, epoch {info['epoch']}, {info['parameters']} parameters"
    )
    return 0


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


def _ship_roots(text: str | None) -> tuple[str, ...] | None:
    """``--ship-roots``: absolute directories (None: the default, the user's home)."""
    if text is None:
        return None
    roots = tuple(r.strip() for r in text.split(",") if r.strip())
    bad = [r for r in roots if not Path(r).is_absolute() or not Path(r).is_dir()]
    if bad or not roots:
        raise SystemExit(f"error: --ship-roots takes existing absolute directories, got {text!r}")
    return roots


def cmd_server(args: argparse.Namespace) -> int:
    import threading

    from elasticps.manager.workdir import (
        WorkdirLock,
        api_token,
        check_token,
        ray_token_auth,
        secure_workdir,
        without_token,
    )
    from elasticps.raycluster import LOOPBACK_ENV

    workdir = Path(args.workdir)
    secure_workdir(workdir)  # 0700, files 0600, umask 077 here and in the Ray processes we start
    if args.ray_address in (None, "", "local"):
        os.environ[LOOPBACK_ENV] = "0"  # the embedded cluster's ports on loopback (read when Ray is imported)
    if args.token is not None:
        check_token(args.token)
        print(
            "warning: --token can be read by every local user (ps, /proc/PID/cmdline) while it is on a command "
            "line; the server takes it off its own now. Give it in $ELASTICPS_TOKEN or WORKDIR/token instead.",
            file=sys.stderr,
            flush=True,
        )
        os.environ["ELASTICPS_TOKEN"] = args.token
    elif os.environ.get("ELASTICPS_TOKEN"):
        check_token(os.environ["ELASTICPS_TOKEN"])
    # Ray's own token authentication for the cluster we start (docs/security.md). Ray reads
    # the variables once, when it is imported, so the process starts again with them set:
    # the same PID, the same arguments but --token (passed on in the environment instead).
    if (args.ray_address in (None, "", "local") and ray_token_auth(workdir)) or args.token is not None:
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-m", "elasticps", *without_token(args.argv)])
    lock = WorkdirLock(workdir)  # one manager per workdir: a second one stops here
    # the token stays in this process's memory: not in the environment the Ray processes and jobs inherit
    token = os.environ.pop("ELASTICPS_TOKEN", None) or api_token(workdir)

    import uvicorn

    from elasticps.manager import Store
    from elasticps.manager.api import LOOPBACK_HOSTS, create_app
    from elasticps.manager.service import Manager
    from elasticps.raycluster import ensure_ray

    ensure_ray(args.ray_address, num_cpus=args.num_cpus)
    options: dict[str, float] = {"rescale_cost_s": args.rescale_cost_s} if args.rescale_cost_s is not None else {}
    if args.efficiency_threshold is not None:
        options["efficiency_threshold"] = args.efficiency_threshold
    allow = tuple(m.strip() for m in args.allow_programs.split(",") if m.strip()) if args.allow_programs else None
    manager = Manager(
        Store(workdir / "manager.db"), workdir, args.policy, args.objective, args.placement, policy_options=options,
        allow_programs=allow, ship_roots=_ship_roots(args.ship_roots),
    )  # fmt: skip
    if args.kuberay:
        from elasticps.k8s.deploy import kuberay_growth

        # the capacity object watches Nodes and Pods; it lives as long as this call
        manager.growth, _kube_capacity = kuberay_growth(
            args.kuberay, args.kuberay_namespace, args.kuberay_group, args.kubeconfig, on_change=manager.wake.set
        )
    hosts = set(LOOPBACK_HOSTS) | set(args.allow_host or [])
    if args.host not in ("0.0.0.0", "::"):
        hosts.add(args.host)
    stop = threading.Event()
    loop = threading.Thread(target=manager.run, args=(args.interval_s, stop), name="elasticps-loop", daemon=True)
    loop.start()
    print(f"elasticps manager on http://{args.host}:{args.port} (state in {workdir})", flush=True)
    print(f"dashboard: http://{args.host}:{args.port}/#token={token}", flush=True)
    try:
        uvicorn.run(create_app(manager, token, frozenset(hosts)), host=args.host, port=args.port, log_level="warning")
    finally:
        # Everything a restart needs is in the store; if Ray went down with us (a signal to the
        # whole process group), calls into it would wait out Ray's own 60 s timeout, so give up sooner.
        stop.set()
        closer = threading.Thread(target=lambda: (loop.join(timeout=30), manager.shutdown()), daemon=True)
        closer.start()
        closer.join(timeout=args.shutdown_timeout_s)
        lock.release()
        if closer.is_alive():
            print(f"stopped without releasing every job (over {args.shutdown_timeout_s:g} s)", file=sys.stderr)
            os._exit(0)
    return 0


def _bar(done: float, total: float, width: int = 20) -> str:
    frac = min(1.0, done / total) if total else 0.0
    return "[" + "#" * round(frac * width) + "." * (width - round(frac * width)) + "]"


def _status_table(jobs: list[Any]) -> str:
    rows = []
    for j in jobs:
        alloc, prog = j.allocation, j.progress
        rate, metric = (prog.samples_per_s, prog.metric) if prog else (None, None)
        epochs = prog.epochs if prog else None
        rows.append(
            [
                j.name,
                j.state,
                f"{alloc.num_ps}x{alloc.num_workers}" if alloc else "-x-",
                f"{_bar(prog.epoch, epochs)} {prog.epoch}/{epochs}" if prog and epochs else "-",
                f"{rate:.0f}" if rate else "-",
                f"{metric:.4f}" if metric is not None else "-",
            ]
        )
    return format_table(rows, ["JOB", "STATE", "PSxW", "PROGRESS (EPOCHS)", "SAMPLES/S", "METRIC"])


def _watch_status(client: Any, every_s: float) -> int:
    """Redraw the status table every ``every_s`` until every job has ended (or Ctrl-C)."""
    import time

    try:
        while True:
            jobs = client.jobs()
            stamp = time.strftime("%H:%M:%S")
            print("\033[H\033[J" + f"elasticps status  {stamp}  (Ctrl-C to stop)\n\n" + _status_table(jobs), flush=True)
            if jobs and all(j.state in ("finished", "failed", "cancelled") for j in jobs):
                return 0
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def _wait(client: Any, name: str) -> int:
    """Stream the job's log until it ends; 0 if it finished, 1 if it failed or was cancelled."""
    _print_logs(client, name, follow=True)
    state = client.job(name).state
    print(f"{name}: {state}", flush=True)
    return 0 if state == "finished" else 1


def _print_logs(client: Any, name: str, follow: bool) -> None:
    for line in client.logs(name, follow=follow):
        step = f"step {line.step:6d}" if line.step is not None else "event      "
        print(f"{step}  {line.text}", flush=True)


def cmd_client(args: argparse.Namespace) -> int:
    from elasticps.manager.client import Client, ManagerError
    from elasticps.manager.workdir import client_token

    client = Client(args.url, token=client_token(args.token, args.workdir))
    try:
        if args.command == "submit":
            try:
                text = Path(args.spec).read_text()
            except OSError as exc:
                raise SystemExit(f"error: cannot read the job spec {args.spec}: {exc.strerror}") from None
            json_body = args.spec.endswith(".json")
            if args.working_dir:
                text, json_body = _with_working_dir(text, args.working_dir), True
            job = client.submit(text, json_body=json_body)
            print(f"submitted {job.name} ({job.state})", flush=True)
            if args.wait:
                return _wait(client, job.name)
        elif args.command == "status":
            if args.watch:
                return _watch_status(client, args.watch)
            jobs = client.jobs()
            print(_status_table(jobs) if args.output == "table" else _dump(_plain(jobs), args.output))
        elif args.command == "describe":
            print(_dump(_plain(client.job(args.name)), "json" if args.output == "table" else args.output))
        elif args.command == "cancel":
            print(f"{args.name}: {client.cancel(args.name).state}")
        elif args.command == "scale":
            if args.ps is None and args.workers is None:
                raise SystemExit("error: scale: give --ps and/or --workers")
            spec = client.scale(args.name, ps=args.ps, workers=args.workers).spec
            print(f"{args.name}: ps {spec.ps.min}..{spec.ps.max}, workers {spec.workers.min}..{spec.workers.max}")
        elif args.command == "retry":
            print(f"{args.name}: {client.retry(args.name).state}")
        elif args.command == "delete":
            client.delete(args.name)
            print(f"{args.name}: deleted")
        elif args.command == "logs":
            if args.output != "table":
                print(_dump(_plain(list(client.logs(args.name))), args.output))
            else:
                _print_logs(client, args.name, args.follow)
        elif args.command == "events":
            events = client.events(args.name)
            if args.output != "table":
                print(_dump(_plain(events), args.output))
            for e in events if args.output == "table" else []:
                print(f"{e.id:5d} {e.job or '-':12s} {e.kind:10s} {e.message}")
    except ManagerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _with_working_dir(text: str, directory: str) -> str:
    """The spec (YAML or JSON) with ``runtime_env.working_dir`` set to ``directory``
    (made absolute: the manager, on this machine, uploads it to the Ray cluster)."""
    from elasticps.errors import ConfigError
    from elasticps.manager.spec import load_document

    path = Path(directory).resolve()
    if not path.is_dir():
        raise SystemExit(f"error: --working-dir {directory}: not a directory")
    try:
        data = load_document(text, "yaml")  # YAML reads JSON too
    except ConfigError as exc:
        raise SystemExit(f"error: the job spec: {exc}") from None
    if not isinstance(data, dict):
        raise SystemExit("error: the job spec must be a mapping")
    env = data.get("runtime_env") or {}
    if not isinstance(env, dict):
        raise SystemExit("error: the job spec's runtime_env must be a mapping")
    data["runtime_env"] = {**env, "working_dir": str(path)}
    return json.dumps(data)


def _plain(data: Any) -> Any:
    """API models as the JSON the API sent (for -o json|yaml)."""
    if isinstance(data, list):
        return [_plain(x) for x in data]
    return data.model_dump(mode="json")


def _dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(data, sort_keys=False).rstrip("\n")
    return json.dumps(data, indent=2)


def task_range(text: str) -> tuple[int, int]:
    """``"4"`` -> (4, 4); ``"2..8"`` -> (2, 8)."""
    lo, sep, hi = text.partition("..")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN..MAX, got {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text!r}")
    return low, high


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("elasticps")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


POLICY_HELP = "static: the spec's counts; greedy, optimus: classic managers; elastic (default): see docs/scheduler.md"
OBJECTIVE_HELP = (
    "goodput (default): progress per second (samples/s x statistical efficiency); speed: samples/s; "
    "efficiency: goodput, growing a job only while it scales well"
)
THRESHOLD_HELP = (
    "efficiency objective: a job grows only while its relative gain per relative growth in its dominant share "
    "of the cluster stays at or above this (default 0.75; 1.0 is linear scaling)"
)
PLACEMENT_HELP = "locality (default): fewest PS bytes across nodes; spread, pack, optimus: the classic rules"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticps", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"elasticps {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

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
    demo.add_argument("--epochs", type=int, help="epochs of the shortest job (others 4/3 and 5/3 of it; default 30)")
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
        choices=["runtime", "scheduler", "manager", "placement", "chaos", "shapes", "explore", "batches"],
        help="runtime: throughput and rescale pauses; scheduler: decision time; manager: a live round's time "
        "with many ended jobs stored; placement: cross-node bytes; "
        "chaos: faults vs invariants; shapes: a real job's speed grid; explore: the probe walk on that grid; "
        "batches: epochs to a target accuracy at each fixed global batch (what a bigger batch costs)",
    )
    bench.add_argument(
        "--steps", type=int, default=None, help="placement: steps per job (20); shapes: steps timed per shape (8)"
    )
    bench.add_argument("--quick", action="store_true", help="runtime: fewer repetitions")
    bench.add_argument("--jobs", type=int, default=1000, help="scheduler: number of jobs")
    bench.add_argument("--nodes", type=int, default=256, help="scheduler: number of nodes")
    bench.add_argument("--rounds", type=int, default=21, help="scheduler: decisions timed; manager: rounds timed")
    bench.add_argument("--ended", type=int, default=2000, help="manager: ended jobs in the store")
    bench.add_argument("--active", type=int, default=20, help="manager: active jobs")
    bench.add_argument("--policy", default="elastic", help="scheduler: policy to time")
    bench.add_argument("--scaling", action="store_true", help="scheduler: also time a grid of sizes")
    bench.add_argument("--faults", type=int, default=50, help="chaos: faults to inject")
    bench.add_argument("--seed", type=int, default=0, help="chaos: seed of the fault sequence")
    bench.add_argument("--nodes-ray", type=int, default=3, help="chaos: Ray nodes (raylets) to start here")
    bench.add_argument("--kinds", help="chaos: comma-separated fault kinds (default: all)")
    bench.add_argument(
        "--grid", default="docs/results/bench-shapes.json", help="explore: a measured grid from 'bench shapes'"
    )
    bench.add_argument("--probes", default="3,5,8", help="explore: report the choice after this many probes")
    bench.add_argument("--batches", default="128,256,512", help="batches: the global batches to train at")
    bench.add_argument("--seeds", type=int, default=3, help="batches: seeds (data order and init) per batch")
    bench.add_argument("--target", type=float, default=0.98, help="batches: the held-out accuracy to reach")
    bench.add_argument("--lr", type=float, default=0.02, help="batches: learning rate at batch 128 (sqrt-scaled)")
    bench.add_argument(
        "--json", nargs="?", const="", default="", help="also write the JSON to this path (it is always printed)"
    )
    bench.set_defaults(func=cmd_bench)

    export = sub.add_parser("export", help="write a job's trained model (state_dict) from its latest checkpoint")
    export.add_argument("name", nargs="?", help="a job of the manager in --workdir")
    export.add_argument("--out", required=True, help="where to torch.save the state_dict (e.g. model.pt)")
    export.add_argument(
        "--workdir",
        default=os.environ.get("ELASTICPS_WORKDIR", DEFAULT_WORKDIR),
        help="the manager's workdir (default $ELASTICPS_WORKDIR or elasticps-state)",
    )
    export.add_argument("--program", help="instead of a job name: the program of an `elasticps train` run ...")
    export.add_argument("--checkpoint-dir", help="... and its --checkpoint-dir")
    export.set_defaults(func=cmd_export)

    train = sub.add_parser("train", help="train one program at a fixed shape (resumes from --checkpoint-dir)")
    train.add_argument(
        "program",
        help="package.module:attr naming a TrainingProgram, a factory of one, or a training function "
        "that uses elasticps.torch (your own loop; told apart by what calling it does, docs/user-loop.md)",
    )
    train.add_argument("--ps", type=int, default=1, help="parameter-server shards (default 1)")
    train.add_argument("--workers", type=int, default=1, help="workers (default 1)")
    train.add_argument(
        "--mode", choices=["sync", "async"], default="sync", help="sync: exact at any shape; async: no barrier"
    )
    train.add_argument("--checkpoint-dir", help="write checkpoints here, and resume from the newest one there")
    train.add_argument("--max-steps", type=int, help="stop after this many steps (default: train to the end)")
    train.add_argument("--report-interval-s", type=float, default=5.0, help="seconds per progress line (default 5)")
    train.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    train.add_argument("--num-cpus", type=int, help="logical CPUs of the embedded local Ray cluster")
    train.set_defaults(func=cmd_train)
    server = sub.add_parser("server", help="run the configuration manager (REST API + control loop)")
    server.add_argument(
        "--workdir",
        default=os.environ.get("ELASTICPS_WORKDIR", DEFAULT_WORKDIR),
        help="database, checkpoints, API token and Ray token go here; one manager per workdir "
        "(default $ELASTICPS_WORKDIR or elasticps-state)",
    )
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)")
    server.add_argument("--port", type=int, default=8470, help="port to listen on (default 8470)")
    server.add_argument(
        "--token", help="the API's bearer token (default $ELASTICPS_TOKEN, else WORKDIR/token, made at first start)"
    )
    server.add_argument(
        "--allow-programs",
        metavar="MODULES",
        help="comma-separated modules whose programs may run (and their submodules); default: any importable one",
    )
    server.add_argument(
        "--ship-roots",
        metavar="DIRS",
        help="comma-separated directories a job's runtime_env may ship code from (never the workdir); "
        "default: your home directory",
    )
    server.add_argument(
        "--allow-host",
        action="append",
        metavar="NAME",
        help="a Host name clients may use besides loopback and --host (repeatable; '*' for any)",
    )
    server.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    server.add_argument("--num-cpus", type=int, help="logical CPUs of the embedded local Ray cluster")
    server.add_argument("--interval-s", type=float, default=10.0, help="scheduling interval")
    server.add_argument(
        "--shutdown-timeout-s", type=float, default=20.0, help="on exit, give up stopping jobs after this long"
    )
    server.add_argument(
        "--rescale-cost-s",
        type=float,
        help="elastic: seconds a rescale is taken to cost (default 10; measured pauses here are < 1 s)",
    )
    server.add_argument(
        "--policy", default="elastic", choices=["static", "greedy", "optimus", "elastic"], help=POLICY_HELP
    )
    server.add_argument(
        "--objective", default="goodput", choices=["goodput", "speed", "efficiency"], help=OBJECTIVE_HELP
    )
    server.add_argument("--efficiency-threshold", type=float, help=THRESHOLD_HELP)
    server.add_argument(
        "--placement", default="locality", choices=["locality", "spread", "pack", "optimus"], help=PLACEMENT_HELP
    )
    server.add_argument("--kuberay", metavar="NAME", help="grow and shrink this KubeRay RayCluster's worker group")
    server.add_argument("--kuberay-namespace", help="its namespace (default: the pod's own, else 'default')")
    server.add_argument("--kuberay-group", help="its worker group (default: the first)")
    server.add_argument("--kubeconfig", help="Kubernetes credentials (default: in-cluster, else $KUBECONFIG)")
    server.set_defaults(func=cmd_server)

    for name, helptext in [
        ("submit", "submit a job spec (YAML or JSON)"),
        ("status", "list jobs"),
        ("describe", "one job in full"),
        ("cancel", "cancel a job (final)"),
        ("scale", "change a job's PS and worker limits; the scheduler picks the shape within them"),
        ("retry", "queue a failed job again (it resumes from its latest checkpoint)"),
        ("delete", "forget an ended job (record, history, checkpoints); its name can be used again"),
        ("logs", "a job's progress log (windows, epochs, events)"),
        ("events", "events"),
    ]:
        c = sub.add_parser(name, help=helptext)
        c.add_argument("--url", help="manager URL (default $ELASTICPS_URL or http://127.0.0.1:8470)")
        c.add_argument("--token", help="bearer token (default $ELASTICPS_TOKEN, else the workdir's token file)")
        c.add_argument(
            "--workdir",
            help="the manager's workdir, to read its token file (default $ELASTICPS_WORKDIR or elasticps-state)",
        )
        if name == "submit":
            c.add_argument("spec", help="a job spec file (.yaml, .yml or .json)")
            c.add_argument(
                "--wait", action="store_true", help="stream the job's log until it ends; exit 0 if it finished, else 1"
            )
            c.add_argument(
                "--working-dir",
                help="ship this directory's code with the job (sets runtime_env.working_dir; read by the manager, "
                "so a path on the manager's machine)",
            )
        elif name in ("describe", "cancel", "retry", "logs", "scale", "delete"):
            c.add_argument("name", help="the job's name")
        if name in ("status", "describe", "logs", "events"):
            c.add_argument(
                "-o",
                "--output",
                choices=["table", "json", "yaml"],
                default="table",
                help="output format (default table)",
            )
        if name == "scale":
            c.add_argument("--ps", type=task_range, help="PS limits: N (exactly N) or MIN..MAX")
            c.add_argument("--workers", type=task_range, help="worker limits: N (exactly N) or MIN..MAX")
        if name == "logs":
            c.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
        if name == "status":
            c.add_argument("--watch", type=float, nargs="?", const=2.0, help="redraw every N seconds (default 2)")
        elif name == "events":
            c.add_argument("name", nargs="?", help="only this job's events (default: all)")
        c.set_defaults(func=cmd_client)

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
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(message)s")
    from elasticps.errors import ElasticPSError

    try:
        return int(args.func(args) or 0)
    except ElasticPSError as exc:  # bad input or a failed job: a message, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
