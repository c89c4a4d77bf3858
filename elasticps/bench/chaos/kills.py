"""Faults that kill processes: a job's worker or PS, the manager, a whole Ray node."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elasticps.bench.chaos_bench import Chaos


def kill_worker(chaos: Chaos) -> str | None:
    """SIGKILL one worker process of a running job."""
    return _kill_task(chaos, "ray::Worker")


def kill_ps(chaos: Chaos) -> str | None:
    """SIGKILL one PS process of a running job."""
    return _kill_task(chaos, "ray::PSShard")


def kill_server(chaos: Chaos) -> str | None:
    """SIGKILL the manager, then start it again on the same workdir (its jobs'
    tasks die with it, owned by its Ray driver)."""
    server = chaos.server
    old = server.proc.pid if server.proc else None
    server.kill()
    time.sleep(chaos.rng.uniform(0.0, 3.0))
    server.start()
    return f"pid {old}, back as pid {server.proc.pid if server.proc else None}"


def kill_node(chaos: Chaos) -> str | None:
    """SIGKILL a whole Ray node (raylet, object store, every task on it) but the
    manager's own, then add a fresh node in its place."""
    drivers = {id(node) for _, node in _task_pids(chaos.cluster, "ray::JobDriver")}
    candidates = [n for n in chaos.cluster.worker_nodes if id(n) not in drivers]
    if not candidates:
        return None
    node = chaos.rng.choice(candidates)
    chaos.cluster.remove_node(node, allow_graceful=False)
    chaos.cluster.add_node(num_cpus=chaos.cfg.cpus_per_node)
    return f"node {node.node_id[:12]} (replaced)"


def _kill_task(chaos: Chaos, title: str) -> str | None:
    tasks = _task_pids(chaos.cluster, title)
    if not tasks:
        return None
    pid, _ = chaos.rng.choice(tasks)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
        return f"pid {pid}"
    return None


def _task_pids(cluster: Any, title: str) -> list[tuple[int, Any]]:
    """(pid, node) of every Ray task process whose title starts with ``title``."""
    nodes = [cluster.head_node, *cluster.worker_nodes]
    raylets = {node.all_processes["raylet"][0].process.pid: node for node in nodes}
    return [(pid, raylets[ppid]) for pid, ppid, cmd in _processes() if ppid in raylets and cmd.startswith(title)]


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process (Linux /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append((int(entry.name), ppid, cmd))
    return out
