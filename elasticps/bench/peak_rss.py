"""The peak resident memory of every process a command starts (its Ray tasks among them).

``python -m elasticps.bench.peak_rss [--every S] -- COMMAND ...`` runs
``COMMAND``, reads the kernel's high-water mark of resident memory (``VmHWM``
in ``/proc/PID/status``) of it and of every process below it every ``S``
seconds, and prints one JSON line per process at the end, largest first:
``{"pid", "name", "peak_rss_mib"}``, ``name`` being what the process calls
itself (a Ray actor: ``ray::LoopWorker``, ``ray::PSShard``). A process that lives less
than ``S`` seconds may be missed; the high-water mark of one that lives
longer is exact (the kernel keeps it). Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

from elasticps.bench.proc_stat import stat_fields


def _parents() -> dict[int, list[int]]:
    """Every running process's children, by parent pid."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is None or len(fields) < 2 or not fields[1].isdigit():
            continue
        kids.setdefault(int(fields[1]), []).append(int(entry))
    return kids


def _peak(pid: int | str) -> tuple[str, int] | None:
    """A process's name (its first argument) and its high-water mark in KiB."""
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            name = f.read().split("\0")[0]
        with open(f"/proc/{pid}/status") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return name, kib


def peak_mib(pid: int | str = "self") -> float | None:
    """The high-water mark of one process's resident memory in MiB (``self``: this
    process's), or None if it has gone."""
    got = _peak(pid)
    return None if got is None else got[1] / 1024


def watch(command: list[str], every_s: float = 0.5) -> tuple[int, list[dict[str, object]]]:
    """Run ``command``; its exit status and each of its processes' peak RSS."""
    proc = subprocess.Popen(command)
    seen: dict[int, tuple[str, int]] = {}
    while True:
        ended = proc.poll() is not None
        kids, todo = _parents(), [proc.pid]
        while todo:
            pid = todo.pop()
            todo.extend(kids.get(pid, []))
            got = _peak(pid)
            if got is not None:
                name, kib = got
                before, most = seen.get(pid, (name, 0))
                if name.startswith("ray::"):  # an actor's name, without the method it runs now
                    name = name.split(".")[0]
                    name = before if name == "ray::IDLE" and before.startswith("ray::") else name
                seen[pid] = (name, max(kib, most))
        if ended:
            break
        time.sleep(every_s)
    rows = [{"pid": pid, "name": name, "peak_rss_mib": round(kib / 1024, 1)} for pid, (name, kib) in seen.items()]
    return proc.returncode, sorted(rows, key=lambda r: -float(r["peak_rss_mib"]))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elasticps.bench.peak_rss", description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between reads (default 0.5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    code, rows = watch(command, args.every)
    for row in rows:
        print(json.dumps(row))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
