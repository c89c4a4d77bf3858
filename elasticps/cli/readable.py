"""What the client commands print for people: times as local times, durations
in words, a job's summary (``describe``) and the event list."""

from __future__ import annotations

import time
from typing import Any

from elasticps.tables import shape_text


def clock(at: float | None) -> str:
    """A Unix time as local time: ``2026-11-25 08:31:02``."""
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def duration(seconds: float | None) -> str:
    """``45s``, ``3m 12s``, ``2h 05m``."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    h, m, sec = s // 3600, s % 3600 // 60, s % 60
    return f"{h}h {m:02d}m" if h else f"{m}m {sec:02d}s" if m else f"{sec}s"


def describe_text(detail: dict[str, Any], spec: dict[str, Any]) -> str:
    """A job's summary from the dashboard's view of it (``GET /api/jobs/{name}``)."""
    j = detail["job"]
    lines = [f"name:       {j['name']}", f"state:      {j['state']}"]
    if j.get("reason"):
        lines.append(f"reason:     {j['reason']}")
    args = f"  args {spec['args']}" if spec.get("args") else ""
    lines.append(f"program:    {spec['program']}{args}")
    lines.append(f"submitted:  {clock(j['submitted_at'])}")
    if j.get("started_at") is not None:  # the start event's time, as `events` shows it (the tasks ran from the
        # first allocation, seconds later); the allocation's where the event is no longer among the newest
        started = next((e["at"] for e in detail.get("events", ()) if e["kind"] == "started"), j["started_at"])
        elapsed = j["elapsed_s"] + j["started_at"] - started
        lines.append(f"started:    {clock(started)}  (elapsed {duration(elapsed)})")
    if j["ended"]:
        lines.append(f"ended:      {clock(j['updated_at'])}")
    limits = f"PS {j['ps_range'][0]}..{j['ps_range'][1]}, workers {j['workers_range'][0]}..{j['workers_range'][1]}"
    ran = "last " if j["ended"] else ""  # an ended job's: the shape it last ran
    now = f"{ran}{shape_text(j['num_ps'], j['num_workers'])}, " if j["num_ps"] or j["num_workers"] else ""
    lines.append(f"shape:      {now}limits {limits}")
    progress = []
    if j.get("epochs"):
        progress.append(f"epoch {j['epoch']}/{j['epochs']}")
    if j.get("step") is not None:
        progress.append(f"step {j['step']}")
    if j.get("samples_per_s"):
        progress.append(f"{j['samples_per_s']:.0f} samples/s")
    if j.get("metric") is not None:
        progress.append(f"metric {j['metric']:.4f}")
    if j.get("eta_s") is not None:
        progress.append(f"ETA {duration(j['eta_s'])} ({j['eta_from']})")
    if progress:
        lines.append("progress:   " + ", ".join(progress))
    held = [(s, end[0]) for s, end in zip(detail["shapes"], detail["shapes"][1:], strict=False) if s[1] or s[2]]
    if held:  # each shape until the next entry (a stop is an entry of no tasks)
        lines.append("shape history:")
        for (at, p, w), end in held:
            lines.append(f"  {clock(at)}  {shape_text(p, w)}  for {duration(end - at)}")
    rescales = [r for r in detail["rescales"] if r["ok"]]
    if rescales:
        pauses = sorted(r["pause_s"] for r in rescales)
        lines.append(f"rescales:   {len(rescales)} applied, median pause {pauses[len(pauses) // 2] * 1e3:.0f} ms")
    return "\n".join(lines)


def event_line(at: float, job: str | None, kind: str, message: str) -> str:
    return f"{clock(at)}  {job or '-':12s} {kind:10s} {message}"
