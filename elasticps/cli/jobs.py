"""The client commands: submit, status, describe, cancel, scale, retry, delete, logs, events."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from elasticps.cli.common import dump, plain, positive_float, task_range
from elasticps.cli.follow import print_line, print_output, wait
from elasticps.cli.readable import describe_text, event_line
from elasticps.errors import ConfigError, one_line
from elasticps.tables import format_table


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count, 0 or more, got {text!r}")
    return n


def _bar(done: float, total: float, width: int = 20) -> str:
    frac = min(1.0, done / total) if total else 0.0
    return "[" + "#" * round(frac * width) + "." * (width - round(frac * width)) + "]"


#: Characters of a job's reason in the status table; a shortened one is named under it (describe shows it whole).
REASON_WIDTH = 100


def _status_table(jobs: list[Any]) -> str:
    rows, shortened = [], []
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
                one_line(j.reason or "", REASON_WIDTH),
            ]
        )
        if rows[-1][-1] != (j.reason or "").strip():  # cut at the width, or a traceback's middle left out
            shortened.append(j.name)
    headers = ["JOB", "STATE", "PSxW", "PROGRESS (EPOCHS)", "SAMPLES/S", "METRIC", "REASON"]
    if not any(j.reason for j in jobs):  # a REASON column when a job waits (or failed) for a reason
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    table = format_table(rows, headers)
    if shortened:
        table += "\nshortened here; whole: " + ", ".join(f"elasticps describe {name}" for name in shortened)
    return table


def _watch_status(client: Any, every_s: float, args: argparse.Namespace) -> int:
    """Redraw the status table every ``every_s`` until every job has ended (or Ctrl-C)."""
    import time

    try:
        while True:
            jobs = [j for j in client.jobs() if _shown(j.state, args)]
            stamp = time.strftime("%H:%M:%S")
            print("\033[H\033[J" + f"elasticps status  {stamp}  (Ctrl-C to stop)\n\n" + _status_table(jobs), flush=True)
            if jobs and all(j.state in ("finished", "failed", "cancelled") for j in jobs):
                return 0
            time.sleep(every_s)
    except KeyboardInterrupt:
        return 0


def _print_logs(client: Any, name: str, follow: bool) -> bool:
    shown = False
    for line in client.logs(name, follow=follow):
        print_line(line)
        shown = True
    return shown


def cmd_client(args: argparse.Namespace) -> int:
    from elasticps.manager.client import Client, ManagerError
    from elasticps.manager.states import JobState

    client = Client(args.url, token=args.token, workdir=args.workdir)
    try:
        if args.command == "submit":
            try:
                text = Path(args.spec).read_text()
            except OSError as exc:
                print(f"error: cannot read the job spec {args.spec}: {exc.strerror}", file=sys.stderr)
                return 2
            job = client.submit(text, json_body=args.spec.endswith(".json"), working_dir=args.working_dir)
            print(f"submitted {job.name} ({job.state})", flush=True)
            if args.wait:
                return _watching(job.name, lambda: wait(client, job.name))
        elif args.command == "status":
            if args.watch:
                return _watch_status(client, args.watch, args)
            jobs = [j for j in client.jobs() if _shown(j.state, args)]
            print(_status_table(jobs) if args.output == "table" else dump(plain(jobs), args.output))
        elif args.command == "describe":
            job = client.job(args.name)
            if args.output == "table":
                print(describe_text(client.detail(args.name), job.spec.model_dump(mode="json")))
            else:
                print(dump(plain(job), args.output))
        elif args.command == "cancel":
            print(f"{args.name}: {client.cancel(args.name).state}")
        elif args.command == "scale":
            if args.ps is None and args.workers is None:
                raise ConfigError("scale: give --ps and/or --workers")
            spec = client.scale(args.name, ps=args.ps, workers=args.workers).spec
            print(f"{args.name}: ps {spec.ps.min}..{spec.ps.max}, workers {spec.workers.min}..{spec.workers.max}")
        elif args.command == "retry":
            print(f"{args.name}: {client.retry(args.name).state}")
        elif args.command == "delete":
            if not args.yes:  # a job that cannot be deleted is refused before the question, not after it
                state = client.job(args.name).state
                if not JobState(state).ended:
                    raise ManagerError(f"job {args.name!r} is {state}; cancel it before deleting it")
            if not (args.yes or _confirmed(f"delete job {args.name}, its history and its checkpoints for good?")):
                print(f"{args.name}: not deleted", file=sys.stderr)
                return 1
            client.delete(args.name)
            print(f"{args.name}: deleted")
        elif args.command == "logs":  # what it printed; --progress: its progress log
            read, show = (client.logs, _print_logs) if args.progress else (client.output, print_output)
            if args.output != "table":
                print(dump(plain(list(read(args.name))), args.output))
            elif args.follow:  # until it has ended, then how it ended

                def follow() -> None:
                    show(client, args.name, True)
                    print(f"{args.name}: {client.job(args.name).state}", flush=True)

                return _watching(args.name, follow)
            elif not show(client, args.name, False):  # said, or an empty screen reads as a hang or a fault
                state = client.job(args.name).state
                what = "has no progress log" if args.progress else "printed nothing"
                hint = "" if args.progress else "; --progress shows its progress log"
                yet = "" if JobState(state).ended else " yet"
                print(f"{args.name}: {state}, {what}{yet}{hint}", file=sys.stderr)
        elif args.command == "events":
            events = client.events(args.name)
            if args.tail is not None:
                events = events[-args.tail :] if args.tail else []
            if args.output != "table":
                print(dump(plain(events), args.output))
            for e in events if args.output == "table" else []:
                print(event_line(e.at, e.job, e.kind, e.message))
    except ManagerError as exc:
        for line in exc.problems or [str(exc)]:  # a spec's every problem, one a line
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the client stops, and says so in a line, not a traceback
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


def _watching(name: str, watch: Any) -> int:
    """``watch()`` (following a job), where Ctrl-C stops the watching, not the job, and says so."""
    try:
        return int(watch() or 0)
    except KeyboardInterrupt:
        print(f"\nstopped watching {name}; it goes on (elasticps cancel {name} stops it)", file=sys.stderr)
        return 130


def _confirmed(question: str) -> bool:
    """The user's yes on a terminal; without one (a script, a pipe) there is no
    one to ask, and the answer is no: such callers pass --yes."""
    if not sys.stdin.isatty():
        print("error: delete asks before it wipes checkpoints: pass --yes where no one can answer", file=sys.stderr)
        return False
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False


def _shown(state: str, args: argparse.Namespace) -> bool:
    """``status --active``: pending and running jobs only; ``--state S``: jobs in S only."""
    if args.active and state not in ("pending", "running"):
        return False
    return args.state is None or state == args.state


def add_parsers(sub: Any) -> None:
    """the client commands"""
    for name, helptext in [
        ("submit", "submit a job spec (YAML or JSON)"),
        ("status", "list jobs"),
        ("describe", "one job in full"),
        ("cancel", "cancel a job (final)"),
        ("scale", "change a job's PS and worker limits; the scheduler picks the shape within them"),
        ("retry", "run a failed or cancelled job again, from its latest checkpoint"),
        ("delete", "forget an ended job (record, history, checkpoints); its name can be used again"),
        ("logs", "what a job printed (its driver, PS and workers, tagged by task; the traceback of a failure)"),
        ("events", "events"),
    ]:
        c = sub.add_parser(name, help=helptext)
        c.add_argument(
            "--url",
            help="manager URL (default $ELASTICPS_URL, else the one the server on --workdir wrote there, "
            "else http://127.0.0.1:8470)",
        )
        c.add_argument("--token", help="bearer token (default $ELASTICPS_TOKEN, else the workdir's token file)")
        c.add_argument(
            "--workdir",
            help="the manager's workdir, to read its token file (default $ELASTICPS_WORKDIR or elasticps-state)",
        )
        if name == "submit":
            c.add_argument("spec", help="a job spec file (.yaml, .yml or .json)")
            c.add_argument(
                "--wait",
                action="store_true",
                help="stream the job's progress and output until it ends; exit 0 if it finished, else 1 (also when it "
                "can never start on this cluster)",
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
        if name == "delete":
            c.add_argument("-y", "--yes", action="store_true", help="do not ask first (needed without a terminal)")
        if name == "scale":
            c.add_argument("--ps", type=task_range, help="PS limits: N (exactly N) or MIN..MAX")
            c.add_argument("--workers", type=task_range, help="worker limits: N (exactly N) or MIN..MAX")
        if name == "logs":
            c.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the job ends")
            c.add_argument(
                "--progress", action="store_true", help="instead: its progress log (windows, epochs, runtime events)"
            )
        if name == "status":
            c.add_argument(
                "--watch", type=positive_float, nargs="?", const=2.0, help="redraw every N seconds (default 2)"
            )
            c.add_argument("--active", action="store_true", help="only pending and running jobs")
            c.add_argument(
                "--state", choices=["pending", "running", "finished", "failed", "cancelled"], help="only jobs in it"
            )
        elif name == "events":
            c.add_argument("name", nargs="?", help="only this job's events (default: all)")
            c.add_argument("--tail", type=_count, metavar="N", help="only the newest N events")
        c.set_defaults(func=cmd_client)
