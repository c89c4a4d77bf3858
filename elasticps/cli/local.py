"""``elasticps train`` (one program at a fixed shape, here) and ``elasticps export`` (a trained model)."""

from __future__ import annotations

import argparse
import contextlib
import math
import re
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from elasticps.cli.common import default_workdir, nonnegative_int, output_dir, output_file, positive_int
from elasticps.errors import ConfigError
from elasticps.raycluster import check_address
from elasticps.tables import shape_text


def cmd_export(args: argparse.Namespace) -> int:
    from elasticps.cli.export import export_job

    output_file(args.out, "--out")  # a folder, or nowhere to write: before any work
    if args.args and not args.program:
        raise ConfigError("export --args is for --program (a manager's job has its arguments)")
    code_paths: list[str] = []
    reached = None  # the step a manager's job reached (its kept progress)
    unpacked_dir = tempfile.TemporaryDirectory(prefix="elasticps-code-")  # mode 0700: the operator's alone
    if args.program:  # a job trained with `elasticps train`
        if not args.checkpoint_dir or args.name:
            raise ConfigError("export --program needs --checkpoint-dir and no job name")
        program, program_args, directory = args.program, factory_args(args.args or []), Path(args.checkpoint_dir)
    else:  # a job of the manager whose workdir this is
        from elasticps.manager.store import Store

        if not args.name:
            raise ConfigError("export: give a job name (or --program and --checkpoint-dir)")
        workdir = Path(args.workdir)
        if not (workdir / "manager.db").exists():
            raise ConfigError(f"no manager database in {workdir} (--workdir)")
        store = Store(workdir / "manager.db")
        try:
            record = store.get_job(args.name)
            reached = (store.progress(args.name) or {}).get("step")
        except KeyError:
            raise ConfigError(f"no job {args.name!r} in {workdir}") from None
        finally:
            store.close()
        spec = record.spec
        from elasticps.manager.pinning import CODE_DIR, unpacked
        from elasticps.manager.workdir import job_dir
        from elasticps.runtime.checkpoint import checkpoint_files

        if spec.runtime_env:  # shipped code: the job's as pinned at submit
            code_paths = unpacked(spec.runtime_env, job_dir(workdir, args.name) / CODE_DIR, unpacked_dir.name)
        program, program_args = spec.program, dict(spec.args)
        directory = job_dir(workdir, args.name) / "checkpoints"
        if not checkpoint_files(directory):  # said of the job, not of a folder the user never named
            from elasticps.manager.states import JobState

            when = "before it ended" if JobState(record.state).ended else "yet"
            raise ConfigError(f"job {args.name!r} ({record.state}) has no checkpoint: it saved none {when}")
    # the job's code runs in a child process; only tensors come back (elasticps.cli.export)
    with unpacked_dir:
        info = export_job(program, program_args, directory, Path(args.out), code_paths)
    print(
        f"wrote {args.out}: {info['name']}, step {info['step']}, epoch {info['epoch']}, {info['parameters']} parameters"
    )
    if not args.program and isinstance(reached, int) and reached > info["step"]:
        print(
            f"warning: {args.name} {record.state} at step {reached}; its newest checkpoint is at step {info['step']}, "
            f"so the {reached - info['step']} steps after it are not in this model",
            file=sys.stderr,
        )
    if info["step"] == 0:
        print("warning: step 0 is the model as it was built, before any training", file=sys.stderr)
    return 0


#: A number YAML 1.1 reads as a string: an exponent without a dot (1e-3, 5E+2).
_FLOAT = re.compile(r"[-+]?\d+[eE][-+]?\d+")


