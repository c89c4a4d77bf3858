"""Following a job from the CLI: ``submit --wait`` (its progress, its output
and why it waits) and ``logs`` (its output, or with ``--progress`` its
progress log)."""

from __future__ import annotations

import sys
import time
from typing import Any

from elasticps.manager.models import ENDED, LogLine


def print_line(line: LogLine) -> None:
    step = f"step {line.step:6d}" if line.step is not None else "event      "
    print(f"{step}  {line.text}", flush=True)


def print_piece(piece: Any) -> None:
    """A piece of the job's own output (see :meth:`Client.output`)."""
    if piece.dropped:
        print(f"... ({piece.dropped} bytes of older output no longer kept)", flush=True)
    print(piece.text, end="", flush=True)


def print_output(client: Any, name: str, follow: bool) -> bool:
    """What the job printed, tagged by task, and the traceback of a failure;
    False if there was nothing to show."""
    shown = False
    for piece in client.output(name, follow=follow):
        print_piece(piece)
        shown = shown or bool(piece.text or piece.dropped)
    return shown


def wait(client: Any, name: str, poll_s: float = 1.0) -> int:
    """Stream the job's progress log and output, and why it waits whenever that
    changes, until it ends: 0 if it finished; 1 if it failed, was cancelled, or
    can never start on this cluster as it is (then it is left pending: cancel
    it or change it)."""
    last_step, next_event, said, offset = -1, 0, None, 0
    while True:
        job = client.job(name)  # read first: no line written before the end is lost
        piece = client.output_page(name, offset)
        offset = piece.next
        if piece.text or piece.dropped:
            print_piece(piece)
        for line in client.log_page(name, last_step, next_event):
            print_line(line)
            if line.step is not None:
                last_step = max(last_step, line.step)
            if line.event is not None:
                next_event = max(next_event, line.event + 1)
        if job.state in ENDED:
            why = f": {job.reason}" if job.state == "failed" and job.reason else ""
            print(f"{name}: {job.state}{why}", flush=True)
            return 0 if job.state == "finished" else 1
        if job.reason and job.reason != said:
            print(f"{name}: {job.state}: {job.reason}", flush=True)
            said = job.reason
        if job.never_starts:
            print(f"error: {name} can never start on this cluster: {job.reason}", file=sys.stderr, flush=True)
            return 1
        time.sleep(poll_s)
