"""Reading a process's ``/proc/PID/stat`` (Linux): the one parser of it, for
the CPU time a process used and the tree of processes a command started."""

from __future__ import annotations

import os


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` from the state on (``[1]`` the parent's
    pid, ``[11]`` and ``[12]`` the user and system CPU time in clock ticks), or
    None if the process has gone. They are read after the last ``)``: the
    name before them, in parentheses, may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) a process has used since it started, or
    None if it has gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