def factory_args(given: list[str]) -> dict[str, Any]:
    """``--args epochs=40 --args lr=0.1,seed=3``: the factory's keyword arguments, each
    value read as a YAML scalar (40 an int, 0.1 a float, true a bool, text a string)."""
    import yaml

    out: dict[str, Any] = {}
    for item in (part for text in given for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ConfigError(f"--args {item!r}: expected NAME=VALUE")
        try:
            parsed = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            parsed = None
        if isinstance(parsed, str) and _FLOAT.fullmatch(parsed.strip()):  # 1e-3: a string to YAML 1.1
            parsed = float(parsed)
        if not isinstance(parsed, (str, int, float, bool)):
            raise ConfigError(f"--args {item!r}: the value must be a number, a boolean or a string")
        if key in out:
            raise ConfigError(f"--args {key} is given twice ({key}={out[key]!r} and {item!r})")
        out[key] = parsed
    return out


def seconds(text: str) -> float:
    """A positive, finite number of seconds (an option's value)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def job_config(args: argparse.Namespace) -> Any:
    """The :class:`JobConfig` of an ``elasticps train`` run (its ``step_timeout_s``: JobConfig's unless given)."""
    from elasticps.runtime.config import JobConfig

    timeout = {} if args.step_timeout_s is None else {"step_timeout_s": args.step_timeout_s}
    return JobConfig(
        mode=args.mode,
        checkpoint_dir=args.checkpoint_dir,
        report_interval_s=args.report_interval_s,
        standby_workers=args.standby_workers,
        **timeout,
    )


def cpus_needed(num_ps: int, num_workers: int, ps_cpu: float = 1.0, worker_cpu: float = 1.0) -> float:
    return num_ps * ps_cpu + num_workers * worker_cpu


def _check_local_cpus(args: argparse.Namespace) -> None:
    """Before a local cluster starts: a ConfigError saying which --num-cpus the shape needs
    (Ray would otherwise leave the tasks pending for ever)."""
    import math
    import os

    if args.ray_address not in (None, "", "local"):
        return
    need = cpus_needed(args.ps, args.workers)
    have = args.num_cpus if args.num_cpus is not None else os.cpu_count() or 1
    if need > have:
        where = f"--num-cpus {args.num_cpus}" if args.num_cpus is not None else f"this machine's {have} CPUs"
        raise ConfigError(
            f"{shape_text(args.ps, args.workers)} need {need:g} CPUs (1 a task), more than {where}: "
            f"pass --num-cpus {math.ceil(need)} (Ray shares the cores) or ask for fewer tasks"
        )


def _user_code_from_cwd() -> None:
    """As ``python -m`` does: the current directory first on the path, for this process
    and (through PYTHONPATH, inherited by the local cluster) for the job's Ray processes."""
    import os
    import sys

    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *paths])


def cmd_train(args: argparse.Namespace) -> int:
    from elasticps.limits import MAX_TASKS

    if args.ps < 1 or args.workers < 1:
        raise ConfigError(f"a job needs at least 1 PS and 1 worker, got {args.ps}x{args.workers}")
    if args.standby_workers > MAX_TASKS:  # before a cluster starts: JobConfig would refuse it after
        raise ConfigError(f"--standby-workers {args.standby_workers}: a job keeps at most {MAX_TASKS}")
    if args.standby_workers > args.workers:
        raise ConfigError(
            f"--standby-workers {args.standby_workers}: train keeps its shape, so a standby only takes a dead "
            f"worker's place; more than --workers ({args.workers}) are never used"
        )
    program_args = factory_args(args.args or [])
    _check_local_cpus(args)
    check_address(args.ray_address)  # malformed or nothing there: said now, not after minutes of Ray's retries
    _user_code_from_cwd()
    from elasticps import JobController, load_program  # Ray and torch: after the checks
    from elasticps.raycluster import ensure_ray
    from elasticps.runtime.tasks import quiet_unread_failures

    quiet_unread_failures()  # this process drives the job: a step's failure is said once, by the job

    program = load_program(args.program, program_args)
    finished = _finished_run(args.checkpoint_dir, program.epochs, args.program, tuple(args.args or ()))
    if finished:
        print(finished, flush=True)
        return 0
    if args.checkpoint_dir is not None:  # a file, or a folder that cannot be made: before Ray starts
        output_dir(args.checkpoint_dir, "--checkpoint-dir")
    ensure_ray(args.ray_address, num_cpus=args.num_cpus)
    config = job_config(args)
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
        print(f"running {shape_text(args.ps, args.workers)}: {job.placement()}", flush=True)
        with _stop_on_interrupt(job.stop):
            report = job.run(max_steps=args.max_steps)
        if report.state == "running" and args.checkpoint_dir:  # --max-steps ran out: keep what they did
            job.checkpoint()
    finally:
        job.shutdown()
    if report.state == "running":  # --max-steps ran out
        print(_resume_line(args.checkpoint_dir, report.step), flush=True)
        return 0
    print(f"{report.state} at step {report.step}", flush=True)
    if report.state == "stopped":
        print(_resume_line(args.checkpoint_dir, report.step), flush=True)
    return 0 if report.state in ("finished", "stopped", "running") else 1


def _finished_run(
    checkpoint_dir: str | None, epochs: int, program: str = "...", given: tuple[str, ...] = ()
) -> str | None:
    """What to say instead of training when ``checkpoint_dir``'s newest intact checkpoint
    is at the program's last epoch (read only: no directory made, nothing renamed);
    ``program`` and ``given`` (its --args) go into the command that exports the model."""
    from elasticps.runtime.checkpoint import CheckpointStore

    if not checkpoint_dir or not Path(checkpoint_dir).is_dir():
        return None
    newest = next(CheckpointStore(checkpoint_dir).intact(), None)
    if newest is None or newest[1].position.epoch < epochs:
        return None
    export = shlex.join(
        ["elasticps", "export", "--program", program, "--checkpoint-dir", checkpoint_dir]
        + [part for text in given for part in ("--args", text)]
        + ["--out", "model.pt"]
    )
    return (
        f"already finished: {checkpoint_dir} holds step {newest[1].step}, epoch {newest[1].position.epoch} of "
        f"{epochs}; nothing to train (`{export}` writes the model)"
    )


@contextlib.contextmanager
def _stop_on_interrupt(stop: Callable[[], None]) -> Iterator[None]:
    """The first Ctrl-C asks the job to stop at the next step boundary (where it writes a
    checkpoint); a second one interrupts at once."""

    def first(signum: int, frame: Any) -> None:
        print("\nstopping at the next step boundary (Ctrl-C again to quit at once)", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop()

    before = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _resume_line(checkpoint_dir: str | None, step: int) -> str:
    if not checkpoint_dir:
        return f"stopped at step {step}; nothing was saved (no --checkpoint-dir)"
    again = shlex.join(["elasticps", *sys.argv[1:]])
    return f"stopped at step {step}: checkpoint in {checkpoint_dir}; resume with: {again}"


def add_parsers(sub: Any) -> None:
    """export, train"""
    export = sub.add_parser("export", help="write a job's trained model (state_dict) from its latest checkpoint")
    export.add_argument("name", nargs="?", help="a job of the manager in --workdir")
    export.add_argument("--out", required=True, help="where to torch.save the state_dict (e.g. model.pt)")
    export.add_argument(
        "--workdir",
        default=default_workdir(),
        help="the manager's workdir (default $ELASTICPS_WORKDIR or elasticps-state)",
    )
    export.add_argument("--program", help="instead of a job name: the program of an `elasticps train` run ...")
    export.add_argument("--checkpoint-dir", help="... and its --checkpoint-dir")
    export.add_argument(
        "--args",
        action="append",
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="... and the --args it trained with (the factory's keyword arguments, read as train reads them)",
    )
    export.set_defaults(func=cmd_export)
    train = sub.add_parser("train", help="train one program at a fixed shape (resumes from --checkpoint-dir)")
    train.add_argument(
        "program",
        help="package.module:attr naming a TrainingProgram, a factory of one, or a training function "
        "that uses elasticps.torch (your own loop; told apart by what calling it does, docs/user-loop.md)",
    )
    train.add_argument(
        "--args",
        action="append",
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="keyword arguments of the program's factory or loop function (repeat, or comma-separate); "
        "values read as YAML scalars: epochs=40 lr=0.1 shuffle=true",
    )
    train.add_argument("--ps", type=int, default=1, help="parameter-server shards (default 1)")
    train.add_argument("--workers", type=int, default=1, help="workers (default 1)")
    train.add_argument(
        "--mode", choices=["sync", "async"], default="sync", help="sync: exact at any shape; async: no barrier"
    )
    train.add_argument("--checkpoint-dir", help="write checkpoints here, and resume from the newest one there")
    train.add_argument("--max-steps", type=positive_int, help="stop after this many steps (default: train to the end)")
    train.add_argument("--report-interval-s", type=float, default=5.0, help="seconds per progress line (default 5)")
    train.add_argument(
        "--step-timeout-s",
        type=seconds,
        help="seconds a step may take before the tasks late in it are taken for hung, stopped and replaced "
        "(default 600); the first step counts its warm-up (a loop's code up to its first batch, compilation)",
    )
    train.add_argument(
        "--standby-workers",
        type=nonnegative_int,
        default=0,
        help="worker processes started ahead, holding no resources until one takes a dead worker's place "
        "(default 0; at most --workers); each costs its process's memory for the run and its start's CPU once",
    )
    train.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    train.add_argument(
        "--num-cpus",
        type=int,
        help="logical CPUs of the embedded local Ray cluster (default: this machine's); a task asks for 1",
    )
    train.set_defaults(func=cmd_train)
